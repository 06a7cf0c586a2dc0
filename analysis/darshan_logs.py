"""Darshan logs -> JobAnalysis, using PyDarshan for everything it already does.

PyDarshan reads the logs (`DarshanReport(read_all=True)`, `records[...].to_df()`), its C
accumulator (`accumulate_records`) gives the job-level derived metrics (file categories, slowest
rank, aggregate performance) and its heat-map helpers bin DXT segments. What is left here is what
PyDarshan does not do: treating many per-process logs of one job (darshan-runtime in non-MPI mode
writes one log per process, e.g. a Python data loader's workers) as one job, with each process as
a "rank", and putting their differently-sized HEATMAP grids on one time axis.

Byte totals are sums of POSIX_BYTES_READ / POSIX_BYTES_WRITTEN over the POSIX records of all logs,
exactly what PyDarshan reports; STDIO and MPI-IO are reported beside them, never added (MPI-IO
traffic also appears in POSIX, and STDIO is usually the console).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from dlio_ckpt.analysis.model import (
    SIZE_BUCKETS,
    JobAnalysis,
    Timeline,
    phase_entry,
    rate_mib_per_s,
    share,
)
from dlio_ckpt.analysis import darshan_summary as summary
from dlio_ckpt.analysis.timeline import grid, spread
from dlio_ckpt.errors import UserError
from dlio_ckpt.optional import require
from dlio_ckpt.trace.darshan_input import BadDarshanLog, open_report

_PID = re.compile(r"_id\d+-(\d+)_")
# get_heatmap_df builds a (segments x bins) dummy matrix; above this many segments the
# vectorised spread() gives the same bins without the memory.
_PYDARSHAN_DXT_LIMIT = 50_000
_TOP_FILES = 50
_CATEGORY_INDEX = {"total": 0, "read_only": 1, "write_only": 2, "read_write": 3,
                   "unique": 4, "shared": 5, "partially_shared": 6}


@dataclass
class LoadedLog:
    path: Path
    report: Any  # darshan.DarshanReport

    @property
    def job(self) -> dict[str, Any]:
        return self.report.metadata["job"]

    @property
    def start(self) -> float:
        return self.job["start_time_sec"] + self.job.get("start_time_nsec", 0) * 1e-9

    @property
    def end(self) -> float:
        return self.job["end_time_sec"] + self.job.get("end_time_nsec", 0) * 1e-9

    @property
    def pid(self) -> int | None:
        match = _PID.search(self.path.name)
        return int(match.group(1)) if match else None

    @property
    def job_key(self) -> tuple[int, int]:
        return (int(self.job["jobid"]), int(self.job["uid"]))


def load_logs(paths: list[Path]) -> list[LoadedLog]:
    """Read every log once; a file that is not a complete Darshan log (empty, truncated, garbage)
    is a user error naming it, checked before PyDarshan reads it (a truncated log would read as
    zero bytes) and with libdarshan's own messages kept off the terminal."""
    require("darshan")
    require("pandas")
    loaded = []
    for path in paths:
        try:
            report = open_report(str(path))
        except BadDarshanLog as exc:
            raise UserError(f"{path}: {exc}") from None
        loaded.append(LoadedLog(path, report))
    return loaded


def group_by_job(logs: list[LoadedLog]) -> list[list[LoadedLog]]:
    """Logs sharing (job id, uid) are one job: one log per process in non-MPI mode."""
    groups: dict[tuple[int, int], list[LoadedLog]] = {}
    for log in logs:
        groups.setdefault(log.job_key, []).append(log)
    ordered = [sorted(g, key=lambda lg: (lg.start, lg.pid or 0, str(lg.path))) for g in groups.values()]
    return sorted(ordered, key=lambda g: g[0].start)


