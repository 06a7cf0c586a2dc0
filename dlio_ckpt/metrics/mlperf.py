"""MLPerf Storage's and DLIO's figures, computed and worded as they compute and word them.

MLPerf Storage runs DLIO. DLIO (dlio_benchmark/utils/statscounter.py, end_save_ckpt) gives each
rank's checkpoint throughput as the *whole* checkpoint's size (its `checkpoint_size`, summed over
ranks with an allreduce in checkpointing/base_checkpointing.py) divided by *that rank's* duration,
in "GB" of 1024^3 bytes; MLPerf Storage's rules (Submission_guidelines.md 2.2.3) then take the
maximum duration and the minimum throughput over ranks. The minimum of whole / duration_r is
whole / max(duration_r): a checkpoint's throughput is all ranks' bytes over the slowest rank's
time. DLIO then reports the mean and the population standard deviation (np.mean, np.std) of the
per-checkpoint figures: rates are averaged here because DLIO averages them.

Users paste these figures beside published results and feed run folders to DLIO's and
mlpstorage's post-processing, so `dlio_metric` writes DLIO's summary.json `metric` keys and
`metric_block` prints DLIO's `[METRIC]` lines character for character (the f-strings of
StatsCounter.end_run).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

GIB = float(1 << 30)  # DLIO's "GB"
MIB = float(1 << 20)  # DLIO's "MB"
RULE = ("per checkpoint: duration = the slowest rank's; throughput = the whole checkpoint's bytes / each rank's "
        "duration, min over ranks = all bytes / the slowest rank's duration (DLIO, MLPerf Storage); GB = 2^30 bytes")
RULER = "[METRIC] =========================================================="


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and population standard deviation (np.mean, np.std as DLIO calls them); None for none."""
    if not values:
        return None, None
    return float(np.mean(values)), float(np.std(values))


def checkpoint_rates(rows: list[dict[str, Any]], duration_key: str) -> list[float]:
    """Each checkpoint's MLPerf throughput in GiB/s: its bytes over all ranks / the slowest rank's duration."""
    return [r["bytes"] / GIB / r[duration_key] if r[duration_key] > 0 else 0.0 for r in rows]


def mlperf_figures(per_checkpoint: list[dict[str, Any]], per_read: list[dict[str, Any]]) -> dict[str, Any]:
    """Save and load duration (s) and throughput (GiB/s, DLIO's "GB/s") as mean and std, with counts."""
    figures: dict[str, Any] = {}
    for kind, rows, duration_key in (("write", per_checkpoint, "write_s_max"), ("read", per_read, "read_s_max")):
        rates = checkpoint_rates(rows, duration_key)
        figures[f"{kind}s"] = len(rows)
        figures[f"{kind}_duration_s_mean"], figures[f"{kind}_duration_s_std"] = _mean_std([r[duration_key] for r in rows])
        figures[f"{kind}_throughput_gib_per_s_mean"], figures[f"{kind}_throughput_gib_per_s_std"] = _mean_std(rates)
        figures[f"{kind}_throughput_gib_per_s_each"] = rates
    return figures


def mlperf_rows(checkpoint: dict[str, Any]) -> list[tuple[str, str]]:
    """The printed rows MLPerf Storage users expect, from summary.json's checkpoint section."""
    figures = checkpoint.get("mlperf", {})
    rows = []
    distinct = len({r.get("step") for r in checkpoint.get("per_read", [])})
    for kind, label, noun in (("write", "save (MLPerf)", "write"), ("read", "load (MLPerf)", "read")):
        count = figures.get(f"{kind}s")
        if not count or figures.get(f"{kind}_duration_s_mean") is None:
            continue
        repeated = ""
        if kind == "read" and distinct < count:
            repeated = (f", of {distinct} distinct checkpoint{'s' if distinct != 1 else ''} (checkpoint.keep_last kept "
                        "only those; keep_last=0 reads each one written, as MLPerf does)")
        rows.append((label, (
            f"duration {figures[f'{kind}_duration_s_mean']:.3f} ({figures[f'{kind}_duration_s_std']:.3f}) s, "
            f"throughput {figures[f'{kind}_throughput_gib_per_s_mean']:.3f} ({figures[f'{kind}_throughput_gib_per_s_std']:.3f}) GiB/s"
            f" (DLIO's GB/s), mean (std) over {count} {noun}{'s' if count != 1 else ''}{repeated}")))
    if rows:
        rows.append(("MLPerf rule", figures.get("rule", RULE)))
        cache = checkpoint.get("page_cache_drop", "not requested")
        rows.append(("page cache", "dropped before the reads" if cache == "dropped" else f"not dropped ({cache})"))
    return rows


def _checkpoint_metric(checkpoints: list[dict[str, Any]]) -> dict[str, Any]:
    """DLIO's save/load keys over every checkpoint written and read (all repeats together, as DLIO
    pools every save of a run)."""
    saves = [c for ck in checkpoints for c in ck.get("per_checkpoint", [])]
    loads = [r for ck in checkpoints for r in ck.get("per_read", [])]
    metric: dict[str, Any] = {}
    if saves:
        io, duration = checkpoint_rates(saves, "write_s_max"), [c["write_s_max"] for c in saves]
        metric["save_checkpoint_io_mean_GB_per_second"], metric["save_checkpoint_io_stdev_GB_per_second"] = _mean_std(io)
        metric["save_checkpoint_duration_mean_seconds"], metric["save_checkpoint_duration_stdev_seconds"] = _mean_std(duration)
    if loads:
        io, duration = checkpoint_rates(loads, "read_s_max"), [r["read_s_max"] for r in loads]
        metric["load_checkpoint_io_mean_GB_per_second"], metric["load_checkpoint_io_stdev_GB_per_second"] = _mean_std(io)
        metric["load_checkpoint_duration_mean_seconds"], metric["load_checkpoint_duration_stdev_seconds"] = _mean_std(duration)
    if saves or loads:
        sizes = [c["bytes"] for c in saves] or [r["bytes"] for r in loads]
        metric["checkpoint_size_GB"] = float(np.mean(sizes)) / GIB
    return metric


