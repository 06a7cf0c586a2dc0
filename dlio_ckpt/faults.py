"""Deterministic failures at named points: how tests prove that a job fails cleanly.

`DLIO_CKPT_FAULT=<point>@<rank>[:<how>]` fails at that point on that rank. `how` is
- (nothing): raise a RunFailure, as a rank that hits an error would;
- `kill`: send the process SIGKILL, as a crashed node would (no cleanup, no message);
- `enospc`: raise OSError(ENOSPC) for the file being written, as a full disk would;
- `interrupt`: raise KeyboardInterrupt, as Ctrl-C does when only that rank sees it in Python (the
  others are inside an MPI call, where Python never sees the signal).
- `delay=<seconds>`: sleep that long and go on, as a rank slower than the others would (the
  training clock's start, the per-step meeting of train.gradient_sync).

Points: `start` (on every rank once its World exists, before the run folder is chosen);
`train` (before the first step); `step` (before each training step's compute: for `delay=`);
`checkpoint-step:<N>` (after a rank's first file of the checkpoint at step N: with single_writer,
after a non-root rank sent its first file to rank 0);
`checkpoint-write:<N>` (inside the write of each of a rank's files of checkpoint N, after its first
chunk reached the file, so a partial file is on disk); `generate-write` (inside the write of a
rank's first dataset file, after the format wrote it under its final name, before its fsync). Unset, a fault
point costs one environment lookup.

Divergences the determinism check must catch (`fault_how`; the caller carries them out): `resume`
with `perturb-state` (one byte of the rank's restored state flipped) or `skip-batch` (the rank's
data loader skips one batch after the restore), at every restore of a run with failures.
"""

from __future__ import annotations

import errno
import os
import signal
import time

from dlio_ckpt.errors import RunFailure

VARIABLE = "DLIO_CKPT_FAULT"


def fault_point(point: str, rank: int, path: str = "") -> None:
    spec = os.environ.get(VARIABLE)
    if not spec:
        return
    where, _, who = spec.partition("@")
    who, _, how = who.partition(":")
    if where != point or who != str(rank):
        return
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "interrupt":
        raise KeyboardInterrupt
    if how.startswith("delay="):
        time.sleep(float(how[len("delay="):]))
        return
    if how == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path or None)
    raise RunFailure(f"failure injected at {point} on rank {rank} ({VARIABLE})")


def fault_how(point: str, rank: int) -> str | None:
    """The `how` of a DLIO_CKPT_FAULT naming `point` on `rank` ("" when none is given), or None:
    for faults the caller carries out itself."""
    spec = os.environ.get(VARIABLE)
    if not spec:
        return None
    where, _, who = spec.partition("@")
    who, _, how = who.partition(":")
    return how if where == point and who == str(rank) else None
