"""Reading a Darshan log into a ReplayPlan (replay.py): the DXT_POSIX traces exactly, or, in a log
without them, the POSIX counters approximately (replay_approx.py).

Apart from the plan's value types so that the approximate plan can build on them without a circle,
and so that only this module opens a log (through trace/darshan_input.py, which checks it first).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dlio_ckpt.metrics.timing import busy_seconds
from dlio_ckpt.optional import require
from dlio_ckpt.plan.replay import (MAX_CALLS, OP_DTYPE, READ, WRITE, ReplayFile, ReplayPlan, _relative_paths, bad_log,
                                   check_against_counters)
from dlio_ckpt.plan.replay_approx import approximate_ops
from dlio_ckpt.trace.darshan_input import BadDarshanLog, captured_c_stderr, open_report


def check_replay_log(path: str) -> "ReplayPlan":
    """The ReplayPlan of `path`, or a ConfigError naming replay.log (one line) when the log is not a
    complete, undamaged Darshan log with DXT_POSIX traces or POSIX counters, or its traces go beyond
    its own counters. The loader runs it before the run folder exists; it is the very parse the run
    does (load_replay_plan), so what the loader accepts the run reads. libdarshan's own messages are
    captured, not printed."""
    return load_replay_plan(path)


def _open_report(path: str):
    require("darshan")
    if not path:
        raise bad_log("is empty; set replay.log=FILE.darshan, a Darshan log with DXT_POSIX traces")
    try:
        report = open_report(path)
    except BadDarshanLog as exc:
        raise bad_log(f"'{path}' {exc}; give a complete, undamaged .darshan log (DXT_POSIX traces replay exactly, "
                   "POSIX counters approximately)") from None
    if "DXT_POSIX" not in report.modules and "POSIX" not in report.modules:
        raise bad_log(f"'{path}' has neither DXT_POSIX traces nor POSIX counters; record the run with darshan-runtime "
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


def load_replay_plan(path: str | Path) -> ReplayPlan:
    """Read the log's DXT_POSIX records into a ReplayPlan (ConfigError naming replay.log on bad input)."""
    path = str(path)
    report = _open_report(path)
    if "DXT_POSIX" not in report.modules:
        return _approximate_plan(report, path)
    with captured_c_stderr():  # libdarshan's messages; a checked log has no errors left to report
        report.mod_read_all_dxt_records("DXT_POSIX", dtype="pandas")
    records = report.records["DXT_POSIX"].to_df()
    traced = sum(int(record["write_count"]) + int(record["read_count"]) for record in records)
    if traced > MAX_CALLS:
        raise bad_log(f"'{path}' traces {traced:,} calls, more than the {MAX_CALLS:,} a replay holds in memory")
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
        raise bad_log(f"'{path}' has DXT_POSIX records but no traced reads or writes of named files")
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
    times = [[busy_seconds(calls["start"][calls["op"] == op], calls["end"][calls["op"] == op]) for calls in ops]
             for op in (READ, WRITE)]
    return max(times[0], default=0.0), max(times[1], default=0.0)


def _approximate_plan(report, path: str) -> ReplayPlan:
    """A log without DXT: a plan synthesised from its POSIX counters (plan/replay_approx.py)."""
    with captured_c_stderr():
        report.mod_read_all_records("POSIX")
    frames = report.records["POSIX"].to_df()
    counters = frames["counters"].to_dict("records")
    fcounters = frames["fcounters"].to_dict("records")
    nprocs = int(report.metadata["job"]["nprocs"])
    calls = sum(max(int(row["POSIX_READS"]), 0) + max(int(row["POSIX_WRITES"]), 0) for row in counters)
    if calls > MAX_CALLS:
        raise bad_log(f"'{path}' counts {calls:,} reads and writes, more than the {MAX_CALLS:,} a replay holds in memory")
    names = dict(report.name_records)
    files, ops, figures = approximate_ops(list(zip(counters, fcounters)), names, nprocs)
    if not files or not any(len(calls) for calls in ops):
        raise bad_log(f"'{path}' has no DXT_POSIX traces and its POSIX counters show no reads or writes of named files")
    plan = ReplayPlan(log=os.path.abspath(path), stem=_stem(path), nprocs=nprocs, files=files, ops=ops,
                      approximate=True, original_s=(figures["read_s"], figures["write_s"]))
    check_against_counters(plan, counters, names)
    return plan
