"""Weak scaling: per-rank and aggregate bandwidth against the number of ranks, from several runs.

MPI fixes a job's world size at launch (`mpirun -np N`), so a scaling study is several runs (or
several sweeps) of one configuration at different N. This reads their summary.json files and puts
one row per (configuration, ranks): the aggregate bandwidth is what the run reported (all ranks'
bytes over the slowest rank's time), the per-rank bandwidth is that divided by the ranks, and the
efficiency is per-rank bandwidth relative to the smallest run of the same configuration (1.0 =
perfect weak scaling: every added rank brings the same bandwidth).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from dlio_ckpt.analysis.inputs import is_run_folder, is_sweep_folder
from dlio_ckpt.analysis.run_folders import read_summary
from dlio_ckpt.analysis.run_inputs import checked_summary
from dlio_ckpt.errors import UserError

MIB = 1 << 20
GIB = 1 << 30
# Overrides that name where a run went, not what it did: never part of a configuration's label.
_PLACE_KEYS = ("storage.root=", "hydra.", "checkpoint.restore_from=")


def run_folders(paths: list[Path]) -> list[Path]:
    """Every run folder among `paths`: a run folder itself, or the job folders of a sweep."""
    folders: list[Path] = []
    for path in paths:
        if is_run_folder(path):
            folders.append(path)
        elif is_sweep_folder(path) or path.is_dir():
            jobs = sorted((p for p in path.iterdir() if is_run_folder(p)), key=lambda p: (len(p.name), p.name))
            if not jobs:
                raise UserError(f"{path}: holds no run folder (summary.json); --scaling takes run folders or sweep folders")
            folders.extend(jobs)
        else:
            raise UserError(f"{path}: not a run folder (summary.json) or a sweep folder; --scaling takes those")
    return folders


def _overrides(folder: Path) -> list[str]:
    path = folder / ".hydra" / "overrides.yaml"
    try:
        listed = yaml.safe_load(path.read_text()) if path.is_file() else []
    except (OSError, yaml.YAMLError):
        listed = []
    return [str(o) for o in listed or [] if not str(o).startswith(_PLACE_KEYS)]


def _rate(bytes_moved: Any, seconds: Any, unit: int) -> float | None:
    if not bytes_moved or not seconds:
        return None
    return float(bytes_moved) / float(seconds) / unit


def scaling_point(folder: Path) -> dict[str, Any]:
    """One run's ranks and bandwidths, from its summary.json."""
    summary = checked_summary(read_summary(folder), folder / "summary.json")
    ranks = int(summary.get("world_size") or 1)
    train = summary.get("train") or {}
    checkpoint = summary.get("checkpoint") or {}
    read = _rate(train.get("bytes_read"), train.get("read_s_max"), MIB)
    write = checkpoint.get("write_gib_per_s") or None
    return {
        "run": str(folder),
        "workload": summary.get("workload"),
        "overrides": _overrides(folder),
        "ranks": ranks,
        "hosts": len(set(summary.get("hostnames") or [])) or None,
        "read_mib_per_s": read,
        "read_mib_per_s_per_rank": read / ranks if read else None,
        "checkpoint_write_gib_per_s": write,
        "checkpoint_write_gib_per_s_per_rank": write / ranks if write else None,
    }


def keys_that_follow_ranks(points: list[dict[str, Any]]) -> set[str]:
    """Override keys whose value is fixed by the rank count (dataset.num_files_train=8*N in a weak-scaling
    study): they scale the work with the ranks, so they belong to the scaling, not to the configuration."""
    values: dict[str, dict[int, set[str]]] = {}
    for point in points:
        for override in point["overrides"]:
            key, _, value = override.partition("=")
            values.setdefault(key, {}).setdefault(point["ranks"], set()).add(value)
    return {key for key, by_ranks in values.items()
            if len(by_ranks) > 1 and all(len(v) == 1 for v in by_ranks.values())
            and len(set().union(*by_ranks.values())) > 1}


def weak_scaling(paths: list[Path]) -> list[dict[str, Any]]:
    """Rows sorted by configuration then ranks, each with its efficiency against the smallest run."""
    points = [scaling_point(folder) for folder in run_folders(paths)]
    if not points:
        raise UserError("--scaling found no runs")
    follows_ranks = keys_that_follow_ranks(points)
    common = set.intersection(*(set(p["overrides"]) for p in points))
    for point in points:
        varied = [o for o in point["overrides"] if o not in common and o.split("=", 1)[0] not in follows_ranks]
        point["configuration"] = " ".join([str(point["workload"])] + varied)
    points.sort(key=lambda p: (p["configuration"], p["ranks"]))
    base: dict[str, dict[str, Any]] = {}
    for point in points:
        first = base.setdefault(point["configuration"], point)
        for kind in ("read_mib_per_s", "checkpoint_write_gib_per_s"):
            here, there = point[f"{kind}_per_rank"], first[f"{kind}_per_rank"]
            point[f"{kind}_efficiency"] = here / there if here and there else None
    return points


def _cell(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table (it reads as plain text in a terminal too)."""
    header = ("| configuration | ranks | hosts | read MiB/s | read MiB/s per rank | read efficiency "
              "| ckpt write GiB/s | ckpt GiB/s per rank | ckpt efficiency |")
    lines = [header, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['configuration']} | {r['ranks']} | {r['hosts'] or '-'} | {_cell(r['read_mib_per_s'], 1)} "
            f"| {_cell(r['read_mib_per_s_per_rank'], 1)} | {_cell(r['read_mib_per_s_efficiency'], 2)} "
            f"| {_cell(r['checkpoint_write_gib_per_s'], 3)} | {_cell(r['checkpoint_write_gib_per_s_per_rank'], 3)} "
            f"| {_cell(r['checkpoint_write_gib_per_s_efficiency'], 2)} |"
        )
    return "\n".join(lines)
