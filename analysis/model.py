"""The shapes every input is reduced to, so that reports, plots and compare never care whether a
figure came from a Darshan log or from a run folder's events.

All byte counts are ints, all times are seconds (floats), all rates MiB/s (2^20 bytes per second),
matching docs/metrics.md. `to_json` turns numpy scalars and non-finite floats into plain JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MIB = float(1 << 20)
GIB = float(1 << 30)

# Darshan's access-size buckets (POSIX_SIZE_READ_* / POSIX_SIZE_WRITE_*): a size goes into the
# first bucket whose inclusive upper bound is >= the size; the last bucket is open-ended.
SIZE_BUCKETS = ("0_100", "100_1K", "1K_10K", "10K_100K", "100K_1M", "1M_4M", "4M_10M", "10M_100M", "100M_1G", "1G_PLUS")
SIZE_BOUNDS = (100, 1024, 10240, 102400, 1048576, 4194304, 10485760, 104857600, 1073741824)


def rate_mib_per_s(nbytes: float, seconds: float) -> float | None:
    """A rate only where a time was measured: 0 s means "no measurement", not infinite speed."""
    if seconds is None or seconds <= 0:
        return None
    return nbytes / seconds / MIB


def share(part: float, whole: float) -> float | None:
    return None if whole <= 0 else part / whole


@dataclass
class Timeline:
    """Bytes moved per (row, time bin); rows are ranks or processes, bins start at the job start."""

    bin_width_s: float
    read: np.ndarray  # shape (rows, bins), bytes
    write: np.ndarray
    row_labels: list[str]
    source: str  # "HEATMAP", "DXT_POSIX", "events", "record timestamps"
    phase_spans: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def nbins(self) -> int:
        return int(self.read.shape[1])


@dataclass
class JobAnalysis:
    """Everything the report says about one job (one run folder, or one Darshan job id)."""

    label: str
    kind: str  # "darshan" or "run"
    inputs: list[str]
    bytes_read: int
    bytes_written: int
    per_phase: dict[str, dict[str, Any]]
    per_rank: list[dict[str, Any]]
    slowest_rank: dict[str, Any] | None
    histogram: dict[str, Any]
    files: dict[str, Any]
    io_time_share: dict[str, Any]
    job: dict[str, Any] = field(default_factory=dict)
    headline: dict[str, Any] = field(default_factory=dict)  # figures a compare table shows
    extra: dict[str, Any] = field(default_factory=dict)  # input-specific: darshan derived metrics, summary.json parts
    warnings: list[str] = field(default_factory=list)
    timeline: Timeline | None = None
    figures: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc = {
            "label": self.label,
            "kind": self.kind,
            "inputs": self.inputs,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "job": self.job,
            "headline": self.headline,
            "per_phase": self.per_phase,
            "per_rank": self.per_rank,
            "slowest_rank": self.slowest_rank,
            "histogram": self.histogram,
            "files": self.files,
            "io_time_share": self.io_time_share,
            "timeline_source": self.timeline.source if self.timeline else None,
            "figures": self.figures,
            "warnings": self.warnings,
            **self.extra,
        }
        return plain(doc)


def plain(value: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, NaN/inf to None (json.dumps would emit NaN)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def histogram_from_sizes(sizes: np.ndarray) -> list[int]:
    """Counts per Darshan size bucket, so run-folder histograms line up with Darshan ones."""
    idx = np.searchsorted(np.asarray(SIZE_BOUNDS), np.asarray(sizes, dtype=np.int64), side="left")
    return np.bincount(idx, minlength=len(SIZE_BUCKETS)).astype(int).tolist()


def phase_entry(bytes_read: int, bytes_written: int, read_s_max: float | None, write_s_max: float | None,
                read_s_sum: float, write_s_sum: float, ops: int, reads: int, writes: int) -> dict[str, Any]:
    """One phase's totals; bandwidth is total bytes over the slowest rank's time (docs/metrics.md).

    A slowest-rank time of None means it is unknown (summary.json keeps only sums), and then no
    bandwidth is claimed rather than one computed from the wrong time.
    """
    return {
        "bytes_read": int(bytes_read),
        "bytes_written": int(bytes_written),
        "read_s": None if read_s_max is None else float(read_s_max),
        "write_s": None if write_s_max is None else float(write_s_max),
        "read_s_sum": float(read_s_sum),
        "write_s_sum": float(write_s_sum),
        "read_mib_per_s": None if read_s_max is None else rate_mib_per_s(bytes_read, read_s_max),
        "write_mib_per_s": None if write_s_max is None else rate_mib_per_s(bytes_written, write_s_max),
        "ops": int(ops),
        "reads": int(reads),
        "writes": int(writes),
    }
