"""A replay plan from a Darshan log's DXT_POSIX traces: which files, and each rank's reads and writes.

DXT keeps every POSIX read and write call (offset, bytes moved, start and end) per rank and file,
which is enough to re-issue the same I/O on another system and compare the two with the analysis
command. The plan is a value: files get a place under storage.root/replay/<log stem>/ (the
original tree below the longest common folder) and a size (the furthest byte any call touched),
and every log rank gets its calls in start-time order. Nothing here touches the storage; reading
the log into a plan is replay_log.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from dlio_ckpt.errors import ConfigError

READ, WRITE = 0, 1
MAX_CALLS = 1 << 26  # calls a plan holds: 41 bytes each, so at most 2.6 GB of memory
OP_DTYPE = np.dtype([("op", "u1"), ("file", "u4"), ("offset", "i8"), ("length", "i8"), ("start", "f8"), ("end", "f8")])


@dataclass(frozen=True)
class ReplayFile:
    original: str  # the path in the log
    relative: str  # where it goes under storage.root/replay/<stem>/
    size: int  # the furthest byte any call in the log touched
    read: bool  # some call reads it: it must exist with contents before the replay starts


@dataclass(frozen=True)
class ReplayPlan:
    log: str
    stem: str
    nprocs: int  # ranks of the logged job
    files: tuple[ReplayFile, ...]
    ops: tuple[np.ndarray, ...]  # per log rank: OP_DTYPE calls in start-time order
    approximate: bool = False  # True: synthesised from POSIX counters (replay_approx.py), the log had no DXT
    original_s: tuple[float, float] = (0.0, 0.0)  # the log's slowest-rank read and write time, for the comparison

    @property
    def log_ranks(self) -> int:
        return len(self.ops)

    def ranks_for(self, world_rank: int, world_size: int) -> list[int]:
        """Log ranks a world rank replays: log rank r goes to world rank r % world_size."""
        return [r for r in range(self.log_ranks) if r % world_size == world_rank]

    def ops_for(self, world_rank: int, world_size: int) -> np.ndarray:
        """The calls a world rank replays, merged in start-time order when it replays several log ranks."""
        mine = [self.ops[r] for r in self.ranks_for(world_rank, world_size)]
        if not mine:
            return np.zeros(0, OP_DTYPE)
        merged = np.concatenate(mine)
        return merged[np.argsort(merged["start"], kind="stable")]

    def totals(self) -> dict[str, int]:
        every = np.concatenate(self.ops) if self.ops else np.zeros(0, OP_DTYPE)
        reads, writes = every[every["op"] == READ], every[every["op"] == WRITE]
        return {"reads": len(reads), "writes": len(writes), "bytes_read": int(reads["length"].sum()),
                "bytes_written": int(writes["length"].sum())}


def bad_log(message: str) -> ConfigError:
    return ConfigError(f"replay.log: {message}")


def disk_bytes(plan: "ReplayPlan") -> int:
    """Bytes the replay leaves on storage.root: every file at its planned size (the files read are
    recreated whole; the files written grow to their furthest written byte)."""
    return sum(spec.size for spec in plan.files)


def check_replay_space(plan: "ReplayPlan", root: str, free_bytes: int | None) -> None:
    """ConfigError (one line) when the files the replay recreates and writes cannot fit in the free
    space of storage.root's file system (`free_bytes`; None: unbounded, not checked)."""
    needed = disk_bytes(plan)
    if free_bytes is not None and needed > free_bytes:
        raise bad_log(f"'{plan.log}' replays {len(plan.files)} files of {needed:,} bytes in all, but {root} has "
                   f"{free_bytes:,} bytes free; free some space or choose another storage.root")


def check_against_counters(plan: "ReplayPlan", counters: list[dict], names: dict[int, str]) -> None:
    """ConfigError (one line) when a file's planned size, or the bytes the plan reads or writes in it,
    go beyond what the log's POSIX counters say of that file (its furthest byte + 1, its bytes read
    and written, summed over ranks). The counters are the log's own totals: a replay never writes
    more than the job it stands for did, whatever its traces claim."""
    limits: dict[str, list[int]] = {}
    for row in counters:
        name = names.get(int(row["id"]))
        if not name:
            continue
        extent = max(int(row["POSIX_MAX_BYTE_READ"]), int(row["POSIX_MAX_BYTE_WRITTEN"])) + 1
        entry = limits.setdefault(name, [0, 0, 0])
        entry[0] = max(entry[0], extent)
        entry[1] += max(int(row["POSIX_BYTES_READ"]), 0)
        entry[2] += max(int(row["POSIX_BYTES_WRITTEN"]), 0)
    every = np.concatenate(plan.ops) if plan.ops else np.zeros(0, OP_DTYPE)
    moved = {op: np.bincount(every["file"][every["op"] == op], weights=every["length"][every["op"] == op],
                             minlength=len(plan.files)) for op in (READ, WRITE)}
    for index, spec in enumerate(plan.files):
        limit = limits.get(spec.original)
        if limit is None:  # no POSIX record (the module's record limit was hit): bounded by free space only
            continue
        planned = (spec.size, int(moved[READ][index]), int(moved[WRITE][index]))
        for what, value, most in zip(("reaches byte", "reads", "writes"), planned, limit):
            if value > most:
                raise bad_log(f"'{plan.log}': the replay of {spec.original} {what} {value:,} but the log's POSIX counters "
                           f"say {most:,}; the log is damaged or inconsistent, give an undamaged log")


def _relative_paths(originals: list[str]) -> list[str]:
    """Each path below the longest folder all of them share (at least the file name)."""
    folders = [os.path.dirname(p) or "/" for p in originals]
    try:
        common = os.path.commonpath(folders) if folders else "/"
    except ValueError:  # a mix of absolute and relative names
        common = ""
    out = []
    for path in originals:
        rel = os.path.relpath(path, common) if common else path
        # After normpath a '..' can only lead; dropping the leading ones keeps every replayed file
        # under storage.root/replay/<stem>/ whatever names the log holds.
        parts = [p for p in os.path.normpath(rel).split(os.sep) if p not in ("", ".", "..")]
        out.append(os.path.join(*parts) if parts else os.path.basename(path) or "file")
    return out
