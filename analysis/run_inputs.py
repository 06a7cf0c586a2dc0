"""What a run folder hands the analysis (summary.json, events/rank-*.npz), checked before use
(the events as they are read, a block at a time).

Both are the run's own output, but they are files on disk: edited by hand, cut short, written by
another version. A field of the wrong type (a string where summary.json has an object) or an event
file that is not one became a traceback deep in the report code (issue 24). Here each is checked
once, for exactly what the analysis reads of it, and refused as a UserError (one line, exit 2)
naming the file and the field. Fields that are missing or null stay allowed: older runs lack some.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from dlio_ckpt.errors import UserError
from dlio_ckpt.storage.events import EVENT_DTYPE, OPS, PHASES, EventFile, event_files

NUMBER = (int, float)
# Fields the analysis reads, by path, with the JSON type each must have when present and not null.
FIELDS: dict[tuple[str, ...], type | tuple[type, ...]] = {
    ("workload",): str, ("mode",): str, ("world_size",): int, ("wall_s",): NUMBER, ("goodput",): NUMBER,
    ("hostnames",): list, ("warnings",): list, ("ranks",): list, ("started_at",): str, ("tool_version",): str,
    ("train",): dict, ("checkpoint",): dict, ("dataset",): dict, ("io",): dict, ("failures",): dict,
    ("latency",): dict, ("traces",): dict,
    ("train", "samples_per_s"): NUMBER, ("train", "au"): NUMBER, ("train", "au_overall"): NUMBER,
    ("train", "read_mib_per_s"): NUMBER, ("train", "bytes_read"): NUMBER, ("train", "read_s_max"): NUMBER,
    ("train", "storage"): dict, ("train", "storage", "required_mib_per_s"): NUMBER,
    ("train", "storage", "storage_bound"): bool,
    ("checkpoint", "strategy"): str, ("checkpoint", "policy"): dict, ("checkpoint", "policy", "interval_steps"): NUMBER,
    ("checkpoint", "write_gib_per_s"): NUMBER, ("checkpoint", "write_gib_per_s_min_rank"): NUMBER,
    ("checkpoint", "blocking_s_max"): NUMBER, ("checkpoint", "persist_s_max"): NUMBER,
    ("checkpoint", "training_time_lost_fraction"): NUMBER, ("checkpoint", "restore_gib_per_s"): NUMBER,
    ("checkpoint", "restore_verified"): bool,
    ("failures", "count"): NUMBER, ("failures", "lost_work_s"): NUMBER, ("failures", "restart_s"): NUMBER,
    ("io", "bytes_read"): NUMBER, ("io", "bytes_written"): NUMBER,
    ("latency", "train"): dict, ("latency", "train", "read"): dict,
    ("latency", "train", "read", "p99_s"): NUMBER, ("latency", "train", "read", "iops"): NUMBER,
    ("traces", "darshan"): str, ("traces", "events"): str,
}
RANK_FIELDS = {"rank": int, "hostname": str, "bytes_read": NUMBER, "bytes_written": NUMBER, "read_s": NUMBER,
               "write_s": NUMBER, "samples": NUMBER, "steps": NUMBER, "peak_rss_bytes": NUMBER}
_JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
               bool: "true or false", NUMBER: "a number"}


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__)


def _fits(value: Any, expected: type | tuple[type, ...]) -> bool:
    if isinstance(value, bool) and expected is not bool:  # JSON true is no number
        return False
    return isinstance(value, expected)


def checked_summary(summary: dict[str, Any], path: Path) -> dict[str, Any]:
    """`summary` (from `path`) when every field the analysis reads has its type; else a UserError."""
    for keys, expected in FIELDS.items():
        value: Any = summary
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None and not _fits(value, expected):
            raise UserError(f"{path}: field {'.'.join(keys)} is {_kind(value)}, not {_JSON_NAMES[expected]}; "
                            "the run summary is damaged: rerun the run or restore its summary.json")
    for number, rank in enumerate(summary.get("ranks") or []):
        if not isinstance(rank, dict):
            raise UserError(f"{path}: ranks[{number}] is {_kind(rank)}, not an object; the run summary is damaged")
        for key, expected in RANK_FIELDS.items():
            if rank.get(key) is not None and not _fits(rank[key], expected):
                raise UserError(f"{path}: field ranks[{number}].{key} is {_kind(rank[key])}, not "
                                f"{_JSON_NAMES[expected]}; the run summary is damaged")
    return summary


def open_checked_events(run_dir: Path) -> list[EventFile]:
    """Every events/rank-*.npz of a run folder opened for reading a block at a time, ordered by rank;
    a file that is not a whole event file of this version (not a zip, cut, other arrays, a path
    table that does not hold together) is a UserError naming it. The events themselves are checked
    as they are read (`checked_blocks`). The caller closes the files."""
    opened: list[EventFile] = []
    try:
        seen: dict[int, Path] = {}
        for path in event_files(run_dir):
            events = _open(path)
            opened.append(events)
            if events.rank in seen:
                raise UserError(f"{path}: holds the events of rank {events.rank}, as {seen[events.rank].name} does; "
                                "the run's events are damaged")
            seen[events.rank] = path
    except BaseException:
        for events in opened:
            events.close()
        raise
    return sorted(opened, key=lambda r: r.rank)


def _not_an_event_file(path: Path, exc: BaseException) -> UserError:
    reason = " ".join(str(exc).split()).split(". ")[0][:100] or type(exc).__name__
    return UserError(f"{path}: not a dlio_ckpt event file ({reason}); the run's events are damaged: rerun the "
                     "run, or move events/ aside to analyse from summary.json alone")


def _damaged(path: Path, problem: str) -> UserError:
    return UserError(f"{path}: {problem}; the run's events are damaged: rerun the run, or move events/ aside "
                     "to analyse from summary.json alone")


def _open(path: Path) -> EventFile:
    try:
        events = EventFile(path)
    except (OSError, ValueError, EOFError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        raise _not_an_event_file(path, exc) from None
    try:
        events.check_path_table()
    except (OSError, ValueError) as exc:
        events.close()
        raise _not_an_event_file(path, exc) from None
    problem = (f"its events have the layout {events.events.dtype} (dlio_ckpt writes {EVENT_DTYPE})"
               if events.events.dtype != EVENT_DTYPE else f"its rank is {events.rank}" if events.rank < 0 else None)
    events.close()  # opened again when read: a run of many ranks holds no file open per rank
    if problem:
        raise _damaged(path, problem)
    return events


def checked_blocks(events: EventFile) -> Iterator[tuple[np.ndarray, dict[int, str]]]:
    """The file's events a block at a time with the paths each names, every block checked first:
    a problem is a UserError naming the file (the analysis writes nothing before all are read).
    The file is closed at the end."""
    for block, _ in events.blocks(paths=False):
        problem = _block_problem(block, events.path_count)
        if problem:
            raise _damaged(events.path, problem)
        try:
            names = events.names(block["file"])
        except (OSError, ValueError) as exc:
            raise _not_an_event_file(events.path, exc) from None
        yield block, names
    events.close()


def _block_problem(ev: np.ndarray, path_count: int) -> str | None:
    """What makes a block of events unusable, or None."""
    if not len(ev):
        return None
    if int(ev["op"].max()) >= len(OPS) or int(ev["phase"].max()) >= len(PHASES):
        return "it holds operation or phase codes this version does not know"
    if int(ev["file"].max()) >= path_count:  # u4: never negative
        return f"its events name file numbers past its {path_count} paths"
    if (ev["length"] < 0).any():
        return "it holds negative byte counts"
    if not (np.isfinite(ev["start"]).all() and np.isfinite(ev["end"]).all()) or (ev["end"] < ev["start"]).any():
        return "it holds times that are not finite or end before they start"
    return None
