"""The shape of the summary.json fields the advisor reads, checked before any of them is used.

Why: summary.json is input like any other (edited by hand, truncated by a full disk, written by
another version), and calibrate.py reads a few dozen of its fields in arithmetic. A field of the
wrong type (a string where a number was, a number where a section was) used to surface as a
traceback deep in the calibration; here it is a UserError naming the field and the file, so the
run is skipped with a note (or, alone, refused in one line, exit 2). A field that is missing or
null is allowed: calibrate.py falls back to simpler figures and says so.

Numbers must be finite and not negative (they are times, bytes and counts), times at most 1e9 s
(31.7 years: a cost of 1e308 s overflowed the calibration's statistics), bytes below 2**63, and
counts whole and below 2**53 (what a JSON number holds exactly).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dlio_ckpt.errors import UserError

MAX_COUNT = 2**53
MAX_SECONDS = 1e9
MAX_BYTES = 2**63

# Field kinds: "number" (finite, >= 0: seconds, at most MAX_SECONDS), "bytes" (finite, >= 0, below
# 2**63), "real" (seconds that may be negative: a difference such as the loop's own time), "count"
# (a whole number >= 0), "name" (a string or a whole number: a level is named either way), "text";
# a dict is a section, [dict] a list of rows.
_ROW = {"blocking_s_max": "number", "write_s_max": "number", "persist_s_max": "number", "bytes_written": "bytes",
        "bytes": "bytes", "step": "count", "level": "name"}
_LEVEL = {"name": "name", "write_s_mean": "number", "flush_s_mean": "number", "flush_latency_s_mean": "number",
          "restore_s_mean": "number", "bytes": "bytes", "checkpoints": "count", "flushes": "count", "every": "count",
          "survives": "text", "scope": "text", "path": "text", "write": "text"}
_RESTART = {"warmup_s": "number", "restore_s": "number", "step": "count", "level": "name", "kind": "text",
            "restored_step": "real"}
SHAPE: dict[str, Any] = {
    "world_size": "count",
    "goodput": "number",
    "checkpoint": {"per_checkpoint": [_ROW], "levels": [_LEVEL], "policy": {"interval_steps": "count"},
                   "strategy": "text", "restore_s": "number", "restore_s_max": "number"},
    "train": {"steps": "count", "step_s_mean": "number", "wall_s": "number", "checkpoint_s_in_loop": "number"},
    "time_accounting": {"checkpoint_s": "number", "other_s": "real", "useful_compute_s": "number",
                        "lost_steps": "count"},
    "failures": {"count": "count", "restart_s": "number", "restarts": [_RESTART]},
    "config": {"checkpoint": {"levels": [_LEVEL], "steps_between_checkpoints": "count", "strategy": "text",
                              "encoding": "text"},
               "failures": {"mtbf_s": "number", "kind": "text"}},
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _problem(value: Any, kind: Any) -> str | None:
    """What is wrong with `value` as a `kind`, or None."""
    if isinstance(kind, dict):
        return None if isinstance(value, dict) else "is not a section (a mapping of fields)"
    if isinstance(kind, list):
        return None if isinstance(value, list) else "is not a list"
    if kind == "text":
        return None if isinstance(value, str) else "is not a string"
    if kind == "name" and isinstance(value, str):
        return None
    if not _is_number(value):
        return "is not a number"
    if not math.isfinite(value):
        return "is not a finite number"
    if kind == "real":
        return None if abs(value) <= MAX_SECONDS else f"is beyond {MAX_SECONDS:g} seconds"
    if value < 0:
        return "is negative"
    if kind == "number" and value > MAX_SECONDS:
        return f"is beyond {MAX_SECONDS:g} seconds"
    if kind == "bytes" and value >= MAX_BYTES:
        return "is not below 2**63 bytes"
    if kind in ("count", "name") and (value != int(value) or value >= MAX_COUNT):
        return "is not a whole number below 2**53"
    return None


def _check(node: dict[str, Any], shape: dict[str, Any], where: str, file: Path) -> None:
    for key, kind in shape.items():
        value = node.get(key)
        if value is None:
            continue
        name = f"{where}{key}"
        problem = _problem(value, kind)
        if problem is not None:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise UserError(f"{file}: field {name} {problem} (got {shown}); the file is damaged or was edited: "
                            "rerun the run, or move it out of the folder")
        if isinstance(kind, dict):
            _check(value, kind, name + ".", file)
        elif isinstance(kind, list):
            for index, row in enumerate(value):
                if not isinstance(row, dict):
                    raise UserError(f"{file}: field {name}[{index}] is not a mapping of fields; the file is damaged "
                                    "or was edited: rerun the run, or move it out of the folder")
                _check(row, kind[0], f"{name}[{index}].", file)


def check_summary(summary: Any, run_dir: Path) -> None:
    """UserError naming the first field the advisor reads whose type or value cannot be right."""
    file = Path(run_dir) / "summary.json"
    if not isinstance(summary, dict):
        raise UserError(f"{file}: not a JSON object of fields; the file is damaged: rerun the run, or move it out of the folder")
    _check(summary, SHAPE, "", file)
    if summary.get("world_size") == 0:
        raise UserError(f"{file}: field world_size is 0; a run has at least one rank: the file is damaged or was edited")
