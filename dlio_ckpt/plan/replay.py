"""A replay plan from a Darshan log's DXT_POSIX traces: which files, and each rank's reads and writes.

DXT keeps every POSIX read and write call (offset, bytes moved, start and end) per rank and file,
which is enough to re-issue the same I/O on another system and compare the two with the analysis
command. The plan is a value: files get a place under storage.root/replay/<log stem>/ (the
original tree below the longest common folder) and a size (the furthest byte any call touched),
and every log rank gets its calls in start-time order. Nothing here touches the storage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlio_ckpt.errors import ConfigError
from dlio_ckpt.optional import require

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


def _bad(message: str) -> ConfigError:
    return ConfigError(f"replay.log: {message}")


def check_replay_log(path: str) -> "ReplayPlan":
    """The ReplayPlan of `path`, or a ConfigError naming replay.log (one line) when the log is not a
    complete, undamaged Darshan log with DXT_POSIX traces or POSIX counters, or its traces go beyond
    its own counters. The loader runs it before the run folder exists; it is the very parse the run
    does (load_replay_plan), so what the loader accepts the run reads. libdarshan's own messages are
    captured, not printed."""
    return load_replay_plan(path)


def disk_bytes(plan: "ReplayPlan") -> int:
    """Bytes the replay leaves on storage.root: every file at its planned size (the files read are
    recreated whole; the files written grow to their furthest written byte)."""
    return sum(spec.size for spec in plan.files)


def check_replay_space(plan: "ReplayPlan", root: str, free_bytes: int | None) -> None:
    """ConfigError (one line) when the files the replay recreates and writes cannot fit in the free
    space of storage.root's file system (`free_bytes`; None: unbounded, not checked)."""
    needed = disk_bytes(plan)
    if free_bytes is not None and needed > free_bytes:
        raise _bad(f"'{plan.log}' replays {len(plan.files)} files of {needed:,} bytes in all, but {root} has "
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
                raise _bad(f"'{plan.log}': the replay of {spec.original} {what} {value:,} but the log's POSIX counters "
                           f"say {most:,}; the log is damaged or inconsistent, give an undamaged log")


def _open_report(path: str):
    from dlio_ckpt.trace.darshan_input import BadDarshanLog, open_report

    require("darshan")
    if not path:
        raise _bad("is empty; set replay.log=FILE.darshan, a Darshan log with DXT_POSIX traces")
    try:
        report = open_report(path)
    except BadDarshanLog as exc:
        raise _bad(f"'{path}' {exc}; give a complete, undamaged .darshan log (DXT_POSIX traces replay exactly, "
                   "POSIX counters approximately)") from None
    if "DXT_POSIX" not in report.modules and "POSIX" not in report.modules:
        raise _bad(f"'{path}' has neither DXT_POSIX traces nor POSIX counters; record the run with darshan-runtime "
                   "(DARSHAN_MOD_ENABLE=DXT_POSIX for an exact replay) or trace.darshan=true (dlio_ckpt)")
    return report


def _segments(frame, op: int, file_index: int, rank_calls: list) -> int:
    """Append one record's segments (a pandas frame, empty when there are none); return the max extent."""
    if frame is None or len(frame) == 0:
        return 0
    count = len(frame)
    calls = np.zeros(count, OP_DTYPE)
    calls["op"] = op
    calls["file"] = file_index
    calls["offset"] = frame["offset"].to_numpy()
    calls["length"] = frame["length"].to_numpy()
    calls["start"] = frame["start_time"].to_numpy()
    calls["end"] = frame["end_time"].to_numpy()
    rank_calls.append(calls)
    return int((calls["offset"] + calls["length"]).max())


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


def load_replay_plan(path: str | Path) -> ReplayPlan:
    """Read the log's DXT_POSIX records into a ReplayPlan (ConfigError naming replay.log on bad input)."""
    path = str(path)
    report = _open_report(path)
    from dlio_ckpt.trace.darshan_input import captured_c_stderr

    if "DXT_POSIX" not in report.modules:
        return _approximate_plan(report, path)
    with captured_c_stderr():  # libdarshan's messages; a checked log has no errors left to report
        report.mod_read_all_dxt_records("DXT_POSIX", dtype="pandas")
    records = report.records["DXT_POSIX"].to_df()
    traced = sum(int(record["write_count"]) + int(record["read_count"]) for record in records)
    if traced > MAX_CALLS:
        raise _bad(f"'{path}' traces {traced:,} calls, more than the {MAX_CALLS:,} a replay holds in memory")
    names: dict[int, str] = dict(report.name_records)
    nprocs = int(report.metadata["job"]["nprocs"])
    file_index: dict[str, int] = {}
    extents: list[int] = []
    read_files: set[int] = set()
    per_rank: dict[int, list] = {}
    for record in records:
        name = names.get(record["id"])
        if not name or name.startswith("<"):
            continue
        index = file_index.setdefault(name, len(file_index))
        if index == len(extents):
            extents.append(0)
        rank = max(int(record["rank"]), 0)
        calls = per_rank.setdefault(rank, [])
        extents[index] = max(extents[index], _segments(record["write_segments"], WRITE, index, calls))
        read_extent = _segments(record["read_segments"], READ, index, calls)
        if int(record.get("read_count", 0)) > 0:
            read_files.add(index)
        extents[index] = max(extents[index], read_extent)
    if not file_index:
        raise _bad(f"'{path}' has DXT_POSIX records but no traced reads or writes of named files")
    ranks = max(max(per_rank) + 1, nprocs if nprocs > 0 else 1)
    ops = []
    for rank in range(ranks):
        calls = per_rank.get(rank)
        merged = np.concatenate(calls) if calls else np.zeros(0, OP_DTYPE)
        ops.append(merged[np.argsort(merged["start"], kind="stable")])
    originals = list(file_index)
    files = tuple(ReplayFile(original=o, relative=r, size=extents[i], read=i in read_files)
                  for i, (o, r) in enumerate(zip(originals, _relative_paths(originals))))
    plan = ReplayPlan(log=os.path.abspath(path), stem=_stem(path), nprocs=nprocs, files=files, ops=tuple(ops),
                      original_s=_slowest_busy(ops))
    if "POSIX" in report.records and len(report.records["POSIX"]):
        check_against_counters(plan, report.records["POSIX"].to_df()["counters"].to_dict("records"), names)
    return plan


def _stem(path: str) -> str:
    return Path(path).name.split(".darshan")[0] or "log"


def _slowest_busy(ops: list[np.ndarray]) -> tuple[float, float]:
    """The slowest rank's overlap-free read and write time in the log's calls."""
    from dlio_ckpt.metrics.timing import busy_seconds

    times = [[busy_seconds(calls["start"][calls["op"] == op], calls["end"][calls["op"] == op]) for calls in ops]
             for op in (READ, WRITE)]
    return max(times[0], default=0.0), max(times[1], default=0.0)


def _approximate_plan(report, path: str) -> ReplayPlan:
    """A log without DXT: a plan synthesised from its POSIX counters (plan/replay_approx.py)."""
    from dlio_ckpt.plan.replay_approx import approximate_ops
    from dlio_ckpt.trace.darshan_input import captured_c_stderr

    with captured_c_stderr():
        report.mod_read_all_records("POSIX")
    frames = report.records["POSIX"].to_df()
    counters = frames["counters"].to_dict("records")
    fcounters = frames["fcounters"].to_dict("records")
    nprocs = int(report.metadata["job"]["nprocs"])
    calls = sum(max(int(row["POSIX_READS"]), 0) + max(int(row["POSIX_WRITES"]), 0) for row in counters)
    if calls > MAX_CALLS:
        raise _bad(f"'{path}' counts {calls:,} reads and writes, more than the {MAX_CALLS:,} a replay holds in memory")
    names = dict(report.name_records)
    files, ops, figures = approximate_ops(list(zip(counters, fcounters)), names, nprocs)
    if not files or not any(len(calls) for calls in ops):
        raise _bad(f"'{path}' has no DXT_POSIX traces and its POSIX counters show no reads or writes of named files")
    plan = ReplayPlan(log=os.path.abspath(path), stem=_stem(path), nprocs=nprocs, files=files, ops=ops,
                      approximate=True, original_s=(figures["read_s"], figures["write_s"]))
    check_against_counters(plan, counters, names)
    return plan
