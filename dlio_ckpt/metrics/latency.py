"""Latency percentiles (p50, p99, max) per phase and operation kind, and IOPS, as fio users expect.

A run holds millions of events spread over ranks; gathering every duration on rank 0 would cost
as much memory as the events themselves. Each rank instead counts its durations in a fixed
log-spaced histogram (BINS_PER_DECADE bins per factor of 10, the approach fio's own percentiles
take), rank 0 adds the histograms, and a percentile is the upper edge of the bin it falls in:
never below the true value and at most one bin width (2.3%) above it. Max and mean are exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlio_ckpt.metrics.timing import busy_seconds
from dlio_ckpt.storage.events import OPS, PHASES

BINS_PER_DECADE = 100
SMALLEST_S = 1e-7  # durations below 0.1 us share the first bin
DECADES = 10  # up to 1,000 s
EDGES = SMALLEST_S * np.power(10.0, np.arange(1, DECADES * BINS_PER_DECADE + 1) / BINS_PER_DECADE)
PERCENTILES = (50.0, 99.0)
# operation kinds whose latencies are reported (stat, seek and rename are too rare to matter)
REPORTED_OPS = ("open", "read", "write", "fsync", "close")


def rank_latency(events: np.ndarray) -> dict[str, dict[str, dict[str, Any]]]:
    """One rank's histogram, count, summed and maximal duration and overlap-free time, per phase
    and operation kind that occurred. One sort by (phase, op) groups the calls, so a rank with
    millions of events is read once rather than once per kind."""
    result: dict[str, dict[str, dict[str, Any]]] = {}
    reported = np.isin(events["op"], [OPS.index(op) for op in REPORTED_OPS])
    selected = events[reported]
    keys = selected["phase"].astype(np.int64) * len(OPS) + selected["op"]
    order = np.argsort(keys, kind="stable")
    keys, selected = keys[order], selected[order]
    groups, firsts = np.unique(keys, return_index=True)
    for key, first, last in zip(groups, firsts, list(firsts[1:]) + [len(keys)]):
        calls = selected[first:last]
        took = np.maximum(calls["end"] - calls["start"], 0.0)
        bins = np.minimum(np.searchsorted(EDGES, took, side="left"), len(EDGES) - 1)
        phase, op = PHASES[int(key) // len(OPS)], OPS[int(key) % len(OPS)]
        result.setdefault(phase, {})[op] = {
            "histogram": np.bincount(bins, minlength=len(EDGES)),
            "count": int(len(calls)),
            "sum_s": float(took.sum()),
            "max_s": float(took.max()),
            "busy_s": busy_seconds(calls["start"], calls["end"]),
        }
    return result


def _percentile(histogram: np.ndarray, count: int, percent: float) -> float:
    """The upper edge of the bin holding the percent-th duration (nearest-rank rule)."""
    rank = max(int(np.ceil(percent / 100.0 * count)), 1)
    return float(EDGES[int(np.searchsorted(np.cumsum(histogram), rank))])


def latency_section(ranks: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """summary.json's `latency`: per phase and operation kind, all ranks: `count`, `mean_s`,
    `p50_s`, `p99_s`, `max_s` and `iops` (calls / the slowest rank's overlap-free time in them)."""
    section: dict[str, dict[str, dict[str, float]]] = {}
    for phase in PHASES:
        for op in REPORTED_OPS:
            parts = [r["latency"][phase][op] for r in ranks if op in r.get("latency", {}).get(phase, {})]
            if not parts:
                continue
            histogram = np.sum([p["histogram"] for p in parts], axis=0)
            count = sum(p["count"] for p in parts)
            busy = max(p["busy_s"] for p in parts)
            row = {"count": count, "mean_s": sum(p["sum_s"] for p in parts) / count}
            for percent in PERCENTILES:
                row[f"p{percent:g}_s"] = min(_percentile(histogram, count, percent), max(p["max_s"] for p in parts))
            row["max_s"] = max(p["max_s"] for p in parts)
            row["iops"] = count / busy if busy > 0 else None
            section.setdefault(phase, {})[op] = row
    return section
