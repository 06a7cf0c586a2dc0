"""Bytes read and written per file over all ranks, without a Python object per file.

The analysis counts files by class (read only, written only, both, neither) and lists the files
that moved the most bytes, over every rank's path table (a path can be in several ranks' tables,
and twice in one: EventRecorder gives a path a second index once it left its cache). A dict keyed
by path held 10 million entries at 10 million files. Instead every (rank, path index) named, with
the bytes a block of events moved to it, becomes a fixed-size record keyed by the path's 64-bit
hash, and the records go through the external bucket sort the Darshan writer uses
(trace/darshan_spill.BucketSpill: one unlinked temporary file, nothing left behind however the
analysis ends). It hands them back a bucket at a time, a path's records never split, and a bucket
that grew past its bound is split again; so what is held is one bucket's records (about half a
MiB), at any number of paths. (A fixed 256 partitions, before, held 1/256 of all records at
once: 22 MiB more at 10M files than at 10k, benchmarks/README.md.)

A path is known by its hash alone: two different paths with the same 64-bit hash (Python's
SipHash of the text, random per process) would count as one file. With n paths the odds are about
n^2 / 2^65: 3e-12 at 10 thousand, 3e-6 at 10 million.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from dlio_ckpt.trace.darshan_spill import BucketSpill

TOP_FILES = 50

# the hash as unsigned: BucketSpill's keys (its buckets are ranges of them)
RECORD = np.dtype([("hash", "u8"), ("rank", "i4"), ("index", "i8"), ("read", "i8"), ("written", "i8"),
                   ("named", "u1")])


class FileTotals:
    """Per-path totals over ranks, fed the path tables (`add_paths`) and the events (`add_events`),
    then read once (`result`). `rank` is the rank's position in the run (its order in the report)."""

    def __init__(self, total_paths: int) -> None:
        # about a record per path from the tables and one per path from the events
        self._spill = BucketSpill(RECORD, "hash", 1 << 64, 2 * max(total_paths, 1), prefix=".dlio_ckpt-file-totals-")

    def close(self) -> None:
        self._spill.close()

    def add_paths(self, rank: int, first: int, paths: Iterable[str]) -> None:
        """Paths `first`, `first` + 1, ... of a rank's table: each is a file of the run, events or not."""
        hashes = np.fromiter((hash(path) for path in paths), np.int64)
        records = np.zeros(len(hashes), RECORD)
        records["hash"], records["rank"], records["index"] = hashes.view(np.uint64), rank, np.arange(first, first + len(hashes))
        self._spill.add(records)

    def add_events(self, rank: int, ops_read: np.ndarray, ops_written: np.ndarray, files: np.ndarray,
                   lengths: np.ndarray, names: dict[int, str]) -> None:
        """A block of a rank's events: `files` the path index of each, `lengths` its bytes, masks of
        the reads and the writes; `names` the paths they name."""
        indices, inverse = np.unique(files, return_inverse=True)
        records = np.zeros(len(indices), RECORD)
        records["hash"] = np.fromiter((hash(names[index]) for index in indices.tolist()), np.int64, len(indices)).view(np.uint64)
        records["rank"], records["index"], records["named"] = rank, indices, 1
        records["read"] = np.bincount(inverse, weights=np.where(ops_read, lengths, 0), minlength=len(indices))
        records["written"] = np.bincount(inverse, weights=np.where(ops_written, lengths, 0), minlength=len(indices))
        self._spill.add(records)

    def result(self, name_of: Callable[[int, int], str]) -> dict[str, Any]:
        """The analysis's `files` figures: the count of files, by class, and the TOP_FILES that
        moved the most bytes (ties in the order the files first appear: rank, then path index),
        named through `name_of(rank, index)`."""
        counts = {"count": 0, "read_only": 0, "write_only": 0, "read_write": 0, "metadata_only": 0}
        top = np.zeros(0, [("total", "i8"), ("rank", "i4"), ("index", "i8"), ("read", "i8"), ("written", "i8"),
                           ("ranks", "i8")])
        for records in self._spill.chunks():
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
    # the hash read as signed throughout: it stacks with the ranks below, and searchsorted needs the
    # order the sort made
    order = np.lexsort((records["index"], records["rank"], records["hash"].view(np.int64)))
    records = records[order]
    keys = records["hash"].view(np.int64)
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    named = records["named"] == 1
    pairs = np.unique(np.stack([keys[named], records["rank"][named].astype(np.int64)]), axis=1) if named.any() \
        else np.zeros((2, 0), np.int64)
    hashes = keys[starts]
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
