"""Float values for the `sgd` and `trace` models: weights, update noise, the learning-rate decay.

Drawing a normal or Student-t value per element would run at a few hundred MB/s, far below memory
speed; so each model draws one seeded pool of values once and takes every chunk's values from it
at a seeded position (as ByteSource does for bytes), scaled per chunk. Statistically each chunk
still holds independent draws of the distribution; the pool only bounds the cost.
"""

from __future__ import annotations

import numpy as np

POOL_VALUES = 1 << 20  # values per pool (4 MiB of float32), stored twice so any window is one slice
CHUNK_VALUES = 1 << 18  # elements handled at a time (at most POOL_VALUES)
INIT_STD = 0.02  # weights start as N(0, 0.02), as a transformer's do
NOISE_DF = 3  # Student-t degrees of freedom of the per-step noise: heavy tails, finite variance
NOISE_CLIP = 100.0  # |noise| bound, so a float16 weight cannot overflow however long the run
DECAY_STEPS = 100  # learning rate at step s: lr / sqrt(1 + s / DECAY_STEPS) (inverse square root decay)


def decay(steps: np.ndarray | int) -> np.ndarray:
    """The learning-rate factor at each step (1 at step 0, 1/sqrt(1 + s/100) later)."""
    return 1.0 / np.sqrt(1.0 + np.asarray(steps, dtype=np.float64) / DECAY_STEPS)


def decay_rss(a: int, b: int) -> float:
    """The root sum of squares of the learning-rate factors of the steps in (a, b]: the scale of
    an interval's update, folded (independent per-step steps add up as a random walk, as the
    trace's do: its deltas over 250 steps are about sqrt(5) times those over 50)."""
    total = 0.0
    for first in range(a + 1, b + 1, 1 << 20):
        total += float(np.square(decay(np.arange(first, min(b + 1, first + (1 << 20))))).sum())
    return float(np.sqrt(total))


class ValuePool:
    """Seeded standard-normal and Student-t values, taken a window at a time."""

    def __init__(self, seed: int) -> None:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed & ((1 << 64) - 1), 0x5EED])))
        normal = rng.standard_normal(POOL_VALUES, dtype=np.float32)
        noise = np.clip(rng.standard_t(NOISE_DF, POOL_VALUES), -NOISE_CLIP, NOISE_CLIP).astype(np.float32)
        self.normal = np.concatenate([normal, normal])
        self.noise = np.concatenate([noise, noise])

    @staticmethod
    def window(pool: np.ndarray, rng: np.random.Generator, count: int) -> np.ndarray:
        """`count` (<= POOL_VALUES) consecutive values of `pool` from a position `rng` draws."""
        start = int(rng.integers(0, POOL_VALUES))
        return pool[start : start + count]
