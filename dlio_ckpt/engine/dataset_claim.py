"""Who may write a dataset's files in place: an exclusive claim on the dataset's folder.

Generation writes files under their final names and commits the dataset once, by its manifest
(engine/generate.py). That is safe for one writer only: a second run generating the same dataset
at the same time (identical runs started together on one storage.root) would truncate files the
first run's manifest may already list. So rank 0 claims the dataset first: `.dlio_ckpt_generating`
in its folder, created exclusively (the backend's `create_exclusive`: O_EXCL on POSIX), naming the
host and the process; it is released after the commit, or after a failure. A run that finds a live
claim stages each of its files instead (temporary name, fsync, rename: `open_staged`), which never
disturbs a complete file. A claim left by a crashed process of this host is taken over; one left
by another host cannot be judged from here, so later runs stage (correct, slower) until it is
deleted. An object store grants every claim: its objects appear whole.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from dlio_ckpt.plan.dataset import DatasetPlan

CLAIM_NAME = ".dlio_ckpt_generating"


def claim_path(plan: DatasetPlan) -> str:
    return os.path.join(plan.folder, CLAIM_NAME)


def claim_dataset(storage: Any, plan: DatasetPlan) -> bool:
    """Rank 0: True when this run alone generates the dataset (it may write in place); False when
    another live run holds the claim (then stage every file). A claim of a process of this host
    that is gone is taken over."""
    token = f"{socket.gethostname()} {os.getpid()}".encode()
    if storage.create_exclusive(claim_path(plan), token):
        return True
    try:
        host, pid = storage.read_whole(claim_path(plan)).decode().split()
    except (OSError, ValueError):
        return False
    if host != socket.gethostname() or _alive(int(pid)):
        return False
    storage.remove(claim_path(plan))
    return storage.create_exclusive(claim_path(plan), token)


def release_claim(storage: Any, plan: DatasetPlan) -> None:
    """Rank 0, the claim's holder: remove it (committed, or nothing committed)."""
    if storage.exists(claim_path(plan)):
        storage.remove(claim_path(plan))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
