"""ShareOrder: which (file, sample) a rank reads i-th in an epoch, computed for any range of i (pure).

The epoch's global sequence is the files in the epoch's file order, each file's samples in
place; a rank's share is a contiguous run [begin, begin + length) of it; the rank reads its
share in order, or shuffled. Both shuffles are KeyedPermutations (plan/permutation.py), so the
rows of positions [lo, hi) come from arithmetic on those positions alone: nothing is held per
sample or, where every file has the same sample count (a dataset's files always do), per file.
Files of differing counts (several splits in one list, hand-made lists in tests) keep the epoch's
file order and each file's first row (two integers a file) to find a row's file by bisection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dlio_ckpt.plan.permutation import KeyedPermutation


def index_dtype(count: int) -> np.dtype:
    """int32 for positions below 2^31, else int64: rows take 4 bytes an entry, not 8, up to 2
    billion files or samples."""
    return np.dtype(np.int32 if count < 2**31 else np.int64)


@dataclass(frozen=True, eq=False)
class ShareOrder:
    """One rank's share of one epoch: `rows(lo, hi)` gives positions lo..hi-1 of its read order."""

    length: int  # samples in the share
    begin: int  # the share's first row in the epoch's global sequence
    dtype: np.dtype
    per_file: int  # samples in every file (uniform layout); 0: the file-order arrays below
    first_slot: int = 0  # the file-order slot the global sequence starts at (a whole-file share's)
    file_order: KeyedPermutation | None = None  # slot -> file position (None: in list order)
    sample_order: KeyedPermutation | None = None  # share position -> position in the share (None: in order)
    slot_files: np.ndarray | None = None  # differing counts: the file position of each slot of the share's files
    slot_starts: np.ndarray | None = None  # ... and the global row each slot's samples start at

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """(file position, sample index in the file) of share positions [lo, hi), one row each."""
        positions = np.arange(lo, hi, dtype=np.int64)
        if self.sample_order is not None:
            positions = self.sample_order(positions)
        positions += self.begin
        out = np.empty((len(positions), 2), self.dtype)
        if self.per_file:
            slots, out[:, 1] = np.divmod(positions, self.per_file)
            slots += self.first_slot
            if self.file_order is None:
                out[:, 0] = slots
            elif self.sample_order is None and self.per_file > 1:  # in order: each slot's file once, not per sample
                out[:, 0] = self.file_order(np.arange(slots[0], slots[-1] + 1))[slots - slots[0]]
            else:
                out[:, 0] = self.file_order(slots)
        else:
            slots = np.searchsorted(self.slot_starts, positions, side="right") - 1  # an empty file's slot shares its start with the next: never chosen
            out[:, 0] = self.slot_files[slots]
            out[:, 1] = positions - self.slot_starts[slots]
        return out


@dataclass(frozen=True, eq=False)
class ListedOrder:
    """An order given row by row (tests and tools that hand a reader chosen samples): what an
    EpochReadPlan reads from, as a ShareOrder, with the rows held whole."""

    listed: np.ndarray  # (n, 2): file position, sample index in the file

    @property
    def length(self) -> int:
        return len(self.listed)

    @property
    def dtype(self) -> np.dtype:
        return self.listed.dtype

    def rows(self, lo: int, hi: int) -> np.ndarray:
        return self.listed[lo:hi]


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S29 = np.uint64(29)
DIGEST_BLOCK = 1 << 16  # files a numpy call when a share's set of files is digested or iterated
LOOKUP_BLOCK = 4096  # files computed at once when one is asked for


@dataclass(frozen=True, eq=False)
class RunFiles(Sequence):
    """The files of a share read in file order (each file's rows one run), in that order, by
    arithmetic: file k is slot `first + k` of the epoch's file order (what a whole-file reader
    hands its framework as the list of files, without a list)."""

    first: int  # the slot of the first file
    files: int  # how many
    file_order: KeyedPermutation | None  # slot -> file position (None: the list's order)
    # the block of positions last asked for one at a time, (block, positions), replaced whole: a
    # reader asks for files in about their order, and one file's permutation costs ~60 numpy calls
    _block: list = field(init=False, default_factory=lambda: [None], compare=False, repr=False)

    def __len__(self) -> int:
        return self.files

    def between(self, lo: int, hi: int) -> np.ndarray:
        """Positions of files lo..hi-1, int64."""
        slots = np.arange(self.first + max(lo, 0), self.first + min(hi, self.files), dtype=np.int64)
        return slots if self.file_order is None else self.file_order(slots)

    def __getitem__(self, k):
        if isinstance(k, slice):
            raise TypeError("RunFiles is indexed one file at a time (between() gives a range)")
        k = range(self.files)[k]  # negatives, IndexError
        block, cached = k // LOOKUP_BLOCK, self._block[0]
        if cached is None or cached[0] != block:
            cached = (block, self.between(block * LOOKUP_BLOCK, (block + 1) * LOOKUP_BLOCK))
            self._block[0] = cached
        return int(cached[1][k - block * LOOKUP_BLOCK])

    def __iter__(self):
        for lo in range(0, self.files, DIGEST_BLOCK):
            yield from self.between(lo, lo + DIGEST_BLOCK).tolist()

    def identity(self) -> tuple:
        """Equal for two shares of the same set of files (in any order): the slots where the order
        is the list's, every file where the share is the whole order, else a digest of the set
        (count, sum, and the sum of a multiplicative hash, wrapping), a block at a time."""
        if self.file_order is None:
            return ("slots", self.first, self.files)
        if self.first == 0 and self.files == self.file_order.n:
            return ("every file", self.files)
        total, mixed = 0, np.uint64(0)
        for lo in range(0, self.files, DIGEST_BLOCK):
            block = self.between(lo, lo + DIGEST_BLOCK)
            total += int(block.sum())
            z = block.astype(np.uint64) * _GOLDEN
            mixed += np.bitwise_xor(z, z >> _S29).sum(dtype=np.uint64)
        return ("set", self.files, total, int(mixed))
