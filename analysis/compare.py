"""Headline figures of several jobs side by side (e.g. sync vs async vs incremental checkpoints).

Only figures that mean the same thing for every input are compared, each with its unit in the
label; a row appears when at least one job has a value, so comparing Darshan logs with run
folders shows the common rows filled and the run-only ones (AU, checkpoint blocking) blank.
"""

from __future__ import annotations

from typing import Any, Callable

from dlio_ckpt.analysis.model import GIB, JobAnalysis, plain

_IDENTITY: Callable[[Any], Any] = lambda v: v
_TO_GIB: Callable[[Any], Any] = lambda v: None if v is None else v / GIB

# key in JobAnalysis.headline, label with unit, conversion for display and plot
METRICS: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("workload", "workload", _IDENTITY),
    ("mode", "mode", _IDENTITY),
    ("strategy", "checkpoint strategy", _IDENTITY),
    ("overrides", "overrides", _IDENTITY),
    ("ranks", "ranks / processes", _IDENTITY),
    ("bytes_read", "bytes read (GiB)", _TO_GIB),
    ("bytes_written", "bytes written (GiB)", _TO_GIB),
    ("read_mib_per_s", "read MiB/s (bytes / slowest rank's read time)", _IDENTITY),
    ("write_mib_per_s", "write MiB/s (bytes / slowest rank's write time)", _IDENTITY),
    ("read_s", "read time of the slowest rank (s)", _IDENTITY),
    ("write_s", "write time of the slowest rank (s)", _IDENTITY),
    ("slowest_rank_io_s", "I/O time of the slowest rank (s)", _IDENTITY),
    ("read_share", "read share of I/O time", _IDENTITY),
    ("checkpoint_share", "checkpoint share of I/O time", _IDENTITY),
    ("files", "files touched", _IDENTITY),
    ("wall_s", "wall time (s)", _IDENTITY),
    ("samples_per_s", "training samples/s", _IDENTITY),
    ("au", "accelerator utilisation (DLIO AU)", _IDENTITY),
    ("train_read_mib_per_s", "train read MiB/s (summary.json)", _IDENTITY),
    ("checkpoint_write_gib_per_s", "checkpoint write GiB/s", _IDENTITY),
    ("checkpoint_write_gib_per_s_min_rank", "checkpoint write GiB/s, slowest rank (MLPerf)", _IDENTITY),
    ("checkpoint_blocking_s_max", "checkpoint blocking time, max over ranks (s)", _IDENTITY),
    ("training_time_lost_fraction", "training time lost to checkpoints", _IDENTITY),
    ("restore_gib_per_s", "restore GiB/s", _IDENTITY),
    ("pydarshan_agg_perf_mib_per_s", "PyDarshan I/O performance estimate (MiB/s)", _IDENTITY),
)

# what the comparison plot shows, in order of preference; the first few with values are drawn
PLOT_KEYS = ("bytes_read", "bytes_written", "read_mib_per_s", "write_mib_per_s", "checkpoint_blocking_s_max",
             "training_time_lost_fraction", "samples_per_s", "slowest_rank_io_s", "wall_s")
MAX_PLOTTED = 6


def unique_labels(jobs: list[JobAnalysis]) -> list[str]:
    """Columns are keyed by label, so equal labels (two runs named "run") get a suffix."""
    seen: dict[str, int] = {}
    labels = []
    for job in jobs:
        n = seen.get(job.label, 0)
        seen[job.label] = n + 1
        labels.append(job.label if n == 0 else f"{job.label} #{n + 1}")
    return labels


def compare(jobs: list[JobAnalysis]) -> dict[str, Any]:
    """A table: one row per metric, one column per job; values converted to the row's unit."""
    labels = unique_labels(jobs)
    rows = []
    known = {key for key, _, _ in METRICS}
    extra_keys = []
    for job in jobs:  # numeric columns a sweep recorded that we have no row for
        for key, value in job.headline.items():
            if key not in known and key not in extra_keys and isinstance(value, (int, float)):
                extra_keys.append(key)
    for key, label, convert in METRICS + tuple((k, k, _IDENTITY) for k in extra_keys):
        values = [convert(job.headline.get(key)) for job in jobs]
        if all(v is None for v in values):
            continue
        rows.append({"metric": key, "label": label, "values": dict(zip(labels, values))})
    return plain({"runs": labels, "inputs": [job.inputs for job in jobs], "rows": rows})


def plotted_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    by_key = {row["metric"]: row for row in table["rows"]}
    chosen = []
    for key in PLOT_KEYS:
        row = by_key.get(key)
        if row and any(isinstance(v, (int, float)) for v in row["values"].values()):
            chosen.append(row)
        if len(chosen) == MAX_PLOTTED:
            break
    return chosen
