"""mode=plan: size a job's checkpoints without MPI and without writing anything but plan.json.

A 1,024-rank llama3 1T job is planned on one core in well under a second: the ModelPlan keeps
one tensor list per model-parallel shard and applies the DP/ZeRO rule per rank on demand.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from dlio_ckpt.schema import RunConfig
from dlio_ckpt.metrics.bandwidth import required_read_bandwidth
from dlio_ckpt.metrics.report import log_report, plain_table
from dlio_ckpt.metrics.words import plural
from dlio_ckpt.plan.checkpoint import build_checkpoint_plan
from dlio_ckpt.plan.durability import resolve_durability

GIB = float(1 << 30)
MIB = float(1 << 20)


def plan_world_size(config: RunConfig) -> int:
    """world.size when given; else the workload's full job (TP x PP x DP when DP is fixed); else 1."""
    if config.world.size:
        return config.world.size
    par = config.model.parallelism
    if par.data:
        return par.tensor * par.pipeline * par.data
    return 1


def build_plan_report(config: RunConfig) -> dict:
    start = time.perf_counter()
    world = plan_world_size(config)
    plan = build_checkpoint_plan(config, world)
    model = plan.model
    per_rank = plan.per_rank_bytes()
    layout = plan.layout
    split = [layout.rank_bytes(model, r) for r in range(model.world_size)]
    step = max(config.checkpoint.steps_between_checkpoints, 1)
    commit = resolve_durability(config).commit
    flat = layout.flat(commit)  # straight in the checkpoint folder, numbered by the save (or the step)
    number = 1 if flat and config.checkpoint.flat_numbers == "counter" else step
    data_files, data_file_count, encoded_bytes = plan.files_summary(number, flat=flat)  # one walk over the ranks
    names = plan.names_with_metadata(number, data_files, manifest=commit)
    ck = config.checkpoint
    report = {
        "workload": config.workload,
        "world_size": world,
        "model": model.describe(),
        "checkpoint": {
            "enabled": ck.enabled,
            "strategy": ck.strategy,
            "layout": plan.layout_name,
            "format": plan.format_name,
            "total_bytes": plan.total_bytes,
            "total_gib": plan.total_bytes / GIB,
            "model_bytes": sum(m for m, _ in split),
            "optimizer_bytes": sum(o for _, o in split),
            "encoded_bytes": encoded_bytes,
            "per_rank_bytes": per_rank,
            "per_rank_model_bytes": [m for m, _ in split],
            "per_rank_optimizer_bytes": [o for _, o in split],
            "max_rank_bytes": max(per_rank) if per_rank else 0,
            "min_rank_bytes": min(per_rank) if per_rank else 0,
            "writing_ranks": sum(1 for b in per_rank if b),
            "data_files": data_file_count,
            "files": len(names),
            "file_names": names,
            "file_names_step": step,
            "unscaled_total_bytes": model.unscaled_total_bytes,
            "scale_factor": model.scale_factor,
        },
    }
    report["dataset"] = dataset_plan_figures(config, world)
    report["accelerator"] = config.accelerator or None  # None: the workload names none; its own figures
    report["au_target"] = config.metric.au
    report["plan_s"] = time.perf_counter() - start
    return report


def dataset_plan_figures(config: RunConfig, world: int) -> dict:
    """The dataset side of the plan: its nominal size, and the read bandwidth `world` ranks need
    to keep their compute busy (metrics/bandwidth.py), from the nominal sample size."""
    ds = config.dataset
    need = required_read_bandwidth(world, config.reader.batch_size, ds.record_length_bytes, config.train.computation_time)
    return {
        "format": ds.format,
        "files_train": ds.num_files_train,
        "samples_per_file": ds.num_samples_per_file,
        "bytes": ds.num_files_train * ds.num_samples_per_file * ds.record_length_bytes,
        **need,
    }


def _dataset_rows(data: dict) -> list[tuple[str, str]]:
    rows = [("dataset", f"{data['files_train']:,} files x {data['samples_per_file']:,} samples x "
                        f"{data['bytes_per_sample'] / MIB:.3f} MiB = {data['bytes'] / GIB:.2f} GiB ({data['format']}, nominal)")]
    need = data["required_mib_per_s"]
    rows.append(("dataset read needed", "unbounded: no compute is emulated (train.computation_time=0)" if need is None else
                 f"{need:.1f} MiB/s ({data['required_mib_per_s_per_rank']:.1f} per rank) = {plural(data['ranks'], 'rank')} x "
                 f"batch {data['batch_size']} x {data['bytes_per_sample'] / MIB:.3f} MiB / {data['compute_s_per_step']:.3f} s compute per step"))
    return rows


def _accelerator_rows(report: dict) -> list[tuple[str, str]]:
    """Which accelerator the compute time and batch size stand for, and the AU a run must reach:
    a plan's read requirement means nothing without them."""
    data = report["dataset"]
    name = report["accelerator"]
    figures = f"{data['compute_s_per_step']:.3f} s compute per step, batch {data['batch_size']}"
    return [("accelerator", f"{name}: {figures} (accelerator=NAME picks another of the workload's)" if name
             else f"none named: the workload's own figures, {figures}"),
            ("AU target", f"{report['au_target']:.2f} (metric.au): a run meets it when compute / training wall time "
                          "reaches it")]


def _table(report: dict) -> str:
    m, c = report["model"], report["checkpoint"]
    rows = [
        ("workload", report["workload"]),
        ("ranks (TP x PP x DP)", f"{report['world_size']} ({m['tensor_parallel']} x {m['pipeline_parallel']} x {m['data_parallel']}), ZeRO {m['zero_stage']}"
         + (" subset" if m["subset"] else "") + (", every replica writes its copy (checkpoint.replicas=all)" if m["replicas"] == "all" else "")),
        ("parameters", f"{m['parameters']:,}" if m["parameters"] else "explicit sizes"),
        *([] if report["checkpoint"]["enabled"] else
          [("checkpointing", "off in this workload (checkpoint.enabled=false): the sizes below are what it would write")]),
        ("checkpoint total", f"{c['total_gib']:.2f} GiB  (model {c['model_bytes'] / GIB:.2f} / optimizer {c['optimizer_bytes'] / GIB:.2f})"),
        ("per rank", f"max {c['max_rank_bytes'] / GIB:.3f} GiB, min {c['min_rank_bytes'] / GIB:.3f} GiB, "
                     f"{plural(c['writing_ranks'], 'rank')} write{'s' if c['writing_ranks'] == 1 else ''}"),
        ("files", f"{c['files']} ({c['data_files']} data) in layout {c['layout']}, format {c['format']}"),
    ]
    if m["scale_factor"] != 1.0:
        rows.append(("scaled from", f"{m['unscaled_total_bytes'] / GIB:.2f} GiB (factor {m['scale_factor']:.3g})"
                     + (", one copy of the state: the replicas' copies come on top" if m["replicas"] == "all" else "")))
    rows += _accelerator_rows(report)
    rows += _dataset_rows(report["dataset"])
    rows.append(("planned in", f"{report['plan_s']:.3f} s"))
    return plain_table(rows)


def run_plan_mode(config: RunConfig, run_dir: Path) -> dict:
    report = build_plan_report(config)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / "plan.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(target)
    table = _table(report)
    log_report(table)
    print(table, flush=True)
    return report
