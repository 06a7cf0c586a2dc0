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


WALK_VALUES = 1 << 18  # the most positions of a noise walk (one chunk's window)
MIN_WALK_VALUES = 1 << 12  # the fewest (a tiny file's walk: a tiny FFT)
NOISE_UNIT = 1 << 12  # the walk is exact integer arithmetic: noise in 1/4096ths ...
WEIGHT_UNIT = 1 << 12  # ... times decay(t) in 1/4096ths: any order of summation gives the same integers
STEPS_BEFORE_FFT = 16  # a walk moved by more steps than this is computed in closed form (FFT), else step by step


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


def walk_size(elements: int) -> int:
    """The walk a file whose largest float chunk has `elements` reads: the power of two that holds
    it, between MIN_WALK_VALUES and WALK_VALUES (a file's own size: the same on any rank count)."""
    return int(min(WALK_VALUES, max(MIN_WALK_VALUES, 1 << max(0, int(elements) - 1).bit_length())))


class NoiseWalk:
    """W_s: the sum over the steps t <= s of decay(t) times step t's noise, at `size` positions (a
    chunk reads a window of it, at a position fixed per chunk).

    Step t's noise is the Student-t pool rotated by a position p_t hashed from (seed, t), so
    W_s[j] = sum_t w_t * noise[(j - p_t) mod size]. Noise and weights are integers (NOISE_UNIT,
    WEIGHT_UNIT), so W_s is exact integer arithmetic: the same integers whether computed step by
    step from any earlier (or later) step, or in closed form as a circular convolution with one
    FFT pair (rounded: the float64 FFT's error stays far below 0.5 for runs of up to ~10^7
    steps). Each request takes the cheaper way from the last step computed: a checkpoint every
    few steps costs a few vector additions, a long interval or a restart one FFT pair. W_s depends
    on s alone, and W_b - W_a is the sum of the steps in (a, b]: a random walk."""

    def __init__(self, seed: int, noise: np.ndarray, size: int = WALK_VALUES) -> None:
        self._seed = seed & ((1 << 64) - 1)
        self._size = size
        self._noise = np.rint(noise[:size].astype(np.float64) * NOISE_UNIT).astype(np.int64)
        self._noise_fft: np.ndarray | None = None
        self._step = 0
        self._exact = np.zeros(size, dtype=np.int64)
        self._cache: dict[int, np.ndarray] = {}  # the two steps asked for last, as float32

    @property
    def size(self) -> int:
        return self._size

    def positions(self, first: int, last: int) -> np.ndarray:
        """p_t for the steps first..last."""
        steps = np.arange(first, last + 1, dtype=np.uint64)
        return (mix64(self._seed, 0x57A1, steps) % np.uint64(self._size)).astype(np.int64)

    @staticmethod
    def weights(first: int, last: int) -> np.ndarray:
        """w_t = decay(t) in WEIGHT_UNITs for the steps first..last."""
        return np.rint(decay(np.arange(first, last + 1)) * WEIGHT_UNIT).astype(np.int64)

    def _move(self, step: int) -> None:
        """self._exact from W at self._step to W at `step`, one step's noise at a time."""
        lo, hi, sign = (self._step + 1, step, 1) if step > self._step else (step + 1, self._step, -1)
        n = self._size
        for p, w in zip(self.positions(lo, hi).tolist(), self.weights(lo, hi).tolist()):
            w *= sign
            self._exact[p:] += w * self._noise[: n - p]
            self._exact[:p] += w * self._noise[n - p :]
        self._step = step

    def _closed_form(self, step: int) -> None:
        if self._noise_fft is None:
            self._noise_fft = np.fft.rfft(self._noise.astype(np.float64))
        weights = np.zeros(self._size, dtype=np.float64)
        for first in range(1, step + 1, 1 << 20):
            last = min(step, first + (1 << 20) - 1)
            np.add.at(weights, self.positions(first, last), self.weights(first, last).astype(np.float64))
        self._exact = np.rint(np.fft.irfft(self._noise_fft * np.fft.rfft(weights), n=self._size)).astype(np.int64)
        self._step = step

    def at(self, step: int) -> np.ndarray:
        """W_step as float32 (in units of one step's noise at decay 1), stored twice (any window
        of up to `size` values is one slice)."""
        cached = self._cache.get(step)
        if cached is not None:
            return cached
        if step <= 0:
            self._exact[:] = 0
            self._step = 0
        elif abs(step - self._step) <= STEPS_BEFORE_FFT:
            self._move(step)
        else:
            self._closed_form(step)
        single = (self._exact * (1.0 / (NOISE_UNIT * WEIGHT_UNIT))).astype(np.float32)
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
