"""Who may write a dataset's files in place: an exclusive claim on the dataset's folder.

Generation writes files under their final names and commits the dataset once, by its manifest
(engine/generate.py). That is safe for one writer only: a second run generating the same dataset
at the same time (identical runs started together on one storage.root) would truncate files the
first run's manifest may already list. So rank 0 claims the dataset first: `.dlio_ckpt_generating`
in its folder, created exclusively (the backend's `create_exclusive`: O_EXCL on POSIX), naming the
host and the process; it is released after the commit, or after a failure. A run that finds the
claim of a live process of this host waits for it to be released, then uses that run's commit
(or, when it committed nothing, claims the dataset itself): generating beside it, even through
staged files, would let one run commit and train on files the other then truncates and rewrites
in place. A claim left by a crashed process of this host is taken over; one left by another host
cannot be judged from here, so a later run stages each of its files instead (temporary name,
fsync, rename: `open_staged`), until the claim is deleted. An object store grants every claim:
its objects appear whole.
"""

from __future__ import annotations

import os
import socket
import time
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


def wait_for_live_claim(storage: Any, plan: DatasetPlan, poll_s: float = 0.1) -> bool:
    """Rank 0 after a refused claim: while a live process of this host holds the claim (it is
    generating this very dataset, in place), wait, saying so once; True when it waited."""
    waited = False
    while True:
        try:
            host, pid = storage.read_whole(claim_path(plan)).decode().split()
            live = host == socket.gethostname() and _alive(int(pid))
        except (OSError, ValueError):
            live = False  # released (or unreadable: not a claim to wait for)
        if not live:
            return waited
        if not waited:
            print(f"dlio_ckpt: note: process {pid} is generating this dataset ({plan.folder}); "
                  "waiting for it to finish, then using it", flush=True)
            waited = True
        time.sleep(poll_s)


def release_claim(storage: Any, plan: DatasetPlan) -> None:
    """Rank 0, the claim's holder: remove it (committed, or nothing committed)."""
    if storage.exists(claim_path(plan)):
        storage.remove(claim_path(plan))


def _alive(pid: int) -> bool:
    """Whether process `pid` of this host still runs (an exited one its parent has not reaped yet,
    a zombie, writes nothing more: gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
