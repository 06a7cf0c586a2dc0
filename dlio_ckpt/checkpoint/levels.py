"""Multi-level checkpointing (`checkpoint.levels`): one checkpoint engine per level, SCR's rule
for which level a checkpoint goes to, asynchronous flushes from the fast level to a slower one,
node failures that take a node-local level with them, and a restore that takes the newest
checkpoint that survived, from whichever level holds it (docs/levels.md).

The MultiLevelEngine offers the training loop the interface of one engine (base.CheckpointEngine):
`due`, `save`, `finish`, `restore`, `records`, plus `fail(kind, node)` for the failure injection.
Every level is a CheckpointEngineImpl with its own root, storage and retention, all sharing the
rank's one evolving state, so the levels differ only in where their bytes go.

A flush (DeepFreeze's fast-then-PFS path, SCR's flush) copies a committed checkpoint, and every
checkpoint of its chain that the target lacks, from the first level to the target: each rank
copies the files it wrote, in a background thread, while training goes on; the manifests are
written by rank 0 last, at the next save or at finish, on the training thread (collectives never
leave it), byte for byte the source's. One flush is in flight at a time (the next one waits), and
a save that could let the first level's retention delete a checkpoint being flushed waits for
that flush first.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

from dlio_ckpt.checkpoint.base import CheckpointRecord, RestoreRecord
from dlio_ckpt.checkpoint.engine import CheckpointEngineImpl
from dlio_ckpt.checkpoint.fileio import now
from dlio_ckpt.checkpoint.flush import copy_entries
from dlio_ckpt.checkpoint.manifest import parse_manifest
from dlio_ckpt.errors import RunFailure, failure_text
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME, build_checkpoint_plan
from dlio_ckpt.plan.levels import host_indices, node_count, node_of, placement, ranks_on_node, to_copy
from dlio_ckpt.storage import make_backend
from dlio_ckpt.storage.traced import TracedStorage

FAILURE_KINDS = ("process", "node")
NUMBER_KEY = "checkpoint_number"  # in the resume point a checkpoint stores: its number, for SCR's rule after a restart


@dataclass
class FlushRecord:
    """One flush as one rank saw it."""

    step: int  # the checkpoint flushed
    level: str  # the level it was copied to
    steps: list[int]  # what was copied: chain members the target lacked, then the checkpoint
    bytes: int = 0  # this rank's write calls into the target
    files: int = 0
    copy_s: float = 0.0  # this rank's copy (read, write, fsync of its files), in the background
    flush_s: float = 0.0  # from the start of the copy to the manifest on the target (as this rank waited)
    committed: bool = False
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class _Flush:
    record: FlushRecord
    source: int  # level indices
    target: int
    manifests: dict[int, dict]  # step -> the source's manifest (every rank)
    raw: dict[int, bytes]  # step -> the source manifest's bytes (rank 0), written to the target last
    started: float
    future: concurrent.futures.Future


@dataclass
class _Pending:
    """A flush waiting for its source checkpoint's commit (an async first level commits later)."""

    record: CheckpointRecord
    source: int
    target: int


@dataclass
class _LevelStats:
    writes: list[CheckpointRecord] = field(default_factory=list)  # the checkpoints written to the level
    restores: list[dict] = field(default_factory=list)  # {step, bytes, read_s}


