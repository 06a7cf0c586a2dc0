"""The short human table rank 0 prints at the end of a run, and leaves in the run's log file."""

from __future__ import annotations

import logging
import sys
from typing import Any

from dlio_ckpt.strategy_registry import strategy_declares
from dlio_ckpt.metrics.checkpoint_rows import encoding_rows, writer_rows
from dlio_ckpt.metrics.mlperf import metric_block, mlperf_rows
from dlio_ckpt.metrics.replay_compare import comparison_rows
from dlio_ckpt.metrics.utilisation import FEW_STEPS_PER_BLOCK
from dlio_ckpt.metrics.words import plural

MIB = float(1 << 20)
GIB = float(1 << 30)


def _train_rows(train: dict[str, Any], evaluation: dict[str, Any] | None,
                dlio_expectation: str | None = None) -> list[tuple[str, str]]:
    """The training rows; `dlio_expectation` is DLIO's train_au_meet_expectation of the [METRIC]
    lines, which judges DLIO's block AU and is named as such beside the run's own verdict."""
    wall = f"{train['wall_s']:.2f} s" + (f" (+ evaluation {evaluation['wall_s']:.2f} s)" if evaluation else "")
    rate = train["read_mib_per_s"]
    rate_text = (": no read time was measured, so no rate" if rate is None
                 else f" at {rate:.1f} MiB/s (bytes from storage / slowest rank's read time)")
    shares = train["time_shares"]
    dlio = f"DLIO's block AU {train['au']:.3f}"
    if train["au_method"] != "dlio_blocks":
        dlio = f"DLIO's AU {train['au']:.3f} (compute / wall: no DLIO block had a second step)"
    elif train["au_steps_per_block"] <= FEW_STEPS_PER_BLOCK:
        dlio += (f" ({train['au_steps_per_block']:.1f} steps per block: it leaves out the first step of each block, "
                 "and with it most of the waiting for data)")
    verdict = {"met": "met", "not met": "NOT met"}.get(train["au_verdict"], train["au_verdict"])
    rows = [
        ("train", f"{plural(train['epochs'], 'epoch')}, {plural(train['steps'], 'step')}, "
                  f"{plural(train['samples'], 'sample')} in {wall}"),
        ("samples/s", f"{train['samples_per_s']:.1f}"),
        ("read", f"{train['bytes_read'] / MIB:.1f} MiB read{rate_text}"),
        ("time", f"reading (waiting for data) {shares['reading']:.1%}, computing {shares['computing']:.1%}, "
                 f"checkpointing {shares['checkpointing']:.1%} (blocking training), other {shares['other']:.1%} "
                 "of the training wall time, all ranks together"),
        ("AU", f"{train['au_overall']:.3f} over the whole run (au_overall, the one judged); {dlio}, the AU of the "
               "[METRIC] lines" + (f", whose train_au_meet_expectation ({dlio_expectation}) judges it as DLIO does"
                                   if dlio_expectation else "")),
        ("AU target", f"{train['au_target']:.2f}: {verdict}: {train['au_verdict_reason']}"),
    ] + storage_rows(train.get("storage"))
    judged = train.get("run_verdict")
    return ([("verdict", judged["line"])] if judged else []) + rows


