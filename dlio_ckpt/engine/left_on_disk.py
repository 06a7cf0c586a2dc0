"""What a run left on disk, and the command that removes it.

Runs leave gigabytes of dataset and checkpoints under storage.root, and a user who never read
about `dlio_ckpt clean` finds them only when the disk is full. So every run ends by saying how
many bytes it left, in which folders, and how to remove them. The folders are summary.json's
`created` (clean.py removes exactly those); a dataset the run reused was an earlier run's and is
named as such. Checkpoint folders are measured by listing them through an untraced backend after
the run's figures are gathered: this is no I/O of the emulated program.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

from dlio_ckpt.engine.dataset_claim import CLAIM_NAME
from dlio_ckpt.engine.ownership import LEASE, OWNER_MARKER
from dlio_ckpt.plan.dataset import MANIFEST_NAME
from dlio_ckpt.storage import make_backend

# the small files beside a dataset's data: its manifest and the runs' own markers (ownership, lease, claim)
DATASET_SIDE_FILES = (MANIFEST_NAME, OWNER_MARKER, LEASE, CLAIM_NAME)


def tree_bytes(backend: Any, folder: str) -> int:
    """Bytes of every file below `folder` (0 when it is gone)."""
    total, pending = 0, [folder]
    while pending:
        current = pending.pop()
        for name in backend.listdir(current):
            path = f"{current.rstrip('/')}/{name}"
            if backend.isdir(path):
                pending.append(path)
            else:
                total += backend.file_size(path)
    return total


def left_on_disk(config: Any, created: dict[str, Any], dataset: dict[str, Any] | None, run_dir: Path) -> dict[str, Any]:
    """summary.json's `left_on_disk`: the dataset (its size on disk, and whether this run made it),
    each checkpoint folder this run wrote and its bytes, the total this run left, and the clean command."""
    folders = []
    if created.get("checkpoints"):
        folders.append((created["checkpoints"], config.storage))
    for level in created.get("checkpoint_levels") or []:
        folders.append((level["checkpoints"], dataclasses.replace(config.storage, backend=level["backend"], root=level["folder"])))
    checkpoints = []
    for folder, storage in folders:
        backend = make_backend(storage)
        if backend.isdir(folder):
            checkpoints.append({"folder": folder, "bytes": tree_bytes(backend, folder)})
    data = None
    if dataset and dataset.get("folder"):
        # the files' sizes generation took (no walk over a million files), the manifest and markers beside them
        backend = make_backend(config.storage)
        side = [f"{dataset['folder'].rstrip('/')}/{name}" for name in DATASET_SIDE_FILES]
        extra = sum(backend.file_size(path) for path in side if backend.exists(path))
        data = {"folder": dataset["folder"], "bytes": int(dataset.get("bytes_on_disk") or 0) + extra,
                "created_by_this_run": created.get("dataset") is not None}
    mine = sum(c["bytes"] for c in checkpoints) + (data["bytes"] if data and data["created_by_this_run"] else 0)
    return {"dataset": data, "checkpoints": checkpoints, "bytes": mine,
            "clean_command": f"dlio_ckpt clean {shlex.quote(str(run_dir))}" if mine else None}
