"""The phases of a training run: generate (or reuse) the dataset, train with checkpoints, restore."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import psutil

from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.checkpoint.base import NoCheckpoints
from dlio_ckpt.checkpoint.registry import strategy_declares
from dlio_ckpt.checkpoint.levels_report import levels_summary
from dlio_ckpt.checkpoint.report import checkpoint_summary
from dlio_ckpt.engine.context import RunContext
from dlio_ckpt.engine.generate import ensure_dataset, format_options
from dlio_ckpt.engine.ownership import DatasetLease
from dlio_ckpt.engine.page_cache import drop_page_cache
from dlio_ckpt.engine.train import run_training
from dlio_ckpt.faults import fault_point
from dlio_ckpt.formats import get_format
from dlio_ckpt.metrics import summary as summaries
from dlio_ckpt.metrics.goodput import FAILURE_SECTIONS, failure_section
from dlio_ckpt.plan.dataset import plan_dataset
from dlio_ckpt.plan.layouts import writing_ranks

GIB = float(1 << 30)


def page_cache_warning(dataset_bytes: int, direct_io: bool, dropped: bool) -> str | None:
    """Reads of a dataset that fits in free memory may measure the page cache, not the storage."""
    if direct_io or dropped:
        return None
    available = psutil.virtual_memory().available
    if dataset_bytes >= available:
        return None
    return (
        f"the dataset ({dataset_bytes / GIB:.2f} GiB) fits in available memory ({available / GIB:.1f} GiB): "
        "reads may be served from the page cache; use storage.direct_io=true, storage.drop_caches=true (root), "
        "or a dataset larger than memory"
    )


def make_checkpoints(ctx: RunContext) -> Any:
    if not ctx.config.checkpoint.enabled:
        return NoCheckpoints()

    return make_checkpoint_engine(ctx)


def single_writer_note(ctx: RunContext, checkpoints: Any) -> str | None:
    """Say when a parallel strategy ends up with one writer, or single_writer has no one to gather
    from, which the config makes easy to miss (a serial strategy sweep compares nothing)."""
    strategy = ctx.config.checkpoint.strategy
    if ctx.world.size == 1 and ctx.config.checkpoint.enabled and strategy_declares(strategy, "gathers_to_one_writer"):
        return (f"checkpoint.strategy={strategy} on 1 rank: there is nothing to gather, so it writes as sharded does; "
                "run it under mpirun -np N (N >= 2) to measure the single-writer bottleneck")
    plan = getattr(checkpoints, "plan", None)
    if plan is None or ctx.world.size < 2 or strategy_declares(strategy, "gathers_to_one_writer"):
        return None

    writers = int(writing_ranks(plan.model).sum())  # not every rank's file list: that is N^2 over the job
    if writers != 1:
        return None
    return (
        f"checkpoint.strategy={ctx.config.checkpoint.strategy}, but only one of {ctx.world.size} ranks writes: "
        "data-parallel replicas hold the same state and, at model.parallelism.zero_stage=0, only the first writes it; "
        "set model.parallelism.zero_stage>=1 (optimizer state sharded over ranks) or tensor/pipeline parallelism to spread the writes, "
        "or checkpoint.replicas=all for every replica to write its own copy"
    )


def run_length_notes(config: Any, steps: int, epochs: int, wall_s: float, failures: int, checkpoints: int) -> list[str | None]:
    """Say when the run was too short for what the config asks of it: an MTBF longer than the
    training run injects nothing, and a checkpoint interval longer than the run writes at most
    the end-of-epoch checkpoints, so a sweep over either compares runs that did the same thing."""
    mtbf_s = config.failures.mtbf_s
    notes: list[str | None] = []
    if mtbf_s > 0 and not config.failures.at_steps and failures == 0 and wall_s < mtbf_s:
        notes.append(f"failures.mtbf_s={mtbf_s:g} is longer than the training run ({wall_s:.2f} s): no failure struck; "
                     "lower failures.mtbf_s or run longer (train.epochs, scale=) to see failures and lost work")
    every = config.checkpoint.steps_between_checkpoints
    per_epoch = config.train.step_counting == "dlio"  # DLIO counts the interval within each epoch
    span = steps // max(epochs, 1) if per_epoch else steps
    if config.checkpoint.enabled and every > 0 and every >= span:
        where = f"an epoch ({span} steps)" if per_epoch else f"the run ({steps} steps)"
        notes.append(f"checkpoint.steps_between_checkpoints={every} is not shorter than {where}: "
                     f"{checkpoints} checkpoint(s) written; lower it or run longer for the interval to matter")
    return notes


def run_training_phases(ctx: RunContext) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Returns (summary sections, this rank's figures, warnings). The dataset's lease is held
    throughout, so `dlio_ckpt clean` of another run never deletes it under this one."""
    fmt = get_format(ctx.config.dataset.format)
    plan = plan_dataset(ctx.config, fmt.extension)
    lease = DatasetLease(ctx.storage.inner, plan.folder, ctx.world.is_root)
    lease.take()  # an existing dataset: before it is checked for reuse
    try:
        return _phases(ctx, fmt, plan, lease)
    finally:
        lease.release()