class _Rows:
    """Map (log, MPI rank) to a row: MPI ranks for one log, processes for per-process logs."""

    def __init__(self, logs: list[LoadedLog]):
        self.logs = logs
        self.single = len(logs) == 1
        self.keys: dict[tuple[int, int], int] = {}
        self.labels: list[str] = []
        if self.single:
            nprocs = int(logs[0].job["nprocs"])
            for rank in range(nprocs):
                self.keys[(0, rank)] = rank
                self.labels.append(f"rank {rank}")

    def row(self, log_index: int, rank: int) -> int:
        if rank < 0:
            return -1
        key = (log_index, rank)
        if key not in self.keys:
            log = self.logs[log_index]
            self.keys[key] = len(self.labels)
            name = f"pid {log.pid}" if log.pid is not None else log.path.stem
            per_process = int(log.job["nprocs"]) == 1
            self.labels.append(name if per_process else f"{name} rank {rank}")
        return self.keys[key]

    def map(self, log_index: int, ranks: np.ndarray) -> np.ndarray:
        return np.array([self.row(log_index, int(r)) for r in ranks], dtype=np.int64)

    @property
    def count(self) -> int:
        return len(self.labels)


def _posix_frames(logs: list[LoadedLog], rows: _Rows):
    """All logs' POSIX records in one pair of frames, ranks remapped to rows."""
    pd = require("pandas")
    counters, fcounters = [], []
    for index, log in enumerate(logs):
        if "POSIX" not in log.report.records or len(log.report.records["POSIX"]) == 0:
            continue
        frames = log.report.records["POSIX"].to_df()
        c, f = frames["counters"].copy(), frames["fcounters"].copy()
        mapped = rows.map(index, c["rank"].to_numpy())
        c["rank"] = mapped
        f["rank"] = mapped
        counters.append(c)
        fcounters.append(f)
    if not counters:
        return None, None
    return pd.concat(counters, ignore_index=True), pd.concat(fcounters, ignore_index=True)


def _module_bytes(logs: list[LoadedLog], module: str, prefix: str) -> dict[str, Any] | None:
    total_read = total_written = records = 0
    for log in logs:
        if module in log.report.records and len(log.report.records[module]):
            c = log.report.records[module].to_df()["counters"]
            total_read += int(c[f"{prefix}_BYTES_READ"].sum())
            total_written += int(c[f"{prefix}_BYTES_WRITTEN"].sum())
            records += len(c)
    if not records:
        return None
    return {"bytes_read": total_read, "bytes_written": total_written, "records": records}


def _names(logs: list[LoadedLog]) -> dict[int, str]:
    names: dict[int, str] = {}
    for log in logs:
        names.update(log.report.name_records)
    return names


def _per_rank(c, f, rows: _Rows) -> list[dict[str, Any]]:
    pd = require("pandas")
    frame = pd.DataFrame({
        "row": c["rank"],
        "bytes_read": c["POSIX_BYTES_READ"],
        "bytes_written": c["POSIX_BYTES_WRITTEN"],
        "reads": c["POSIX_READS"],
        "writes": c["POSIX_WRITES"],
        "read_s": f["POSIX_F_READ_TIME"],
        "write_s": f["POSIX_F_WRITE_TIME"],
        "meta_s": f["POSIX_F_META_TIME"],
    })
    sums = frame.groupby("row").sum()
    out = []
    for row, values in sums.iterrows():
        row = int(row)
        io_s = float(values.read_s + values.write_s + values.meta_s)
        out.append({
            "rank": row,
            "label": "shared files (summed over ranks)" if row < 0 else rows.labels[row],
            "bytes_read": int(values.bytes_read),
            "bytes_written": int(values.bytes_written),
            "reads": int(values.reads),
            "writes": int(values.writes),
            "read_s": float(values.read_s),
            "write_s": float(values.write_s),
            "meta_s": float(values.meta_s),
            "io_s": io_s,
            "read_mib_per_s": rate_mib_per_s(values.bytes_read, values.read_s),
            "write_mib_per_s": rate_mib_per_s(values.bytes_written, values.write_s),
        })
    return out


