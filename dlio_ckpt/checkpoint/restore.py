"""Restore: read back the newest complete checkpoint, verified, or say why each newer one was not.

The reader side of the engine (DCP's StorageReader; what it reads is restore_plan.py): newest
checkpoint first; every file is read in full by the rank the plan names and checked against the
manifest (size, checksum); a torn or corrupted checkpoint is skipped with a message naming what
failed, and the previous complete one is restored. An encoded checkpoint is rebuilt from its chain
(each link's files read in full and verified, then decoded) and must come back bit for bit as the
state it was written from. Nothing here writes to storage.
"""

from __future__ import annotations

import os
import sys
from contextlib import closing
from typing import Any, Callable, Sequence

from dlio_ckpt.checkpoint.base import RestoreRecord
from dlio_ckpt.checkpoint.encoded import Window, digest_view, make_decoder, payload_offset
from dlio_ckpt.checkpoint.fileio import now, verify_file
from dlio_ckpt.checkpoint.folders import CheckpointFolders
from dlio_ckpt.checkpoint.restore_plan import (candidates, chain_length, planned_file, reads_entry, same_file,
                                               state_key)
from dlio_ckpt.codec.base import ChainLink
from dlio_ckpt.memory import peak_rss_bytes
from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.state.store import ScratchStore


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


