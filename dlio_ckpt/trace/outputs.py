"""The trace files of a run, written once on rank 0 after every rank's events are in.

One entry point for the engine, so it does not need to know which writers exist or when a real
darshan-runtime makes our own Darshan log redundant.
"""

from __future__ import annotations

from pathlib import Path

from dlio_ckpt.storage.events import RankEvents
from dlio_ckpt.trace.chrome import write_chrome_trace
from dlio_ckpt.trace.darshan_writer import JobInfo, darshan_log_name, write_darshan_log
from dlio_ckpt.trace.runtime import RuntimeInfo

CHROME_TRACE_NAME = "trace.chrome.json"


def write_trace_outputs(run_dir: Path, ranks: list[RankEvents] | list[Path], job: JobInfo, darshan: bool, chrome: bool,
                        runtime: RuntimeInfo | None = None) -> dict[str, str]:
    """Write the requested traces into `run_dir`; return {kind: path relative to run_dir}.

    `ranks`: every rank's event file, in rank order (a run's end: both writers read them a block
    at a time, so a run of millions of files is traced in memory that does not grow with them), or
    events already loaded.

    Kinds: "darshan" (our log, named as darshan-runtime names its logs), "chrome", and
    "darshan_runtime" (where the real runtime's log will appear) when `runtime` captures the run;
    then no emulated .darshan is written beside it.
    """
    run_dir = Path(run_dir)
    written: dict[str, str] = {}
    if runtime is not None and runtime.replaces_own_log:
        written["darshan_runtime"] = _relative(runtime.logfile if runtime.mode == "mpi" else runtime.log_dir, run_dir)
    elif darshan:
        path = write_darshan_log(run_dir / darshan_log_name(job), ranks, job)
        written["darshan"] = _relative(path, run_dir)
    if chrome:
        path = write_chrome_trace(run_dir / CHROME_TRACE_NAME, ranks,
                                  metadata={"jobid": job.jobid, "nprocs": job.nprocs, "start_wall": job.start_wall,
                                            **dict(job.metadata)})
        written["chrome"] = _relative(path, run_dir)
    return written


def _relative(path: Path, run_dir: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return str(path)
