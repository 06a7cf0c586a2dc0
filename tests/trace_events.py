"""Synthetic per-rank events for the trace tests: a tiny job with a shared file and private files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dlio_ckpt.storage.events import EVENT_DTYPE, OP_CODE, PHASE_CODE, RankEvents

JOB_START = 1_700_000_000.25


class Timeline:
    """Appends events for one rank with strictly increasing, never-zero times."""

    def __init__(self, rank: int, paths: list[str]) -> None:
        self.rank = rank
        self.paths = paths
        self.rows: list[tuple] = []
        self.t = 0.01 + rank * 0.003

    def add(self, op: str, phase: str, file: int, offset: int = -1, length: int = 0, duration: float = 0.001,
            gap: float = 0.0005) -> None:
        self.rows.append((OP_CODE[op], PHASE_CODE[phase], file, offset, length, self.t, self.t + duration))
        self.t += duration + gap

    def overlapping(self, op: str, phase: str, file: int, offset: int, length: int, start: float, end: float) -> None:
        self.rows.append((OP_CODE[op], PHASE_CODE[phase], file, offset, length, start, end))

    def events(self, hostname: str | None = None) -> RankEvents:
        array = np.array(self.rows, dtype=EVENT_DTYPE)
        return RankEvents(rank=self.rank, hostname=hostname or f"node{self.rank}", job_start_wall=JOB_START,
                          paths=list(self.paths), events=array)


def two_rank_job(root: Path) -> list[RankEvents]:
    """Rank r: reads a shared dataset file (different parts), writes its own checkpoint shard."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "ckpt").mkdir(parents=True, exist_ok=True)
    ranks = []
    for rank in range(2):
        shared = str(root / "data" / "train.bin")
        shard = str(root / "ckpt" / f"model-r{rank}.bin")
        tmp = str(root / "ckpt" / f"manifest-r{rank}.json.tmp")
        line = Timeline(rank, [shared, shard, tmp])
        line.add("stat", "train", 0)
        line.add("open", "train", 0)
        base = rank * 1_000_000
        for k in range(6):  # sequential, consecutive 64 KiB reads; rank 1's first one is slow
            line.add("read", "train", 0, base + k * 65536, 65536, duration=0.002 if (rank and not k) else 0.001)
        line.add("read", "train", 0, base + 10 * 65536, 65536)  # a stride of 3 x 64 KiB
        line.add("read", "train", 0, base + 10 * 65536 + 1, 100)  # backwards: not sequential
        line.add("read", "train", 0, 5_000_000, 0)  # end of file: 0 bytes
        line.add("close", "train", 0)
        line.add("open", "checkpoint", 1)
        for k in range(3):
            line.add("write", "checkpoint", 1, k * 1_048_576, 1_048_576, duration=0.004)
        line.add("write", "checkpoint", 1, 3 * 1_048_576, 1024 + rank)  # size buckets: 1024 | 1025
        line.add("fsync", "checkpoint", 1, duration=0.003)
        line.add("close", "checkpoint", 1)
        line.add("open", "restore", 1)
        line.add("read", "restore", 1, 0, 1_048_576)
        line.add("write", "restore", 1, 10, 101)  # a read -> write switch on a restored shard
        line.add("close", "restore", 1)
        line.add("open", "checkpoint", 2)
        line.add("write", "checkpoint", 2, 0, 100)
        line.add("fsync", "checkpoint", 2)
        line.add("close", "checkpoint", 2)
        line.add("rename", "checkpoint", 2)
        ranks.append(line.events())
    return ranks
