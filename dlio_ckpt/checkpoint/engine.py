"""The checkpoint engine: triggers, the commit protocol, retention and restore, around a strategy.

What every strategy shares lives here, so they differ only in who writes which file when:

- commit: after every rank's data files are fsynced, each rank fsyncs the folders its files'
  entries are in, rank 0 gathers the file lists (path, size, checksum, writer), writes the layout's
  coordinator files, fsyncs the folders above the checkpoint folder, then writes the manifest last
  and all or nothing (`write_atomic`: a renamed temporary file on POSIX, then its folder fsynced;
  one PUT on S3), then the framework's "latest" tag. A folder without a manifest is torn; what
  fails after the manifest (tag, retention) is reported as such, never as an uncommitted checkpoint.
- restore: newest checkpoint first; every file is read in full by the rank that wrote it and
  checked against the manifest (size, checksum); a torn or corrupted checkpoint is skipped with a
  message naming what failed, and the previous complete one is restored.
- retention: keep the newest `keep_last` complete checkpoints; delete older folders only directly
  inside this run's checkpoint root.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import closing
from typing import Any, Callable, Iterator

from dlio_ckpt.checkpoint.base import CheckpointRecord, RestoreRecord
from dlio_ckpt.checkpoint.fileio import (FileEntry, merge_framework_files, now, tensor_key,
                                         verify_file, write_file, write_framework_file, write_framework_metadata)
from dlio_ckpt.checkpoint.encoded import (Payload, Window, check_encoding, digest_view, encoded_payload, make_decoder,
                                         make_encoder, payload_offset, tensor_chunks_of)
from dlio_ckpt.codec.base import ChainLink
from dlio_ckpt.checkpoint.formats import get_format
from dlio_ckpt.checkpoint.manifest import encode_manifest, parse_manifest
from dlio_ckpt.checkpoint.registry import canonical_strategy
from dlio_ckpt.checkpoint.triggers import Triggers
from dlio_ckpt.content import ByteSource
from dlio_ckpt.errors import ConfigError, RunFailure, failure_text, storage_failure
from dlio_ckpt.faults import fault_point
from dlio_ckpt.memory import peak_rss_bytes
from dlio_ckpt.metrics.report import plural
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME, CheckpointPlan, PlannedFile, build_checkpoint_plan
from dlio_ckpt.plan.durability import data_fsync, resolve_durability
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.storage.durable import backend_root, entry_folders, sync_folders



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
        needs = getattr(self.fmt, "needs_layout", None)
        if needs and needs != self.layout.name:
            raise ConfigError(f"checkpoint.format={self.fmt.name} writes {needs}'s own file names; "
                              f"use checkpoint.layout={needs} (not {self.layout.name})")
        # Formats whose framework opens and names its own files (TensorFlow) are staged per rank
        # and merged by the coordinator at commit; see formats.py.
        self.framework_writes = bool(getattr(self.fmt, "writes_paths", False))
        # checkpoint.durability (plan/durability.py): under `framework` only the framework's own
        # calls are issued (its fsyncs, if any; no checksum, no manifest); `commit` is the protocol below.
        self.durability = resolve_durability(ctx.config)
        self.data_fsync = data_fsync(self.durability, self.fmt, self.layout, self.cfg.fsync)
        self.checksum = self.cfg.checksum if self.durability.commit else "none"
        self._framework_steps: list[int] = []  # framework durability: the checkpoints written, for retention
        check_encoding(self.cfg)
        base_storage = storage if storage is not None else ctx.storage
        self.storage = base_storage.with_phase("checkpoint")
        self.restore_storage = base_storage.with_phase("restore")
        self.root = root or ctx.checkpoint_root()
        # the top of the folder chain a commit fsyncs: the storage root (a level's path)
        self._top = backend_root(base_storage) or os.path.abspath(self.config.storage.root)
        self.triggers = Triggers.from_config(self.cfg)
        self.records: list[CheckpointRecord] = []
        self.strategy_name = canonical_strategy(self.cfg.strategy)
        self._source: ByteSource | None = None
        self._state = state
        self._encoder: Any = None
        self._resume: dict[int, dict] = {}  # step -> the loop's resume point, until its manifest is written
        self._steps: dict[int, int] = {}  # checkpoint index -> step, for the chains of encoded checkpoints
        self._last_step = -1
        self._last_time = time.monotonic()
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
            from dlio_ckpt.state.rank_state import RankState

            self._state = RankState(self.plan.files_by_rank[self.world.rank], self.cfg, self.config.seed, self.source,
                                    layout=self.plan.files_by_rank)
        return self._state

    def use_state(self, state: Any) -> None:
        """Share `state` (another engine's): the levels of a multi-level setup write one state."""
        self._state = state

    @property
    def encoder(self) -> Any:
        """This rank's encoder (None for checkpoint.encoding=full); it remembers earlier checkpoints."""
        if self._encoder is None and self.cfg.encoding != "full":
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
        self.state.advance(step)
        record = self.strategy.save(index, step, epoch)
        self._last_time = time.monotonic()
        self.records.append(record)
        return record

    def finish(self) -> None:
        self.strategy.finish()

    # writing -------------------------------------------------------------------------------
    def folder_path(self, step: int) -> str:
        return os.path.join(self.root, self.layout.folder(step))

    def write_planned(self, files: tuple[PlannedFile, ...], step: int,
                      payload_for: Callable[[PlannedFile], Payload]) -> list[FileEntry]:
        """Write `files` of checkpoint `step` (each fsynced) and return their manifest entries."""
        folder = self.folder_path(step)
        made = set()
        entries = []
        started: list[str] = []
        path = folder
        try:
            for pf in files:
                rel = pf.path_for(step)
                path = os.path.join(folder, rel)
                parent = os.path.dirname(path)
                if parent not in made:
                    self.storage.makedirs(parent)
                    made.add(parent)
                started.append(path)
                payload = payload_for(pf)
                chunks = self._with_write_fault_point(payload.chunks, step, path)
                if self.framework_writes:
                    done = write_framework_file(self.storage, path, pf.owner, payload.tensors, self.fmt, chunks,
                                                self.data_fsync, self.checksum, self.cfg.write_chunk_bytes)
                else:
                    done = write_file(self.storage, path, payload.tensors, self.fmt, chunks, self.data_fsync,
                                      self.checksum, self.cfg.write_chunk_bytes)
                entries.append(FileEntry(rel, done.size, done.checksum, pf.owner, self.world.rank,
                                         done.bytes_written, done.write_s, done.verify_s, payload.encoding,
                                         pf.payload_bytes, payload.encode_s, payload.stats or None,
                                         done.write_calls_s, done.fsync_s, done.prepare_s, done.records))
                fault_point(f"checkpoint-step:{step}", self.world.rank)
        except OSError as exc:  # a full disk, say: name the file, and leave no partial files behind
            self._remove_files(started)
            raise storage_failure(exc, exc.filename or path) from None
        except BaseException:
            self._remove_files(started)
            raise
        return entries

    def _with_write_fault_point(self, chunks: Callable[[TensorSpec], Iterator[memoryview]], step: int,
                                path: str) -> Callable[[TensorSpec], Iterator[memoryview]]:
        """`chunks`, with the `checkpoint-write:<step>` fault point after each tensor's first chunk
        (the format has written that chunk to `path` before it asks for the next)."""
        point = f"checkpoint-write:{step}"

        def with_fault_point(tensor: TensorSpec) -> Iterator[memoryview]:
            for number, piece in enumerate(chunks(tensor)):
                yield piece
                if number == 0:
                    fault_point(point, self.world.rank, path)

        return with_fault_point

    def _remove_files(self, paths: list[str]) -> None:
        """This rank's files of a checkpoint that failed: they would only fill the disk."""
        for path in paths:
            try:
                if self.storage.exists(path):
                    self.storage.remove(path)
            except OSError:
                pass  # the failure being reported matters more than a leftover file

    def discard_failed(self, step: int) -> None:
        """Remove the folder of checkpoint `step` of this run when it was never committed (no
        manifest), with any temporary file its commit left; never anything outside this run's root."""
        folder = self._own_folder(self.layout.folder(step))
        try:
            if folder is not None and self.storage.isdir(folder) and not self.storage.exists(os.path.join(folder, MANIFEST_NAME)):
                self.storage.remove_tree(folder)
            tag = self.layout.tag(step)
            for name in self.storage.listdir(self.root) if tag else []:
                if name.startswith(f"{tag[0]}.tmp"):
                    self.storage.remove(os.path.join(self.root, name))
        except OSError:
            pass

    def commit(self, index: int, step: int, epoch: int, entries: list[FileEntry], error: BaseException | None = None) -> tuple[int, float]:
        """Collective: make checkpoint `step` visible (manifest written last, all or nothing). Returns (metadata bytes, seconds).

        The protocol (docs/checkpointing.md, "Atomic commit"): each rank fsyncs the folders its
        files' entries are in (`sync_file_folders`), rank 0 writes the coordinator files, fsyncs
        the folders above the checkpoint folder and writes the manifest (`publish_manifest`), then
        the tag and retention, which come after the commit and never undo it. The encoder adopts
        what it encoded for this checkpoint only once the manifest is written."""
        start = now()
        if error is None and self.durability.commit:  # framework durability: only the framework's own calls
            try:
                self.sync_file_folders(step, [e.path for e in entries])
            except OSError as exc:  # reported like a failed write: the checkpoint is not committed
                error = exc
        mine = failure_text(error) if error else None
        gathered = self.world.gather((None if error else [e.as_dict() for e in entries], mine))
        status: tuple[str, Any] = ("ok", 0)
        if self.world.is_root:
            if any(msg for _, msg in gathered):
                self.discard_failed(step)
                status = ("failed", 0)
            else:
                try:
                    files = [e for part, _ in gathered for e in part]
                    status = ("ok", self._write_manifest(index, step, epoch, files) if self.durability.commit
                              else self._write_framework_metadata(step, files))
                except Exception as exc:  # every rank must hear of it, or they wait forever
                    self.discard_failed(step)
                    mine = failure_text(exc)
                    status = ("failed", 0)
                if status[0] == "ok" and self.durability.commit:  # framework: its tag and retention are written above
                    status, mine = self._after_commit(step, status[1])
        status = self.world.bcast(status)
        if self._encoder is not None:
            self._encoder.settle(index, committed=status[0] != "failed")
        if status[0] == "failed":
            # Every rank knows: the ranks that failed say why, in one line each; the others end quietly.
            raise RunFailure(f"checkpoint {self.layout.folder(step)} not committed: {mine}" if mine else "",
                             known_everywhere=True)
        if status[0] == "after":  # committed: the manifest is on disk; what failed came after it
            raise RunFailure(f"checkpoint {self.layout.folder(step)} committed (its manifest is written), "
                             f"but {mine}" if mine else "", known_everywhere=True)
        return int(status[1]), now() - start

    def _after_commit(self, step: int, metadata: int) -> tuple[tuple[str, Any], str | None]:
        """On rank 0, once the manifest is written: the framework's tag, then retention. Their
        failure is reported as what it is, after a commit that stands (status "after")."""
        tag = self.layout.tag(step)
        if tag:
            try:
                self.storage.write_atomic(os.path.join(self.root, tag[0]), tag[1].encode())
            except Exception as exc:
                return ("after", metadata), f"its {tag[0]!r} tag was not written: {failure_text(exc)}"
            metadata += len(tag[1])
        if self.cfg.keep_last:
            try:
                self.apply_retention()
            except Exception as exc:
                return ("after", metadata), (f"retention (checkpoint.keep_last={self.cfg.keep_last}) failed to "
                                             f"delete an older checkpoint: {failure_text(exc)}")
        return ("ok", metadata), None

    # the commit's durability (storage/durable.py) -------------------------------------------
    def sync_file_folders(self, step: int, relpaths: list[str]) -> int:
        """This rank's part of a commit: fsync the folders that the entries of its files of
        checkpoint `step` (paths relative to its folder) are in, from each file's folder up to
        the checkpoint folder. Returns the folders synced (none with checkpoint.fsync=false)."""
        if not self.cfg.fsync or not relpaths:
            return 0
        folder = self.folder_path(step)
        return sync_folders(self.storage, entry_folders([os.path.join(folder, p) for p in relpaths], folder))

    def publish_manifest(self, step: int, manifest: bytes) -> None:
        """Rank 0's commit step: fsync the folders above the checkpoint folder (the root, which
        holds its entry, up to the storage root), then write the manifest all or nothing
        (`write_atomic`: on POSIX temporary name, fsync, rename, fsync of the checkpoint folder)."""
        folder = self.folder_path(step)
        if self.cfg.fsync:
            sync_folders(self.storage, entry_folders([folder], self._top))
        self.storage.write_atomic(os.path.join(folder, MANIFEST_NAME), manifest)

    def _write_manifest(self, index: int, step: int, epoch: int, files: list[dict]) -> int:
        folder = self.folder_path(step)
        metadata = 0
        records = files  # with each file's records (DCP) for the coordinator's files; the manifest lists none
        files = [{k: v for k, v in f.items() if k != "records"} for f in files]
        coordinator_files = self.layout.coordinator_files(step, self.world.size)
        if self.framework_writes:  # the framework writes its own index when it merges the shards
            for path, size, digest in merge_framework_files(self.storage, folder, [f["path"] for f in files], self.fmt,
                                                            self.cfg.fsync, self.cfg.checksum, self.cfg.write_chunk_bytes):
                files = files + [{"path": path, "size": size, "checksum": digest, "owner": 0, "writer": 0}]
                metadata += size
            coordinator_files = []
        for name in coordinator_files:
            content = self._coordinator_content(step, records)
            self.storage.write_atomic(os.path.join(folder, name), content)
            files = files + [{"path": name, "size": len(content), "checksum": _digest(content, self.cfg.checksum),
                              "owner": 0, "writer": 0}]
            metadata += len(content)
        fields: dict[str, Any] = {}
        needed = sorted({i for f in files for i in f.get("encoding", {}).get("chain", [])})
        if needed:
            fields.update(encoding=self.cfg.encoding, chain=[[i, self._steps[i]] for i in needed])
        if step in self._resume:
            fields["resume"] = self._resume.pop(step)
        manifest = encode_manifest({
            **fields,
            "index": index,
            "step": step,
            "epoch": epoch,
            "run_id": self.ctx.run_id,
            "strategy": self.strategy_name,
            "layout": self.layout.name,
            "format": self.fmt.name,
            "checksum": self.cfg.checksum,
            "world_size": self.world.size,
            "data_bytes": sum(f["size"] for f in files),
            "files": files,
            "written_at": time.time(),
        })
        self.publish_manifest(step, manifest)
        return metadata + len(manifest)

    def _write_framework_metadata(self, step: int, files: list[dict]) -> int:
        """checkpoint.durability=framework, on the coordinator: the files the framework itself
        writes after the data (TensorFlow's merged index, DCP's `.metadata`, the layout's "latest"
        tag), written as the framework writes them (`Layout.metadata_write`), then retention over
        the checkpoints this run wrote. No manifest: a real program writes none."""
        folder = self.folder_path(step)
        metadata = 0
        if self.framework_writes:
            for _, size, _ in merge_framework_files(self.storage, folder, [f["path"] for f in files], self.fmt,
                                                    False, "none", self.cfg.write_chunk_bytes):
                metadata += size
        else:
            for name in self.layout.coordinator_files(step, self.world.size):
                content = self._coordinator_content(step, files)
                write_framework_metadata(self.storage, os.path.join(folder, name), content, self.layout.metadata_write)
                metadata += len(content)
        tag = self.layout.tag(step)
        for _ in range(self.layout.tag_writes if tag else 0):
            write_framework_metadata(self.storage, os.path.join(self.root, tag[0]), tag[1].encode(),
                                     self.layout.metadata_write)
            metadata += len(tag[1])
        self._framework_steps.append(step)
        while self.cfg.keep_last and len(self._framework_steps) > self.cfg.keep_last:
            path = self._own_folder(self.layout.folder(self._framework_steps.pop(0)))
            if path is not None and self.storage.isdir(path):
                self.storage.remove_tree(path)
        return metadata

    def _coordinator_content(self, step: int, files: list[dict]) -> bytes:
        """A layout's coordinator file (DCP's `.metadata`): where every tensor of the checkpoint is;
        the framework's own where the format writes it (torch under DCP: its pickled Metadata),
        else a JSON list of the files and their tensors."""
        own = getattr(self.fmt, "coordinator_content", None)
        if own is not None:
            tensors = {pf.path_for(step): pf.tensors for rank_files in self.plan.files_by_rank for pf in rank_files}
            return own(files, tensors, self.folder_path(step))
        return json.dumps({
            "step": step,
            "layout": self.layout.name,
            "files": [{"path": f["path"], "owner": f["owner"], "size": f["size"]} for f in files],
            "tensors": {pf.path_for(step): [[t.name, t.numel, t.framework_dtype] for t in pf.tensors]
                        for rank_files in self.plan.files_by_rank for pf in rank_files},
        }).encode()

    # retention -----------------------------------------------------------------------------
    def checkpoint_folders(self) -> list[tuple[int, str, bool]]:
        """(step, folder name, complete) of this run's checkpoints, oldest first."""
        found = []
        for name in self.storage.listdir(self.root):
            step = self.layout.parse_step(name)
            path = os.path.join(self.root, name)
            if step is not None and self.storage.isdir(path):
                found.append((step, name, self.storage.exists(os.path.join(path, MANIFEST_NAME))))
        return sorted(found)

    def apply_retention(self) -> list[str]:
        """Delete checkpoints older than the newest `keep_last` complete ones; only in our root."""
        folders = self.checkpoint_folders()
        complete = [step for step, _, ok in folders if ok]
        if len(complete) <= self.cfg.keep_last:
            return []
        oldest_kept = complete[-self.cfg.keep_last]
        needed = self._chain_steps(complete[-self.cfg.keep_last:])
        deleted = []
        for step, name, _ in folders:
            path = self._own_folder(name) if step < oldest_kept and step not in needed else None
            if path is not None:
                self.storage.remove_tree(path)
                deleted.append(name)
        return deleted

    def _chain_steps(self, steps: list[int]) -> set[int]:
        """Steps of the checkpoints that the checkpoints at `steps` need to be restored (their
        chains): retention never deletes one. A manifest that cannot be read protects nothing
        (its checkpoint cannot be restored anyway)."""
        needed: set[int] = set()
        for step in steps:
            manifest = self._read_manifest(self.folder_path(step), step, self.storage)
            if isinstance(manifest, dict):
                needed.update(int(s) for _, s in manifest.get("chain", []))
        return needed

    def _own_folder(self, name: str) -> str | None:
        """The path of `name` directly inside this run's checkpoint root, or None where it is a
        link or leads elsewhere (never followed, never deleted). Only a backend with local files
        has links to resolve; on an object store the path is a key as written, so a storage.root
        reached through a local link must not change it (its key would leave the prefix)."""
        path = os.path.join(self.root, name)
        if not self.storage.capabilities.local_paths:
            return path if os.path.dirname(os.path.normpath(path)) == os.path.normpath(self.root) else None
        resolved = os.path.realpath(path)
        if os.path.dirname(resolved) != os.path.realpath(self.root) or os.path.islink(path):
            return None
        return resolved

    # restore -------------------------------------------------------------------------------
    def restore(self, step: int | None = None, warn_if_none: bool = True, load_state: bool = False) -> RestoreRecord | None:
        """Collective: restore the newest complete, verified checkpoint (or `step`'s). None when
        there is no checkpoint folder; a record with checkpoint_step -1 when every one was rejected
        (printed on stderr unless `warn_if_none` is off: the caller then reports it).

        An encoded checkpoint is rebuilt from its chain (each link's files read in full and
        verified, then decoded) and must come back bit for bit as the state it was written from.
        `load_state` (a restart): the restored bytes become this rank's state."""
        self.strategy.finish()
        if self.world.is_root:
            candidates = [s for s, _, _ in reversed(self.checkpoint_folders()) if step is None or s == step]
        else:
            candidates = None
        candidates = self.world.bcast(candidates)
        if not candidates:
            return None
        candidates = [int(c) for c in candidates]
        skipped: list[str] = []
        buffer = memoryview(bytearray(self.cfg.write_chunk_bytes))
        for candidate in candidates:
            name = self.layout.folder(candidate)
            folder = self.folder_path(candidate)
            manifest = self.world.root_first(lambda: self._read_manifest(folder, candidate))
            if isinstance(manifest, str):
                skipped.append(f"{name}: {manifest}")
                continue
            start = now()
            read = files = chain_length = 0
            problems = []
            digests: dict[str, str] = {}
            chain = self._chain_manifests(manifest) if "chain" in manifest else {}
            for entry in manifest["files"]:
                # A restart loads each rank's own state, whoever wrote it; a restore check reads
                # what each rank wrote.
                reader = entry["owner"] if load_state else entry["writer"]
                if reader % self.world.size != self.world.rank:
                    continue
                if isinstance(chain, str):
                    problems.append(chain)
                    break
                got, problem, digest = self._restore_file(folder, manifest, entry, chain, buffer, load_state)
                read += got
                files += 1
                chain_length = max(chain_length, len(entry.get("encoding", {}).get("chain", [1])))
                if digest:
                    digests[entry.get("encoding", {}).get("key", entry["path"])] = digest
                if problem:
                    problems.append(f"{entry['path']}: {problem}")
            read_s = now() - start
            all_problems = [p for part in self.world.allgather(problems) for p in part]
            if all_problems:
                more = f" (+{len(all_problems) - 1} more)" if len(all_problems) > 1 else ""
                skipped.append(f"{name}: {all_problems[0]}{more}")
                continue
            verified = manifest["checksum"] != "none"
            listed = plural(len(manifest["files"]), "file")
            message = (f"restored {name} (step {candidate}) verified: {manifest['checksum']} and size of {listed}"
                       if verified else
                       f"restored {name} (step {candidate}) unverified: written with checkpoint.checksum=none, "
                       f"only sizes were checked ({listed})")
            if skipped:
                message += "; skipped newer " + "; ".join(skipped) + " -> fell back to the previous complete checkpoint"
                self._warn(message)
            if "chain" in manifest:
                message += f"; rebuilt bit for bit from a chain of {plural(chain_length, 'checkpoint')}"
            return RestoreRecord(checkpoint_index=int(manifest.get("index", -1)), bytes=read, files=files, read_s=read_s,
                                 verified=verified, message=message, checkpoint_step=candidate, folder=name,
                                 skipped=skipped, peak_rss_bytes=peak_rss_bytes(), resume=manifest.get("resume", {}),
                                 state_digests=digests, chain_length=chain_length, encoding=manifest.get("encoding", "full"))
        message = f"no complete checkpoint to restore in {self.root}: " + "; ".join(skipped)
        if warn_if_none:
            self._warn(message)
        return RestoreRecord(checkpoint_index=-1, bytes=0, files=0, read_s=0.0, verified=False, message=message,
                             skipped=skipped, peak_rss_bytes=peak_rss_bytes())

    def _chain_manifests(self, manifest: dict) -> dict[int, tuple[str, dict]] | str:
        """The folder and manifest of every earlier checkpoint in `manifest`'s chain (index ->
        (folder, manifest)), or why the chain is broken (a link deleted, torn or altered)."""
        links: dict[int, tuple[str, dict]] = {}
        for index, link_step in manifest["chain"]:
            if index == manifest["index"] and link_step == manifest["step"]:
                continue
            folder = self.folder_path(link_step)
            found = self.world.root_first(lambda f=folder, s=link_step: self._read_manifest(f, s))
            name = self.layout.folder(link_step)
            if isinstance(found, str):
                return f"chain link {name} (checkpoint {index}) unusable: {found}"
            if found["index"] != index:
                return f"chain link {name} is checkpoint {found['index']}, the chain needs checkpoint {index}"
            links[index] = (folder, found)
        return links

    def _restore_file(self, folder: str, manifest: dict, entry: dict, chain: dict[int, tuple[str, dict]],
                      buffer: memoryview, load_state: bool) -> tuple[int, str | None, str]:
        """Read, verify and (encoded files) rebuild one file; (bytes read, problem, state digest)."""
        from dlio_ckpt.state.store import ScratchStore

        algorithm = manifest["checksum"]
        encoding = entry.get("encoding")
        if encoding is None:
            if not load_state:
                got, problem = verify_file(self.restore_storage, os.path.join(folder, entry["path"]), entry["size"],
                                           entry["checksum"], algorithm, buffer)
                return got, problem, ""
            pf = self._planned(entry["owner"], entry["path"], manifest["step"])
            if isinstance(pf, str):
                return 0, pf, ""
            with closing(ScratchStore(entry["size"], self.cfg.state_dir)) as kept:
                got, problem = verify_file(self.restore_storage, os.path.join(folder, entry["path"]), entry["size"],
                                           entry["checksum"], algorithm, buffer, sink=kept)
                if problem:
                    return got, problem, ""
                view = Window(kept, payload_offset(self.fmt.name, pf.payload_bytes), pf.payload_bytes)
                self.state.load(pf, view, manifest["step"])
                return got, None, digest_view(view, len(buffer))
        pf = self._planned(entry["owner"], encoding["key"], None)
        if isinstance(pf, str):
            return 0, pf, ""
        read = 0
        stores: list[Any] = []  # each link's file as read and verified (untraced scratch)
        links: list[ChainLink] = []
        try:
            for index in encoding["chain"]:
                link_folder, link_entry = (folder, entry) if index == encoding["index"] else \
                    (chain[index][0], _same_file(chain[index][1], encoding["key"], entry["owner"]))
                name = os.path.basename(link_folder)
                if link_entry is None:
                    return read, f"chain link {name} has no {encoding['key']} of rank {entry['owner']}", ""
                stores.append(ScratchStore(link_entry["size"], self.cfg.state_dir))
                got, problem = verify_file(self.restore_storage, os.path.join(link_folder, link_entry["path"]),
                                           link_entry["size"], link_entry["checksum"], algorithm, buffer, sink=stores[-1])
                read += got
                if problem:
                    return read, f"chain link {name}: {problem}", ""
                inner = link_entry["encoding"]
                window = Window(stores[-1], inner["offset"], inner["container_bytes"])
                links.append(ChainLink(index=index, size=window.size, read_at=window.read_at))
            with closing(ScratchStore(encoding["logical_bytes"], self.cfg.state_dir)) as out:
                try:
                    make_decoder(encoding["codec"], pf.tensors).rebuild(links, out)
                except ValueError as exc:
                    return read, f"cannot rebuild from its chain: {exc}", ""
                digest = digest_view(out, len(buffer))
                if digest != encoding["state_digest"]:
                    return read, (f"rebuilt state differs from the state written (xxh3_128 {digest[:12]}..., "
                                  f"manifest {encoding['state_digest'][:12]}...)"), digest
                if load_state:
                    self.state.load(pf, out, manifest["step"])
                return read, None, digest
        finally:
            for store in stores:
                store.close()

    def _planned(self, owner: int, key: str, step: int | None) -> PlannedFile | str:
        """The planned file of rank `owner` whose path template is `key` (or, given `step`, whose
        path at that step is `key`): where a restored file's tensors and state belong."""
        if not 0 <= owner < self.plan.world_size:
            return f"written by rank {owner}, outside this run's {self.plan.world_size} ranks"
        for pf in self.plan.files_by_rank[owner]:
            if (pf.path_for(step) if step is not None else pf.relpath) == key:
                return pf
        return f"not a file of this run's plan for rank {owner} (written with another model, layout or world size)"

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

    def tear(self, step: int) -> None:
        """Collective: an injected failure struck while checkpoint `step` was being written, so its
        commit never happened: its folder goes, manifest first. Through the untraced backend, as
        a node's loss (levels.py): the failure's doing, not the program's I/O."""
        self.world.barrier()
        folder = self._own_folder(self.layout.folder(step)) if self.world.is_root else None
        backend = getattr(self.storage, "inner", self.storage)
        if folder is not None and backend.isdir(folder):
            if backend.exists(os.path.join(folder, MANIFEST_NAME)):
                backend.remove(os.path.join(folder, MANIFEST_NAME))
            backend.remove_tree(folder)
        self.world.barrier()

    def _read_manifest(self, folder: str, step: int, storage: Any = None) -> dict | str:
        """The checkpoint's manifest, validated (see manifest.py), or why the checkpoint is rejected."""
        storage = storage or self.restore_storage
        path = os.path.join(folder, MANIFEST_NAME)
        if not storage.exists(path):
            return "torn: no manifest (data written but never committed; a rank may have died mid-write)"
        try:
            raw = storage.read_whole(path)
        except OSError as exc:
            return f"unreadable manifest ({exc.strerror or exc})"
        return parse_manifest(raw, folder, step)

    def _warn(self, message: str) -> None:
        if self.world.is_root:
            print(f"dlio_ckpt: checkpoint restore: {message}", file=sys.stderr, flush=True)


def _same_file(manifest: dict, key: str, owner: int) -> dict | None:
    """The entry of `manifest` holding the encoded file `key` of rank `owner`."""
    for entry in manifest["files"]:
        if entry.get("owner") == owner and entry.get("encoding", {}).get("key") == key:
            return entry
    return None


def _digest(data: bytes, algorithm: str) -> str:
    from dlio_ckpt.checkpoint.fileio import new_hasher

    hasher = new_hasher(algorithm)
    if hasher is None:
        return ""
    hasher.update(data)
    return hasher.hexdigest()