def _per_phase(per_rank: list[dict[str, Any]], c, nrows: int) -> dict[str, dict[str, Any]]:
    """Read and write as the two phases; time is the slowest rank's, shared files split evenly.

    Darshan keeps only the sum over ranks for a shared (rank -1) file, so each rank is charged
    an equal part of it; for per-process logs there are no shared records and this is exact.
    """
    ranks = [r for r in per_rank if r["rank"] >= 0]
    shared = next((r for r in per_rank if r["rank"] < 0), None)
    phases = {}
    for phase, key, bytes_key, ops_key in (("read", "read_s", "bytes_read", "reads"),
                                           ("write", "write_s", "bytes_written", "writes")):
        own = max((r[key] for r in ranks), default=0.0)
        extra = shared[key] / max(nrows, 1) if shared else 0.0
        total_bytes = int(c[f"POSIX_{bytes_key.upper()}"].sum())
        total_ops = int(c[f"POSIX_{ops_key.upper()}"].sum())
        summed = sum(r[key] for r in per_rank)
        phases[phase] = phase_entry(
            bytes_read=total_bytes if phase == "read" else 0,
            bytes_written=total_bytes if phase == "write" else 0,
            read_s_max=own + extra if phase == "read" else 0.0,
            write_s_max=own + extra if phase == "write" else 0.0,
            read_s_sum=summed if phase == "read" else 0.0,
            write_s_sum=summed if phase == "write" else 0.0,
            ops=total_ops,
            reads=total_ops if phase == "read" else 0,
            writes=total_ops if phase == "write" else 0,
        )
    return phases


def _histogram(c) -> dict[str, Any]:
    read = [int(c[f"POSIX_SIZE_READ_{b}"].sum()) for b in SIZE_BUCKETS]
    write = [int(c[f"POSIX_SIZE_WRITE_{b}"].sum()) for b in SIZE_BUCKETS]
    return {"buckets": list(SIZE_BUCKETS), "read": read, "write": write,
            "source": "POSIX_SIZE_READ_* / POSIX_SIZE_WRITE_* summed over records"}


def _files(c, names: dict[int, str], derived) -> dict[str, Any]:
    pd = require("pandas")
    frame = pd.DataFrame({"id": c["id"], "row": c["rank"], "bytes_read": c["POSIX_BYTES_READ"],
                          "bytes_written": c["POSIX_BYTES_WRITTEN"]})
    per_file = frame.groupby("id").agg(bytes_read=("bytes_read", "sum"), bytes_written=("bytes_written", "sum"),
                                       ranks=("row", "nunique"))
    per_file["total"] = per_file.bytes_read + per_file.bytes_written
    top = per_file.sort_values("total", ascending=False).head(_TOP_FILES)
    cats = {name: int(derived.category_counters[i].count) for name, i in _CATEGORY_INDEX.items()}
    return {
        "count": int(len(per_file)),
        "read_only": cats["read_only"],
        "write_only": cats["write_only"],
        "read_write": cats["read_write"],
        "metadata_only": max(0, int(len(per_file)) - cats["read_only"] - cats["write_only"] - cats["read_write"]),
        "categories_pydarshan": cats,
        "top": [{"path": names.get(int(i), str(i)), "bytes_read": int(r.bytes_read),
                 "bytes_written": int(r.bytes_written), "ranks": int(r.ranks)} for i, r in top.iterrows()],
        "listed": int(len(top)),
    }


def _dxt_timeline(logs, rows: _Rows, t0: float, span: float) -> Timeline | None:
    heat = require("darshan.experimental.plots.heatmap_handling")
    pd = require("pandas")
    frames: dict[str, list] = {"read": [], "write": []}
    for index, log in enumerate(logs):
        if "DXT_POSIX" not in log.report.records or not len(log.report.records["DXT_POSIX"]):
            continue
        offset = log.start - t0
        for op, df in heat.get_single_df_dict(log.report, mod="DXT_POSIX", ops=["read", "write"]).items():
            if df.size:
                df = df.copy()
                df["rank"] = rows.map(index, df["rank"].to_numpy())
                df["start_time"] += offset
                df["end_time"] += offset
                frames[op].append(df)
    if not frames["read"] and not frames["write"]:
        return None
    span = max([span] + [float(d["end_time"].max()) for op in frames for d in frames[op]])
    width, nbins = grid(span)
    out = {}
    for op in ("read", "write"):
        if not frames[op]:
            out[op] = np.zeros((rows.count, nbins))
            continue
        agg = pd.concat(frames[op], ignore_index=True)
        if len(agg) <= _PYDARSHAN_DXT_LIMIT:
            df = heat.get_heatmap_df(agg_df=agg, xbins=nbins, nprocs=rows.count, max_time=width * nbins)
            out[op] = df.to_numpy(dtype=np.float64)
        else:
            out[op] = spread(agg["rank"].to_numpy(), agg["start_time"].to_numpy(), agg["end_time"].to_numpy(),
                             agg["length"].to_numpy(), rows.count, width, nbins)
    return Timeline(width, out["read"], out["write"], list(rows.labels), "DXT_POSIX")


