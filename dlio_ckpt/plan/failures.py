"""When failures strike (pure and seeded): at given steps, or drawn from an exponential law.

Failure i is a pure function of (failures.seed, i), so every rank, every rank count and a
relaunched job (failures.restart=exit) agree on it without talking. Failures are consumed in
order: failure i can only strike after failure i-1 has, so work recomputed after a restart
never meets the same failure twice.

Clocks. `failures.at_steps=[s, ...]`: failure i strikes when the training reaches step s_i (the
step number, counted from 1, right after its compute and before any checkpoint of that step).
`failures.mtbf_s=M`: the gaps between failures are exponential with mean M seconds of *training
wall time*: rank 0's clock from the start of the training loop, counting everything training
spends (compute, waiting for data, checkpoints, restarts; evaluation excluded), carried over a
relaunch. A failure strikes at the first step boundary at or after its time, as a real failure
is noticed at the next collective; one whose time falls inside a checkpoint's save strikes at the
save's end, and that checkpoint, whose commit it preceded, is withdrawn (engine/failures.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# Stream numbers of the seeded draws (numpy SeedSequence entropy: seed, failure index, stream).
_GAP_STREAM = 0
_RANK_STREAM = 1


@dataclass(frozen=True)
class FailureEvent:
    index: int  # 0 for the run's first failure
    kind: str  # process | node
    rank: int  # the rank that fails (a node failure takes its node)
    step: int | None = None  # at_steps: the step it strikes after
    at_s: float | None = None  # mtbf_s: seconds of training wall time when it strikes


@dataclass(frozen=True)
class FailureSchedule:
    at_steps: tuple[int, ...]
    mtbf_s: float
    seed: int
    kind: str
    world_size: int

    @classmethod
    def from_config(cls, failures: Any, world_size: int) -> "FailureSchedule":
        return cls(tuple(sorted(failures.at_steps)), float(failures.mtbf_s), int(failures.seed), failures.kind,
                   world_size)

    @property
    def enabled(self) -> bool:
        return bool(self.at_steps) or self.mtbf_s > 0

    @property
    def by_steps(self) -> bool:
        """at_steps decides the injections; mtbf_s then only feeds the young_daly policy."""
        return bool(self.at_steps)

    def event(self, index: int) -> FailureEvent | None:
        """Failure `index`, or None when there is none (past the end of at_steps)."""
        if not self.enabled:
            return None
        rank = int(np.random.default_rng([self.seed, index, _RANK_STREAM]).integers(self.world_size))
        if self.by_steps:
            if index >= len(self.at_steps):
                return None
            return FailureEvent(index, self.kind, rank, step=self.at_steps[index])
        return FailureEvent(index, self.kind, rank, at_s=failure_time(self.mtbf_s, self.seed, index))

    def count_before(self, horizon_s: float) -> int:
        """mtbf_s: how many failures strike within `horizon_s` seconds of uninterrupted time."""
        if self.mtbf_s <= 0:
            raise ValueError("count_before needs failures.mtbf_s > 0")
        count, elapsed = 0, failure_gap(self.mtbf_s, self.seed, 0)
        while elapsed < horizon_s:
            count += 1
            elapsed += failure_gap(self.mtbf_s, self.seed, count)
        return count


def failure_gap(mtbf_s: float, seed: int, index: int) -> float:
    """Seconds between failure index-1 (or the start) and failure `index`: Exp(mean mtbf_s)."""
    return float(np.random.default_rng([seed, index, _GAP_STREAM]).exponential(mtbf_s))


def failure_time(mtbf_s: float, seed: int, index: int) -> float:
    """Training wall time at which failure `index` strikes: the sum of its and earlier gaps."""
    return float(sum(failure_gap(mtbf_s, seed, i) for i in range(index + 1)))
