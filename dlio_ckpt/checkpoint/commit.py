"""The commit: every rank's say, one decision on rank 0, the same outcome on every rank.

A checkpoint counts only once every rank's files are durable and the manifest listing them is
written (publish.py writes, in their durable order); this module is the coordinator's part, as in
DCP's coordinator step: gather every rank's entries (or its failure), decide on rank 0, write the
metadata or discard the folder, broadcast the outcome, and turn it into what every rank raises:
not committed (nothing of it stays), or committed with a later step (the tag, retention) failed,
which never undoes the commit.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from dlio_ckpt.checkpoint.fileio import FileEntry, now
from dlio_ckpt.checkpoint.folders import CheckpointFolders
from dlio_ckpt.checkpoint.manifest import encode_manifest
from dlio_ckpt.checkpoint.metadata import CheckpointIdentity, manifest_fields
from dlio_ckpt.checkpoint.publish import Publisher
from dlio_ckpt.checkpoint.retention import Retention
from dlio_ckpt.errors import RunFailure, failure_text


class Committer:
    """Commits the checkpoints of `folders` for one rank of `world`.

    `commit_durability`: checkpoint.durability=commit (else only the framework's own writes);
    `encoding`: checkpoint.encoding, named in an encoded checkpoint's manifest. `resume_points`
    (step -> the loop's resume point) and `checkpoint_steps` (checkpoint index -> step) are the
    engine's: a manifest takes its step's resume point out of the first when it is written."""

    def __init__(self, world: Any, folders: CheckpointFolders, publisher: Publisher, retention: Retention,
                 identity: CheckpointIdentity, commit_durability: bool, encoding: str,
                 resume_points: dict[int, dict], checkpoint_steps: dict[int, int]) -> None:
        self.world = world
        self.folders = folders
        self.publisher = publisher
        self.retention = retention
        self.identity = identity
        self.commit_durability = commit_durability
        self.encoding = encoding
        self.resume_points = resume_points
        self.checkpoint_steps = checkpoint_steps

    def commit(self, index: int, step: int, epoch: int, entries: list[FileEntry], error: BaseException | None,
               settle: Callable[[int, bool], None]) -> tuple[int, float]:
        """Collective: make checkpoint `step` visible (manifest written last, all or nothing).
        Returns (metadata bytes, seconds); `settle(index, committed)` runs on every rank once the
        outcome is known (the encoder adopts what it encoded only for a committed checkpoint)."""
        start = now()
        if error is None and self.commit_durability:  # framework durability: only the framework's own calls
            try:
                self.publisher.sync_file_folders(step, [e.path for e in entries])
            except OSError as exc:  # reported like a failed write: the checkpoint is not committed
                error = exc
        mine = failure_text(error) if error else None
        gathered = self.world.gather((None if error else [e.as_dict() for e in entries], mine))
        status: tuple[str, Any] = ("ok", 0)
        if self.world.is_root:
            status, mine = self._decide(index, step, epoch, gathered, mine)
        status = self.world.bcast(status)
        settle(index, status[0] != "failed")
        name = self.folders.layout.folder(step)
        if status[0] == "failed":
            # Every rank knows: the ranks that failed say why, in one line each; the others end quietly.
            raise RunFailure(f"checkpoint {name} not committed: {mine}" if mine else "", known_everywhere=True)
        if status[0] == "after":  # committed: the manifest is on disk; what failed came after it
            raise RunFailure(f"checkpoint {name} committed (its manifest is written), "
                             f"but {mine}" if mine else "", known_everywhere=True)
        return int(status[1]), now() - start

    def _decide(self, index: int, step: int, epoch: int, gathered: list, mine: str | None
                ) -> tuple[tuple[str, Any], str | None]:
        """Rank 0: commit when no rank failed, else discard the folder; (status, rank 0's failure)."""
        if any(msg for _, msg in gathered):
            self.folders.discard_failed(step)
            return ("failed", 0), mine
        status: tuple[str, Any] = ("ok", 0)
        try:
            files = [e for part, _ in gathered for e in part]
            if self.commit_durability:
                status = ("ok", self._write_manifest(index, step, epoch, files))
            else:  # framework durability: its tag and retention are written here
                metadata = self.publisher.framework_metadata(step, files, lambda: self.retention.framework_written(step))
                status = ("ok", metadata)
        except Exception as exc:  # every rank must hear of it, or they wait forever
            self.folders.discard_failed(step)
            return ("failed", 0), failure_text(exc)
        if self.commit_durability:
            return self._after_commit(step, status[1])
        return status, mine

    def _write_manifest(self, index: int, step: int, epoch: int, files: list[dict]) -> int:
        """Rank 0: the coordinator files, then the manifest, last; their bytes."""
        metadata, files = self.publisher.coordinator_files(step, files)
        resume = self.resume_points.pop(step) if step in self.resume_points else None
        manifest = encode_manifest(manifest_fields(self.identity, index, step, epoch, files, self.encoding,
                                                   self.checkpoint_steps, resume, time.time()))
        self.publisher.publish_manifest(step, manifest)
        return metadata + len(manifest)

    def _after_commit(self, step: int, metadata: int) -> tuple[tuple[str, Any], str | None]:
        """On rank 0, once the manifest is written: the framework's tag, then retention. Their
        failure is reported as what it is, after a commit that stands (status "after")."""
        tag = self.folders.layout.tag(step)
        try:
            metadata += self.publisher.write_tag(step)
        except Exception as exc:
            return ("after", metadata), f"its {tag[0]!r} tag was not written: {failure_text(exc)}"
        if self.retention.keep_last:
            try:
                self.retention.apply()
            except Exception as exc:
                return ("after", metadata), (f"retention (checkpoint.keep_last={self.retention.keep_last}) failed to "
                                             f"delete an older checkpoint: {failure_text(exc)}")
        return ("ok", metadata), None