def _train_metric(trains: list[dict[str, Any]], record_length_bytes: int) -> dict[str, Any]:
    """DLIO's training keys. DLIO lists one AU and one throughput per epoch; a dlio_ckpt run gives
    one figure for the whole run (its DLIO-block AU, `train.au`, and `train.dlio_samples_per_s`),
    so the lists hold one entry per run (per repeat), and mean and stdev are over those."""
    au = [t["au"] * 100.0 for t in trains]
    throughput = [t["dlio_samples_per_s"] for t in trains]
    au_mean, au_std = _mean_std(au)
    samples_mean, samples_std = _mean_std(throughput)
    return {
        "train_au_percentage": au,
        "train_au_mean_percentage": au_mean,
        "train_au_meet_expectation": "success" if au_mean >= trains[0]["au_target"] * 100 else "fail",
        "train_au_stdev_percentage": au_std,
        "train_throughput_samples_per_second": throughput,
        "train_throughput_mean_samples_per_second": samples_mean,
        "train_throughput_stdev_samples_per_second": samples_std,
        "train_io_mean_MB_per_second": samples_mean * record_length_bytes / MIB,
        "train_io_stdev_MB_per_second": samples_std * record_length_bytes / MIB,
    }


def dlio_metric(runs: list[dict[str, Any]], record_length_bytes: int) -> dict[str, Any]:
    """DLIO's summary.json `metric` section (the one mlpstorage's reporting reads) from one run's
    summary, or from each repeat's; empty when the run neither trained nor checkpointed."""
    metric: dict[str, Any] = {}
    trains = [r["train"] for r in runs if r.get("train")]
    if trains:
        metric.update(_train_metric(trains, record_length_bytes))
    metric.update(_checkpoint_metric([r["checkpoint"] for r in runs if r.get("checkpoint")]))
    return metric


def metric_block(metric: dict[str, Any], accelerators: int) -> str:
    """DLIO's closing `[METRIC]` lines, worded and formatted as StatsCounter.end_run prints them
    ("" when there is no DLIO figure to print)."""
    if not metric:
        return ""
    lines = ["Averaged metric over all steps/epochs", RULER, f"[METRIC] Number of Simulated Accelerators: {accelerators} "]
    if "train_au_mean_percentage" in metric:
        lines += [
            f"[METRIC] Training Accelerator Utilization [AU] (%): {metric['train_au_mean_percentage']:.4f} "
            f"({metric['train_au_stdev_percentage']:.4f})",
            f"[METRIC] Training Throughput (samples/second): {metric['train_throughput_mean_samples_per_second']:.4f} "
            f"({metric['train_throughput_stdev_samples_per_second']:.4f})",
            f"[METRIC] Training I/O Throughput (MB/second): {metric['train_io_mean_MB_per_second']:.4f} "
            f"({metric['train_io_stdev_MB_per_second']:.4f})",
            f"[METRIC] train_au_meet_expectation: {metric['train_au_meet_expectation']}",
        ]
    for kind in ("save", "load"):
        if f"{kind}_checkpoint_io_mean_GB_per_second" in metric:
            lines += [
                f"[METRIC] Checkpoint {kind} duration (seconds): {metric[f'{kind}_checkpoint_duration_mean_seconds']:.4f} "
                f"({metric[f'{kind}_checkpoint_duration_stdev_seconds']:.4f})",
                f"[METRIC] Checkpoint {kind} I/O Throughput (GB/second): {metric[f'{kind}_checkpoint_io_mean_GB_per_second']:.4f} "
                f"({metric[f'{kind}_checkpoint_io_stdev_GB_per_second']:.4f})",
            ]
    lines.append(RULER)
    return "\n".join(lines)


def dlio_header(hosts: list[dict[str, Any]], started_at: str) -> dict[str, Any]:
    """The top-level keys of DLIO's summary.json that mlpstorage reads beside `metric`
    (mlpstorage/rules.py: num_accelerators, start, host_memory_GB and host_cpu_count per host,
    num_hosts), from each rank's host name, memory and CPU count."""
    by_host: dict[str, dict[str, Any]] = {}
    for rank in hosts:
        by_host.setdefault(rank["hostname"], rank)
    return {
        "num_accelerators": len(hosts),
        "num_hosts": len(by_host),
        "hostname": hosts[0]["hostname"],
        "start": started_at,
        "host_memory_GB": [h["host_memory_bytes"] / GIB for h in by_host.values()],
        "host_cpu_count": [h["host_cpu_count"] for h in by_host.values()],
    }


def host_resources() -> dict[str, int]:
    """This rank's host memory (bytes) and CPU count, which DLIO's summary.json lists per host."""
    return {"host_memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host_cpu_count": os.cpu_count() or 1}
