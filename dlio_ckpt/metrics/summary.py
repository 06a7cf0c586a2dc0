"""Reduce every rank's figures into summary.json (schema in docs/summary-schema.md).

Only this module and the checkpoint report decide how per-rank numbers combine: bytes add up,
durations take the slowest rank, rates are derived from those (never averaged themselves).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from dlio_ckpt import __version__
from dlio_ckpt.metrics import bandwidth, utilisation, verdict
from dlio_ckpt.metrics.loader import loader_section
from dlio_ckpt.metrics.timing import EventBlocks, UnionLength, as_blocks
from dlio_ckpt.storage.events import OP_CODE, PHASE_CODE, PHASES, totals_by_phase

SCHEMA_VERSION = 2  # 2: figures redefined by issue 7 (docs/summary-schema.md)
MIB = float(1 << 20)
GIB = float(1 << 30)


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


def _rate_or_none(nbytes: float, seconds: float) -> float | None:
    """MiB/s, or None when no time was measured (a rate of 0 would claim the storage was idle)."""
    return nbytes / seconds / MIB if seconds > 0 else None


def _phase(rank: dict[str, Any], phase: str, figure: str) -> float:
    """One rank's figure of one phase (its io entry), 0 when the phase did no I/O."""
    return rank["io"].get(phase, {}).get(figure, 0)


def rank_io(events: np.ndarray | EventBlocks) -> dict[str, dict[str, float]]:
    """One rank's figures per phase, all derived from its events (one array, or blocks as the
    recorder gives them back: added up block by block): bytes and calls as the tracer counted
    them, and overlap-free read and write (+fsync) time."""
    totals: dict[str, dict[str, int]] = {}
    busy: dict[tuple[str, str], UnionLength] = {}
    for rows, later_start in as_blocks(events):
        for phase, figures in totals_by_phase(rows).items():
            total = totals.setdefault(phase, dict.fromkeys(figures, 0))
            for key, value in figures.items():
                total[key] += value
        for phase in PHASES:
            for kind, ops in (("read_s", ("read",)), ("write_s", ("write", "fsync"))):
                mask = (rows["phase"] == PHASE_CODE[phase]) & np.isin(rows["op"], [OP_CODE[o] for o in ops])
                if mask.any() or (phase, kind) in busy:
                    busy.setdefault((phase, kind), UnionLength()).add(rows["start"][mask], rows["end"][mask], later_start)
    return {phase: {**totals[phase],
                    **{kind: busy[(phase, kind)].seconds() if (phase, kind) in busy else 0.0 for kind in ("read_s", "write_s")}}
            for phase in PHASES if phase in totals}


