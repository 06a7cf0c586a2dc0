"""Headline figures of several jobs side by side (e.g. sync vs async vs incremental checkpoints).

Only figures that mean the same thing for every input are compared, each with its unit in the
label; a row appears when at least one job has a value, so comparing Darshan logs with run
folders shows the common rows filled and the run-only ones (AU, checkpoint blocking) blank.
"""

from __future__ import annotations

from typing import Any, Callable

from dlio_ckpt.analysis.model import GIB, JobAnalysis, plain
from dlio_ckpt.analysis.numbers import fmt
from dlio_ckpt.errors import UserError

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
    ("read_mib_per_s_wall", "read MiB/s over the wall-clock time reads were under way", _IDENTITY),
    ("write_mib_per_s_wall", "write MiB/s over the wall-clock time writes were under way", _IDENTITY),
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
    ("checkpoint_persist_s_max", "checkpoint persist time, max over ranks (s)", _IDENTITY),
    ("training_time_lost_fraction", "training time lost to checkpoints", _IDENTITY),
    ("restore_gib_per_s", "restore GiB/s", _IDENTITY),
    ("au_overall", "AU over the whole run (au_overall)", _IDENTITY),
    ("goodput", "goodput (useful compute / training wall time)", _IDENTITY),
    ("failures", "injected failures", _IDENTITY),
    ("lost_work_s", "work lost to failures (s)", _IDENTITY),
    ("restart_s", "restart time: restore and warm-up (s)", _IDENTITY),
    ("checkpoint_interval_steps", "checkpoint interval (steps)", _IDENTITY),
    ("required_read_mib_per_s", "read MiB/s training needs", _IDENTITY),
    ("storage_bound", "storage-bound (the run's verdict; empty: not judged)", _IDENTITY),
    ("train_read_p99_s", "train read latency p99 (s)", _IDENTITY),
    ("train_read_iops", "train read IOPS", _IDENTITY),
    ("pydarshan_agg_perf_mib_per_s", "PyDarshan I/O performance estimate (MiB/s)", _IDENTITY),
)

# sweep_summary.csv columns that are a METRICS figure under another name: shown once, as that figure
CSV_ALIASES = {
    "train_samples_per_s": "samples_per_s",
    "train_au": "au",
    "train_au_overall": "au_overall",
    "failures_lost_work_s": "lost_work_s",
    "failures_restart_s": "restart_s",
    "checkpoint_training_time_lost_fraction": "training_time_lost_fraction",
    "train_required_read_mib_per_s": "required_read_mib_per_s",
    "train_storage_bound": "storage_bound",
}
# sweep_summary.csv columns that are not figures to compare
NOT_COMPARED = ("job", "status")

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


def job_ids(jobs: list[JobAnalysis]) -> list[str]:
    """Short column names: a sweep job's folder name ("job 3" is folder 3), else the position (1, 2, ...);
    positions for all when folder names repeat (jobs of two sweeps)."""
    ids = []
    for position, job in enumerate(jobs, start=1):
        folder = job.job.get("job")
        ids.append(f"job {folder}" if folder is not None else str(position))
    return ids if len(set(ids)) == len(ids) else [str(position) for position in range(1, len(jobs) + 1)]


def _headline(job: JobAnalysis) -> dict[str, Any]:
    """The job's figures, each once: a sweep column that repeats a figure under another name is folded into it."""
    figures = dict(job.headline)
    for alias, key in CSV_ALIASES.items():
        value = figures.pop(alias, None)
        if figures.get(key) is None:
            figures[key] = value
    return figures


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def percent_change(value: Any, base: Any) -> float | None:
    """(value - base) / base in percent; None where either is not a number or the base is 0."""
    if not (_is_number(value) and _is_number(base)) or base == 0:
        return None
    return (value - base) / abs(base) * 100.0


def _baseline_index(jobs: list[JobAnalysis], ids: list[str], labels: list[str], baseline: str) -> int:
    wanted = baseline.strip()
    for index, (short, label) in enumerate(zip(ids, labels)):
        if wanted in (short, label, short.removeprefix("job ")):
            return index
    raise UserError(f"--baseline {baseline}: no such job; give one of {', '.join(ids)}")


def compare(jobs: list[JobAnalysis], baseline: str | None = None) -> dict[str, Any]:
    """A table: one row per metric, one column per job; values converted to the row's unit; with
    a baseline, each row also has every job's change against it in percent."""
    labels = unique_labels(jobs)
    ids = job_ids(jobs)
    figures = [_headline(job) for job in jobs]
    base = _baseline_index(jobs, ids, labels, baseline) if baseline is not None else None
    rows = []
    known = {key for key, _, _ in METRICS}
    extra_keys = []
    for headline in figures:  # numeric columns a sweep recorded that we have no row for
        for key, value in headline.items():
            if key not in known and key not in extra_keys and key not in NOT_COMPARED and _is_number(value):
                extra_keys.append(key)
    for key, label, convert in METRICS + tuple((k, k, _IDENTITY) for k in extra_keys):
        values = [convert(headline.get(key)) for headline in figures]
        if all(v is None for v in values):
            continue
        row = {"metric": key, "label": label, "values": dict(zip(labels, values))}
        if base is not None:
            row["change_percent"] = {run: percent_change(v, values[base]) for run, v in zip(labels, values)}
        rows.append(row)
    return plain({"runs": labels, "ids": dict(zip(labels, ids)), "baseline": labels[base] if base is not None else None,
                  "inputs": [job.inputs for job in jobs], "rows": rows})


def column_header(table: dict[str, Any], run: str) -> str:
    """`job 3: <what it varied>` for sweep jobs (the label already starts with it), `2: <label>` otherwise."""
    short = table["ids"][run]
    return run if run.startswith(short) else f"{short}: {run}"


def cell(table: dict[str, Any], row: dict[str, Any], run: str) -> str:
    """A value for people, "-" when the job has none, and its change against the baseline."""
    text = fmt(row["values"].get(run))
    change = (row.get("change_percent") or {}).get(run)
    if change is not None and run != table.get("baseline"):
        text += f" ({round(change):+d}%)"  # round first: a tiny drop reads +0%, not -0%
    return text


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
