"""KeyedSizes: a split's per-file sample sizes, each file's computed from (seed, split, its block)
alone (pure).

The sizes were one seeded normal draw over all the split's files: an int64 array of 8 bytes a
file, 80 MB at ten million, held by every rank for the run, because file i's value depends on
every draw before it. Here the files fall in blocks of BLOCK, and block b is its own draw from
numpy's generator seeded with [seed, split, b] (SeedSequence mixes the three into independent
streams): the same normal (mean, stdev, clipped at the minimum, truncated to whole bytes), but
file i's size needs only block i // BLOCK, whatever the file count. A block is always drawn
whole, BLOCK values (the last one cut to the files there are), so a file's size depends on
neither the count nor which other files were asked for. The values differ from the single draw's
for the same seed (as the read order's did when it became keyed permutations).

One block is kept, replaced whole (reader threads may ask at once): files asked for in order
(generation, a file-ordered epoch) cost one draw per BLOCK files; a shuffled reader's lookups
cost a draw each (~40 us), which a file large enough to need varied sizes outweighs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

BLOCK = 1024  # files a draw: ~40 us a block here, 8 KiB held; ~0.4 s to sum ten million files' sizes


@dataclass(frozen=True, eq=False)
class KeyedSizes:
    """Sample sizes of `count` files: normal(mean, stdev), at least `minimum`, whole bytes."""

    count: int
    mean: int
    stdev: int
    minimum: int
    key: tuple[int, ...]  # (dataset seed, split stream): with the block number, a draw's seed
    # the block last drawn, (number, sizes), and the sum once taken: caches of pure functions
    _cache: list = field(init=False, default_factory=lambda: [None, None], compare=False, repr=False)

    def __len__(self) -> int:
        return self.count

    def block(self, number: int) -> np.ndarray:
        """The sizes of files [number * BLOCK, (number + 1) * BLOCK), int64."""
        cached = self._cache[0]
        if cached is not None and cached[0] == number:
            return cached[1]
        if not 0 <= number * BLOCK < self.count:
            raise IndexError(f"block {number} of {self.count} files")
        draw = np.random.default_rng([*self.key, number]).normal(self.mean, self.stdev, BLOCK)
        sizes = np.maximum(draw, self.minimum).astype(np.int64)[:self.count - number * BLOCK]
        sizes.flags.writeable = False
        self._cache[0] = (number, sizes)
        return sizes

    def __getitem__(self, i: int) -> int:
        i = int(i)
        if not 0 <= i < self.count:
            raise IndexError(f"file {i} of {self.count}")
        return int(self.block(i // BLOCK)[i % BLOCK])

    def between(self, lo: int, hi: int) -> np.ndarray:
        """The sizes of files lo..hi-1 (for tests and tools: a reader asks one file at a time)."""
        lo, hi = max(lo, 0), min(hi, self.count)
        if hi <= lo:
            return np.empty(0, np.int64)
        parts = [self.block(b) for b in range(lo // BLOCK, (hi - 1) // BLOCK + 1)]
        return np.concatenate(parts)[lo - lo // BLOCK * BLOCK:hi - lo // BLOCK * BLOCK]

    def sum(self) -> int:
        """Every file's size summed, a block at a time (once; kept)."""
        if self._cache[1] is None:
            self._cache[1] = sum(int(self.block(b).sum()) for b in range(-(-self.count // BLOCK)))
        return self._cache[1]
