"""The checkpoint engine: one rank's checkpoints, its parts each doing one job, around a strategy.

The engine holds what a rank's checkpoints share (the plan, the model state, the encoder, the
triggers) and hands each step to the part that does it, as PyTorch Distributed Checkpoint keeps
its planner, StorageWriter, StorageReader and coordinator apart:

- what to write: write_plan.py (a pure value: paths and folders of one checkpoint's files);
- writing them: writer.py (through the format, fsynced, the failed ones removed);
- committing: commit.py (every rank's say, rank 0's decision, one outcome everywhere) with
  publish.py (coordinator files, folder fsyncs, the manifest written last, the tag) and
  metadata.py (the manifest's and coordinator files' contents, pure);
- retention: retention.py; the run's checkpoint folders: folders.py;
- restore: restore.py (the reader) with restore_plan.py (what it reads, pure).

The strategy (strategies.py) decides who writes which file when; the protocol is in
docs/checkpointing.md ("Atomic commit").
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

from dlio_ckpt.checkpoint.base import CheckpointRecord, RestoreRecord
from dlio_ckpt.checkpoint.commit import Committer
from dlio_ckpt.checkpoint.encoded import Payload, check_encoding, encoded_payload, make_encoder, tensor_chunks_of
from dlio_ckpt.checkpoint.fileio import FileEntry, tensor_key
from dlio_ckpt.checkpoint.folders import CheckpointFolders
from dlio_ckpt.checkpoint.formats import get_format
from dlio_ckpt.checkpoint.metadata import CheckpointIdentity
from dlio_ckpt.checkpoint.publish import Publisher
from dlio_ckpt.checkpoint.registry import canonical_strategy
from dlio_ckpt.checkpoint.restore import CheckpointReader
from dlio_ckpt.checkpoint.retention import Retention
from dlio_ckpt.checkpoint.triggers import Triggers
from dlio_ckpt.codec_registry import codec_names, encoding_label
from dlio_ckpt.checkpoint.write_plan import plan_write
from dlio_ckpt.checkpoint.writer import CheckpointWriter
from dlio_ckpt.content import ByteSource
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.plan.checkpoint import CheckpointPlan, PlannedFile, build_checkpoint_plan
from dlio_ckpt.plan.durability import check_flat_layout, data_fsync, resolve_durability
from dlio_ckpt.state.rank_state import RankState
from dlio_ckpt.storage.durable import backend_root


class CheckpointEngineImpl:
    """One rank's checkpoint engine; `strategy` decides who writes what, and when."""

    def __init__(self, ctx: Any, strategy_cls: type, plan: CheckpointPlan | None = None, root: str | None = None,
                 storage: Any = None, state: Any = None) -> None:
        """`root`, `storage` and `state` let several engines (the levels of a multi-level setup)
        share one rank's evolving state while each writes to its own tier."""
        self.ctx = ctx
        self.config = ctx.config
        self.cfg = ctx.config.checkpoint
        self.world = ctx.world
        self.plan = plan or build_checkpoint_plan(ctx.config, ctx.world.size)
        self.layout = self.plan.layout
        self.fmt = get_format(self.cfg.format, self.layout.name)
        if self.cfg.archive_name and hasattr(self.fmt, "archive_name"):  # torch: the program's file's name
            self.fmt = dataclasses.replace(self.fmt, archive_name=self.cfg.archive_name)
        needs = getattr(self.fmt, "needs_layout", None)
        if needs and needs != self.layout.name:
            raise ConfigError(f"checkpoint.format={self.fmt.name} writes {needs}'s own file names; "
                              f"use checkpoint.layout={needs} (not {self.layout.name})")
        # Formats whose framework opens and names its own files (TensorFlow) are staged per rank
        # and merged by the coordinator at commit; see formats.py.
        framework_writes = bool(getattr(self.fmt, "writes_paths", False))
        # checkpoint.durability (plan/durability.py): under `framework` only the framework's own
        # calls are issued (its fsyncs, if any; no checksum, no manifest); `commit` is the protocol.
        self.durability = resolve_durability(ctx.config)
        check_flat_layout(self.layout, self.durability, self.cfg.keep_last)
        self.data_fsync = data_fsync(self.durability, self.fmt, self.layout, self.cfg.fsync)
        check_encoding(self.cfg)
        base_storage = storage if storage is not None else ctx.storage
        self.storage = base_storage.with_phase("checkpoint")
        self.restore_storage = base_storage.with_phase("restore")
        self.root = root or ctx.checkpoint_root()
        self.triggers = Triggers.from_config(self.cfg)
        self.records: list[CheckpointRecord] = []
        self._source: ByteSource | None = None
        self._state = state
        self._encoder: Any = None
        self._resume: dict[int, dict] = {}  # step -> the loop's resume point, until its manifest is written
        self._steps: dict[int, int] = {}  # checkpoint index -> step, for the chains of encoded checkpoints
        # step -> the number the framework names the checkpoint by, where it is not the step: in its
        # own flat layout TensorFlow's CheckpointManager numbers by its save counter (ckpt-1, ckpt-2)
        self._numbers: dict[int, int] = {}
        self._last_step = -1
        self._last_time = time.monotonic()
        # the parts, each with the values it needs
        flat = self.layout.flat(self.durability.commit)
        self.folders = CheckpointFolders(self.root, self.layout, self.storage, flat=flat)
        if flat and self.cfg.enabled:  # the program makes its checkpoint directory at its start (CheckpointManager's
            self.storage.makedirs(self.root)  # constructor, a loop's os.makedirs), never inside a save
        self.writer = CheckpointWriter(self.storage, self.fmt, self.world.rank, self.data_fsync,
                                       self.cfg.checksum if self.durability.commit else "none",
                                       self.cfg.write_chunk_bytes, framework_writes)
        self.retention = Retention(self.folders, self.cfg.keep_last)
        # the top of the folder chain a commit fsyncs: the storage root (a level's path)
        top = backend_root(base_storage) or os.path.abspath(self.config.storage.root)
        self.publisher = Publisher(self.folders, self.storage, self.fmt, self.plan.files_by_rank, self.world.size,
                                   self.cfg.fsync, self.cfg.checksum, self.cfg.write_chunk_bytes, framework_writes,
                                   top, self.cfg.keep_last)
        identity = CheckpointIdentity(ctx.run_id, canonical_strategy(self.cfg.strategy), self.layout.name,
                                      self.fmt.name, self.cfg.checksum, self.world.size)
        self.committer = Committer(self.world, self.folders, self.publisher, self.retention, identity,
                                   self.durability.commit, encoding_label(self.cfg), self._resume, self._steps)
        self.reader = CheckpointReader(self.world, self.folders, self.restore_storage, self.plan.files_by_rank,
                                       self.fmt.name, self.cfg.write_chunk_bytes, self.cfg.state_dir,
                                       lambda: self.state)
        self.strategy = strategy_cls(self)
        if state is None and (self.cfg.enabled or self.config.mode == "checkpoint"):
            self.source  # the pool's random bytes are drawn now, not inside the first checkpoint's timing

    # contents ------------------------------------------------------------------------------
    @property
    def source(self) -> ByteSource:
        if self._source is None:
            self._source = ByteSource(seed=self.config.seed * 7919 + 17, pool_bytes=self.config.generate.pool_bytes,
                                      zeros=self.cfg.content == "zeros")
        return self._source

    @property
    def state(self) -> Any:
        """This rank's evolving model state (checkpoint.update), over the files it owns."""
        if self._state is None:
            self._state = RankState(self.plan.files_by_rank[self.world.rank], self.cfg, self.config.seed, self.source,
                                    layout=self.plan.files_by_rank)
        return self._state

    def use_state(self, state: Any) -> None:
        """Share `state` (another engine's): the levels of a multi-level setup write one state."""
        self._state = state

    @property
    def encoder(self) -> Any:
        """This rank's encoder (None for checkpoint.encoding=full); it remembers earlier checkpoints."""
        if self._encoder is None and codec_names(self.cfg):
            self._encoder = make_encoder(self.cfg, self.plan.files_by_rank[self.world.rank])
        return self._encoder

    def payload(self, pf: PlannedFile, index: int, view: Any = None) -> Payload:
        """What to write for `pf` at checkpoint `index`: from the live state, or from `view` (an
        async snapshot of it). Encoding runs here, so its time is the caller's: blocking for a
        synchronous save, in the persist thread for async."""
        if self.encoder is None:
            if view is None and pf.owner != self.world.rank and self.cfg.update == "random":
                # A plan of more ranks than run (tests, serial single_writer): random state is a
                # function of (owner, tensor, step), so any rank can produce any owner's bytes.
                step, chunk = self._last_step, self.cfg.write_chunk_bytes
                return Payload(pf.tensors, lambda t: self.source.chunks(tensor_key(pf.owner, t.name, step), t.nbytes, chunk))
            if view is None:
                return Payload(pf.tensors, lambda t: self.state.tensor_chunks(pf, t, self.cfg.write_chunk_bytes))
            return Payload(pf.tensors, tensor_chunks_of(view, pf, self.cfg.write_chunk_bytes))
        return encoded_payload(self.encoder, index, pf, view if view is not None else self.state.view(pf),
                               self.fmt.name, self.cfg.write_chunk_bytes)

    # triggers ------------------------------------------------------------------------------
    def due(self, step: int, epoch: int, epoch_end: bool, trigger_step: int | None = None) -> bool:
        """`trigger_step`: the step number the step trigger counts (DLIO counts within each epoch);
        `step` stays the run's global step."""
        if not self.cfg.enabled or step == self._last_step:
            return False
        return self.triggers.due(step if trigger_step is None else trigger_step, epoch, epoch_end,
                                 time.monotonic() - self._last_time, self.world.bcast)

    def save(self, step: int, epoch: int, resume: dict | None = None) -> CheckpointRecord:
        """Checkpoint the state as of `step`; `resume` (the data loader's position) goes in the manifest."""
        self._last_step = step
        if resume is not None:
            self._resume[step] = dict(resume)
        index = len(self.records)
        self._steps[index] = step
        # CheckpointManager.save(): its save counter, from 1; flat_numbers=step (save(checkpoint_number=step))
        # and a folder per checkpoint keep no entry: number() gives the step
        if self.folders.flat and self.cfg.flat_numbers == "counter":
            self._numbers[step] = index + 1
        self.state.advance(step)
        record = self.strategy.save(index, step, epoch)
        self._last_time = time.monotonic()
        self.records.append(record)
        return record

    def finish(self) -> None:
        self.strategy.finish()

    # writing (write_plan.py, writer.py) --------------------------------------------------------
    def number(self, step: int) -> int:
        """The number checkpoint `step`'s names carry: the step, or the framework's own (_numbers)."""
        return self._numbers.get(step, step)

    def checkpoint_name(self, step: int) -> str:
        """Checkpoint `step`'s name (its folder's, or its files' prefix in a flat layout)."""
        return self.layout.folder(self.number(step))

    def folder_path(self, step: int) -> str:
        return self.folders.path(self.number(step))

    def write_planned(self, files: tuple[PlannedFile, ...], step: int,
                      payload_for: Callable[[PlannedFile], Payload]) -> list[FileEntry]:
        """Write `files` of checkpoint `step` (each fsynced) and return their manifest entries."""
        return self.writer.write(plan_write(self.folder_path(step), self.number(step), files,
                                            folder_exists=self.folders.flat), payload_for)

    def discard_failed(self, step: int) -> None:
        """Remove checkpoint `step`'s folder if it was never committed (see CheckpointFolders)."""
        self.folders.discard_failed(self.number(step))

    # commit (commit.py, publish.py) -----------------------------------------------------------
    def commit(self, index: int, step: int, epoch: int, entries: list[FileEntry],
               error: BaseException | None = None) -> tuple[int, float]:
        """Collective: make checkpoint `step` visible (manifest written last, all or nothing).
        Returns (metadata bytes, seconds). The encoder adopts what it encoded for this checkpoint
        only once the manifest is written."""
        return self.committer.commit(index, self.number(step), epoch, entries, error, self._settle)

    def _settle(self, index: int, committed: bool) -> None:
        if self._encoder is not None:
            self._encoder.settle(index, committed=committed)

    # retention (retention.py) and restore (restore.py) ----------------------------------------
    def checkpoint_folders(self) -> list[tuple[int, str, bool]]:
        """(step, folder name, complete) of this run's checkpoints, oldest first."""
        return self.folders.listing()

    def restore(self, step: int | None = None, warn_if_none: bool = True, load_state: bool = False) -> RestoreRecord | None:
        """Collective: restore the newest complete, verified checkpoint (or `step`'s), once every
        checkpoint in flight is persisted; see CheckpointReader.restore."""
        self.strategy.finish()
        return self.reader.restore(step, warn_if_none, load_state)

    # failures ----------------------------------------------------------------------------------
    def tear(self, step: int) -> None:
        """Collective: an injected failure struck while checkpoint `step` was being written, so its
        commit never happened: its folder goes, manifest first. Through the untraced backend, as
        a node's loss (levels.py): the failure's doing, not the program's I/O."""
        self.world.barrier()
        if self.world.is_root:
            self.folders.tear(step, getattr(self.storage, "inner", self.storage))
        self.world.barrier()

    def fail(self, kind: str = "process") -> None:
        """Collective: what a failure does to this side of training: the in-memory state and the
        encoders' memory are lost, and checkpoints still being persisted are abandoned (their
        partial folders removed, never committed). Storage keeps whatever was committed."""
        abandon = getattr(self.strategy, "abandon", None)
        steps = abandon() if abandon else []
        self.world.barrier()
        if self.world.is_root:
            for step in steps:
                self.discard_failed(step)
        if self._state is not None:
            self._state.close()
        self._state = None
        self._encoder = None
        self._resume.clear()
        self._last_step = -1  # steps after the restored one are trained (and due) again (helper-policy hook)
