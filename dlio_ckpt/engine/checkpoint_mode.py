"""mode=checkpoint: MLPerf Storage's checkpoint-only procedure.

N checkpoint writes spaced by `sleep_between_s`, an optional page-cache drop, then N reads
(restores, each fully verified). MLPerf reports a checkpoint's duration as the maximum over ranks
and its throughput as the minimum over ranks of DLIO's per-rank throughput, which is the whole
checkpoint's size / that rank's time: so all bytes / the slowest rank's time (metrics/mlperf.py).
"""

from __future__ import annotations

import dataclasses
import os
import time
from statistics import mean
from typing import Any

from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.checkpoint.report import GIB, checkpoint_summary
from dlio_ckpt.errors import RunFailure
from dlio_ckpt.metrics.mlperf import RULE, mlperf_figures


def drop_page_cache() -> str:
    """sync, then ask the kernel to drop clean pages; say why when it cannot (needs root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
        return "dropped"
    except OSError as exc:
        return f"not possible ({exc.strerror or exc}); reads may be served from the page cache"


def _with_checkpointing(ctx: Any) -> Any:
    """The mode is the request: checkpointing is on whatever the workload says."""
    ck = ctx.config.checkpoint
    if ck.enabled:
        return ctx
    return dataclasses.replace(ctx, config=dataclasses.replace(ctx.config, checkpoint=dataclasses.replace(ck, enabled=True)))


def run_restore_mode(ctx: Any) -> dict:
    """mode=restore: restore (read and verify) the newest complete checkpoint of an earlier run.

    This is how a restart after a crash is measured: a torn checkpoint left by a rank that died
    mid-write is skipped with a message and the previous complete one is read. The run must use
    the same workload and checkpoint settings (layout) that wrote it; the world size may differ.
    A restore that restored nothing is a failure (exit 1), in one line naming the folder and why
    each checkpoint in it was rejected.
    """
    ctx = _with_checkpointing(ctx)
    world = ctx.world
    engine = make_checkpoint_engine(ctx)
    world.barrier()
    record = engine.restore(warn_if_none=False)
    if record is None or record.checkpoint_step < 0:
        why = (record.message if record else
               f"no checkpoint folders of layout {engine.layout.name} in {engine.root}")
        raise RunFailure(f"nothing restored: {why}" if world.is_root else "", known_everywhere=True)
    reads = world.gather(record.as_dict())
    summary = None
    if world.is_root:
        summary = checkpoint_summary([[] for _ in reads], reads, 0.0, ctx.config)
        summary.update(mode="restore", restored_from=engine.root)
    return world.bcast(summary)


def run_checkpoint_mode(ctx: Any) -> dict:
    ctx = _with_checkpointing(ctx)
    config = ctx.config
    ck = config.checkpoint
    world = ctx.world
    engine = make_checkpoint_engine(ctx)

    world.barrier()
    start = time.perf_counter()
    steps = []
    for i in range(ck.num_checkpoints_write):
        if i and ck.sleep_between_s:
            time.sleep(ck.sleep_between_s)
        world.barrier()  # MLPerf starts every write together
        engine.save(i + 1, 1)
        steps.append(i + 1)
    engine.finish()
    write_wall_s = time.perf_counter() - start

    cache = "not requested"
    if ck.drop_caches and ck.num_checkpoints_read:
        world.barrier()
        cache = world.bcast(drop_page_cache() if world.is_root else None)

    restores = []
    if world.is_root:
        available = [s for s, _, complete in engine.checkpoint_folders() if complete]
    else:
        available = None
    available = world.bcast(available) or []
    for j in range(ck.num_checkpoints_read if available else 0):
        world.barrier()
        restores.append(engine.restore(available[j % len(available)]))

    records = world.gather([r.as_dict() for r in engine.records])
    reads = world.gather([r.as_dict() if r else None for r in restores])
    summary = None
    if world.is_root:
        summary = _summarise(records, reads, write_wall_s, config, cache)
    return world.bcast(summary)


def _summarise(records: list[list[dict]], reads: list[list[dict | None]], write_wall_s: float, config: Any, cache: str) -> dict:
    last_read = [r[-1] if r else None for r in reads]
    summary = checkpoint_summary(records, last_read, write_wall_s, config)
    per_read = []
    for j in range(max((len(r) for r in reads), default=0)):
        rows = [r[j] for r in reads if len(r) > j and r[j]]
        nbytes = sum(x["bytes"] for x in rows)
        slowest = max(x["read_s"] for x in rows)
        rates = [x["bytes"] / x["read_s"] / GIB for x in rows if x["bytes"] and x["read_s"] > 0]
        per_read.append({
            "step": rows[0].get("checkpoint_step", -1),
            "bytes": nbytes,
            "read_s_max": slowest,
            "read_gib_per_s": nbytes / slowest / GIB if slowest > 0 else 0.0,
            "read_gib_per_s_min_rank": min(rates) if rates else 0.0,
            "verified": all(x["verified"] for x in rows),
            "chain_length": max(x.get("chain_length", 0) for x in rows),  # checkpoints read to rebuild it
        })
    if per_read:
        avg_bytes = mean(r["bytes"] for r in per_read)
        avg_read = mean(r["read_s_max"] for r in per_read)
        per_rank = {}
        for rank, rank_reads in enumerate(reads):
            done = [x for x in rank_reads if x and x["bytes"]]
            if done:
                per_rank[rank] = mean(x["bytes"] for x in done) / mean(x["read_s"] for x in done) / GIB
        summary.update({
            "reads": len(per_read),
            "restore_s_max": avg_read,
            "restore_bytes": int(round(avg_bytes)),
            "restore_gib_per_s": avg_bytes / avg_read / GIB if avg_read > 0 else 0.0,
            "restore_gib_per_s_min_rank": min(per_rank.values()) if per_rank else 0.0,
            "restore_verified": all(r["verified"] for r in per_read),
        })
    summary["mode"] = "checkpoint"
    summary["page_cache_drop"] = cache
    summary["sleep_between_s"] = config.checkpoint.sleep_between_s
    figures = mlperf_figures(summary.get("per_checkpoint", []), per_read)
    summary["mlperf"] = {
        "write_duration_s": summary["write_s_max"],
        # all ranks' bytes / the slowest rank's time, averaged over the writes as DLIO averages them
        "write_throughput_gib_per_s": figures["write_throughput_gib_per_s_mean"] or 0.0,
        "verify_duration_s": summary["verify_s_max"],  # the checksum read-back, in neither write figure
        "read_duration_s": summary.get("restore_s_max", 0.0),
        "read_throughput_gib_per_s": figures["read_throughput_gib_per_s_mean"] or 0.0,
        "rule": RULE,
        **figures,
    }
    summary["per_read"] = per_read
    # each rank's own bytes and time per write and per read, from which the MLPerf figures derive
    summary["mlperf"]["per_rank_writes"] = [[{"rank": rank, "bytes": r["bytes"], "write_s": r["write_s"]}
                                             for rank, rows in enumerate(records) for r in rows if r["index"] == c["index"]]
                                            for c in summary.get("per_checkpoint", [])]
    summary["mlperf"]["per_rank_reads"] = [[{"rank": rank, "bytes": rows[j]["bytes"], "read_s": rows[j]["read_s"]}
                                            for rank, rows in enumerate(reads) if len(rows) > j and rows[j]]
                                           for j in range(len(per_read))]
    return summary
