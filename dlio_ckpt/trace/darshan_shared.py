"""Across ranks: which POSIX records an MPI run reduces to one rank -1 record, and which record
first names each file, found without holding any rank's records (darshan_stream.py has them in
temporary files).

darshan-runtime reduces the records of the files every rank opened into one record of rank -1
(darshan_posix.reduce_file), which rank 0's stream carries after its own; and the log's name
region names each record id once, where it first occurs in the POSIX streams (rank 0's records,
its reduced ones, rank 1's, ...). Both need every rank's records of one file together: here the
records of all ranks are sorted by record id (darshan_spill.BucketSpill), each id's group decides
its flags, and the flags come back sorted by the records' order, so the writer reads them beside
each rank's records. Only the shared files' records are reduced, a group at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from dlio_ckpt.trace.darshan_posix import POSIX_RECORD, PosixRecord, reduce_file
from dlio_ckpt.trace.darshan_spill import BucketSpill, key_groups
from dlio_ckpt.trace.darshan_stream import PLACED_RECORD, RankPass

KEPT, NAMED, SHARED = 0, 1, 2  # a record kept by its rank; kept and naming its file first; reduced away

_MEMBER = np.dtype([("rid", "<u8"), ("rank", "<u4"), ("key", "<u8"), ("order", "<u8"), ("file", "<u4"),
                    ("body", f"V{POSIX_RECORD.size}")])
_FLAG = np.dtype([("key", "<u8"), ("flag", "u1")])


def reduces(passes: Sequence[RankPass], mpi: bool, nprocs: int) -> bool:
    """Whether the run's shared files are reduced: an MPI run whose ranks 0..nprocs-1 all have
    records (darshan_posix.reduce_shared's rule)."""
    return mpi and nprocs >= 1 and sorted(p.rank for p in passes if p.record_count) == list(range(nprocs))


class CrossRank:
    """The flags of every rank's records (in their order) and the reduced records (in rank 0's
    order: PLACED_RECORD rows with rank 0's path index). Close it (or use `with`)."""

    def __init__(self, passes: Sequence[RankPass], reduce: bool, nprocs: int, folder: Path | None) -> None:
        total = sum(p.record_count for p in passes)
        self.flags = BucketSpill(_FLAG, "key", max(total, 1), total, folder)
        self.shared = BucketSpill(PLACED_RECORD, "pos", max(total, 1), 0, folder)
        try:
            with BucketSpill(_MEMBER, "rid", 1 << 64, total, folder, then="rank") as members:
                base = 0
                for rank_pass in passes:
                    order = 0
                    for block in rank_pass.record_blocks():
                        rows = np.empty(len(block), _MEMBER)
                        for name in ("rid", "file", "body"):
                            rows[name] = block[name]
                        rows["rank"] = rank_pass.rank
                        rows["order"] = np.arange(order, order + len(block), dtype=np.uint64)
                        rows["key"] = rows["order"] + np.uint64(base)
                        members.add(rows)
                        order += len(block)
                    base += order
                for chunk in members.chunks():
                    self._decide(chunk, reduce, nprocs)
        except BaseException:
            self.close()
            raise

    def _decide(self, chunk: np.ndarray, reduce: bool, nprocs: int) -> None:
        flags = np.empty(len(chunk), _FLAG)
        flags["key"] = chunk["key"]
        flags["flag"] = KEPT
        for first, end in key_groups(chunk, "rid"):
            if reduce and end - first == nprocs:
                flags["flag"][first:end] = SHARED
                group = chunk[first:end]
                rid = int(group["rid"][0])
                result = reduce_file([PosixRecord.unpack("", bytes(body)) for body in group["body"]])
                self.shared.add(np.array([(int(group["order"][0]), rid, int(group["file"][0]), result.pack(rid))],
                                         PLACED_RECORD))
            else:
                flags["flag"][first] = NAMED  # the lowest rank holding it names it first
        self.flags.add(flags)

    def close(self) -> None:
        self.flags.close()
        self.shared.close()

    def __enter__(self) -> "CrossRank":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def flag_blocks(self) -> "Rechunk":
        return Rechunk(chunk["flag"] for chunk in self.flags.chunks())


class Rechunk:
    """Arrays from an iterator, taken back in the sizes asked for (`take`)."""

    def __init__(self, arrays: Iterator[np.ndarray]) -> None:
        self._arrays = iter(arrays)
        self._held = np.empty(0, np.uint8)

    def take(self, count: int) -> np.ndarray:
        parts, have = [self._held], len(self._held)
        while have < count:
            more = next(self._arrays)
            parts.append(more)
            have += len(more)
        joined = np.concatenate(parts) if len(parts) > 1 else parts[0]
        self._held = joined[count:]
        return joined[:count]
