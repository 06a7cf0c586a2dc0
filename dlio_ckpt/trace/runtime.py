"""Working with a real darshan-runtime (`LD_PRELOAD=libdarshan.so`) instead of writing our own log.

When the user preloads Darshan, its log of the real system calls is the ground truth, and a
second, emulated .darshan beside it would only confuse. So the tool detects the preload, sets
what Darshan needs to put a complete log in the run folder, tells the user where it will be, and
does not write its own.

When each setting is read (darshan-runtime 3.5, darshan-core.c / darshan-core-init-finalize.c /
darshan-config.c):
- DARSHAN_LOGFILE: read with getenv by darshan_get_logfile_name at shutdown (MPI_Finalize, or the
  library destructor in non-MPI mode), on rank 0 in MPI mode. Setting os.environ before then works.
- DARSHAN_MOD_ENABLE (DXT), DARSHAN_JOBID: read when Darshan initialises. In MPI mode that is
  MPI_Init (mpi4py's import), so preparing before the World is created is early enough. In
  non-MPI mode the library constructor ran before Python started: only the launch environment
  counts for this process, and what is set here reaches processes started later.
- DARSHAN_ENABLE_NONMPI: checked by the library constructor. Without it and without MPI, Darshan
  never initialises and writes nothing; with it, every process (and every forked or spawned
  worker) writes its own log, which is how worker processes' I/O gets captured at all.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, MutableMapping

from dlio_ckpt.trace.darshan_hash import darshan_hash
from dlio_ckpt.trace.darshan_writer import JOBID_VARIABLES
from dlio_ckpt.world import launched_by_mpi

DXT_MODULE = "DXT_POSIX"
JOBID_VARIABLE = "DLIO_CKPT_JOBID"  # where the job id goes when no scheduler provides one
RUNTIME_LOG_FOLDER = "darshan"


def preloaded_darshan(environ: Mapping[str, str]) -> str | None:
    """The libdarshan in LD_PRELOAD (a path or a bare name), or None."""
    for entry in environ.get("LD_PRELOAD", "").replace(":", " ").split():
        if os.path.basename(entry).startswith("libdarshan"):
            return entry
    return None


@dataclass(frozen=True)
class RuntimeInfo:
    """What the tool arranged with darshan-runtime for this process."""

    library: str
    mode: str  # "mpi": one log per job, written by rank 0 at MPI_Finalize; "nonmpi": one log per process
    log_dir: Path
    logfile: Path  # this job's (mpi) or this process's (nonmpi) log
    captures: bool  # False: the runtime records nothing here; the tool writes its own log instead
    environment: dict[str, str] = field(default_factory=dict)  # variables set by prepare_darshan_runtime
    message: str = ""

    @property
    def replaces_own_log(self) -> bool:
        """True when the tool must not write its own .darshan (the runtime's log is coming)."""
        return self.captures


def _job_id_setting(environ: Mapping[str, str], job_name: str) -> dict[str, str]:
    """DARSHAN_JOBID names the variable holding the job id (parsed with %d, so an int32)."""
    if environ.get("DARSHAN_JOBID"):
        return {}
    for name in JOBID_VARIABLES:
        if environ.get(name, "")[:1].isdigit():
            return {"DARSHAN_JOBID": name}
    return {"DARSHAN_JOBID": JOBID_VARIABLE, JOBID_VARIABLE: str(darshan_hash(job_name) % (1 << 31))}


def _with_dxt(current: str) -> str:
    modules = [m for m in current.replace(" ", "").split(",") if m]
    return ",".join(modules if DXT_MODULE in modules else [*modules, DXT_MODULE])


def _safe(name: str) -> str:
    return "".join(ch if (ch.isalnum() or ch in "-_.") else "-" for ch in name) or "dlio_ckpt"


def worker_log_path(log_dir: Path, when: float | None = None) -> list[Path]:
    """DARSHAN_LOGPATH folders (<dir>/YYYY/M/D) for today and tomorrow: the runtime never creates them."""
    now = time.time() if when is None else when
    folders = []
    for day in (now, now + 86400):
        local = time.localtime(day)
        folders.append(log_dir / "workers" / str(local.tm_year) / str(local.tm_mon) / str(local.tm_mday))
    return folders


def prepare_darshan_runtime(environ: MutableMapping[str, str], run_dir: Path, world_size: int, job_name: str, *,
                            rank: int = 0, mpi: bool | None = None, worker_processes: bool = False,
                            pid: int | None = None) -> RuntimeInfo | None:
    """Set what darshan-runtime needs for this run in `environ` (pass os.environ); None when not preloaded.

    Call it on every rank before the MPI World is created (before mpi4py is imported). `mpi` is
    whether this process runs under an MPI launcher (default: detected from `environ`);
    `worker_processes` says whether processes other than the ranks do I/O (non-MPI mode is then
    the only way Darshan sees their I/O, one log per process).
    """
    library = preloaded_darshan(environ)
    if library is None or environ.get("DARSHAN_DISABLE"):
        return None
    mpi = launched_by_mpi(dict(environ)) if mpi is None else mpi
    nonmpi_at_launch = bool(environ.get("DARSHAN_ENABLE_NONMPI"))
    dxt_at_launch = DXT_MODULE in environ.get("DARSHAN_MOD_ENABLE", "") or bool(environ.get("DXT_ENABLE_IO_TRACE"))
    pid = os.getpid() if pid is None else pid
    log_dir = Path(run_dir).resolve() / RUNTIME_LOG_FOLDER
    log_dir.mkdir(parents=True, exist_ok=True)

    settings = {"DARSHAN_MOD_ENABLE": _with_dxt(environ.get("DARSHAN_MOD_ENABLE", ""))}
    settings.update(_job_id_setting(environ, job_name))
    if worker_processes or not mpi:
        settings["DARSHAN_ENABLE_NONMPI"] = "1"
    mode = "nonmpi" if (nonmpi_at_launch or not mpi) else "mpi"
    if mode == "mpi":
        logfile = log_dir / f"{_safe(job_name)}.darshan"
    else:
        logfile = log_dir / f"{_safe(job_name)}-rank{rank}-pid{pid}.darshan"
    if worker_processes:
        # Workers inherit the environment: a fixed DARSHAN_LOGFILE would make them all write one
        # path. They get dated folders instead; this process's own path is set at finalize time.
        folders = worker_log_path(log_dir)
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
        settings["DARSHAN_LOGPATH"] = str(log_dir / "workers")
    else:
        settings["DARSHAN_LOGFILE"] = str(logfile)
    environ.update(settings)

    captures = mpi or nonmpi_at_launch
    message = _message(library, mode, logfile, captures, mpi, dxt_at_launch, worker_processes, world_size)
    return RuntimeInfo(library=library, mode=mode, log_dir=log_dir, logfile=logfile, captures=captures,
                       environment=settings, message=message)


def finalize_darshan_runtime(environ: MutableMapping[str, str], info: RuntimeInfo) -> None:
    """Point DARSHAN_LOGFILE at this process's log just before Darshan shuts down (MPI_Finalize/exit)."""
    environ["DARSHAN_LOGFILE"] = str(info.logfile)


def _message(library: str, mode: str, logfile: Path, captures: bool, mpi: bool, dxt_at_launch: bool,
             worker_processes: bool, world_size: int) -> str:
    if not captures:
        return (f"darshan-runtime ({os.path.basename(library)}) is preloaded, but this run has no MPI and "
                f"DARSHAN_ENABLE_NONMPI was not set when the process started, so Darshan records nothing; "
                f"rerun as `DARSHAN_ENABLE_NONMPI=1 DARSHAN_MOD_ENABLE={DXT_MODULE} LD_PRELOAD={library} dlio_ckpt ...`"
                f" (dlio_ckpt writes its own emulated .darshan meanwhile if trace.darshan=true)")
    where = (f"one log for the {world_size}-rank job, written by rank 0 at MPI_Finalize: {logfile}" if mode == "mpi"
             else f"one log per process at exit, in {logfile.parent} (this process: {logfile.name})")
    text = f"darshan-runtime ({os.path.basename(library)}) is recording this run: {where}"
    if worker_processes:
        text += f"; worker processes write theirs under {logfile.parent / 'workers'}/YYYY/M/D"
    if mode == "nonmpi" and not dxt_at_launch:
        text += f"; DXT tracing needs DARSHAN_MOD_ENABLE={DXT_MODULE} in the launch environment"
    return text + "; dlio_ckpt does not write its own .darshan"


def prepare_darshan_init(environ: MutableMapping[str, str], job_name: str) -> bool:
    """The settings Darshan reads when it initialises (at MPI_Init), set before the World exists.

    The run folder (and so DARSHAN_LOGFILE) is only known after MPI_Init, when rank 0 has chosen
    it; `prepare_darshan_runtime` completes the set then. Writes nothing to disk.
    """
    if preloaded_darshan(environ) is None or environ.get("DARSHAN_DISABLE"):
        return False
    environ["DARSHAN_MOD_ENABLE"] = _with_dxt(environ.get("DARSHAN_MOD_ENABLE", ""))
    environ.update(_job_id_setting(environ, job_name))
    return True
