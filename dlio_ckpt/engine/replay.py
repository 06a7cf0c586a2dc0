"""Replay a Darshan DXT trace on this system: same files, offsets, lengths and order per rank.

A log without DXT traces is replayed approximately from its POSIX counters (plan/replay_approx.py):
the same bytes, calls, size mix and files per rank, with synthesised offsets and order; the
summary says `approximate` and compares the log's figures with the replay's (`original`, `replayed`).

The log's files are recreated under storage.root/replay/<log stem>/ with synthetic bytes (only
the files some call reads need contents; written-only files are created by the replayed writes),
then every rank re-issues its log ranks' calls through the traced storage, so the run's events,
summary and Darshan log describe the replay as they would any other run. Reads are tagged "train"
and writes "checkpoint" (in a DL job, reading is the input pipeline and writing is checkpointing).

All handles are opened before the timed part, behind a barrier: the storage offers no
open-without-truncate mode, so a rank that writes a file opens it with O_TRUNC and puts its size
back at once; doing that before any rank starts reading keeps every read within the file, so
each call moves exactly the bytes the log says it moved. Writing at logged offsets into files that
several ranks share, and setting a file's length, need the backend's `seekable_write` capability
(`write_at`, `truncate`); the loader refuses workload=replay on a backend without it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from dlio_ckpt.engine.context import RunContext
from dlio_ckpt.metrics.replay_compare import side
from dlio_ckpt.metrics.timing import phase_busy_seconds
from dlio_ckpt.plan.replay import READ, WRITE, ReplayPlan
from dlio_ckpt.plan.replay_log import load_replay_plan

REPLAY_FOLDER = "replay"
_SEED_OFFSET = 0x5EED  # replay contents differ from the dataset's, whatever the seed


def replay_root(ctx: RunContext, plan: ReplayPlan) -> str:
    return os.path.abspath(os.path.join(ctx.config.storage.root, REPLAY_FOLDER, plan.stem))


def _recreate_files(ctx: RunContext, plan: ReplayPlan, root: str, source: Any) -> None:
    """Write the files that are read, spread over ranks (all of them here when ranks cannot talk)."""
    storage = ctx.storage.with_phase("generate")
    world = ctx.world
    chunk = ctx.config.generate.write_chunk_bytes
    for index, spec in enumerate(plan.files):
        path = os.path.join(root, spec.relative)
        storage.makedirs(os.path.dirname(path))
        if not spec.read or (world.parallel and index % world.size != world.rank):
            continue
        handle = storage.open_staged(path)
        try:
            for piece in source.chunks(index, spec.size, chunk):
                handle.write(piece)
            if ctx.config.storage.fsync:
                handle.fsync()
        except BaseException:
            handle.abort()
            raise
        handle.close()


def _open_handles(ctx: RunContext, plan: ReplayPlan, root: str, ops: np.ndarray) -> dict[tuple[int, int], Any]:
    """Handles keyed by (file, op): writes go through a "checkpoint" read-write handle, reads through
    a "train" read-only one, so each call keeps its phase even on a file that is both read and written."""
    handles: dict[tuple[int, int], Any] = {}
    pairs = dict.fromkeys(zip(ops["file"].tolist(), ops["op"].tolist()))
    for index, op in sorted(pairs, key=lambda pair: -pair[1]):  # writers first: their O_TRUNC comes before any read open
        spec = plan.files[index]
        path = os.path.join(root, spec.relative)
        if op == WRITE:
            handle = ctx.storage.with_phase("checkpoint").open_write(path)
            if spec.read:
                handle.truncate(spec.size)  # O_TRUNC emptied it; reads must stay within the file
        else:
            handle = ctx.storage.with_phase("train").open_read(path)
        handles[(index, op)] = handle
    return handles


def _replay_calls(ops: np.ndarray, handles: dict[tuple[int, int], Any], source: Any, gaps: bool,
                  log_origin: float) -> dict[str, int]:
    """Issue the calls in order; with gaps, each starts no earlier than its offset in the log.

    `log_origin` is the first call of the whole log, so ranks keep their relative timing too.
    """
    counts = {"reads": 0, "writes": 0, "bytes_read": 0, "bytes_written": 0}
    if not len(ops):
        return counts
    reads = ops["length"][ops["op"] == READ]
    buffer = memoryview(bytearray(int(reads.max()) if len(reads) else 0))
    clock_origin = time.perf_counter()
    for number, (op, file_index, offset, length, start) in enumerate(zip(
            ops["op"].tolist(), ops["file"].tolist(), ops["offset"].tolist(), ops["length"].tolist(),
            ops["start"].tolist())):
        if gaps:
            wait = (start - log_origin) - (time.perf_counter() - clock_origin)
            if wait > 0:
                time.sleep(wait)
        handle = handles[(file_index, op)]
        if op == READ:
            counts["bytes_read"] += handle.read_at_into(buffer[:length], offset)
            counts["reads"] += 1
        else:
            data = source.array(number + 1_000_003 * file_index, length)
            counts["bytes_written"] += handle.write_at(data, offset)
            counts["writes"] += 1
    return counts


def run_replay(ctx: RunContext) -> dict:
    """Replay ctx.config.replay.log; returns the summary's `replay` section (totals over all ranks)."""
    world = ctx.world
    load = lambda: load_replay_plan(ctx.config.replay.log)  # noqa: E731
    plan = world.root_first(load) if world.comm is not None else load()  # parsed once, then broadcast
    root = replay_root(ctx, plan)
    source = ctx.source(ctx.config.dataset.seed + _SEED_OFFSET, zeros=ctx.config.dataset.content == "zeros")
    _recreate_files(ctx, plan, root, source)
    world.barrier()
    ops = plan.ops_for(world.rank, world.size)
    handles = _open_handles(ctx, plan, root, ops)
    world.barrier()
    started = time.perf_counter()
    try:
        origin = min((float(calls["start"][0]) for calls in plan.ops if len(calls)), default=0.0)
        counts = _replay_calls(ops, handles, source, ctx.config.replay.gaps, origin)
    finally:
        for handle in handles.values():
            handle.close()
    elapsed = time.perf_counter() - started
    world.barrier()
    totals = {key: int(world.allreduce_sum(value)) for key, value in counts.items()}
    events = ctx.recorder.array()
    read_s = world.allreduce_max(phase_busy_seconds(events, "train", ("read",)))
    write_s = world.allreduce_max(phase_busy_seconds(events, "checkpoint", ("write",)))
    return {
        "log": plan.log,
        "log_ranks": plan.log_ranks,
        "files": len(plan.files),
        "root": root,
        "gaps": bool(ctx.config.replay.gaps),
        **totals,
        "wall_s": world.allreduce_max(elapsed),
        "expected": plan.totals(),
        "approximate": plan.approximate,
        "original": side(plan.totals(), *plan.original_s),
        "replayed": side({key: totals[key] for key in ("reads", "writes", "bytes_read", "bytes_written")}, read_s, write_s),
    }