def _heatmap_timeline(logs, rows: _Rows, t0: float, span: float) -> Timeline | None:
    """Each log has its own bin width and start; re-bin all of them onto one job-wide grid."""
    parts: dict[str, list[tuple]] = {"read": [], "write": []}
    for index, log in enumerate(logs):
        heatmap = getattr(log.report, "heatmaps", {}).get("POSIX") if "HEATMAP" in log.report.modules else None
        if heatmap is None:
            continue
        offset = log.start - t0
        for op in ("read", "write"):
            df = heatmap.to_df(ops=[op], interval_index=True)
            values = df.to_numpy(dtype=np.float64)
            nbins = values.shape[1]
            width = float(df.columns[0].length)
            starts = offset + np.arange(nbins) * width
            for rank, line in zip(df.index, values):
                row = rows.row(index, int(rank))
                parts[op].append((np.full(nbins, row), starts, starts + width, line))
            span = max(span, offset + nbins * width)
    if not parts["read"] and not parts["write"]:
        return None
    return _binned(parts, rows, span, "HEATMAP")


def _timestamp_timeline(c, f, rows: _Rows, logs, t0: float, span: float) -> Timeline | None:
    """Last resort: a record's bytes spread evenly between its first and last access."""
    if c is None:
        return None
    labels = list(rows.labels)
    shared_row = len(labels)
    row = c["rank"].to_numpy()
    has_shared = bool((row < 0).any())
    row = np.where(row < 0, shared_row, row)
    if has_shared:
        labels.append("shared")
    # Record timestamps are relative to their own log's start; per-process logs map row -> log.
    offsets = np.zeros(len(c))
    if len(logs) > 1:
        row_log = {r: li for (li, _), r in rows.keys.items()}
        offsets = np.array([logs[row_log.get(int(r), 0)].start - t0 for r in row])
    parts = {}
    for op, key, start, end in (("read", "POSIX_BYTES_READ", "POSIX_F_READ_START_TIMESTAMP", "POSIX_F_READ_END_TIMESTAMP"),
                                ("write", "POSIX_BYTES_WRITTEN", "POSIX_F_WRITE_START_TIMESTAMP", "POSIX_F_WRITE_END_TIMESTAMP")):
        nbytes = c[key].to_numpy(dtype=np.float64)
        keep = nbytes > 0
        parts[op] = [(row[keep], f[start].to_numpy()[keep] + offsets[keep], f[end].to_numpy()[keep] + offsets[keep], nbytes[keep])]
        if keep.any():
            span = max(span, float((f[end].to_numpy()[keep] + offsets[keep]).max()))
    timeline = _binned(parts, rows, span, "record timestamps", labels)
    return timeline


def _binned(parts, rows: _Rows, span: float, source: str, labels: list[str] | None = None) -> Timeline:
    labels = labels if labels is not None else list(rows.labels)
    width, nbins = grid(span)
    out = {}
    for op in ("read", "write"):
        chunks = parts.get(op) or []
        if chunks:
            r, s, e, n = (np.concatenate([ch[i] for ch in chunks]) for i in range(4))
        else:
            r = s = e = n = np.zeros(0)
        out[op] = spread(r, s, e, n, len(labels), width, nbins)
    return Timeline(width, out["read"], out["write"], labels, source)



