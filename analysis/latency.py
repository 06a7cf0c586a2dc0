"""Latency percentiles and IOPS per phase and operation kind, as fio users read them: the table.

From a run folder's events the percentiles are exact (every call's duration is read, a block at a
time: event_figures.EventFigures.latency, order_statistics.py); without events the figures come
from summary.json's `latency` section, which rank 0 built from per-rank histograms
(dlio_ckpt/metrics/latency.py: within one bin, 2.3 %, above the true value).
"""

from __future__ import annotations

from typing import Any


def latency_rows(latency: dict[str, dict[str, dict[str, Any]]]) -> list[list[Any]]:
    """[phase, op, calls, p50 ms, p99 ms, max ms, IOPS] rows for tables."""
    return [[phase, op, row["count"], row["p50_s"] * 1e3, row["p99_s"] * 1e3, row["max_s"] * 1e3, row["iops"]]
            for phase, ops in latency.items() for op, row in ops.items()]


HEADERS = ["phase", "op", "calls", "p50 ms", "p99 ms", "max ms", "IOPS"]
