"""Is the storage the bottleneck? The read bandwidth training needs against what the storage gave.

An accelerator consumes one batch per step; to never wait, the storage must deliver every rank's
batch within one step's compute: required = ranks x batch x bytes per sample / compute per step.
The verdict compares that with the delivered rate (bytes / slowest rank's read time), so a user
asking "is my storage fast enough for unet3d on 8 ranks?" reads one line instead of doing the
arithmetic. Plan mode uses the nominal sample size; a run uses the bytes the storage actually
moved per sample (headers, O_DIRECT blocks and compression included).
"""

from __future__ import annotations

from typing import Any

MIB = float(1 << 20)
# Within this factor of the requirement the run is called borderline, not bound or free.
MARGIN = 1.1
# A run fast enough on storage that still waited this share of its time for data is told why.
WAITING_SHARE = 0.1


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


def storage_verdict(required_mib_per_s: float | None, delivered_mib_per_s: float | None,
                    waiting_share: float | None = None) -> dict[str, Any]:
    """`storage_bound` (None when it cannot be judged), delivered / required, and one line saying
    it. `waiting_share` (the share of training time spent waiting for data) lets a run whose
    storage was fast enough still say that something else in the input path made it wait."""
    if required_mib_per_s is None:
        return {"delivered_mib_per_s": delivered_mib_per_s, "delivered_over_required": None, "storage_bound": None,
                "verdict": "cannot judge: no compute is emulated (train.computation_time=0), so any storage rate "
                           "bounds this run"}
    if delivered_mib_per_s is None:
        return {"delivered_mib_per_s": None, "delivered_over_required": None, "storage_bound": None,
                "verdict": f"cannot judge: no read time was measured (needs {required_mib_per_s:.1f} MiB/s)"}
    ratio = delivered_mib_per_s / required_mib_per_s if required_mib_per_s > 0 else float("inf")
    figures = f"delivered {delivered_mib_per_s:.1f} MiB/s, required {required_mib_per_s:.1f} MiB/s"
    if ratio < 1.0:
        verdict = (f"storage-bound: {figures} ({ratio:.2f}x; the storage would need "
                   f"{1 / ratio:.1f}x its rate to keep the accelerators busy)")
    elif ratio < MARGIN:
        verdict = f"borderline: {figures} ({ratio:.2f}x, within {MARGIN - 1:.0%} of the requirement)"
    else:
        verdict = f"not storage-bound: {figures} ({ratio:.1f}x the requirement)"
        if waiting_share is not None and waiting_share >= WAITING_SHARE:
            verdict += (f", yet training waited for data {waiting_share:.0%} of its time: the input pipeline "
                        "(reader threads, prefetch, decoding) or the start-up of a short run limits it, not the storage")
    return {"delivered_mib_per_s": delivered_mib_per_s, "delivered_over_required": ratio, "storage_bound": ratio < 1.0,
            "verdict": verdict}


def run_storage_section(train: dict[str, Any], world_size: int, config: Any) -> dict[str, Any]:
    """summary.json's `train.storage`: the requirement from the bytes the storage moved per
    sample in this run, and the verdict against the delivered read rate."""
    bytes_per_sample = train["bytes_read"] / train["samples"] if train["samples"] else float(config.dataset.record_length_bytes)
    need = required_read_bandwidth(world_size, config.reader.batch_size, bytes_per_sample, config.train.computation_time)
    waiting = train["time_shares"]["reading"]
    return {**need, **storage_verdict(need["required_mib_per_s"], train["read_mib_per_s"], waiting)}


def page_cache_meaning(storage: dict[str, Any]) -> str:
    """What the verdict means when reads may have come from the page cache."""
    if storage.get("storage_bound") is False:
        return ("the 'not storage-bound' verdict may reflect memory, not the storage: a dataset that does not "
                "fit in memory could be slower")
    if storage.get("storage_bound") is True:
        return ("the reads were too slow even if the page cache served them: the reader (threads, decoding) "
                "limits this run, and storage slower than memory would only add to it")
    return "the delivered rate may be the page cache's"