def _phases(ctx: RunContext, fmt: Any, plan: Any, lease: DatasetLease) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    config, world = ctx.config, ctx.world
    options = format_options(ctx)
    generated = ensure_dataset(ctx, plan, fmt)
    lease.take()  # a dataset generated now
    warnings: list[str] = []
    sections: dict[str, Any] = {}
    dropped = False
    if config.storage.drop_caches:
        failure = drop_page_cache()
        dropped = failure is None
        if failure:
            warnings.append(failure)
    world.barrier()
    fault_point("train", world.rank)
    if config.mode == "generate":
        local: dict[str, Any] = {}
    else:
        checkpoints = make_checkpoints(ctx)
        note = single_writer_note(ctx, checkpoints)
        if note:
            warnings.append(note)
        result = run_training(ctx, plan, fmt, options, checkpoints)
        warnings.extend(note for note in run_length_notes(config, result.steps, result.epochs, result.wall_s,
                                                          len(result.restarts), len(checkpoints.records)) if note)
        restore = checkpoints.restore() if config.checkpoint.enabled and config.checkpoint.restore else None
        local = {
            "train": True,
            "epochs": result.epochs,
            "steps": result.steps,
            "samples": result.samples,
            "payload_bytes": result.payload_bytes,
            "compute_s": result.compute_s,
            "data_wait_s": result.data_wait_s,
            "sync_wait_s": result.sync_wait_s,
            "train_wall_s": result.wall_s,
            "au_compute_s": result.au_blocks.compute_s,
            "au_wall_s": result.au_blocks.wall_s,
            "au_blocks": result.au_blocks.blocks,
            "au_block_steps": result.au_blocks.steps,
            "checkpoint_s": result.checkpoint_s,
            "eval_samples": result.eval_samples,
            "eval_wall_s": result.eval_wall_s,
            "checkpoints": [record.as_dict() for record in checkpoints.records],
            "restore": restore.as_dict() if restore is not None else None,
            "levels": checkpoints.level_report() if hasattr(checkpoints, "level_report") else None,
            "ledger": result.ledger.figures(),
            "restarts": result.restarts,
            "policy": result.policy,
            "resume": result.resume,
            "step_s_mean": result.ledger.step_s_mean,
            "loader": result.loader,
        }
        for key in FAILURE_SECTIONS:  # goodput, where the time went, failures, resume (metrics/goodput.py)
            sections[key] = partial(failure_section, key)
        if config.checkpoint.enabled:
            sections["checkpoint"] = _checkpoint_section(config)
    cached_locally = ctx.storage.capabilities.local_paths  # an object store's reads do not pass this host's page cache
    cache_note = page_cache_warning(generated.bytes_on_disk, config.storage.direct_io, dropped) if cached_locally else None
    if cache_note and config.mode != "generate":
        warnings.append(cache_note)
    dataset = {
        "folder": plan.folder,
        "format": fmt.name,
        "files_train": len(plan.train),
        "files_eval": len(plan.eval),
        "samples_train": plan.train_samples,
        "bytes_on_disk": generated.bytes_on_disk,
        "reused": generated.reused,
        "generate_s": generated.seconds,
        "page_cache_risk": cache_note is not None,
    }
    sections["dataset"] = partial(summaries.dataset_section, dataset)  # byte counts come from every rank's events
    return sections, local, warnings


def _checkpoint_section(config: Any) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """Built on rank 0 once every rank's checkpoint records are gathered (training wall time:
    the slowest rank's, from the gathered records)."""

    def build(everyone: list[dict[str, Any]]) -> dict[str, Any]:
        wall = max(r["train_wall_s"] for r in everyone)
        summary = checkpoint_summary([r["checkpoints"] for r in everyone], [r["restore"] for r in everyone], wall, config)
        if config.checkpoint.levels:
            summary["levels"] = levels_summary([r.get("levels") for r in everyone])
        summary["policy"] = everyone[0]["policy"]  # every rank derives the same interval from the same numbers
        return summary

    return build
