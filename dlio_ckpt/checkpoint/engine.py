"""The checkpoint engine: triggers, the commit protocol, retention and restore, around a strategy.

What every strategy shares lives here, so they differ only in who writes which file when:

- commit: after every rank's data files are fsynced, rank 0 gathers the file lists (path, size,
  checksum, writer), writes the layout's coordinator files, then the manifest last and all or nothing
  (`write_atomic`: a renamed temporary file on POSIX, one PUT on S3), then the framework's "latest"
  tag. A folder without a manifest is torn.
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
from typing import Any, Callable, Iterator

from dlio_ckpt.checkpoint.base import CheckpointRecord, RestoreRecord
from dlio_ckpt.checkpoint.fileio import (FileEntry, merge_framework_files, now, tensor_key,
                                         verify_file, write_file, write_framework_file)
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
from dlio_ckpt.plan.model import TensorSpec



class CheckpointEngineImpl:
    """One rank's checkpoint engine; `strategy` decides who writes what, and when."""

    def __init__(self, ctx: Any, strategy_cls: type, plan: CheckpointPlan | None = None) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.cfg = ctx.config.checkpoint
        self.world = ctx.world
        self.plan = plan or build_checkpoint_plan(ctx.config, ctx.world.size)
        self.layout = self.plan.layout
        self.fmt = get_format(self.cfg.format)
        needs = getattr(self.fmt, "needs_layout", None)
        if needs and needs != self.layout.name:
            raise ConfigError(f"checkpoint.format={self.fmt.name} writes {needs}'s own file names; "
                              f"use checkpoint.layout={needs} (not {self.layout.name})")
        # Formats whose framework opens and names its own files (TensorFlow) are staged per rank
        # and merged by the coordinator at commit; see formats.py.
        self.framework_writes = bool(getattr(self.fmt, "writes_paths", False))
        self.storage = ctx.storage.with_phase("checkpoint")
        self.restore_storage = ctx.storage.with_phase("restore")
        self.root = ctx.checkpoint_root()
        self.triggers = Triggers.from_config(self.cfg)
        self.records: list[CheckpointRecord] = []
        self.strategy_name = canonical_strategy(self.cfg.strategy)
        self._source: ByteSource | None = None
        self._last_step = -1
        self._last_time = time.monotonic()
        self.strategy = strategy_cls(self)
        if self.cfg.enabled or self.config.mode == "checkpoint":
            self.source  # the pool's random bytes are drawn now, not inside the first checkpoint's timing

    # contents ------------------------------------------------------------------------------
    @property
    def source(self) -> ByteSource:
        if self._source is None:
            self._source = ByteSource(seed=self.config.seed * 7919 + 17, pool_bytes=self.config.generate.pool_bytes,
                                      zeros=self.cfg.content == "zeros")
        return self._source

    def source_chunks(self, owner: int, step: int) -> Callable[[TensorSpec], Iterator[memoryview]]:
        chunk = self.cfg.write_chunk_bytes

        def chunks(tensor: TensorSpec) -> Iterator[memoryview]:
            return self.source.chunks(tensor_key(owner, tensor.name, step), tensor.nbytes, chunk)

        return chunks

    # triggers ------------------------------------------------------------------------------
    def due(self, step: int, epoch: int, epoch_end: bool, trigger_step: int | None = None) -> bool:
        """`trigger_step`: the step number the step trigger counts (DLIO counts within each epoch);
        `step` stays the run's global step."""
        if not self.cfg.enabled or step == self._last_step:
            return False
        if epoch_end:
            return self.triggers.at_epoch_end(epoch)
        if self.triggers.at_step(step if trigger_step is None else trigger_step):
            return True
        if self.cfg.seconds_between_checkpoints > 0:
            # Clocks differ between ranks: rank 0 decides and every rank follows.
            elapsed = time.monotonic() - self._last_time
            return bool(self.world.bcast(elapsed >= self.cfg.seconds_between_checkpoints))
        return False

    def save(self, step: int, epoch: int) -> CheckpointRecord:
        self._last_step = step
        record = self.strategy.save(len(self.records), step, epoch)
        self._last_time = time.monotonic()
        self.records.append(record)
        return record

    def finish(self) -> None:
        self.strategy.finish()

    # writing -------------------------------------------------------------------------------
    def folder_path(self, step: int) -> str:
        return os.path.join(self.root, self.layout.folder(step))

    def write_planned(self, files: tuple[PlannedFile, ...], step: int,
                      chunks_for: Callable[[PlannedFile], Callable[[TensorSpec], Iterator[memoryview]]]) -> list[FileEntry]:
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
                chunks = self._with_write_fault_point(chunks_for(pf), step, path)
                if self.framework_writes:
                    done = write_framework_file(self.storage, path, pf.owner, pf.tensors, self.fmt, chunks,
                                                self.cfg.fsync, self.cfg.checksum, self.cfg.write_chunk_bytes)
                else:
                    done = write_file(self.storage, path, pf.tensors, self.fmt, chunks, self.cfg.fsync,
                                      self.cfg.checksum, self.cfg.write_chunk_bytes)
                entries.append(FileEntry(rel, done.size, done.checksum, pf.owner, self.world.rank,
                                         done.bytes_written, done.write_s, done.verify_s))
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
        """Collective: make checkpoint `step` visible (manifest written last, all or nothing). Returns (metadata bytes, seconds)."""
        start = now()
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
                    status = ("ok", self._write_manifest(index, step, epoch, files))
                except Exception as exc:  # every rank must hear of it, or they wait forever
                    self.discard_failed(step)
                    mine = failure_text(exc)
                    status = ("failed", 0)
        status = self.world.bcast(status)
        if status[0] == "failed":
            # Every rank knows: the ranks that failed say why, in one line each; the others end quietly.
            raise RunFailure(f"checkpoint {self.layout.folder(step)} not committed: {mine}" if mine else "",
                             known_everywhere=True)
        return int(status[1]), now() - start

    def _write_manifest(self, index: int, step: int, epoch: int, files: list[dict]) -> int:
        folder = self.folder_path(step)
        metadata = 0
        coordinator_files = self.layout.coordinator_files(step, self.world.size)
        if self.framework_writes:  # the framework writes its own index when it merges the shards
            for path, size, digest in merge_framework_files(self.storage, folder, [f["path"] for f in files], self.fmt,
                                                            self.cfg.fsync, self.cfg.checksum, self.cfg.write_chunk_bytes):
                files = files + [{"path": path, "size": size, "checksum": digest, "owner": 0, "writer": 0}]
                metadata += size
            coordinator_files = []
        for name in coordinator_files:
            content = json.dumps({
                "step": step,
                "layout": self.layout.name,
                "files": [{"path": f["path"], "owner": f["owner"], "size": f["size"]} for f in files],
                "tensors": {pf.path_for(step): [[t.name, t.numel, t.dtype] for t in pf.tensors]
                            for rank_files in self.plan.files_by_rank for pf in rank_files},
            }).encode()
            self.storage.write_atomic(os.path.join(folder, name), content)
            files = files + [{"path": name, "size": len(content), "checksum": _digest(content, self.cfg.checksum),
                              "owner": 0, "writer": 0}]
            metadata += len(content)
        manifest = encode_manifest({
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
        self.storage.write_atomic(os.path.join(folder, MANIFEST_NAME), manifest)
        metadata += len(manifest)
        tag = self.layout.tag(step)
        if tag:
            self.storage.write_atomic(os.path.join(self.root, tag[0]), tag[1].encode())
            metadata += len(tag[1])
        if self.cfg.keep_last:
            self.apply_retention()
        return metadata

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
        deleted = []
        for step, name, _ in folders:
            path = self._own_folder(name) if step < oldest_kept else None
            if path is not None:
                self.storage.remove_tree(path)
                deleted.append(name)
        return deleted

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
    def restore(self, step: int | None = None, warn_if_none: bool = True) -> RestoreRecord | None:
        """Collective: restore the newest complete, verified checkpoint (or `step`'s). None when
        there is no checkpoint folder; a record with checkpoint_step -1 when every one was rejected
        (printed on stderr unless `warn_if_none` is off: the caller then reports it)."""
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
            read = files = 0
            problems = []
            for entry in manifest["files"]:
                if entry["writer"] % self.world.size != self.world.rank:
                    continue
                got, problem = verify_file(self.restore_storage, os.path.join(folder, entry["path"]), entry["size"],
                                           entry["checksum"], manifest["checksum"], buffer)
                read += got
                files += 1
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
            return RestoreRecord(checkpoint_index=int(manifest.get("index", -1)), bytes=read, files=files, read_s=read_s,
                                 verified=verified, message=message, checkpoint_step=candidate, folder=name,
                                 skipped=skipped, peak_rss_bytes=peak_rss_bytes())
        message = f"no complete checkpoint to restore in {self.root}: " + "; ".join(skipped)
        if warn_if_none:
            self._warn(message)
        return RestoreRecord(checkpoint_index=-1, bytes=0, files=0, read_s=0.0, verified=False, message=message,
                             skipped=skipped, peak_rss_bytes=peak_rss_bytes())

    def _read_manifest(self, folder: str, step: int) -> dict | str:
        """The checkpoint's manifest, validated (see manifest.py), or why the checkpoint is rejected."""
        path = os.path.join(folder, MANIFEST_NAME)
        if not self.restore_storage.exists(path):
            return "torn: no manifest (data written but never committed; a rank may have died mid-write)"
        try:
            raw = self.restore_storage.read_whole(path)
        except OSError as exc:
            return f"unreadable manifest ({exc.strerror or exc})"
        return parse_manifest(raw, folder, step)

    def _warn(self, message: str) -> None:
        if self.world.is_root:
            print(f"dlio_ckpt: checkpoint restore: {message}", file=sys.stderr, flush=True)


def _digest(data: bytes, algorithm: str) -> str:
    from dlio_ckpt.checkpoint.fileio import new_hasher

    hasher = new_hasher(algorithm)
    if hasher is None:
        return ""
    hasher.update(data)
    return hasher.hexdigest()
