"""Deterministic failures at named points: how tests prove that a job fails cleanly.

`DLIO_CKPT_FAULT=<point>@<rank>` raises at that point on that rank; `<point>@<rank>:kill`
sends the process SIGKILL instead, as a crashed node would (no cleanup, no message). Points:
`train` (before the first step) and `checkpoint-step:<N>` (after a rank's first file of the
checkpoint at step N). Unset, a fault point costs one environment lookup.
"""

from __future__ import annotations

import os
import signal

VARIABLE = "DLIO_CKPT_FAULT"


def fault_point(point: str, rank: int) -> None:
    spec = os.environ.get(VARIABLE)
    if not spec:
        return
    where, _, who = spec.partition("@")
    who, _, how = who.partition(":")
    if where != point or who != str(rank):
        return
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"failure injected at {point} on rank {rank} ({VARIABLE})")
