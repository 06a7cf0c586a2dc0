"""Latency (min, mean, stdev, p50, p90, p99, p99.9, max) per phase and operation kind, and IOPS,
as fio reports them.

A run holds millions of events spread over ranks; gathering every duration on rank 0 would cost
as much memory as the events themselves. Each rank instead counts its durations in log-spaced
bins (BINS_PER_DECADE bins per factor of 10, the approach fio's own percentiles take), kept
sparse: only the bins that hold a call are sent, so the range has no upper end (a 3-hour fsync
is a bin like any other) and a rank sends at most one pair per call. Rank 0 adds the bins, and a
percentile is the upper edge of the bin it falls in (nearest-rank rule), capped at the maximum:
never below the true value and at most one bin width (2.3%) above it. Min, max, mean and the
standard deviation are exact (each rank's count, mean and sum of squared deviations, combined
with Chan et al.'s pairwise formula, which loses no precision to large means).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlio_ckpt.metrics.timing import EventBlocks, UnionLength, as_blocks
from dlio_ckpt.storage.events import OPS, PHASES

BINS_PER_DECADE = 100
SMALLEST_S = 1e-7  # durations up to 0.1 us share the first bin; there is no largest
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
# operation kinds whose latencies are reported (stat, seek and rename are too rare to matter)
REPORTED_OPS = ("open", "read", "write", "fsync", "close")


def percentile_key(percent: float) -> str:
    """summary.json's key for a percentile: p50_s, p90_s, p99_s, p99_9_s (no dot, so a dotted
    path such as latency.train.read.p99_9_s still names it)."""
    return f"p{percent:g}_s".replace(".", "_")


def bin_edge(bins: np.ndarray | int) -> np.ndarray:
    """The upper edge (seconds) of log bin number `bins`."""
    return SMALLEST_S * np.power(10.0, np.asarray(bins, dtype=np.float64) / BINS_PER_DECADE)


def bin_of(took: np.ndarray) -> np.ndarray:
    """The smallest bin whose upper edge is at or above each duration (bin 0 below SMALLEST_S)."""
    scaled = np.log10(np.maximum(took, SMALLEST_S) / SMALLEST_S) * BINS_PER_DECADE
    bins = np.maximum(np.ceil(scaled).astype(np.int64), 0)
    bins += bin_edge(bins) < took  # log10's rounding: never an edge below the value
    lower = np.maximum(bins - 1, 0)
    bins -= (bins > 0) & (bin_edge(lower) >= took)  # ... and never one bin too high
    return bins


def rank_latency(events: np.ndarray | EventBlocks) -> dict[str, dict[str, dict[str, Any]]]:
    """One rank's sparse histogram, count, min, max, mean, sum of squared deviations and
    overlap-free time, per phase and operation kind that occurred, from its events: one array,
    or blocks as the recorder gives them back (each block's figures combined with the ones before:
    bins added, moments by Chan et al.'s formula, busy time by timing.UnionLength), so a run of
    any length holds one block. Within a block one sort by (phase, op) groups the calls: what is
    sorted is their row numbers (8 bytes a call) and only one kind's times are gathered at a time,
    not copies of the 38-byte events."""
    kinds: dict[int, dict[str, Any]] = {}
    for rows, later_start in as_blocks(events):
        for key, starts, ends in _kinds_of(rows):
            took = np.maximum(ends - starts, 0.0)
            bins, counts = np.unique(bin_of(took), return_counts=True)
            part = {"count": int(len(took)), "mean_s": float(took.mean()), "min_s": float(took.min()),
                    "max_s": float(took.max())}
            part["m2"] = float(np.sum((took - part["mean_s"]) ** 2))
            kind = kinds.get(key)
            if kind is None:
                kinds[key] = kind = {**part, "bins": dict(zip(bins.tolist(), counts.tolist())), "busy": UnionLength()}
            else:
                count, mean, m2 = _pair_moments(kind, part)
                kind.update(count=count, mean_s=mean, m2=m2, min_s=min(kind["min_s"], part["min_s"]),
                            max_s=max(kind["max_s"], part["max_s"]))
                for number, n in zip(bins.tolist(), counts.tolist()):
                    kind["bins"][number] = kind["bins"].get(number, 0) + n
            kind["busy"].add(starts, ends, later_start)
        for kind in kinds.values():  # a kind absent from this block: its open periods may close now
            if np.isfinite(later_start):
                kind["busy"].add(np.empty(0), np.empty(0), later_start)
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for key in sorted(kinds):
        kind = kinds[key]
        numbers = sorted(kind["bins"])
        result.setdefault(PHASES[key // len(OPS)], {})[OPS[key % len(OPS)]] = {
            "bins": np.array(numbers, dtype=np.int64),
            "counts": np.array([kind["bins"][n] for n in numbers], dtype=np.int64),
            "count": kind["count"],
            "min_s": kind["min_s"],
            "max_s": kind["max_s"],
            "mean_s": kind["mean_s"],
            "m2": kind["m2"],
            "busy_s": kind["busy"].seconds(),
        }
    return result


def _kinds_of(events: np.ndarray):
    """(phase * len(OPS) + op, starts, ends) of each reported kind of call in `events`."""
    rows = np.flatnonzero(np.isin(events["op"], [OPS.index(op) for op in REPORTED_OPS]))
    keys = events["phase"][rows].astype(np.uint16) * len(OPS) + events["op"][rows]
    order = np.argsort(keys, kind="stable")
    keys, rows = keys[order], rows[order]
    del order
    groups, firsts = np.unique(keys, return_index=True)
    for key, first, last in zip(groups, firsts, list(firsts[1:]) + [len(keys)]):
        yield int(key), events["start"][rows[first:last]], events["end"][rows[first:last]]


def _pair_moments(a: dict[str, Any], b: dict[str, Any]) -> tuple[int, float, float]:
    """Count, mean and sum of squared deviations of two parts together (Chan et al.)."""
    total = a["count"] + b["count"]
    delta = b["mean_s"] - a["mean_s"]
    return (total, a["mean_s"] + delta * b["count"] / total,
            a["m2"] + b["m2"] + delta * delta * a["count"] * b["count"] / total)


def _combined_moments(parts: list[dict[str, Any]]) -> tuple[int, float, float]:
    """Count, mean and sum of squared deviations of all parts together (Chan et al., pairwise)."""
    count, mean, m2 = 0, 0.0, 0.0
    for part in parts:
        n = part["count"]
        delta = part["mean_s"] - mean
        total = count + n
        mean += delta * n / total
        m2 += part["m2"] + delta * delta * count * n / total
        count = total
    return count, mean, m2


def _percentile(bins: np.ndarray, counts: np.ndarray, count: int, percent: float) -> float:
    """The upper edge of the bin holding the percent-th duration (nearest-rank rule)."""
    rank = max(int(np.ceil(percent / 100.0 * count)), 1)
    return float(bin_edge(bins[int(np.searchsorted(np.cumsum(counts), rank))]))


def latency_section(ranks: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """summary.json's `latency`: per phase and operation kind, all ranks: `count`, `min_s`,
    `mean_s`, `stdev_s` (sample standard deviation, as fio's), `p50_s`, `p90_s`, `p99_s`,
    `p99_9_s`, `max_s` and `iops` (calls / the slowest rank's overlap-free time in them)."""
    section: dict[str, dict[str, dict[str, float]]] = {}
    for phase in PHASES:
        for op in REPORTED_OPS:
            parts = [r["latency"][phase][op] for r in ranks if op in r.get("latency", {}).get(phase, {})]
            if not parts:
                continue
            merged, where = np.unique(np.concatenate([p["bins"] for p in parts]), return_inverse=True)
            counts = np.bincount(where, weights=np.concatenate([p["counts"] for p in parts])).astype(np.int64)
            count, mean, m2 = _combined_moments(parts)
            busy = max(p["busy_s"] for p in parts)
            largest = max(p["max_s"] for p in parts)
            row: dict[str, Any] = {"count": count, "min_s": min(p["min_s"] for p in parts), "mean_s": mean,
                                   "stdev_s": float(np.sqrt(m2 / (count - 1))) if count > 1 else 0.0}
            for percent in PERCENTILES:
                row[percentile_key(percent)] = min(_percentile(merged, counts, count, percent), largest)
            row["max_s"] = largest
            row["iops"] = count / busy if busy > 0 else None
            section.setdefault(phase, {})[op] = row
    return section