def _record_offsets(c, rows: _Rows, logs: list[LoadedLog], t0: float) -> np.ndarray:
    """Seconds from the job start to the start of each record's own log (record timestamps are
    relative to their log's start; per-process logs start at different times)."""
    if len(logs) == 1:
        return np.full(len(c), logs[0].start - t0)
    row_log = {r: li for (li, _), r in rows.keys.items()}
    return np.array([logs[row_log.get(int(r), 0)].start - t0 for r in c["rank"].to_numpy()])


def _console_phase(c, f) -> dict[str, Any]:
    """The standard streams as a phase of their own, so their bytes count in the totals but in
    neither the read nor the checkpoint-write figures."""
    per_rank_read = f.groupby(c["rank"])["POSIX_F_READ_TIME"].sum()
    per_rank_write = f.groupby(c["rank"])["POSIX_F_WRITE_TIME"].sum()
    reads, writes = int(c["POSIX_READS"].sum()), int(c["POSIX_WRITES"].sum())
    return phase_entry(bytes_read=int(c["POSIX_BYTES_READ"].sum()), bytes_written=int(c["POSIX_BYTES_WRITTEN"].sum()),
                       read_s_max=float(per_rank_read.max()), write_s_max=float(per_rank_write.max()),
                       read_s_sum=float(per_rank_read.sum()), write_s_sum=float(per_rank_write.sum()),
                       ops=reads + writes, reads=reads, writes=writes)


def _estimate_warnings(per_phase: dict[str, dict[str, Any]], ranks: int, per_process: bool) -> list[str]:
    """Say when Darshan's bandwidth estimate (bytes / the slowest rank's time in calls) is far
    above what the job got over wall-clock time: the estimate assumes all ranks were in calls at
    once, and per-process logs of a data loader's workers (started epoch after epoch) were not.
    MPI ranks run side by side by construction; there the tables label both figures and a warning
    would only repeat that compute sits between the reads."""
    if not per_process:
        return []
    out = []
    for phase, kind in (("read", "read"), ("write", "write")):
        p = per_phase[phase]
        estimate, wall = p.get(f"{kind}_mib_per_s"), p.get("wall_mib_per_s")
        # one rank cannot overlap itself; with several, the estimate holds when most were in calls together
        if ranks < 2 or estimate is None or not wall or estimate < 2 * wall or p["overlap"] >= ranks / 2:
            continue
        out.append(f"{kind} bandwidth: the {estimate:,.0f} MiB/s estimate (bytes / the slowest rank's {p[f'{kind}_s']:.3g} s "
                   f"inside {kind} calls, Darshan's method) assumes all {ranks} ranks were in {kind} calls at the same time; "
                   f"on average {p['overlap']:.2g} were, so over the {p['active_s']:.3g} s of wall-clock time with {kind}s "
                   f"under way the job got {wall:,.0f} MiB/s, which is what the bandwidth plot shows")
    return out


