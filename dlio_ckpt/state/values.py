"""Float values for the `sgd` and `trace` models: weights, update noise, the learning-rate decay.

The `sgd` weights at step s are a closed form of the seed and s (NoiseWalk): the sum of the
per-step noise of every step up to s, so the state at a step is the same whatever the checkpoint
schedule or the failures before it, and the delta between two checkpoints grows with the steps
between them, as in training.

Drawing a normal or Student-t value per element would run at a few hundred MB/s, far below memory
speed; so each model draws one seeded pool of values once and takes every chunk's values from it
at a seeded position (as ByteSource does for bytes), scaled per chunk. Statistically each chunk
still holds independent draws of the distribution; the pool only bounds the cost.
"""

from __future__ import annotations

import numpy as np

POOL_VALUES = 1 << 20  # values per pool (4 MiB of float32), stored twice so any window is one slice
CHUNK_VALUES = 1 << 18  # elements handled at a time (at most WALK_VALUES)
INIT_STD = 0.02  # weights start as N(0, 0.02), as a transformer's do
NOISE_DF = 4  # Student-t degrees of freedom of the per-step noise, calibrated on real torch trajectories (docs/checkpointing.md)
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


WALK_VALUES = 1 << 18  # positions of the noise walk (one chunk's window): an FFT pair of this size per new step


def mix64(*parts) -> np.ndarray:
    """splitmix64 of the parts (ints or uint64 arrays, broadcast): a cheap seeded hash, the same
    on every platform, for positions that must depend on a step or a unit alone."""
    with np.errstate(over="ignore"):
        z = np.uint64(0x9E3779B97F4A7C15)
        for part in parts:
            z = (z ^ np.asarray(part).astype(np.uint64)) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
    return z


class NoiseWalk:
    """W_s: the sum over the steps t <= s of decay(t) times step t's noise, for WALK_VALUES
    positions (a chunk reads a window of it, at a position fixed per chunk).

    Step t's noise is the Student-t pool rotated by a position hashed from (seed, t), so
    W_s[j] = sum_t decay(t) * noise[(j - p_t) mod N]: a circular convolution of the pool with the
    weights decay(t) placed at p_t, computed with one FFT pair whatever s is. W_s depends on s
    alone (not on which steps were asked for before), and W_b - W_a is the sum of the steps in
    (a, b]: a random walk, as independent SGD steps add up."""

    def __init__(self, seed: int, noise: np.ndarray) -> None:
        self._seed = seed & ((1 << 64) - 1)
        self._noise_fft = np.fft.rfft(noise[:WALK_VALUES].astype(np.float64))
        self._cache: dict[int, np.ndarray] = {}  # the two steps asked for last

    def positions(self, first: int, last: int) -> np.ndarray:
        """p_t for the steps first..last."""
        steps = np.arange(first, last + 1, dtype=np.uint64)
        return (mix64(self._seed, 0x57A1, steps) % np.uint64(WALK_VALUES)).astype(np.int64)

    def at(self, step: int) -> np.ndarray:
        """W_step as float32, stored twice (any window of up to WALK_VALUES is one slice)."""
        cached = self._cache.get(step)
        if cached is not None:
            return cached
        if step <= 0:
            walk = np.zeros(2 * WALK_VALUES, dtype=np.float32)
        else:
            weights = np.zeros(WALK_VALUES, dtype=np.float64)
            for first in range(1, step + 1, 1 << 20):
                last = min(step, first + (1 << 20) - 1)
                np.add.at(weights, self.positions(first, last), decay(np.arange(first, last + 1)))
            single = np.fft.irfft(self._noise_fft * np.fft.rfft(weights), n=WALK_VALUES).astype(np.float32)
            walk = np.concatenate([single, single])
        while len(self._cache) >= 2:
            del self._cache[next(iter(self._cache))]
        self._cache[step] = walk
        return walk


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