def io_section(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    phases: dict[str, dict[str, float]] = {}
    for rank in ranks:
        for phase, figures in rank["io"].items():
            total = phases.setdefault(phase, {"bytes_read": 0, "bytes_written": 0, "reads": 0, "writes": 0,
                                              "read_s": 0.0, "write_s": 0.0, "ops": 0})
            for key in total:
                total[key] += figures[key]
    return {
        "bytes_read": int(sum(p["bytes_read"] for p in phases.values())),
        "bytes_written": int(sum(p["bytes_written"] for p in phases.values())),
        "by_phase": phases,
    }


def dataset_section(dataset: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The dataset's figures, with what generation wrote as the tracer counted it on every rank
    (dataset files and the dataset manifest; 0 when the dataset was reused)."""
    return {**dataset, "generate_bytes_written": int(sum(_phase(r, "generate", "bytes_written") for r in ranks))}


def train_section(ranks: list[dict[str, Any]], config: Any, page_cache_risk: bool = False) -> dict[str, Any]:
    """The training figures and the run's one verdict (metrics/verdict.py), judged here once;
    `page_cache_risk` (the dataset fits in free memory) is part of the evidence."""
    bytes_read = sum(_phase(r, "train", "bytes_read") for r in ranks)
    read_s_max = max(_phase(r, "train", "read_s") for r in ranks)
    wall_s = max(r["train_wall_s"] for r in ranks)
    samples = sum(r["samples"] for r in ranks)
    # DLIO leaves each block's first step out; a run too short for that falls back to the
    # plain ratio of compute to wall time, and says so.
    measurable = all(r["au_wall_s"] > 0 for r in ranks)
    au_per_rank = [
        _ratio(r["au_compute_s"], r["au_wall_s"]) if measurable else _ratio(r["compute_s"], r["train_wall_s"]) for r in ranks
    ]
    au = sum(au_per_rank) / len(au_per_rank)
    au_overall = sum(_ratio(r["compute_s"], r["train_wall_s"]) for r in ranks) / len(ranks)
    # DLIO's throughput: per rank samples / wall without checkpoint time, summed; its "I/O MB/s"
    # multiplies that by the nominal record length.
    dlio_samples_per_s = sum(_ratio(r["samples"], r["train_wall_s"] - r["checkpoint_s"]) for r in ranks)
    section = {
        "epochs": max(r["epochs"] for r in ranks),
        "steps": max(r["steps"] for r in ranks),
        "steps_per_rank": [r["steps"] for r in ranks],
        "samples": samples,
        "samples_per_s": _ratio(samples, wall_s),
        "bytes_read": int(bytes_read),
        "reads": int(sum(_phase(r, "train", "reads") for r in ranks)),
        "read_s_max": read_s_max,
        "read_mib_per_s": _rate_or_none(bytes_read, read_s_max),
        "payload_bytes": int(sum(r["payload_bytes"] for r in ranks)),
        "wall_s": wall_s,
        "compute_s": max(r["compute_s"] for r in ranks),
        "data_wait_s": max(r["data_wait_s"] for r in ranks),
        "sync_wait_s": max(r.get("sync_wait_s", 0.0) for r in ranks),  # train.gradient_sync: of compute_s, the longest wait
        "time_shares": utilisation.time_shares(ranks),
        "au": au,
        "au_per_rank": au_per_rank,
        "au_method": "dlio_blocks" if measurable else "compute_over_wall",
        "au_blocks": sum(r["au_blocks"] for r in ranks),
        "au_steps_per_block": utilisation.steps_per_block(ranks),
        "au_overall": au_overall,
        "au_target": config.metric.au,
        "dlio_samples_per_s": dlio_samples_per_s,
        "dlio_io_mib_per_s_nominal": dlio_samples_per_s * config.dataset.record_length_bytes / MIB,
        "checkpoint_s_in_loop": max(r["checkpoint_s"] for r in ranks),
        "step_s_mean": max(r.get("step_s_mean", 0.0) for r in ranks),  # iteration time: compute and data wait, slowest rank
    }
    need = bandwidth.run_requirement(section, len(ranks), config)
    shares = section["time_shares"]
    judged = verdict.judge(verdict.Evidence(
        fewest_steps=min(r["steps"] for r in ranks), au_overall=au_overall, au_target=config.metric.au,
        required_mib_per_s=need["required_mib_per_s"], delivered_mib_per_s=section["read_mib_per_s"],
        data_wait_share=shares["reading"], checkpoint_share=shares["checkpointing"], page_cache_risk=page_cache_risk))
    section.update({key: judged[key] for key in ("au_target_met", "au_verdict", "au_verdict_reason")})
    section["run_verdict"] = {key: judged[key] for key in ("verdict", "limited_by", "line")}
    section["storage"] = bandwidth.run_storage_section(section, len(ranks), config, judged)
    section["loader"] = loader_section(ranks)
    return section


def eval_section(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    bytes_read = sum(_phase(r, "eval", "bytes_read") for r in ranks)
    return {
        "samples": sum(r["eval_samples"] for r in ranks),
        "bytes_read": int(bytes_read),
        "wall_s": max(r["eval_wall_s"] for r in ranks),
        "read_mib_per_s": _rate_or_none(bytes_read, max(_phase(r, "eval", "read_s") for r in ranks)),
    }


def rank_rows(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per rank: what it moved in every phase, and its training figures when it trained."""
    rows = []
    for rank in ranks:
        row = {
            "rank": rank["rank"],
            "hostname": rank["hostname"],
            "bytes_read": int(sum(p["bytes_read"] for p in rank["io"].values())),
            "bytes_written": int(sum(p["bytes_written"] for p in rank["io"].values())),
            "read_s": float(sum(p["read_s"] for p in rank["io"].values())),
            "write_s": float(sum(p["write_s"] for p in rank["io"].values())),
            "peak_rss_bytes": rank["peak_rss_bytes"],
        }
        if "train" in rank:
            row.update(samples=rank["samples"], steps=rank["steps"], train_bytes_read=int(_phase(rank, "train", "bytes_read")),
                       train_read_s=_phase(rank, "train", "read_s"), train_wall_s=rank["train_wall_s"],
                       data_wait_s=rank["data_wait_s"], sync_wait_s=rank.get("sync_wait_s", 0.0))
        rows.append(row)
    return rows


def write_summary(run_dir: Path, summary: dict[str, Any]) -> Path:
    """summary.json under a temporary name, fsync, rename."""
    target = run_dir / "summary.json"
    tmp = run_dir / "summary.json.tmp"
    with open(tmp, "w") as out:
        json.dump(summary, out, indent=2, default=_jsonable)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, target)
    return target


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def header(config: Any, world_size: int, hostnames: list[str], run_dir: Path, started_at: str, wall_s: float) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "dlio_ckpt",
        "tool_version": __version__,
        "workload": config.workload,
        "mode": config.mode,
        "world_size": world_size,
        "hostnames": hostnames,
        "run_dir": str(run_dir),
        "config_file": ".hydra/config.yaml" if (run_dir / ".hydra" / "config.yaml").exists() else None,
        "started_at": started_at,
        "wall_s": wall_s,
    }