def analyse_job(logs: list[LoadedLog], timeline: bool = True) -> JobAnalysis:
    accumulate_records = require("darshan.backend.cffi_backend").accumulate_records
    rows = _Rows(logs)
    t0 = min(log.start for log in logs)
    t_end = max(log.end for log in logs)
    span = max(t_end - t0, 0.0)
    c, f = _posix_frames(logs, rows)
    warnings: list[str] = []
    job = _job_record(logs, rows, t0, span)
    stdio = _module_bytes(logs, "STDIO", "STDIO")
    mpiio = _module_bytes(logs, "MPI-IO", "MPIIO")
    extra: dict[str, Any] = {"stdio": stdio, "mpiio": mpiio}
    label = f"job {job['jobid']}" if len(logs) > 1 else logs[0].path.name
    if c is None:
        warnings.append("no POSIX records in these logs: byte totals are 0 (STDIO/MPI-IO shown separately)")
        empty = {"buckets": list(SIZE_BUCKETS), "read": [0] * len(SIZE_BUCKETS), "write": [0] * len(SIZE_BUCKETS)}
        return JobAnalysis(label, "darshan", [str(log.path) for log in logs], 0, 0, {}, [], None, empty,
                           {"count": 0, "top": []}, {}, job=job, extra=extra, warnings=warnings)

    nprocs_acc = rows.count
    acc = accumulate_records({"counters": c, "fcounters": f}, "POSIX", nprocs_acc)
    derived = acc.derived_metrics
    names = _names(logs)
    console = summary.console_mask(c, names)
    c_io, f_io = c[~console], f[~console]  # the standard streams are console output, never checkpoint data
    per_rank = _per_rank(c, f, rows)
    per_phase = _per_phase(_per_rank(c_io, f_io, rows), c_io, rows.count)
    offsets = _record_offsets(c, rows, logs, t0)
    _add_wall_clock(per_phase, c, f, console, offsets)
    console_io = summary.console_totals(c, f, console)
    if console_io:
        per_phase["console"] = _console_phase(c[console], f[console])
    bytes_read = int(c["POSIX_BYTES_READ"].sum())
    bytes_written = int(c["POSIX_BYTES_WRITTEN"].sum())
    slowest = _slowest_rank(per_rank, derived)
    io_share = _io_time_share(f, f_io, console_io)
    extra["console"] = console_io
    extra["common_access_sizes"] = summary.common_access_sizes(c_io)
    extra["operations"] = summary.operation_counts(c_io)
    extra["lustre"] = summary.lustre_layout(logs)
    extra["partial_modules"] = summary.partial_modules(logs)
    partial = summary.partial_warning(extra["partial_modules"])
    if partial:
        warnings.append(partial)
    warnings += _estimate_warnings(per_phase, rows.count, per_process=len(logs) > 1)
    extra["darshan"] = _pydarshan_figures(derived, c)
    headline = _headline(per_phase, slowest, io_share, bytes_read, bytes_written, c, rows.count, span, derived)
    analysis = JobAnalysis(
        label=label, kind="darshan", inputs=[str(log.path) for log in logs],
        bytes_read=bytes_read, bytes_written=bytes_written, per_phase=per_phase, per_rank=per_rank,
        slowest_rank=slowest, histogram=_histogram(c_io), files=_files(c, names, derived),
        io_time_share=io_share, job=job, headline=headline, extra=extra, warnings=warnings,
    )
    if timeline:
        analysis.timeline = (_dxt_timeline(logs, rows, t0, span) or _heatmap_timeline(logs, rows, t0, span)
                             or _timestamp_timeline(c, f, rows, logs, t0, span))
        if analysis.timeline is not None and analysis.timeline.source == "record timestamps":
            warnings.append("no DXT or HEATMAP data: timeline spreads each record's bytes evenly between its "
                            "first and last access (approximate)")
    return analysis


def _job_record(logs: list[LoadedLog], rows: "_Rows", t0: float, span: float) -> dict[str, Any]:
    """The job as its logs describe it: id, user, processes, start, run time, executable, versions, modules."""
    first = logs[0]
    return {
        "jobid": int(first.job["jobid"]),
        "uid": int(first.job["uid"]),
        "logs": len(logs),
        "nprocs": [int(log.job["nprocs"]) for log in logs] if len(logs) > 1 else int(first.job["nprocs"]),
        "processes": rows.count,
        "start": datetime.fromtimestamp(t0, tz=timezone.utc).isoformat(),
        "run_time_s": span,
        "exe": first.report.metadata.get("exe", ""),
        "darshan_lib_ver": first.job.get("metadata", {}).get("lib_ver"),
        "log_ver": first.job.get("log_ver"),
        "modules": sorted({m for log in logs for m in log.report.modules}),
    }


def _add_wall_clock(per_phase: dict[str, Any], c: Any, f: Any, console: Any, offsets: Any) -> None:
    """Each data phase's wall-clock figures: the union of its records' first-to-last access times."""
    for phase, op, nbytes in (("read", "READ", "BYTES_READ"), ("write", "WRITE", "BYTES_WRITTEN")):
        moved = (~console) & (c[f"POSIX_{nbytes}"].to_numpy() > 0)
        per_phase[phase].update(summary.wall_clock_figures(
            int(c[f"POSIX_{nbytes}"][moved].sum()), per_phase[phase][f"{phase}_s_sum"],
            f[f"POSIX_F_{op}_START_TIMESTAMP"].to_numpy()[moved] + offsets[moved],
            f[f"POSIX_F_{op}_END_TIMESTAMP"].to_numpy()[moved] + offsets[moved]))


