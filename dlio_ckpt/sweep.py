"""Combine the jobs of a sweep (`dlio_ckpt -m ...`) into one table of headline metrics."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import yaml

# (column, path into summary.json)
HEADLINE_COLUMNS = (
    ("workload", ("workload",)),
    ("world_size", ("world_size",)),
    ("train_samples_per_s", ("train", "samples_per_s")),
    ("train_bytes_read", ("train", "bytes_read")),
    ("train_read_mib_per_s", ("train", "read_mib_per_s")),
    ("train_au", ("train", "au")),
    ("train_au_overall", ("train", "au_overall")),
    ("train_au_target_met", ("train", "au_target_met")),
    ("train_au_verdict", ("train", "au_verdict")),
    ("train_steps", ("train", "steps")),
    ("train_required_read_mib_per_s", ("train", "storage", "required_mib_per_s")),
    ("train_storage_bound", ("train", "storage", "storage_bound")),
    ("train_storage_verdict", ("train", "storage", "verdict")),
    ("train_verdict", ("train", "run_verdict", "verdict")),
    ("train_read_p99_s", ("latency", "train", "read", "p99_s")),
    ("checkpoint_writes", ("checkpoint", "writes")),
    ("checkpoint_bytes", ("checkpoint", "bytes")),
    ("checkpoint_write_s_max", ("checkpoint", "write_s_max")),
    ("checkpoint_write_gib_per_s", ("checkpoint", "write_gib_per_s")),
    ("checkpoint_blocking_s_max", ("checkpoint", "blocking_s_max")),
    ("checkpoint_persist_s_max", ("checkpoint", "persist_s_max")),
    ("checkpoint_training_time_lost_fraction", ("checkpoint", "training_time_lost_fraction")),
    ("checkpoint_interval_steps", ("checkpoint", "policy", "interval_steps")),
    ("goodput", ("goodput",)),
    ("failures", ("failures", "count")),
    ("failures_lost_work_s", ("failures", "lost_work_s")),
    ("failures_restart_s", ("failures", "restart_s")),
    ("resume_deterministic", ("resume", "deterministic")),
    ("wall_s", ("wall_s",)),
    # The first job of a sweep generates the dataset the others reuse: its wall_s holds the
    # generation, theirs does not; wall_s_without_generation compares like with like.
    ("dataset_reused", ("dataset", "reused")),
    ("dataset_generate_s", ("dataset", "generate_s")),
)


def _wall_without_generation(summary: dict[str, Any]) -> Any:
    wall, generate = summary.get("wall_s"), (summary.get("dataset") or {}).get("generate_s")
    if not isinstance(wall, (int, float)):
        return ""
    return wall - generate if isinstance(generate, (int, float)) else wall


def swept_keys(overrides: dict[str, list[str]]) -> list[str]:
    """The keys whose value differs between jobs (what the sweep varied), in first-seen order;
    a key a job does not set counts as a value of its own. One column each in the table, so a
    spreadsheet can sort or plot by them without parsing the overrides string."""
    values: dict[str, set[str | None]] = {}
    for job_overrides in overrides.values():
        for item in job_overrides:
            values.setdefault(_split(item)[0], set())
    for job_overrides in overrides.values():
        given = dict(_split(item) for item in job_overrides)
        for key in values:
            values[key].add(given.get(key))
    return [key for key, seen in values.items() if len(seen) > 1]


def _split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def _lookup(summary: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = summary
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return ""
        value = value[key]
    return value


def _job_folders(sweep_dir: Path) -> list[Path]:
    jobs = [p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(jobs, key=lambda p: int(p.name))


def combine_sweep(sweep_dir: Path) -> Path:
    """Write sweep_summary.csv (one row per job) in the sweep folder and return its path."""
    rows = []
    job_overrides: dict[str, list[str]] = {}
    for job in _job_folders(sweep_dir):
        summary_path = job / "summary.json"
        overrides_path = job / ".hydra" / "overrides.yaml"
        overrides = yaml.safe_load(overrides_path.read_text()) if overrides_path.exists() else []
        overrides = [str(o) for o in overrides or [] if not str(o).startswith("hydra.")]
        job_overrides[job.name] = overrides
        row: dict[str, Any] = {"job": job.name, "overrides": " ".join(overrides), "status": "missing"}
        if summary_path.exists():
            summary = json.loads(summary_path.read_text())
            row["status"] = "ok"
            for column, path in HEADLINE_COLUMNS:
                row[column] = _lookup(summary, path)
            row["wall_s_without_generation"] = _wall_without_generation(summary)
        rows.append(row)
    swept = swept_keys(job_overrides)
    for row in rows:
        given = dict(_split(item) for item in job_overrides[row["job"]])
        row.update({key: given.get(key, "") for key in swept if key not in row})
    target = sweep_dir / "sweep_summary.csv"
    tmp = sweep_dir / "sweep_summary.csv.tmp"
    columns = [c for c, _ in HEADLINE_COLUMNS] + ["wall_s_without_generation"]
    with open(tmp, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=["job", "overrides", *[k for k in swept if k not in columns], "status", *columns])
        writer.writeheader()
        writer.writerows(rows)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, target)
    return target
