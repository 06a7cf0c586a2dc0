"""The folder fsyncs a commit depends on: what makes "the manifest is the commit" survive a power loss.

On POSIX a file's data and the entry that names it in its folder are made durable separately: an
fsync of the file says nothing of the folder entry created for it (or renamed to it), and an
fsync of a folder says nothing of the entry of that folder in its own parent. A manifest that
reaches the disk while one of the entries it depends on does not lists a file that, after a power
loss, is not there: a committed checkpoint that restore must reject. So a commit fsyncs, before
it writes the manifest, every folder whose entries the listed files need: each file's folder and
every folder between it and the storage root (`entry_folders`), and the manifest's primitive
(`write_atomic`: temporary name, fsync, rename) then fsyncs the manifest's folder after the rename.

A backend without a per-file fsync (an object store) has no folders to sync: an object is durable
and visible once its upload completed, so `sync_folders` does nothing there.
"""

from __future__ import annotations

import os
from typing import Any, Iterable


def entry_folders(paths: Iterable[str], top: str) -> list[str]:
    """The folders whose entries the files (or folders) at `paths` depend on, deepest first, each
    once: every path's parent, and each folder above it up to `top` (included), which holds the
    entry of the one below. A path outside `top` contributes its parent only. Pure."""
    top = os.path.normpath(os.path.abspath(top)) if top else ""
    found: dict[str, None] = {}
    for path in paths:
        folder = os.path.dirname(os.path.normpath(os.path.abspath(path)))
        while folder not in found:
            found[folder] = None
            parent = os.path.dirname(folder)
            if not top or folder == top or parent == folder or not _inside(folder, top):
                break
            folder = parent
    return sorted(found, key=lambda f: (-f.count(os.sep), f))


def _inside(path: str, top: str) -> bool:
    return os.path.commonpath([path, top]) == top and path != top


def sync_folders(storage: Any, folders: Iterable[str]) -> int:
    """fsync each folder in `folders` through `storage` (traced: one fsync event per folder, so its
    time is the caller's, the commit's); returns how many. Nothing on a backend without fsync."""
    if not storage.capabilities.fsync:
        return 0
    count = 0
    for folder in folders:
        storage.fsync_dir(folder)
        count += 1
    return count


def backend_root(storage: Any) -> str:
    """The storage root a (traced) backend serves: the top of the folder chains a commit syncs
    ("" where the backend does not say, and then a commit syncs the folders just above its files)."""
    inner = getattr(storage, "inner", storage)
    root = getattr(inner, "root", "") or ""
    return os.path.abspath(root) if root else ""
