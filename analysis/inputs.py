"""Decide what each path on the command line is, before anything is parsed.

Detection is by layout, not by name, so that a renamed run folder still works: a sweep folder has
sweep_summary.csv, a run folder has summary.json, a Darshan log is a file whose header starts
with a Darshan version string. Anything else is a user error that names the path and the accepted
kinds, so a typo never becomes a traceback or an empty report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dlio_ckpt.errors import UserError

ACCEPTED = (
    "accepted: a Darshan log (*.darshan), several logs of one job, a folder of Darshan logs, "
    "a dlio_ckpt run folder (summary.json, events/) or a sweep folder (sweep_summary.csv)"
)

_DARSHAN_HEADER = re.compile(rb"^\d+\.\d+")


class InputError(UserError):
    """A path that is missing or is none of the accepted kinds."""


@dataclass(frozen=True)
class Source:
    """One detected input. `logs` lists the Darshan logs when kind is "darshan"."""

    kind: str  # "darshan", "run", "sweep"
    path: Path
    logs: tuple[Path, ...] = ()


def is_darshan_log(path: Path) -> bool:
    """A .darshan suffix, or a header that starts like one (logs are sometimes renamed)."""
    if not path.is_file():
        return False
    if path.name.endswith(".darshan"):
        return True
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError:
        return False
    return bool(_DARSHAN_HEADER.match(head))


def is_run_folder(path: Path) -> bool:
    return path.is_dir() and (path / "summary.json").is_file()


def is_sweep_folder(path: Path) -> bool:
    return path.is_dir() and (path / "sweep_summary.csv").is_file()


def detect(path: Path) -> list[Source]:
    """Classify one path; a plain folder may expand to logs or to several run folders."""
    if not path.exists():
        raise InputError(f"{path}: no such file or folder; {ACCEPTED}")
    if path.is_file():
        if is_darshan_log(path):
            return [Source("darshan", path, (path,))]
        raise InputError(f"{path}: not a Darshan log; {ACCEPTED}")
    if is_sweep_folder(path):
        return [Source("sweep", path)]
    if is_run_folder(path):
        return [Source("run", path)]
    return _search(path)


def _search(path: Path) -> list[Source]:
    """A plain folder: sweeps, run folders and loose logs below it, each counted once.

    A run folder's own Darshan log describes the same I/O as its events, so logs inside run
    or sweep folders are not taken as separate inputs (that would double count).
    """
    sweeps = sorted(p.parent for p in path.rglob("sweep_summary.csv") if p.is_file())
    runs = sorted(p.parent for p in path.rglob("summary.json")
                  if p.is_file() and not _inside(p.parent, sweeps))
    logs = tuple(sorted(p for p in path.rglob("*.darshan") if p.is_file() and not _inside(p, sweeps + runs)))
    sources = [Source("sweep", s) for s in sweeps] + [Source("run", r) for r in runs]
    if logs:
        sources.append(Source("darshan", path, logs))
    if not sources:
        raise InputError(f"{path}: folder holds no Darshan logs, run folders or sweep; {ACCEPTED}")
    return sources


def _inside(path: Path, folders: list[Path]) -> bool:
    return any(folder == path or folder in path.parents for folder in folders)


def detect_all(paths: list[Path]) -> list[Source]:
    """Detect every path; errors are raised for the first bad one, naming it."""
    sources: list[Source] = []
    for path in paths:
        sources.extend(detect(Path(path)))
    return sources
