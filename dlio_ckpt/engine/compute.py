"""Emulated accelerator compute: a sleep per step, fixed or drawn from a seeded distribution.

A framework that traces or compiles its step (tf.function, torch.compile, XLA) pays that once, in
the first step of every process start: `first_s` is added to the first step a model runs, and a
restarted run builds a new model, as a restarted program compiles again. Spread over the steps as
a larger per-step time instead, it would make a short profiled run's every step as slow as its
first (the Keras reference program: 2.5 s once, then 6 ms a step).

A sleep releases the GIL, so reader threads keep prefetching while the 'accelerator' works,
which is exactly the overlap a real data loader achieves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from dlio_ckpt.schema import TrainConfig


@dataclass
class ComputeModel:
    mean_s: float
    stdev_s: float
    distribution: str
    seed: int
    first_s: float = 0.0
    _rng: np.random.Generator = field(init=False, repr=False)
    _started: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    @classmethod
    def for_training(cls, train: TrainConfig, rank: int) -> "ComputeModel":
        return cls(train.computation_time, train.computation_time_stdev, train.computation_distribution,
                   train.seed * 1_000_003 + rank, train.first_step_time)

    def draw(self) -> float:
        """Seconds of compute for the next step (never negative)."""
        if self.mean_s <= 0:
            return 0.0
        if self.distribution == "fixed" or self.stdev_s <= 0:
            return self.mean_s
        if self.distribution == "normal":
            return max(0.0, float(self._rng.normal(self.mean_s, self.stdev_s)))
        if self.distribution == "uniform":
            half = self.stdev_s * 3**0.5  # same stdev as asked
            return max(0.0, float(self._rng.uniform(self.mean_s - half, self.mean_s + half)))
        # lognormal with the requested mean and stdev
        variance = np.log1p((self.stdev_s / self.mean_s) ** 2)
        return float(self._rng.lognormal(np.log(self.mean_s) - variance / 2, np.sqrt(variance)))

    def restarted(self) -> None:
        """A restart is a new process: its first step traces or compiles again."""
        self._started = False

    def run(self) -> float:
        """Emulate one step's compute; returns the seconds asked for."""
        seconds = self.draw()
        if not self._started:
            self._started = True
            seconds += self.first_s
        if seconds > 0:
            time.sleep(seconds)
        return seconds
