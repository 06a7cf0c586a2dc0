"""A rank's end-of-run figures (metrics/latency.rank_latency, metrics/summary.rank_io) take less
memory than the events they read, and stay what the events say.

Memory is tracemalloc's peak above what was held before the call (numpy reports its arrays to
it), as a share of the events' bytes: copies of the 38-byte events (what these functions made
before, 2.1x and 1.1x) would show. Nothing is timed.
"""

from __future__ import annotations

import tracemalloc

import numpy as np

from dlio_ckpt.metrics import latency, summary
from dlio_ckpt.metrics.timing import busy_seconds
from dlio_ckpt.storage.events import EVENT_DTYPE, OPS, PHASES


def generation_like(n: int, seed: int = 2) -> np.ndarray:
    """A generation's events: open, write, close, stat, stat per file, in one phase."""
    rng = np.random.default_rng(seed)
    events = np.zeros(n, EVENT_DTYPE)
    events["op"] = np.tile([OPS.index(op) for op in ("open", "write", "close", "stat", "stat")], n // 5)
    events["phase"] = PHASES.index("generate")
    events["start"] = np.arange(n) * 1e-3
    events["end"] = events["start"] + rng.exponential(1e-4, n)
    events["length"] = np.where(events["op"] == OPS.index("write"), 64, 0)
    return events


def extra_peak(function, events: np.ndarray) -> float:
    tracemalloc.start()
    try:
        held = tracemalloc.get_traced_memory()[0]
        function(events)
        return (tracemalloc.get_traced_memory()[1] - held) / events.nbytes
    finally:
        tracemalloc.stop()


def test_latency_and_totals_take_less_than_the_events_bytes():
    events = generation_like(60_000)
    assert extra_peak(latency.rank_latency, events) < 0.8
    assert extra_peak(summary.rank_io, events) < 0.8


def test_latency_groups_are_the_calls_of_each_phase_and_kind_in_event_order():
    """Against a grouping done here row by row: count, min, max, mean, histogram and busy time of
    every reported (phase, operation) of random events, 9 kinds in 6 phases, interleaved."""
    rng = np.random.default_rng(7)
    n = 3000
    events = np.zeros(n, EVENT_DTYPE)
    events["op"], events["phase"] = rng.integers(0, len(OPS), n), rng.integers(0, len(PHASES), n)
    events["start"] = rng.random(n) * 10
    events["end"] = events["start"] + rng.exponential(0.01, n)
    got = latency.rank_latency(events)
    groups: dict[tuple[str, str], list[int]] = {}
    for row in range(n):
        groups.setdefault((PHASES[events["phase"][row]], OPS[events["op"][row]]), []).append(row)
    expected = {key: rows for key, rows in groups.items() if key[1] in latency.REPORTED_OPS}
    assert sorted((p, o) for p in got for o in got[p]) == sorted(expected)
    for (phase, op), rows in expected.items():
        figures, calls = got[phase][op], events[rows]
        took = calls["end"] - calls["start"]
        bins, counts = np.unique(latency.bin_of(took), return_counts=True)
        assert figures["count"] == len(rows) and figures["mean_s"] == float(took.mean())
        assert (figures["min_s"], figures["max_s"]) == (float(took.min()), float(took.max()))
        assert figures["bins"].tolist() == bins.tolist() and figures["counts"].tolist() == counts.tolist()
        assert figures["busy_s"] == busy_seconds(calls["start"], calls["end"])
