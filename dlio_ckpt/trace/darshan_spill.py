"""An external bucket sort of numpy rows by an integer key: what lets the Darshan writer group a
run's events by file, and put records in first-touch order, without holding them all (and the
offline analysis sum each file's bytes over ranks: analysis/file_totals.py).

A Darshan log is made per file (a record per rank and file), but events come in time order, and
a dataset of millions of files made the writer hold every file's record at once (3.7 KiB a file,
benchmarks/README.md). Here rows are added in any order and come back sorted by their key, a
bucket at a time: each flush of the buffer is sorted by bucket (a key range) and appended to one
unlinked temporary file (`tempfile.TemporaryFile`: nothing is left behind whatever way the process
ends), with each bucket's row count; a bucket is read back from its pieces in every flush. A
spill has at most MAX_BUCKETS buckets, and a bucket bigger than BUCKET_MAX_BYTES is split again
the same way over its own key range, so what is held is a bucket of about BUCKET_BYTES of rows,
whatever the number of rows; only rows of one key are never split (a file's events all come back
in one piece).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

import numpy as np

BUCKET_BYTES = 512 << 10  # the rows a bucket aims at (what the reader holds, sorted, at a time)
BUCKET_MAX_BYTES = 4 * BUCKET_BYTES  # past this a bucket is partitioned again
FLUSH_BYTES = 1 << 20  # rows buffered before they are sorted by bucket and written
# Buckets of one spill at most: each flush keeps a row count per bucket (4 bytes), so more would
# make that bookkeeping grow as flushes x buckets; bigger buckets are split again instead.
MAX_BUCKETS = 256


class BucketSpill:
    """Rows of `dtype` sorted by the unsigned integer column `key`, with keys in [low, low + span).

    `then` names a column that orders rows of one key (a stable sort keeps their adding order
    otherwise). Use as a context manager, or call `close`: the file is closed, and so gone.
    """

    def __init__(self, dtype: np.dtype, key: str, span: int, expected_rows: int, folder: Path | None = None,
                 then: str | None = None, low: int = 0, prefix: str = ".dlio_ckpt-darshan-") -> None:
        self.dtype, self.key, self.then, self.low = np.dtype(dtype), key, then, low
        self.folder, self.prefix = folder, prefix
        self._max_rows = max(1, BUCKET_MAX_BYTES // self.dtype.itemsize)
        buckets = min(MAX_BUCKETS, max(1, expected_rows * self.dtype.itemsize // BUCKET_BYTES))
        width = max(1, -(-span // buckets))
        self.shift = (width - 1).bit_length()  # bucket = (key - low) >> shift
        self.buckets = ((max(span, 1) - 1) >> self.shift) + 1
        self._pending: list[np.ndarray] = []
        self._pending_rows = 0
        self._flush_rows = max(1, FLUSH_BYTES // self.dtype.itemsize)
        self._file: IO[bytes] | None = None
        self._size = 0
        self._flushes: list[tuple[int, np.ndarray]] = []  # (file offset, each bucket's first row there)
        self.rows = 0

    def __enter__(self) -> "BucketSpill":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._pending = []

    def add(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        self._pending.append(np.ascontiguousarray(rows, self.dtype))
        self._pending_rows += len(rows)
        self.rows += len(rows)
        if self._pending_rows >= self._flush_rows:
            self._flush()

    def _bucket_of(self, rows: np.ndarray) -> np.ndarray:
        if self.buckets == 1:  # (a shift by 64 would be undefined)
            return np.zeros(len(rows), np.int64)
        keys = rows[self.key].astype(np.uint64, copy=False)
        return ((keys - np.uint64(self.low)) >> np.uint64(self.shift)).astype(np.int64)

    def _flush(self) -> None:
        if not self._pending:
            return
        rows = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._pending_rows = [], 0
        buckets = self._bucket_of(rows)
        order = np.argsort(buckets, kind="stable")
        firsts = np.zeros(self.buckets + 1, np.int32)  # a flush holds far fewer than 2^31 rows
        np.cumsum(np.bincount(buckets, minlength=self.buckets), out=firsts[1:])
        if self._file is None:
            self._file = tempfile.TemporaryFile(dir=self.folder, prefix=self.prefix, buffering=0)
        self._file.seek(self._size)
        self._file.write(memoryview(np.ascontiguousarray(rows[order])).cast("B"))
        self._flushes.append((self._size, firsts))
        self._size += len(rows) * self.dtype.itemsize

    def _pieces(self, bucket: int) -> Iterator[np.ndarray]:
        """Bucket `bucket`'s rows, a flush's piece at a time, in the order they were added."""
        assert self._file is not None
        item = self.dtype.itemsize
        for offset, firsts in self._flushes:
            first, last = int(firsts[bucket]), int(firsts[bucket + 1])
            if last > first:
                data = os.pread(self._file.fileno(), (last - first) * item, offset + first * item)
                yield np.frombuffer(bytearray(data), self.dtype)

    def chunks(self) -> Iterator[np.ndarray]:
        """Every row, sorted by key (then by `then`), a chunk at a time; a key's rows are never
        split across chunks."""
        self._flush()
        for bucket in range(self.buckets):
            count = sum(int(firsts[bucket + 1] - firsts[bucket]) for _, firsts in self._flushes)
            if not count:
                continue
            if count > self._max_rows:
                yield from self._split(bucket, count)
                continue
            yield self._sorted(np.concatenate(list(self._pieces(bucket))))

    def _split(self, bucket: int, count: int) -> Iterator[np.ndarray]:
        """An oversized bucket sorted through a spill of its own over the keys it holds."""
        low = high = None
        for piece in self._pieces(bucket):
            keys = piece[self.key]
            low = int(keys.min()) if low is None else min(low, int(keys.min()))
            high = int(keys.max()) if high is None else max(high, int(keys.max()))
        assert low is not None and high is not None
        if low == high:  # one key: its rows cannot be split
            yield self._sorted(np.concatenate(list(self._pieces(bucket))))
            return
        with BucketSpill(self.dtype, self.key, high - low + 1, count, self.folder, self.then, low, self.prefix) as inner:
            for piece in self._pieces(bucket):
                inner.add(piece)
            yield from inner.chunks()

    def _sorted(self, rows: np.ndarray) -> np.ndarray:
        if self.then is None:
            return rows[np.argsort(rows[self.key], kind="stable")]
        return rows[np.lexsort((rows[self.then], rows[self.key]))]


def key_groups(rows: np.ndarray, key: str) -> Iterator[tuple[int, int]]:
    """(first, end) of each run of equal `key` in sorted `rows`."""
    if not len(rows):
        return
    starts = np.flatnonzero(rows[key][1:] != rows[key][:-1]) + 1
    bounds = [0, *starts.tolist(), len(rows)]
    yield from zip(bounds[:-1], bounds[1:])
