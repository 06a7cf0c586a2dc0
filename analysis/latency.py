"""Latency percentiles and IOPS per phase and operation kind, as fio users read them.

From a run folder's events the percentiles are exact (every call's duration is there); without
events the figures come from summary.json's `latency` section, which rank 0 built from per-rank
histograms (dlio_ckpt/metrics/latency.py: within one bin, 2.3 %, above the true value).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlio_ckpt.metrics.latency import REPORTED_OPS
from dlio_ckpt.metrics.timing import busy_seconds
from dlio_ckpt.storage.events import OP_CODE, PHASES, RankEvents


def event_latency(ranks: list[RankEvents]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per phase and operation kind over all ranks: count, min, mean, stdev (n - 1, as fio's), p50,
    p90, p99, p99.9, max (seconds) and IOPS (calls / the slowest rank's overlap-free time in those
    calls), with the keys of summary.json's `latency`."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for code, phase in enumerate(PHASES):
        for op in REPORTED_OPS:
            took, busy = [], []
            for rank in ranks:
                mask = (rank.events["phase"] == code) & (rank.events["op"] == OP_CODE[op])
                if mask.any():
                    took.append(rank.events["end"][mask] - rank.events["start"][mask])
                    busy.append(busy_seconds(rank.events["start"][mask], rank.events["end"][mask]))
            if not took:
                continue
            durations = np.maximum(np.concatenate(took), 0.0)
            p50, p90, p99, p99_9 = np.percentile(durations, [50, 90, 99, 99.9], method="inverted_cdf")
            slowest = max(busy)
            table.setdefault(phase, {})[op] = {"count": int(len(durations)), "min_s": float(durations.min()),
                                               "mean_s": float(durations.mean()),
                                               "stdev_s": float(durations.std(ddof=1)) if len(durations) > 1 else 0.0,
                                               "p50_s": float(p50), "p90_s": float(p90), "p99_s": float(p99),
                                               "p99_9_s": float(p99_9), "max_s": float(durations.max()),
                                               "iops": len(durations) / slowest if slowest > 0 else None}
    return table


def latency_rows(latency: dict[str, dict[str, dict[str, Any]]]) -> list[list[Any]]:
    """[phase, op, calls, p50 ms, p99 ms, max ms, IOPS] rows for tables."""
    return [[phase, op, row["count"], row["p50_s"] * 1e3, row["p99_s"] * 1e3, row["max_s"] * 1e3, row["iops"]]
            for phase, ops in latency.items() for op, row in ops.items()]


HEADERS = ["phase", "op", "calls", "p50 ms", "p99 ms", "max ms", "IOPS"]
