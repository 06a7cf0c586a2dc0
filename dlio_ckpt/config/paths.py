"""Every configured path stays under storage.root: checked in the loader, before anything is written.

`dataset.folder`, `dataset.file_prefix` and `checkpoint.folder` are joined to storage.root; a `..`,
an absolute path or a symbolic link could otherwise make a run write (and regenerate, and delete
old checkpoints) anywhere the user can write. Paths are resolved with `os.path.realpath`, so a link
inside storage.root that points outside counts as outside. Only the dataset may live elsewhere,
and only when `storage.allow_outside_root_dataset=true` says so (a shared, pre-generated dataset).
"""

from __future__ import annotations

import os

from dlio_ckpt.schema import RunConfig
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.local_fs import nearest_existing


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _file_in_the_way(path: str) -> str | None:
    """The nearest existing path at or above `path` when it is not a folder (no folder can be made
    there), else None. An object store's logical root does not exist locally: nothing in the way."""
    existing = nearest_existing(path)
    return existing if not os.path.isdir(existing) else None


def resolved(root: str, relative: str) -> str:
    """`relative` under `root` (an absolute `relative` stands alone), links and `..` resolved."""
    return os.path.realpath(os.path.join(root, relative))


def check_paths(config: RunConfig) -> None:
    """ConfigError (one line naming the key) for any configured path that leaves storage.root."""
    root = os.path.realpath(os.path.abspath(config.storage.root))
    prefix = config.dataset.file_prefix
    if os.sep in prefix or (os.altsep and os.altsep in prefix) or "\0" in prefix:
        raise ConfigError(
            f"dataset.file_prefix: '{prefix}' holds a path separator; it starts each file's name, so it cannot name a folder "
            "(put folders in dataset.folder, under storage.root)"
        )
    folder = config.dataset.folder or os.path.join("data", config.workload)
    target = resolved(root, folder)
    if not _inside(target, root) and not config.storage.allow_outside_root_dataset:
        raise ConfigError(
            f"dataset.folder: '{folder}' resolves to {target}, outside storage.root ({root}); use a folder under storage.root, "
            "or set storage.allow_outside_root_dataset=true to read and write a dataset there"
        )
    checkpoints = resolved(root, config.checkpoint.folder)
    if not _inside(checkpoints, root):
        raise ConfigError(
            f"checkpoint.folder: '{config.checkpoint.folder}' resolves to {checkpoints}, outside storage.root ({root}); "
            "checkpoints (and the retention that deletes old ones) stay under storage.root: use a relative folder without '..'"
        )
    if _file_in_the_way(root) is not None:
        return  # storage.root itself is the backend's to report (PosixStorage.check); below are the folders under it
    for key, given, path in (("dataset.folder", folder, target), ("checkpoint.folder", config.checkpoint.folder, checkpoints)):
        blocker = _file_in_the_way(path)
        if blocker is not None:
            raise ConfigError(f"{key}: '{given}' cannot be a folder: {blocker} is a file; choose a folder path")
