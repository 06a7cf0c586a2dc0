"""Is the storage the bottleneck? The read bandwidth training needs against what the storage gave.

An accelerator consumes one batch per step; to never wait, the storage must deliver every rank's
batch within one step's compute: required = ranks x batch x bytes per sample / compute per step.
The run's verdict (metrics/verdict.py) compares that with the delivered rate (bytes / slowest
rank's read time), so a user asking "is my storage fast enough for unet3d on 8 ranks?" reads one
line instead of doing the arithmetic. Plan mode uses the nominal sample size; a run uses the bytes the storage actually
moved per sample (headers, O_DIRECT blocks and compression included).
"""

from __future__ import annotations

from typing import Any

MIB = float(1 << 20)


def required_read_bandwidth(ranks: int, batch_size: int, bytes_per_sample: float, compute_s_per_step: float) -> dict[str, Any]:
    """The aggregate and per-rank read rate (MiB/s) that keeps every step's compute busy; None
    when no compute is emulated (then any storage rate bounds the run)."""
    per_rank_bytes_per_step = batch_size * bytes_per_sample
    per_rank = per_rank_bytes_per_step / compute_s_per_step / MIB if compute_s_per_step > 0 else None
    return {
        "ranks": ranks,
        "batch_size": batch_size,
        "bytes_per_sample": bytes_per_sample,
        "compute_s_per_step": compute_s_per_step,
        "required_mib_per_s": per_rank * ranks if per_rank is not None else None,
        "required_mib_per_s_per_rank": per_rank,
    }


def run_storage_section(train: dict[str, Any], world_size: int, config: Any, judged: dict[str, Any]) -> dict[str, Any]:
    """summary.json's `train.storage`: the requirement from the bytes the storage moved per
    sample in this run, the delivered rate, and the storage's side of the run's one verdict
    (`judged`, metrics/verdict.py)."""
    return {**run_requirement(train, world_size, config), "delivered_mib_per_s": train["read_mib_per_s"],
            "delivered_over_required": judged["delivered_over_required"], "storage_bound": judged["storage_bound"],
            "verdict": judged["storage_line"]}


def run_requirement(train: dict[str, Any], world_size: int, config: Any) -> dict[str, Any]:
    """The read rate this run needed, from the bytes the storage moved per sample."""
    bytes_per_sample = train["bytes_read"] / train["samples"] if train["samples"] else float(config.dataset.record_length_bytes)
    return required_read_bandwidth(world_size, config.reader.batch_size, bytes_per_sample, config.train.computation_time)
