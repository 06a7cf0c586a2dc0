"""Darshan logs -> one job's processes and the files each used (pure values, absolute times).

The profiler needs per process what darshan-runtime saw: every file's POSIX and STDIO counters,
its DXT segments when the log has them, and when the process ran. The logs are read through the
project's one checked door (analysis/darshan_logs.load_logs -> trace/darshan_input.open_report), so
a truncated or damaged log is one line naming it before PyDarshan touches it. A log of an MPI job
(nprocs > 1) becomes one process per rank (rank -1 records, shared by all ranks, go to rank 0);
the per-process logs of a non-MPI job (DataLoader workers, torchrun's ranks) each become one.
Times are made absolute (the log's start plus the record's offset) so that processes line up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlio_ckpt.analysis.darshan_logs import group_by_job, load_logs
from dlio_ckpt.errors import UserError
from dlio_ckpt.trace.darshan_input import captured_c_stderr

SEGMENT = np.dtype([("write", "?"), ("offset", "i8"), ("length", "i8"), ("start", "f8"), ("end", "f8")])


@dataclass
class FileUse:
    """One file in one process: counters summed over POSIX and STDIO (a file is in one or the other:
    fopen's own open() is not seen by POSIX), with the module(s) named."""

    path: str
    modules: tuple[str, ...]
    opens: int = 0
    reads: int = 0
    writes: int = 0
    seeks: int = 0
    fsyncs: int = 0
    renames: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    max_byte_read: int = -1
    max_byte_written: int = -1
    first_open: float = float("nan")
    last_close: float = float("nan")
    access_sizes: dict[int, int] = field(default_factory=dict)  # POSIX's 4 most common access sizes
    segments: np.ndarray | None = None  # DXT_POSIX, absolute times; None without DXT

    @property
    def console(self) -> bool:
        return self.path.startswith("<")


@dataclass
class Process:
    """One process (a per-process log, or one rank of an MPI log)."""

    log: Path
    pid: int | None
    rank: int  # the MPI rank inside its log (0 for per-process logs)
    exe: str
    start: float
    end: float
    files: list[FileUse]
    partial: tuple[str, ...] = ()  # modules whose record memory ran out in this log (later files are missing)
    dxt: bool = False  # the log has DXT_POSIX traces

    @property
    def label(self) -> str:
        return f"pid {self.pid}" if self.pid is not None else f"{self.log.name} rank {self.rank}"


@dataclass
class Job:
    processes: list[Process]
    job_id: int
    source: str  # "DXT" (every log had DXT_POSIX) or "POSIX counters"; profile.py narrows it to the I/O's processes
    nprocs: int  # MPI ranks of the log (1 for per-process logs)
    logs: list[Path]

    @property
    def partial(self) -> list[tuple[Path, tuple[str, ...]]]:
        """Logs whose runtime ran out of record memory: (log, modules), once per log."""
        seen: dict[Path, tuple[str, ...]] = {}
        for p in self.processes:
            if p.partial:
                seen[p.log] = p.partial
        return list(seen.items())


def load_job(paths: list[Path]) -> Job:
    """The one job the logs hold; UserError naming a log for damaged logs or logs of two jobs."""
    logs = load_logs(paths)
    groups = _one_run(group_by_job(logs))
    processes: list[Process] = []
    all_dxt = True
    for log in groups[0]:
        per_rank = _log_files(log)
        all_dxt &= "DXT_POSIX" in log.report.modules
        exe = str(log.report.metadata.get("exe", "")).strip()
        partial = tuple(m for m, info in log.report.modules.items() if info.get("partial_flag"))
        for rank in sorted(per_rank):
            processes.append(Process(log.path, log.pid, rank, exe, log.start, log.end, list(per_rank[rank].values()),
                                     partial, "DXT_POSIX" in log.report.modules))
    nprocs = max(int(log.job["nprocs"]) for log in groups[0])
    return Job(processes, groups[0][0].job_key[0], "DXT" if all_dxt else "POSIX counters", nprocs,
               [log.path for log in groups[0]])


def _one_run(groups: list[list]) -> list[list]:
    """The job ids' groups as one run, or UserError naming a log of another run.

    In non-MPI mode a process started by exec (torchrun's ranks, a shell's children) takes its own
    pid as job id unless a scheduler gives one, so one run can hold several job ids; they are one
    run when they belong to one user and each group's time span overlaps the run's so far. A group
    that starts after the others ended, or another user's, is another run."""
    run = list(groups[0])
    start, end = min(lg.start for lg in run), max(lg.end for lg in run)
    for group in groups[1:]:
        g_start, g_end = min(lg.start for lg in group), max(lg.end for lg in group)
        first, other = run[0], group[0]
        if other.job_key[1] != first.job_key[1] or g_start > end or g_end < start:
            raise UserError(f"{other.path}: belongs to job {other.job_key[0]} (uid {other.job_key[1]}), which did not "
                            f"run beside job {first.job_key[0]} of {first.path}; give the logs of one run only")
        run += group
        start, end = min(start, g_start), max(end, g_end)
    return [sorted(run, key=lambda lg: (lg.start, lg.pid or 0, str(lg.path)))]


def _log_files(log) -> dict[int, dict[str, FileUse]]:
    report, t0 = log.report, log.start
    names = dict(report.name_records)
    out: dict[int, dict[str, FileUse]] = {}

    def use(rank: int, record_id: int, module: str) -> FileUse:
        path = names.get(record_id, str(record_id))
        files = out.setdefault(max(rank, 0), {})
        if path not in files:
            files[path] = FileUse(path, (module,))
        elif module not in files[path].modules:
            files[path].modules += (module,)
        return files[path]

    for module, prefix in (("POSIX", "POSIX_"), ("STDIO", "STDIO_")):
        if module not in report.records or not len(report.records[module]):
            continue
        frames = report.records[module].to_df()
        counters = frames["counters"].to_dict("records")
        fcounters = frames["fcounters"].to_dict("records")
        for c, f in zip(counters, fcounters):
            _add_counters(use(int(c["rank"]), int(c["id"]), module), c, f, prefix, t0)
    if "DXT_POSIX" in report.modules:
        with captured_c_stderr():
            report.mod_read_all_dxt_records("DXT_POSIX", dtype="pandas")
        for record in report.records["DXT_POSIX"].to_df():
            parts = [_segments(record.get(key), key == "write_segments", t0) for key in ("write_segments", "read_segments")]
            target = use(int(record["rank"]), int(record["id"]), "DXT_POSIX")
            target.segments = np.sort(np.concatenate(parts), order="start")
    return out


def _add_counters(target: FileUse, c: dict, f: dict, prefix: str, t0: float) -> None:
    def n(key: str) -> int:
        return max(int(c.get(prefix + key, 0)), 0)

    target.opens += n("OPENS") + n("FDOPENS")
    target.reads += n("READS")
    target.writes += n("WRITES")
    target.seeks += n("SEEKS")
    target.fsyncs += n("FSYNCS") + n("FDSYNCS")
    target.renames += n("RENAME_SOURCES")
    target.bytes_read += n("BYTES_READ")
    target.bytes_written += n("BYTES_WRITTEN")
    target.max_byte_read = max(target.max_byte_read, int(c.get(prefix + "MAX_BYTE_READ", -1)))
    target.max_byte_written = max(target.max_byte_written, int(c.get(prefix + "MAX_BYTE_WRITTEN", -1)))
    opened, closed = float(f.get(prefix + "F_OPEN_START_TIMESTAMP", 0)), float(f.get(prefix + "F_CLOSE_END_TIMESTAMP", 0))
    if opened > 0:
        target.first_open = min(target.first_open, t0 + opened) if target.first_open == target.first_open else t0 + opened
    if closed > 0:
        target.last_close = max(target.last_close, t0 + closed) if target.last_close == target.last_close else t0 + closed
    for i in range(1, 5):
        size, count = int(c.get(f"POSIX_ACCESS{i}_ACCESS", 0)), int(c.get(f"POSIX_ACCESS{i}_COUNT", 0))
        if count > 0:
            target.access_sizes[size] = target.access_sizes.get(size, 0) + count


def _segments(frame, write: bool, t0: float) -> np.ndarray:
    if frame is None or len(frame) == 0:
        return np.zeros(0, SEGMENT)
    out = np.zeros(len(frame), SEGMENT)
    out["write"] = write
    out["offset"] = frame["offset"].to_numpy()
    out["length"] = frame["length"].to_numpy()
    out["start"] = frame["start_time"].to_numpy() + t0
    out["end"] = frame["end_time"].to_numpy() + t0
    return out
