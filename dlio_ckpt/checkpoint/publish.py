"""What a commit writes after the data files, in the order that makes it durable.

The commit's writes and fsyncs, apart from its decision (commit.py) and from the data files
(writer.py), as DCP keeps the coordinator's metadata step apart from StorageWriter.write_data:

- every rank: fsync the folders its files' entries are in (`sync_file_folders`);
- rank 0, checkpoint.durability=commit: the framework's merged files or the layout's coordinator
  files (`coordinator_files`), then the folders above the checkpoint folder fsynced and the
  manifest written last, all or nothing (`publish_manifest`: `write_atomic`, on POSIX a
  temporary name, fsync, rename, then the checkpoint folder fsynced), then the "latest" tag;
- rank 0, checkpoint.durability=framework: only what the framework itself writes after the data
  (`framework_metadata`), as it writes it; no manifest.

The order of these calls is the protocol (docs/checkpointing.md, "Atomic commit";
tests/test_commit_durability.py checks it call by call): change it only with that test.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from dlio_ckpt.checkpoint.fileio import merge_framework_files, write_framework_metadata
from dlio_ckpt.checkpoint.folders import CheckpointFolders
from dlio_ckpt.checkpoint.metadata import coordinator_content, metadata_entry, without_records
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME, PlannedFile
from dlio_ckpt.storage.durable import entry_folders, sync_folders


class Publisher:
    """The commit's writes for the checkpoints of `folders`.

    `fsync`: checkpoint.fsync (folders and metadata files); `checksum`: the manifest's algorithm;
    `framework_writes`: the format's framework merges per-rank staged files into its own names
    (TensorFlow); `top`: the storage root, the top of the folder chain a commit fsyncs."""

    def __init__(self, folders: CheckpointFolders, storage: Any, fmt: Any,
                 files_by_rank: Sequence[tuple[PlannedFile, ...]], world_size: int, fsync: bool, checksum: str,
                 chunk_bytes: int, framework_writes: bool, top: str, keep_last: int = 0) -> None:
        self.folders = folders
        self.storage = storage
        self.fmt = fmt
        self.files_by_rank = files_by_rank
        self.world_size = world_size
        self.fsync = fsync
        self.checksum = checksum
        self.chunk_bytes = chunk_bytes
        self.framework_writes = framework_writes
        self.top = top
        self.keep_last = keep_last
        # the checkpoints a framework's tag lists (TensorFlow's CheckpointManager keeps them with
        # their times): (step, time written), at most keep_last + 1, and when its keeper started
        self.saves: list[tuple[int, float]] = []
        self.started = time.time() - 1.0

    def sync_file_folders(self, step: int, relpaths: list[str]) -> int:
        """This rank's part of a commit: fsync the folders that the entries of its files of
        checkpoint `step` (paths relative to its folder) are in, from each file's folder up to
        the checkpoint folder. Returns the folders synced (none with checkpoint.fsync=false)."""
        if not self.fsync or not relpaths:
            return 0
        folder = self.folders.path(step)
        return sync_folders(self.storage, entry_folders([os.path.join(folder, p) for p in relpaths], folder))

    def _tensors(self, step: int) -> dict:
        """Every planned file of checkpoint `step` (its path in the folder) -> (owner, tensors): what
        the framework's merge wrote its shared index from."""
        return {pf.path_for(step): (pf.owner, pf.tensors) for files in self.files_by_rank for pf in files}

    def coordinator_files(self, step: int, files: list[dict]) -> tuple[int, list[dict]]:
        """Rank 0, before the manifest: the framework's merged files (it writes its own index when
        it merges the shards) or the layout's coordinator files, each written whole. Returns
        (their bytes, the manifest's file list: `files` without records, then these)."""
        folder = self.folders.path(step)
        layout = self.folders.layout
        metadata = 0
        records = files  # with each file's records (DCP) for the coordinator's files; the manifest lists none
        files = without_records(files)
        names = layout.coordinator_files(step, self.world_size)
        if self.framework_writes:
            for path, size, digest in merge_framework_files(self.storage, folder, [f["path"] for f in files], self.fmt,
                                                            self.fsync, self.checksum, self.chunk_bytes,
                                                            self._tensors(step)):
                files = files + [{"path": path, "size": size, "checksum": digest, "owner": 0, "writer": 0}]
                metadata += size
            names = []
        for name in names:
            content = coordinator_content(self.fmt, layout.name, self.files_by_rank, step, records, folder)
            self.storage.write_atomic(os.path.join(folder, name), content)
            files = files + [metadata_entry(name, content, self.checksum)]
            metadata += len(content)
        return metadata, files

    def publish_manifest(self, step: int, manifest: bytes) -> None:
        """Rank 0's commit step: fsync the folders above the checkpoint folder (the root, which
        holds its entry, up to the storage root), then write the manifest all or nothing
        (`write_atomic`: on POSIX temporary name, fsync, rename, fsync of the checkpoint folder)."""
        folder = self.folders.path(step)
        if self.fsync:
            sync_folders(self.storage, entry_folders([folder], self.top))
        self.storage.write_atomic(os.path.join(folder, MANIFEST_NAME), manifest)

    def tag_texts(self, step: int) -> list[str]:
        """The contents of each write of the layout's tag for checkpoint `step`, written now."""
        self.saves = [s for s in self.saves if s[0] != step] + [(step, time.time())]
        texts = self.folders.layout.tag_texts(step, self.saves, self.keep_last, self.started, self.folders.flat)
        if self.keep_last:
            self.saves = self.saves[-self.keep_last:]
        return texts

    def write_tag(self, step: int) -> int:
        """Rank 0, after the manifest: the framework's "latest" tag, written all or nothing, as it
        stands after the framework's rotation; its bytes."""
        tag = self.folders.layout.tag(step)
        if not tag:
            return 0
        text = self.tag_texts(step)[-1]
        self.storage.write_atomic(os.path.join(self.folders.root, tag[0]), text.encode())
        return len(text)

    def framework_metadata(self, step: int, files: list[dict], rotate: Callable[[], None] = lambda: None) -> int:
        """checkpoint.durability=framework, on the coordinator: the files the framework itself
        writes after the data (TensorFlow's merged index, DCP's `.metadata`, the layout's "latest"
        tag), written as the framework writes them (`Layout.metadata_write`). No manifest: a real
        program writes none. `rotate` (deleting the checkpoints past keep_last) runs after the
        tag's first write, as CheckpointManager sweeps between its two, or after the metadata when
        the layout has no tag. Returns their bytes."""
        folder = self.folders.path(step)
        layout = self.folders.layout
        metadata = 0
        if self.framework_writes:
            for _, size, _ in merge_framework_files(self.storage, folder, [f["path"] for f in files], self.fmt,
                                                    False, "none", self.chunk_bytes, self._tensors(step)):
                metadata += size
        else:
            for name in layout.coordinator_files(step, self.world_size):
                content = coordinator_content(self.fmt, layout.name, self.files_by_rank, step, files, folder)
                write_framework_metadata(self.storage, os.path.join(folder, name), content, layout.metadata_write)
                metadata += len(content)
        tag = layout.tag(step)
        texts = self.tag_texts(step) if tag else []
        for index, text in enumerate(texts):
            write_framework_metadata(self.storage, os.path.join(self.folders.root, tag[0]), text.encode(),
                                     layout.metadata_write)
            metadata += len(text)
            if index == 0:
                rotate()
        if not texts:
            rotate()
        return metadata
