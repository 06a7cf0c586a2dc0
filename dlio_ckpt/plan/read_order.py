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

from dataclasses import dataclass

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
