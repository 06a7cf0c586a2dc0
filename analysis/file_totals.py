"""Bytes read and written per file over all ranks, without a Python object per file.

The analysis counts files by class (read only, written only, both, neither) and lists the files
that moved the most bytes, over every rank's path table (a path can be in several ranks' tables,
and twice in one: EventRecorder gives a path a second index once it left its cache). A dict keyed
by path held 10 million entries at 10 million files. Instead every (rank, path index) named, with
the bytes a block of events moved to it, becomes a fixed-size record keyed by the path's 64-bit
hash, appended to one of several unlinked temporary files by that hash (`tempfile.TemporaryFile`:
nothing is left behind however the analysis ends), each PARTITION_PATHS paths or so, at most
MAX_PARTITIONS files (open at once: past 2^22 paths, summed over the ranks' tables, a partition
grows instead, ~70 bytes held a path of one partition). Each file is then grouped on its own with
numpy, so what is held is one partition's records.

A path is known by its hash alone: two different paths with the same 64-bit hash (Python's
SipHash of the text, random per process) would count as one file. With n paths the odds are about
n^2 / 2^65: 3e-12 at 10 thousand, 3e-6 at 10 million.
"""

from __future__ import annotations

import tempfile
from typing import Any, Callable, Iterable

import numpy as np

PARTITION_PATHS = 1 << 14  # paths (and about as many records again from events) a partition holds
MAX_PARTITIONS = 256
TOP_FILES = 50

RECORD = np.dtype([("hash", "i8"), ("rank", "i4"), ("index", "i8"), ("read", "i8"), ("written", "i8"),
                   ("named", "u1")])


class FileTotals:
    """Per-path totals over ranks, fed the path tables (`add_paths`) and the events (`add_events`),
    then read once (`result`). `rank` is the rank's position in the run (its order in the report)."""

    def __init__(self, total_paths: int) -> None:
        count = min(MAX_PARTITIONS, max(1, -(-total_paths // PARTITION_PATHS)))
        self._parts = [tempfile.TemporaryFile() for _ in range(count)]

    def close(self) -> None:
        for part in self._parts:
            part.close()

    def add_paths(self, rank: int, first: int, paths: Iterable[str]) -> None:
        """Paths `first`, `first` + 1, ... of a rank's table: each is a file of the run, events or not."""
        hashes = np.fromiter((hash(path) for path in paths), np.int64)
        records = np.zeros(len(hashes), RECORD)
        records["hash"], records["rank"], records["index"] = hashes, rank, np.arange(first, first + len(hashes))
        self._write(records)

    def add_events(self, rank: int, ops_read: np.ndarray, ops_written: np.ndarray, files: np.ndarray,
                   lengths: np.ndarray, names: dict[int, str]) -> None:
        """A block of a rank's events: `files` the path index of each, `lengths` its bytes, masks of
        the reads and the writes; `names` the paths they name."""
        indices, inverse = np.unique(files, return_inverse=True)
        records = np.zeros(len(indices), RECORD)
        records["hash"] = np.fromiter((hash(names[index]) for index in indices.tolist()), np.int64, len(indices))
        records["rank"], records["index"], records["named"] = rank, indices, 1
        records["read"] = np.bincount(inverse, weights=np.where(ops_read, lengths, 0), minlength=len(indices))
        records["written"] = np.bincount(inverse, weights=np.where(ops_written, lengths, 0), minlength=len(indices))
        self._write(records)

    def _write(self, records: np.ndarray) -> None:
        part = (records["hash"].view(np.uint64) % np.uint64(len(self._parts))).astype(np.int64)
        order = np.argsort(part, kind="stable")
        records, bounds = records[order], np.searchsorted(part[order], np.arange(len(self._parts) + 1))
        for number, handle in enumerate(self._parts):
            if bounds[number + 1] > bounds[number]:
                handle.write(records[bounds[number]:bounds[number + 1]].tobytes())

    def result(self, name_of: Callable[[int, int], str]) -> dict[str, Any]:
        """The analysis's `files` figures: the count of files, by class, and the TOP_FILES that
        moved the most bytes (ties in the order the files first appear: rank, then path index),
        named through `name_of(rank, index)`."""
        counts = {"count": 0, "read_only": 0, "write_only": 0, "read_write": 0, "metadata_only": 0}
        top = np.zeros(0, [("total", "i8"), ("rank", "i4"), ("index", "i8"), ("read", "i8"), ("written", "i8"),
                           ("ranks", "i8")])
        for handle in self._parts:
            handle.seek(0)
            records = np.frombuffer(handle.read(), RECORD)
            if not len(records):
                continue
            files = _grouped(records)
            read, written = files["read"] > 0, files["written"] > 0
            counts["count"] += len(files)
            counts["read_write"] += int((read & written).sum())
            counts["read_only"] += int((read & ~written).sum())
            counts["write_only"] += int((~read & written).sum())
            counts["metadata_only"] += int((~read & ~written).sum())
            top = _best(np.concatenate([top, files]))
        listed = [{"path": name_of(int(row["rank"]), int(row["index"])), "bytes_read": int(row["read"]),
                   "bytes_written": int(row["written"]), "ranks": int(row["ranks"])} for row in top]
        return {**counts, "top": listed, "listed": len(listed)}


def _grouped(records: np.ndarray) -> np.ndarray:
    """One row per path (hash): its bytes, the distinct ranks whose events name it, and where it
    first appears (the least rank, then the least index there)."""
    order = np.lexsort((records["index"], records["rank"], records["hash"]))
    records = records[order]
    starts = np.flatnonzero(np.concatenate([[True], records["hash"][1:] != records["hash"][:-1]]))
    named = records[records["named"] == 1]
    pairs = np.unique(np.stack([named["hash"], named["rank"].astype(np.int64)]), axis=1) if len(named) else np.zeros((2, 0), np.int64)
    hashes = records["hash"][starts]
    ranks = np.bincount(np.searchsorted(hashes, pairs[0]), minlength=len(hashes)) if pairs.shape[1] else np.zeros(len(hashes), np.int64)
    files = np.zeros(len(starts), [("total", "i8"), ("rank", "i4"), ("index", "i8"), ("read", "i8"),
                                   ("written", "i8"), ("ranks", "i8")])
    files["read"] = np.add.reduceat(records["read"], starts)
    files["written"] = np.add.reduceat(records["written"], starts)
    files["total"] = files["read"] + files["written"]
    files["rank"], files["index"], files["ranks"] = records["rank"][starts], records["index"][starts], ranks
    return files


def _best(files: np.ndarray) -> np.ndarray:
    """The TOP_FILES rows with the most bytes, ties by first appearance (rank, then index)."""
    order = np.lexsort((files["index"], files["rank"], -files["total"]))
    return files[order[:TOP_FILES]]