def storage_rows(storage: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The read bandwidth training needs and the storage-bound verdict (metrics/bandwidth.py)."""
    if not storage:
        return []
    need = storage["required_mib_per_s"]
    if need is None:
        needed = "unbounded: no compute is emulated (train.computation_time=0)"
    else:
        needed = (f"{need:.1f} MiB/s ({storage['required_mib_per_s_per_rank']:.1f} per rank) = {plural(storage['ranks'], 'rank')} x "
                  f"batch {storage['batch_size']} x {storage['bytes_per_sample'] / MIB:.3f} MiB per sample / "
                  f"{storage['compute_s_per_step']:.3f} s compute per step")
    return [("needed", needed), ("storage", storage["verdict"])]


def latency_rows(latency: dict[str, Any]) -> list[tuple[str, str]]:
    """fio's latency figures (min, percentiles, max, mean and stdev) and IOPS of the data-moving
    calls of the phases a user asks about."""
    rows = []
    for phase, op in (("train", "read"), ("checkpoint", "write"), ("restore", "read")):
        row = latency.get(phase, {}).get(op)
        if row:
            iops = "" if row["iops"] is None else f", {row['iops']:,.0f} IOPS"
            ms = {key: value * 1e3 for key, value in row.items() if key.endswith("_s") and value is not None}
            rows.append((f"{phase} {op}s", f"latency ms: min {ms['min_s']:.3f}, p50 {ms['p50_s']:.3f}, p90 {ms['p90_s']:.3f}, "
                                          f"p99 {ms['p99_s']:.3f}, p99.9 {ms['p99_9_s']:.3f}, max {ms['max_s']:.3f}, "
                                          f"mean {ms['mean_s']:.3f} (stdev {ms['stdev_s']:.3f}) over {row['count']:,} calls{iops}"))
    return rows


def async_persist_row(ckpt: dict[str, Any]) -> list[tuple[str, str]]:
    """Async checkpoints persist behind training: say how long, apart from what training lost."""
    if not ckpt.get("writes") or not strategy_declares(ckpt.get("strategy") or "", "persists_in_background"):
        return []
    return [("async persist", f"{ckpt['persist_s_max']:.3f} s per checkpoint in the background (slowest rank, "
                              f"read-back included), beside {ckpt['blocking_s_max']:.3f} s blocking training per checkpoint; "
                              "the time row's checkpointing also holds the wait at the end of training for saves in flight")]


def headline_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [("workload", f"{summary['workload']} ({summary['mode']}, {plural(summary['world_size'], 'rank')})")]
    dataset = summary.get("dataset")
    if dataset:
        state = "reused" if dataset["reused"] else f"generated in {dataset['generate_s']:.2f} s"
        rows.append(("dataset", f"{plural(dataset['files_train'], dataset['format'] + ' file')}, "
                                f"{dataset['bytes_on_disk'] / MIB:.1f} MiB, {state}"))
    train = summary.get("train")
    if train:
        rows += _train_rows(train, summary.get("eval"), (summary.get("metric") or {}).get("train_au_meet_expectation"))
    ckpt = summary.get("checkpoint")
    if ckpt and ckpt.get("writes"):
        verify = f", checksum read-back {ckpt['verify_s_max']:.3f} s apart" if ckpt.get("verify_s_max") else ""
        rows.append(("checkpoint", f"{plural(ckpt['writes'], 'write')} of {ckpt['bytes'] / GIB:.3f} GiB, slowest rank "
                                   f"{ckpt['write_s_max']:.3f} s, {ckpt['write_gib_per_s']:.3f} GiB/s{verify}"))
        rows += async_persist_row(ckpt)
        rows += writer_rows(ckpt)
        rows += encoding_rows(ckpt)
        rows += mlperf_rows(ckpt)
        if ckpt.get("restore_verified") is not None and ckpt.get("restore_s_max") is not None:
            chain = ckpt.get("restore_chain_length", 0)
            chain = f", rebuilt from a chain of {chain}" if chain > 1 else ""
            rows.append(("restore", f"{ckpt['restore_s_max']:.3f} s, {ckpt.get('restore_gib_per_s', 0):.3f} GiB/s, "
                                    f"verified: {ckpt['restore_verified']}{chain}"))
    rows += goodput_rows(summary)
    replay = summary.get("replay")
    if replay:
        rows += comparison_rows(replay)
    rows += latency_rows(summary.get("latency", {}))
    rows.append(("run folder", summary["run_dir"]))
    for note in summary.get("warnings", []):
        rows.append(("warning", note))
    return rows + left_on_disk_rows(summary.get("left_on_disk"))


def left_on_disk_rows(left: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The last row: the bytes this run left under storage.root, where, and how to remove them."""
    if left is None:
        return []
    parts = [f"checkpoints {c['bytes'] / MIB:,.1f} MiB in {c['folder']}" for c in left["checkpoints"]]
    data = left["dataset"]
    if data and data["created_by_this_run"]:
        parts.insert(0, f"dataset {data['bytes'] / MIB:,.1f} MiB in {data['folder']}")
    text = (f"{left['bytes'] / MIB:,.1f} MiB: " + ", ".join(parts) + f"; remove with: {left['clean_command']}"
            if left["bytes"] else "nothing of this run's")
    if data and not data["created_by_this_run"]:
        text += (f" (the dataset it reused, {data['bytes'] / MIB:,.1f} MiB in {data['folder']}, is an earlier run's; "
                 "clean keeps it)")
    return [("left on disk", text)]


def goodput_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Goodput and where the training wall time went; failures and the interval policy when they apply."""
    spent = summary.get("time_accounting")
    if not spent:
        return []
    wall = spent["wall_s"] or 1.0
    rows = [("goodput", f"{summary['goodput']:.3f} (useful compute / training wall time {spent['wall_s']:.2f} s): "
                        f"slowest rank: useful compute {spent['useful_compute_s'] / wall:.1%}, "
                        f"steps' time outside compute (waiting for data, loop work) {spent['data_wait_s'] / wall:.1%}, "
                        f"checkpoint blocking {spent['checkpoint_s'] / wall:.1%}, lost work {spent['lost_work_s'] / wall:.1%} "
                        f"({plural(spent['lost_steps'], 'step')} recomputed), restart {spent['restart_s'] / wall:.1%}, "
                        f"other {spent['other_s'] / wall:.1%}")]
    failures = summary.get("failures") or {}
    if failures.get("count"):
        back = ", ".join(f"{r['step']}->{r['restored_step']}" for r in failures["restarts"] if r.get("restored_step") is not None)
        rows.append(("failures", f"{failures['count']} ({failures['restarts'][0]['kind']}, restart "
                                 f"{failures['restarts'][0]['restart']}): step->restored step {back}; "
                                 f"restore + warm-up {failures['restart_s']:.3f} s in all"))
    resume = summary.get("resume") or {}
    if resume.get("deterministic") is not None:
        first = resume.get("first_divergence")
        rows.append(("resume", "deterministic: samples and state after each restart equal the uninterrupted run's"
                     if resume["deterministic"] else
                     f"NOT deterministic: {first['what']} first differ at step {first['step']} on rank {first['rank']}"))
    policy = (summary.get("checkpoint") or {}).get("policy") or {}
    if policy.get("name") in ("young_daly", "checkfreq"):
        predicted = policy.get("predicted_overhead")
        extra = (f"Young {policy['young_s']:.3f} s, Daly {policy['daly_s']:.3f} s (used)" if policy["name"] == "young_daly"
                 else f"stall {policy['stall_s']:.3f} s, full persist {policy['full_s']:.3f} s")
        rows.append(("policy", f"{policy['name']}: every {policy['interval_steps']} steps "
                               f"({policy['iteration_s']:.4f} s per step); {extra}"
                               + (f"; predicted overhead {predicted:.1%}" if predicted is not None else "")))
    return rows


def plain_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)


def log_report(text: str, heading: str = "summary\n") -> None:
    """Put the report (or a note printed on the console) in the run's log file (Hydra's file
    handler on the root logger), and only there: the console already has it."""
    record = logging.LogRecord("dlio_ckpt", logging.INFO, __file__, 0, heading + "%s", (text,), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def print_report(summary: dict[str, Any], fancy: bool = True, extra_rows: list[tuple[str, str]] | None = None) -> None:
    """The table (with `extra_rows`, such as the spread over repeats), then DLIO's `[METRIC]`
    lines (metrics/mlperf.py) for tools that parse DLIO's output."""
    rows = headline_rows(summary) + list(extra_rows or [])
    text = plain_table(rows)
    block = metric_block(summary.get("metric") or {}, summary.get("num_accelerators", summary["world_size"]))
    log_report(text + (f"\n{block}" if block else ""))
    if fancy and sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title="dlio_ckpt", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        for key, value in rows:
            table.add_row(key, value)
        Console().print(table)
        text = ""
    out = "\n".join(part for part in (text, block) if part)
    if out:
        print(out)
    sys.stdout.flush()
