"""This run's checkpoint folders: where each checkpoint lives, which are complete, which are ours.

Commit, retention, restore and failure cleanup all need the same three answers (the folder of a
step, the checkpoints found under the root, whether a folder may be deleted), and one wrong
answer deletes data that is not ours; so they are answered here, once, for all of them.
"""

from __future__ import annotations

import os
from typing import Any

from dlio_ckpt.checkpoint.manifest import parse_manifest
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME
from dlio_ckpt.plan.layouts import Layout


class CheckpointFolders:
    """The checkpoints of one run (or one level) under `root`, named by `layout`, on `storage`."""

    def __init__(self, root: str, layout: Layout, storage: Any, flat: bool = False) -> None:
        self.root = root
        self.layout = layout
        self.storage = storage
        # the framework's own layout (checkpoint.durability=framework, Layout.flat_framework): every
        # checkpoint's files straight in the root, as TensorFlow's CheckpointManager keeps them
        self.flat = flat

    def path(self, step: int) -> str:
        """The folder of checkpoint `step` (the root itself when flat)."""
        return self.root if self.flat else os.path.join(self.root, self.layout.folder(step))

    def remove(self, step: int, backend: Any = None) -> None:
        """Delete checkpoint `step` through `backend` (default: this run's storage): its folder, or,
        when flat, its own files in the root, as the framework deletes them (Layout.checkpoint_files);
        never anything that is not directly ours (`own`)."""
        backend = backend or self.storage
        if not self.flat:
            folder = self.own(self.layout.folder(step))
            if folder is not None and backend.isdir(folder):
                backend.remove_tree(folder)
            return
        for name in self.layout.checkpoint_files(step, backend.listdir(self.root)):
            path = self.own(name)
            if path is None:
                continue
            if backend.isdir(path):
                backend.remove_tree(path)
            else:
                backend.remove(path)

    def listing(self) -> list[tuple[int, str, bool]]:
        """(step, folder name, complete) of this run's checkpoints, oldest first."""
        found = []
        for name in self.storage.listdir(self.root):
            step = self.layout.parse_step(name)
            path = os.path.join(self.root, name)
            if step is not None and self.storage.isdir(path):
                found.append((step, name, self.storage.exists(os.path.join(path, MANIFEST_NAME))))
        return sorted(found)

    def own(self, name: str) -> str | None:
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

    def read_manifest(self, folder: str, step: int, storage: Any = None) -> dict | str:
        """The checkpoint's manifest, validated (see manifest.py), or why the checkpoint is rejected.
        `storage`: the phase to read it in (restore reads count as restore I/O)."""
        storage = storage or self.storage
        path = os.path.join(folder, MANIFEST_NAME)
        if not storage.exists(path):
            return "torn: no manifest (data written but never committed; a rank may have died mid-write)"
        try:
            raw = storage.read_whole(path)
        except OSError as exc:
            return f"unreadable manifest ({exc.strerror or exc})"
        return parse_manifest(raw, folder, step)

    def tear(self, step: int, backend: Any) -> None:
        """Remove checkpoint `step`'s folder, manifest first, through `backend` (the untraced one:
        a failure's doing, not the program's I/O), committed or not: a failure struck its write."""
        folder = self.own(self.layout.folder(step))
        if folder is not None and backend.isdir(folder):
            manifest = os.path.join(folder, MANIFEST_NAME)
            if backend.exists(manifest):
                backend.remove(manifest)
            backend.remove_tree(folder)

    def discard_failed(self, step: int) -> None:
        """Remove the folder of checkpoint `step` of this run when it was never committed (no
        manifest), with any temporary file its commit left; never anything outside this run's root."""
        folder = self.own(self.layout.folder(step))
        try:
            if self.flat:  # no manifest in the framework's layout: the step's own files, never the root
                self.remove(step)
            elif folder is not None and self.storage.isdir(folder) and not self.storage.exists(os.path.join(folder, MANIFEST_NAME)):
                self.storage.remove_tree(folder)
            tag = self.layout.tag(step)
            for name in self.storage.listdir(self.root) if tag else []:
                if name.startswith(f"{tag[0]}.tmp"):
                    self.storage.remove(os.path.join(self.root, name))
        except OSError:
            pass
