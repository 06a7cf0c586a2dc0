"""Time spent in I/O counted once when calls overlap (reader threads read in parallel)."""

from __future__ import annotations

import numpy as np

from dlio_ckpt.storage.events import OP_CODE, PHASE_CODE


def busy_seconds(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of [start, end] intervals."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    running_end = np.maximum.accumulate(ends)
    # A new busy period starts where an interval begins after everything before it ended.
    gaps = np.maximum(starts[1:] - running_end[:-1], 0.0)
    return float(running_end[-1] - starts[0] - gaps.sum())


def phase_busy_seconds(events: np.ndarray, phase: str, ops: tuple[str, ...]) -> float:
    mask = (events["phase"] == PHASE_CODE[phase]) & np.isin(events["op"], [OP_CODE[o] for o in ops])
    return busy_seconds(events["start"][mask], events["end"][mask])