class CheckpointReader:
    """One rank's reader of the checkpoints of `folders`, read through `storage` (the restore phase).

    `state`: this rank's model state, asked for only when restored bytes are loaded into it
    (a restart); `format_name`, `chunk_bytes`, `state_dir`: checkpoint.format, .write_chunk_bytes
    (the read buffer), .state_dir (scratch files of what is rebuilt)."""

    def __init__(self, world: Any, folders: CheckpointFolders, storage: Any,
                 files_by_rank: Sequence[tuple[PlannedFile, ...]], format_name: str, chunk_bytes: int,
                 state_dir: str, state: Callable[[], Any]) -> None:
        self.world = world
        self.folders = folders
        self.storage = storage
        self.files_by_rank = files_by_rank
        self.format_name = format_name
        self.chunk_bytes = chunk_bytes
        self.state_dir = state_dir
        self.state = state

    def restore(self, step: int | None = None, warn_if_none: bool = True, load_state: bool = False) -> RestoreRecord | None:
        """Collective: restore the newest complete, verified checkpoint (or `step`'s). None when
        there is no checkpoint folder; a record with checkpoint_step -1 when every one was rejected
        (printed on stderr unless `warn_if_none` is off: the caller then reports it).
        `load_state` (a restart): the restored bytes become this rank's state."""
        found = candidates(self.folders.listing(), step) if self.world.is_root else None
        found = self.world.bcast(found)
        if not found:
            return None
        skipped: list[str] = []
        buffer = memoryview(bytearray(self.chunk_bytes))
        for candidate in (int(c) for c in found):
            record = self._restore_one(candidate, skipped, buffer, load_state)
            if record is not None:
                return record
        message = f"no complete checkpoint to restore in {self.folders.root}: " + "; ".join(skipped)
        if warn_if_none:
            self._warn(message)
        return RestoreRecord(checkpoint_index=-1, bytes=0, files=0, read_s=0.0, verified=False, message=message,
                             skipped=skipped, peak_rss_bytes=peak_rss_bytes())

    def _restore_one(self, candidate: int, skipped: list[str], buffer: memoryview,
                     load_state: bool) -> RestoreRecord | None:
        """Collective: checkpoint `candidate` restored, or None (why not is added to `skipped`)."""
        name = self.folders.layout.folder(candidate)
        folder = self.folders.path(candidate)
        manifest = self.world.root_first(lambda: self._read_manifest(folder, candidate))
        if isinstance(manifest, str):
            skipped.append(f"{name}: {manifest}")
            return None
        start = now()
        read = files = longest = 0
        problems = []
        digests: dict[str, str] = {}
        chain = self._chain_manifests(manifest) if "chain" in manifest else {}
        for entry in manifest["files"]:
            if not reads_entry(entry, self.world.rank, self.world.size, load_state):
                continue
            if isinstance(chain, str):
                problems.append(chain)
                break
            got, problem, digest = self._restore_file(folder, manifest, entry, chain, buffer, load_state)
            read += got
            files += 1
            longest = max(longest, chain_length(entry))
            if digest:
                digests[state_key(entry)] = digest
            if problem:
                problems.append(f"{entry['path']}: {problem}")
        read_s = now() - start
        all_problems = [p for part in self.world.allgather(problems) for p in part]
        if all_problems:
            more = f" (+{len(all_problems) - 1} more)" if len(all_problems) > 1 else ""
            skipped.append(f"{name}: {all_problems[0]}{more}")
            return None
        verified = manifest["checksum"] != "none"
        listed = _plural(len(manifest["files"]), "file")
        message = (f"restored {name} (step {candidate}) verified: {manifest['checksum']} and size of {listed}"
                   if verified else
                   f"restored {name} (step {candidate}) unverified: written with checkpoint.checksum=none, "
                   f"only sizes were checked ({listed})")
        if skipped:
            message += "; skipped newer " + "; ".join(skipped) + " -> fell back to the previous complete checkpoint"
            self._warn(message)
        if "chain" in manifest:
            message += f"; rebuilt bit for bit from a chain of {_plural(longest, 'checkpoint')}"
        return RestoreRecord(checkpoint_index=int(manifest.get("index", -1)), bytes=read, files=files, read_s=read_s,
                             verified=verified, message=message, checkpoint_step=candidate, folder=name,
                             skipped=skipped, peak_rss_bytes=peak_rss_bytes(), resume=manifest.get("resume", {}),
                             state_digests=digests, chain_length=longest, encoding=manifest.get("encoding", "full"))

    def _read_manifest(self, folder: str, step: int) -> dict | str:
        return self.folders.read_manifest(folder, step, self.storage)

    def _chain_manifests(self, manifest: dict) -> dict[int, tuple[str, dict]] | str:
        """The folder and manifest of every earlier checkpoint in `manifest`'s chain (index ->
        (folder, manifest)), or why the chain is broken (a link deleted, torn or altered)."""
        links: dict[int, tuple[str, dict]] = {}
        for index, link_step in manifest["chain"]:
            if index == manifest["index"] and link_step == manifest["step"]:
                continue
            folder = self.folders.path(link_step)
            found = self.world.root_first(lambda f=folder, s=link_step: self._read_manifest(f, s))
            name = self.folders.layout.folder(link_step)
            if isinstance(found, str):
                return f"chain link {name} (checkpoint {index}) unusable: {found}"
            if found["index"] != index:
                return f"chain link {name} is checkpoint {found['index']}, the chain needs checkpoint {index}"
            links[index] = (folder, found)
        return links

    def _restore_file(self, folder: str, manifest: dict, entry: dict, chain: dict[int, tuple[str, dict]],
                      buffer: memoryview, load_state: bool) -> tuple[int, str | None, str]:
        """Read, verify and (encoded files) rebuild one file; (bytes read, problem, state digest)."""
        algorithm = manifest["checksum"]
        encoding = entry.get("encoding")
        if encoding is None:
            if not load_state:
                got, problem = verify_file(self.storage, os.path.join(folder, entry["path"]), entry["size"],
                                           entry["checksum"], algorithm, buffer)
                return got, problem, ""
            pf = planned_file(self.files_by_rank, entry["owner"], entry["path"], manifest["step"])
            if isinstance(pf, str):
                return 0, pf, ""
            with closing(ScratchStore(entry["size"], self.state_dir)) as kept:
                got, problem = verify_file(self.storage, os.path.join(folder, entry["path"]), entry["size"],
                                           entry["checksum"], algorithm, buffer, sink=kept)
                if problem:
                    return got, problem, ""
                view = Window(kept, payload_offset(self.format_name, pf.payload_bytes), pf.payload_bytes)
                self.state().load(pf, view, manifest["step"])
                return got, None, digest_view(view, len(buffer))
        pf = planned_file(self.files_by_rank, entry["owner"], encoding["key"], None)
        if isinstance(pf, str):
            return 0, pf, ""
        read = 0
        stores: list[Any] = []  # each link's file as read and verified (untraced scratch)
        links: list[ChainLink] = []
        try:
            for index in encoding["chain"]:
                link_folder, link_entry = (folder, entry) if index == encoding["index"] else \
                    (chain[index][0], same_file(chain[index][1], encoding["key"], entry["owner"]))
                name = os.path.basename(link_folder)
                if link_entry is None:
                    return read, f"chain link {name} has no {encoding['key']} of rank {entry['owner']}", ""
                stores.append(ScratchStore(link_entry["size"], self.state_dir))
                got, problem = verify_file(self.storage, os.path.join(link_folder, link_entry["path"]),
                                           link_entry["size"], link_entry["checksum"], algorithm, buffer, sink=stores[-1])
                read += got
                if problem:
                    return read, f"chain link {name}: {problem}", ""
                inner = link_entry["encoding"]
                window = Window(stores[-1], inner["offset"], inner["container_bytes"])
                links.append(ChainLink(index=index, size=window.size, read_at=window.read_at))
            with closing(ScratchStore(encoding["logical_bytes"], self.state_dir)) as out:
                try:
                    make_decoder(encoding["codec"], pf.tensors).rebuild(links, out)
                except ValueError as exc:
                    return read, f"cannot rebuild from its chain: {exc}", ""
                digest = digest_view(out, len(buffer))
                if digest != encoding["state_digest"]:
                    return read, (f"rebuilt state differs from the state written (xxh3_128 {digest[:12]}..., "
                                  f"manifest {encoding['state_digest'][:12]}...)"), digest
                if load_state:
                    self.state().load(pf, out, manifest["step"])
                return read, None, digest
        finally:
            for store in stores:
                store.close()

    def _warn(self, message: str) -> None:
        if self.world.is_root:
            print(f"dlio_ckpt: checkpoint restore: {message}", file=sys.stderr, flush=True)