class MultiLevelEngine:
    """One rank's checkpoint engine over `checkpoint.levels` (see the module docstring)."""

    def __init__(self, ctx: Any, strategy_cls: type) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.cfg = ctx.config.checkpoint
        self.world = ctx.world
        self.levels = list(self.cfg.levels)
        self.plan = build_checkpoint_plan(ctx.config, ctx.world.size)
        self.engines: list[Any] = []
        for level in self.levels:
            root, storage = self._level_place(level)
            keep = self.cfg.keep_last if level.keep_last < 0 else level.keep_last
            level_ctx = dataclasses.replace(ctx, config=dataclasses.replace(
                ctx.config, checkpoint=dataclasses.replace(self.cfg, keep_last=keep, levels=[])))
            state = self.engines[0].state if self.engines else None
            self.engines.append(CheckpointEngineImpl(level_ctx, strategy_cls, plan=self.plan, root=root,
                                                     storage=storage, state=state))
        self.layout = self.engines[0].layout
        self.root = self.engines[0].root
        self.triggers = self.engines[0].triggers
        self.records: list[CheckpointRecord] = []
        self.flushes: list[FlushRecord] = []
        self.restores: list[RestoreRecord] = []
        self.stats = [_LevelStats() for _ in self.levels]
        self.nodes_by_rank = self._node_layout()
        self.nodes = node_count(self.world.size, self.config.world.ranks_per_node, self.nodes_by_rank)
        self._numbers: dict[int, int] = {}  # step -> checkpoint number, for saves without a resume point
        self._count = 0  # the number of the last checkpoint (SCR counts from 1; a restart goes on from the restored one)
        self._pending: list[_Pending] = []
        self._flushing: list[_Flush] = []
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._buffer = memoryview(bytearray(self.cfg.write_chunk_bytes))
        self._last_step = -1
        self._last_time = now()

    def _level_place(self, level: Any) -> tuple[str, Any]:
        """The level's checkpoint root (this run's folder in it) and its traced storage."""
        if not level.path:
            return self.ctx.checkpoint_root(), self.ctx.storage

        folder = os.path.abspath(level.path)
        options = dataclasses.replace(self.config.storage, backend=level.backend or self.config.storage.backend,
                                      root=folder)
        return os.path.join(folder, self.ctx.run_id), TracedStorage(make_backend(options, folder), self.ctx.recorder)

    def node_of(self, rank: int) -> int:
        """The node that `rank` runs on (for a node failure that strikes a rank)."""
        return node_of(rank, self.config.world.ranks_per_node, self.nodes_by_rank)

    def _node_layout(self) -> list[int]:
        """Each rank's node: emulated blocks of world.ranks_per_node, or the real hosts."""
        if self.config.world.ranks_per_node > 0:
            return []
        return host_indices(self.world.allgather(socket.gethostname()))

    # the training loop's interface -------------------------------------------------------
    def due(self, step: int, epoch: int, epoch_end: bool, trigger_step: int | None = None) -> bool:
        """The first level's triggers; a step saved once is not saved again (until a restart)."""
        if not self.cfg.enabled or step == self._last_step:
            return False
        return self.triggers.due(step if trigger_step is None else trigger_step, epoch, epoch_end,
                                 now() - self._last_time, self.world.bcast)

    def save(self, step: int, epoch: int, resume: dict | None = None) -> CheckpointRecord:
        """Checkpoint `step` on the level SCR's rule picks; queue its flush, if its level is flushed."""
        start = now()
        self._last_step = step
        number = self._count + 1
        where = placement(number, [lv.every for lv in self.levels], [lv.write == "flush" for lv in self.levels])
        self._commit_flushes(wait_all=False)
        if where.write == 0:
            self._protect_flushed_source()
        waited = now() - start
        if resume is not None:  # the number goes into the manifest, so a relaunch numbers on from it
            resume = {**resume, NUMBER_KEY: number}
        record = self.engines[where.write].save(step, epoch, resume)
        record.index = len(self.records)
        record.level = self.levels[where.write].name
        self._count = number
        self._numbers[step] = number
        self.records.append(record)
        self.stats[where.write].writes.append(record)
        self._pending.extend(_Pending(record, where.write, target) for target in where.flush)
        before = now()
        self._start_ready_flushes()
        waited += now() - before
        record.wait_s += waited
        record.blocking_s += waited
        self._last_time = now()
        return record

    def finish(self) -> None:
        """Every level's checkpoints committed, then every flush started and committed."""
        for engine in self.engines:
            engine.finish()
        self._start_ready_flushes()
        self._commit_flushes(wait_all=True)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # flushes ---------------------------------------------------------------------------
    def _protect_flushed_source(self) -> None:
        """Before a save to the first level: finish the flushes whose source checkpoint that save's
        retention could delete. It keeps the newest keep_last complete checkpoints, and the save
        may commit every earlier one still in flight (async) and its own, so a source is safe only
        while fewer than keep_last - 1 of the level's checkpoints are newer. A source still in
        flight is committed first (the first level's finish), so that its flush can start."""
        keep = self.engines[0].cfg.keep_last
        if not keep:
            return

        def at_risk(step: int) -> bool:
            return sum(1 for r in self.stats[0].writes if r.step > step) + 1 >= keep

        if any(at_risk(p.record.step) for p in self._pending):
            self.engines[0].finish()
            self._start_ready_flushes()
        if any(at_risk(f.record.step) for f in self._flushing):
            self._commit_flushes(wait_all=True)

    def _start_ready_flushes(self) -> None:
        """Collective: start the queued flushes whose source checkpoint is committed, in order, one
        at a time (a flush still in flight is waited for and committed first)."""
        while self._pending and self._pending[0].record.committed:
            pending = self._pending.pop(0)
            self._commit_flushes(wait_all=True)
            self._start_flush(pending)

    def _start_flush(self, pending: _Pending) -> None:
        source, target = self.engines[pending.source], self.engines[pending.target]
        step = pending.record.step
        record = FlushRecord(step=step, level=self.levels[pending.target].name, steps=[])
        self.flushes.append(record)
        raw: dict[int, bytes] = {}
        plan = self.world.root_first(lambda: self._read_source(source, target, step, raw))
        if isinstance(plan, str):
            record.error = plan
            self._warn(f"flush of {self.layout.folder(step)} to level {record.level} not started: {plan}")
            return
        record.steps = sorted(plan)
        mine = {s: [e for e in m["files"] if e["writer"] % self.world.size == self.world.rank] for s, m in plan.items()}
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-flush")
        future = self._executor.submit(self._copy, source, target, mine, plan, record)
        self._flushing.append(_Flush(record, pending.source, pending.target, plan, raw, now(), future))

    def _read_source(self, source: Any, target: Any, step: int, raw: dict[int, bytes]) -> dict[int, dict] | str:
        """On rank 0: the manifests of what the flush of `step` copies (step -> manifest), their
        bytes kept in `raw`; or why the flush cannot start."""
        present = [s for s, _, complete in target.checkpoint_folders() if complete]
        manifests: dict[int, dict] = {}
        wanted = [step]
        while wanted:
            current = wanted.pop()
            folder = source.folder_path(current)
            try:
                raw[current] = source.storage.read_whole(os.path.join(folder, MANIFEST_NAME))
            except OSError as exc:
                return f"{self.layout.folder(current)}: unreadable manifest ({failure_text(exc)})"
            manifest = parse_manifest(raw[current], folder, current)
            if isinstance(manifest, str):
                return f"{self.layout.folder(current)}: {manifest}"
            manifests[current] = manifest
            if current == step:
                chain = [int(s) for _, s in manifest.get("chain", [])]
                wanted = [s for s in to_copy(step, chain, present) if s != step]
        return manifests

    def _copy(self, source: Any, target: Any, mine: dict[int, list[dict]], plan: dict[int, dict],
              record: FlushRecord) -> None:
        """In the background: this rank's files of every checkpoint the flush copies, oldest first."""
        for step in sorted(mine):
            copied = copy_entries(source.storage, target.storage, source.folder_path(step), target.folder_path(step),
                                  mine[step], plan[step]["checksum"], self.cfg.fsync, self._buffer)
            record.files += copied.files
            record.bytes += copied.bytes
            record.copy_s += copied.seconds

    def _commit_flushes(self, wait_all: bool) -> None:
        """Collective: publish every flush whose copies finished on every rank (manifests last, in
        chain order, then the target's tag and retention); a failed one is removed and reported."""
        while self._flushing:
            head = self._flushing[0]
            if wait_all:
                concurrent.futures.wait([head.future])
            if not self.world.agree(head.future.done()):
                return
            self._flushing.pop(0)
            error = head.future.exception()
            if error is None:
                try:  # the folders of this rank's copies, before rank 0 writes the manifests
                    self._sync_copied_folders(head)
                except OSError as exc:
                    error = exc
            errors = [e for e in self.world.allgather(failure_text(error) if error else "") if e]
            if not errors:
                try:
                    self.world.root_first(lambda: self._publish(head))
                except Exception as exc:  # raised on every rank alike (root_first)
                    errors = [failure_text(exc)]
            record = head.record
            record.flush_s = now() - head.started
            if errors:
                record.error = errors[0]
                self._discard_uncommitted(head.target, record.steps)
                self._warn(f"flush of {self.layout.folder(record.step)} to level {record.level} failed: {errors[0]}")
                continue
            record.committed = True
            try:
                self.world.root_first(lambda: self._after_publish(head))
            except Exception as exc:  # committed all the same: say what failed after it
                self._warn(f"flush of {self.layout.folder(record.step)} to level {record.level} committed "
                           f"(its manifest is written), but {failure_text(exc)}")

    def _sync_copied_folders(self, flush: _Flush) -> None:
        """This rank's part of a flush's commit: fsync the target folders its copies' entries are
        in (each copy's own folder was synced by its staged close; the folders above it were not)."""
        target = self.engines[flush.target]
        for step, manifest in flush.manifests.items():
            mine = [e["path"] for e in manifest["files"] if e["writer"] % self.world.size == self.world.rank]
            target.publisher.sync_file_folders(step, mine)

    def _publish(self, flush: _Flush) -> None:
        """On rank 0: the source manifests on the target (oldest first), each through the target
        engine's commit step (the folders above its checkpoint folder fsynced, then the manifest)."""
        target = self.engines[flush.target]
        for step in sorted(flush.raw):
            target.publisher.publish_manifest(step, flush.raw[step])

    def _after_publish(self, flush: _Flush) -> None:
        """On rank 0, after the flush is committed: the target's tag, then its retention; raises
        naming which of them failed (the flush stays committed)."""
        target = self.engines[flush.target]
        tag = self.layout.tag(flush.record.step)
        if tag:
            try:
                target.publisher.write_tag(flush.record.step)
            except Exception as exc:
                raise RunFailure(f"its {tag[0]!r} tag was not written: {failure_text(exc)}") from None
        if target.cfg.keep_last:
            try:
                target.retention.apply()
            except Exception as exc:
                raise RunFailure(f"retention (keep_last={target.cfg.keep_last}) failed to delete an older "
                                 f"checkpoint on level {flush.record.level}: {failure_text(exc)}") from None

    def _discard_uncommitted(self, level: int, steps: list[int]) -> None:
        """Collective: rank 0 removes the folders a failed or abandoned flush left without a manifest."""
        self.world.barrier()
        if self.world.is_root:
            for step in steps:
                self.engines[level].discard_failed(step)

    # failures ----------------------------------------------------------------------------
    def fail(self, kind: str, node: int | None = None) -> list[str]:
        """Collective: a failure of `kind` ("process": every rank's memory is lost; "node": also
        the node-local levels' files written by `node`'s ranks). Flushes in flight are abandoned
        (a flush's copy ends, its folders lose nothing committed and are removed), every level
        drops its in-memory state. Returns the files the node's loss removed (rank 0)."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind {kind!r}: one of {', '.join(FAILURE_KINDS)}")
        if kind == "node" and not (node is not None and 0 <= node < self.nodes):
            raise ValueError(f"a node failure names a node from 0 to {self.nodes - 1} (got {node})")
        for flush in self._flushing:
            concurrent.futures.wait([flush.future])
            flush.record.error = f"abandoned: {kind} failure"
            self._discard_uncommitted(flush.target, flush.record.steps)
        self._flushing.clear()
        self._pending.clear()
        for engine in self.engines:
            engine.fail(kind)
        state = self.engines[0].state  # one state again, shared by every level (fail() dropped it)
        for engine in self.engines[1:]:
            engine.use_state(state)
        self._last_step = -1
        return self.lose_node(node) if kind == "node" else []

    def tear(self, step: int) -> None:
        """Collective: checkpoint `step`, whose write a failure struck, never committed on any level
        (its flush, started after the save, was abandoned by `fail`)."""
        for engine in self.engines:
            engine.tear(step)

    def lose_node(self, node: int) -> list[str]:
        """Collective: what a node's failure does to storage: every node-local level loses the files
        that `node`'s ranks wrote (a checkpoint's manifest, coordinator files and tag are rank 0's;
        a folder without a manifest, whose writers are unknown, goes whole). Done on rank 0 through
        the untraced backend: the failure is not the program's I/O. Returns the paths removed."""
        lost = ranks_on_node(node, self.world.size, self.config.world.ranks_per_node, self.nodes_by_rank)
        self.world.barrier()
        removed: list[str] = []
        if self.world.is_root:
            for level, engine in zip(self.levels, self.engines):
                if level.scope == "node":
                    removed.extend(_remove_written_by(engine, lost))
        self.world.barrier()
        return removed

    # restore -----------------------------------------------------------------------------
    def restore(self, step: int | None = None, warn_if_none: bool = True, load_state: bool = False) -> RestoreRecord | None:
        """Collective: restore the newest checkpoint that any level holds complete and verified
        (or `step`'s), the faster level first where two hold it. The record names the level
        and what was skipped on the way."""
        self.finish()
        if self.world.is_root:
            candidates = sorted(((s, number) for number, engine in enumerate(self.engines)
                                 for s, _, _ in engine.checkpoint_folders() if step is None or s == step),
                                key=lambda c: (-c[0], c[1]))
        else:
            candidates = None
        candidates = self.world.bcast(candidates)
        self._count = 0  # a restart from scratch numbers from 1 again, as SCR's does
        if not candidates:
            return None
        skipped: list[str] = []
        for candidate, number in candidates:
            name = self.levels[number].name
            record = self.engines[number].restore(step=candidate, warn_if_none=False, load_state=load_state)
            if record is None or record.checkpoint_step < 0:
                skipped.extend(f"level {name}: {why}" for why in (record.skipped if record else ["no folder"]))
                continue
            record.level = name
            record.message = f"level {name}: {record.message}"
            if skipped:
                record.message += "; skipped newer " + "; ".join(skipped)
                self._warn(record.message)
            record.skipped = skipped + record.skipped
            self.restores.append(record)
            self.stats[number].restores.append({"step": candidate, "bytes": record.bytes, "read_s": record.read_s})
            self._count = int(record.resume.get(NUMBER_KEY, self._numbers.get(candidate, 0)))
            self._last_step = -1
            return record
        message = "no complete checkpoint to restore on any level: " + "; ".join(skipped)
        if warn_if_none:
            self._warn(message)
        return RestoreRecord(checkpoint_index=-1, bytes=0, files=0, read_s=0.0, verified=False, message=message,
                             skipped=skipped)

    # report ------------------------------------------------------------------------------
    def level_report(self) -> dict[str, Any]:
        """This rank's figures per level, for summary.json's checkpoint.levels (levels_report.py)."""
        return {
            "levels": [{"name": lv.name, "path": engine.root, "every": lv.every, "write": lv.write, "scope": lv.scope}
                       for lv, engine in zip(self.levels, self.engines)],
            "writes": [[{"index": r.index, "step": r.step, "bytes": r.bytes, "write_s": r.write_s,
                         "committed": r.committed} for r in stats.writes] for stats in self.stats],
            "flushes": [f.as_dict() for f in self.flushes],
            "restores": [list(stats.restores) for stats in self.stats],
        }

    def _warn(self, message: str) -> None:
        if self.world.is_root:
            print(f"dlio_ckpt: checkpoint levels: {message}", file=sys.stderr, flush=True)


def _remove_written_by(engine: Any, ranks: frozenset[int]) -> list[str]:
    """Remove, from one level, the files that `ranks` wrote (see MultiLevelEngine.lose_node)."""
    backend = engine.storage.inner
    removed: list[str] = []
    for step, name, complete in engine.checkpoint_folders():
        folder = engine.folder_path(step)
        manifest = parse_manifest(backend.read_whole(os.path.join(folder, MANIFEST_NAME)), folder, step) if complete else ""
        if isinstance(manifest, str):
            removed.extend(backend.remove_tree(folder))
            continue
        for entry in manifest["files"]:
            path = os.path.join(folder, entry["path"])
            if entry["writer"] % engine.world.size in ranks and backend.exists(path):
                backend.remove(path)
                removed.append(path)
        if 0 in ranks:
            backend.remove(os.path.join(folder, MANIFEST_NAME))
            removed.append(os.path.join(folder, MANIFEST_NAME))
    tag = engine.layout.tag(0)
    if tag and 0 in ranks and backend.exists(os.path.join(engine.root, tag[0])):
        backend.remove(os.path.join(engine.root, tag[0]))
        removed.append(os.path.join(engine.root, tag[0]))
    return removed
