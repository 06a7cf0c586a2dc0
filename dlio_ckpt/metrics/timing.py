"""Time spent in I/O counted once when calls overlap (reader threads read in parallel).

A run's events come a block at a time (EventRecorder.blocks), so the union of their intervals is
built a block at a time too (`UnionLength`): only busy periods that a later block can still
reach are carried from one block to the next.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from dlio_ckpt.storage.events import OP_CODE, PHASE_CODE

# Events given as one array, or as blocks each with the earliest start of any later block's event
# (EventRecorder.blocks).
EventBlocks = Iterable[tuple[np.ndarray, float]]


def as_blocks(events: np.ndarray | EventBlocks) -> EventBlocks:
    """One array of events as the one block it is (nothing after it); blocks as they are."""
    return [(events, np.inf)] if isinstance(events, np.ndarray) else events


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


class UnionLength:
    """`busy_seconds` of intervals given block by block, holding one block and the busy periods
    still open: after each block, the periods that end before `later_start` (no interval still to
    come starts that early) are added up and dropped, the others kept, merged. Events are recorded
    as calls end, so a block's periods are closed by the next block but for calls in flight
    across it. The last block (later_start inf) is kept whole, so intervals given as one block
    give exactly busy_seconds' figure."""

    def __init__(self) -> None:
        self.closed = 0.0
        self.starts = np.empty(0)
        self.ends = np.empty(0)

    def add(self, starts: np.ndarray, ends: np.ndarray, later_start: float) -> None:
        starts, ends = np.concatenate([self.starts, starts]), np.concatenate([self.ends, ends])
        if not np.isfinite(later_start) or not len(starts):
            self.starts, self.ends = starts, ends
            return
        order = np.argsort(starts, kind="stable")
        starts, running_end = starts[order], np.maximum.accumulate(ends[order])
        first = np.flatnonzero(np.concatenate([[True], starts[1:] > running_end[:-1]]))  # each period's first interval
        period_starts = starts[first]
        period_ends = running_end[np.concatenate([first[1:] - 1, [len(starts) - 1]])]
        done = period_ends < later_start
        self.closed += float((period_ends[done] - period_starts[done]).sum())
        self.starts, self.ends = period_starts[~done], period_ends[~done]

    def seconds(self) -> float:
        return self.closed + busy_seconds(self.starts, self.ends)


def phase_busy_seconds(events: np.ndarray, phase: str, ops: tuple[str, ...]) -> float:
    mask = (events["phase"] == PHASE_CODE[phase]) & np.isin(events["op"], [OP_CODE[o] for o in ops])
    return busy_seconds(events["start"][mask], events["end"][mask])
