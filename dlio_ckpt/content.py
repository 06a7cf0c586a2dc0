"""Synthetic bytes for samples and tensors, from a bounded pool of seeded random bytes.

Generating fresh random numbers for every byte of a multi-GiB dataset would measure the random
number generator, not the storage; one all-zero buffer would be deduplicated and compressed away
by the storage. A pool of seeded random bytes (default 64 MiB) read at a per-item starting point
that is not block aligned gives every 4 KiB block of every item different contents at memory
speed, and the same item always gets the same bytes (so a reader can verify them).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1
_LAP_SHIFT = 4097  # odd, and not a multiple of any block size
_STEP_MIX = 0x9E3779B1


def tensor_key(owner: int, name: str, step: int) -> int:
    """A ByteSource key per (rank, tensor, step): contents differ between ranks, tensors and
    checkpoints, so the storage can neither deduplicate nor skip unchanged blocks. Here, below
    both the checkpoint writers and the model states, because both key their bytes by it."""
    return (zlib.crc32(name.encode()) << 20) ^ (owner * 1_000_003) ^ (step * _STEP_MIX)


def spread(key: int) -> int:
    """A 64-bit mix of `key` (splitmix64's finaliser): keys that differ only in high bits (a file
    index shifted left, as sample keys are) or by small steps land far apart. A plain odd
    multiplier modulo the pool's power-of-two size keeps only the key's low bits, and gave every
    one-sample file of a dataset one of two starting points (files i and i+2 identical)."""
    z = (key + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def random_bytes(seed: int, nbytes: int) -> np.ndarray:
    """`default_rng(seed).integers(0, 256, nbytes, dtype=uint8)`, the pool's contents since the
    first release, taken straight from the generator's 64-bit outputs (little-endian), which is
    what numpy's full-range uint8 draw returns byte for byte, at about 3x the speed (a test holds
    the two equal, so a numpy that changed either would be caught)."""
    words = np.random.default_rng(seed).bit_generator.random_raw(-(-nbytes // 8))
    return words.astype("<u8", copy=False).view(np.uint8)[:nbytes]


@dataclass(frozen=True)
class ByteSource:
    """Deterministic item contents: `chunks(key, n)` yields n bytes for item `key`."""

    seed: int
    pool_bytes: int = 64 << 20
    zeros: bool = False
    _pool: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.zeros:
            pool = np.zeros(min(self.pool_bytes, 4 << 20), dtype=np.uint8)
        else:
            # Twice the pool, so any window of up to pool_bytes is one contiguous slice.
            pool = np.empty(2 * self.pool_bytes, dtype=np.uint8)
            pool[: self.pool_bytes] = random_bytes(self.seed, self.pool_bytes)
            pool[self.pool_bytes :] = pool[: self.pool_bytes]
        object.__setattr__(self, "_pool", pool)

    @property
    def window(self) -> int:
        """The largest chunk that is one zero-copy slice of the pool."""
        return len(self._pool) // 2 if not self.zeros else len(self._pool)

    def _start(self, key: int) -> int:
        if self.zeros:
            return 0
        return (spread(key) % (len(self._pool) // 2)) | 1  # odd: off every block boundary

    def piece(self, key: int, nbytes: int) -> memoryview:
        """Item `key`'s `nbytes` bytes as one view, for an item no longer than `window`: the one
        chunk `chunks` yields for it when chunk_bytes >= nbytes, without the generator (a small
        file's only sample: generation calls this once a file)."""
        if nbytes > self.window:
            raise ValueError(f"an item of {nbytes} bytes is longer than the pool window ({self.window})")
        position = 0 if self.zeros else self._start(key) % self.window
        return memoryview(self._pool[position : position + nbytes])

    def chunks(self, key: int, nbytes: int, chunk_bytes: int = 4 << 20) -> Iterator[memoryview]:
        """Yield memoryviews (zero copy) that together hold item `key`'s `nbytes` bytes.

        An item longer than the pool goes round it in laps; each lap starts 4,097 bytes further
        on, so no 4 KiB block of an item repeats an earlier block of it (a storage system that
        deduplicates blocks finds nothing to fold).
        """
        chunk_bytes = max(1, min(chunk_bytes, self.window))
        limit = self.window
        start = self._start(key)
        emitted = 0
        while emitted < nbytes:
            lap, into_lap = divmod(emitted, limit)
            position = 0 if self.zeros else (start + lap * _LAP_SHIFT) % limit + into_lap
            take = min(chunk_bytes, nbytes - emitted, limit - into_lap)
            if self.zeros:
                take = min(take, len(self._pool))
            yield memoryview(self._pool[position : position + take])
            emitted += take

    def rows(self, keys: np.ndarray, nbytes: int) -> np.ndarray:
        """(len(keys), nbytes) bytes, row i from a pool position `keys[i]` picks (nbytes at most
        `window`): fresh contents for many small units in one gather."""
        if nbytes > self.window:
            raise ValueError(f"rows of {nbytes} bytes are longer than the pool window ({self.window})")
        starts = np.asarray(keys, dtype=np.uint64) % np.uint64(max(1, self.window - nbytes + 1))
        starts = starts.astype(np.int64) if not self.zeros else np.zeros(len(starts), np.int64)
        return self._pool[starts[:, None] + np.arange(nbytes, dtype=np.int64)]

    def array(self, key: int, nbytes: int) -> np.ndarray:
        """Item `key` as one uint8 array (a copy only when it spans several pool windows)."""
        if nbytes <= self.window:
            start = self._start(key)
            return self._pool[start : start + nbytes]
        out = np.empty(nbytes, dtype=np.uint8)
        position = 0
        for piece in self.chunks(key, nbytes):
            out[position : position + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
            position += len(piece)
        return out