def _slowest_rank(per_rank: list[dict[str, Any]], derived: Any) -> dict[str, Any]:
    """The rank with the most POSIX I/O time of its own records, beside PyDarshan's slowest rank."""
    ranked = [r for r in per_rank if r["rank"] >= 0] or per_rank
    slow = max(ranked, key=lambda r: r["io_s"])
    return {"rank": slow["rank"], "label": slow["label"], "io_s": slow["io_s"],
            "bytes": slow["bytes_read"] + slow["bytes_written"],
            "basis": "POSIX read + write + metadata time of the rank's own records",
            "pydarshan_unique_io_slowest_rank": int(derived.unique_io_slowest_rank),
            "pydarshan_unique_io_total_time_s": float(derived.unique_io_total_time_by_slowest)}


def _io_time_share(f: Any, f_io: Any, console_io: dict[str, Any] | None) -> dict[str, Any]:
    """Read vs checkpoint (writes) vs other (metadata, console) shares of the summed I/O time."""
    read_s = float(f_io["POSIX_F_READ_TIME"].sum())
    write_s = float(f_io["POSIX_F_WRITE_TIME"].sum())
    meta_s = float(f["POSIX_F_META_TIME"].sum())
    console_s = (console_io["read_s"] + console_io["write_s"]) if console_io else 0.0
    other_s = meta_s + console_s
    total_s = read_s + write_s + other_s
    return {"read": share(read_s, total_s), "checkpoint": share(write_s, total_s), "other": share(other_s, total_s),
            "read_s": read_s, "checkpoint_s": write_s, "other_s": other_s, "console_s": console_s,
            "basis": "POSIX_F_READ_TIME vs POSIX_F_WRITE_TIME (writes to files taken as checkpoint) vs "
                     "POSIX_F_META_TIME plus console (<STDIN>/<STDOUT>/<STDERR>) time, summed over records"}


def _pydarshan_figures(derived: Any, c: Any) -> dict[str, Any]:
    """PyDarshan's accumulator figures over all logs."""
    return {
        "total_bytes": int(derived.total_bytes),
        "agg_perf_by_slowest_mib_per_s": float(derived.agg_perf_by_slowest),
        "agg_time_by_slowest_s": float(derived.agg_time_by_slowest),
        "shared_io_total_time_by_slowest_s": float(derived.shared_io_total_time_by_slowest),
        "posix_records": int(len(c)),
        "note": "from PyDarshan's accumulator over all logs, each process counted as one rank",
    }


def _headline(per_phase: dict[str, Any], slowest: dict[str, Any], io_share: dict[str, Any], bytes_read: int,
              bytes_written: int, c: Any, ranks: int, span: float, derived: Any) -> dict[str, Any]:
    """The figures a comparison of runs and logs puts side by side."""
    return {
        "bytes_read": bytes_read, "bytes_written": bytes_written,
        "read_mib_per_s": per_phase["read"]["read_mib_per_s"],
        "write_mib_per_s": per_phase["write"]["write_mib_per_s"],
        "read_mib_per_s_wall": per_phase["read"]["wall_mib_per_s"],
        "write_mib_per_s_wall": per_phase["write"]["wall_mib_per_s"],
        "read_s": per_phase["read"]["read_s"], "write_s": per_phase["write"]["write_s"],
        "slowest_rank_io_s": slowest["io_s"], "read_share": io_share["read"],
        "checkpoint_share": io_share["checkpoint"], "files": int(c["id"].nunique()),
        "ranks": ranks, "wall_s": span,
        "pydarshan_agg_perf_mib_per_s": float(derived.agg_perf_by_slowest),
    }


def analyse_logs(paths: list[Path], timeline: bool = True) -> list[JobAnalysis]:
    """One JobAnalysis per job id found among the logs."""
    return [analyse_job(group, timeline) for group in group_by_job(load_logs(paths))]
