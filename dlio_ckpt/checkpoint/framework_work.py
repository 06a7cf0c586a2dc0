"""The framework's work inside a save call that does not depend on the checkpoint's bytes.

A real save call does more than build its container and write it. Before the first byte the
framework walks the program's objects (the `model.state_dict()` and `optimizer.state_dict()` of
the program's torch.save statement; DCP's call of the program's `Stateful.state_dict()`, its
planner and collectives; CheckpointManager's walk of the trackable object graph, its proto and
the read of each variable). The emulator has no module tree or object graph, so that work is a
measured figure, `checkpoint.framework_cpu_s`: the real save's CPU seconds outside its byte work,
measured on the real program (benchmarks/realapps/framework_cpu.py, docs/fidelity.md). What of it
the emulation does for real (DCP's `_storage_setup`, below, and its plan exchange) counts against
it; the rest is spent here as CPU work on the saving thread. CPU, not a sleep: on a busy machine
the real walk waits for a core like any other work, where a sleep would not.
"""

from __future__ import annotations

import time


def thread_cpu() -> float:
    """This thread's CPU clock, seconds."""
    return time.thread_time()


def spend_cpu(seconds: float) -> float:
    """Keep this thread busy until its CPU clock has advanced by `seconds`; the wall seconds it took."""
    if seconds <= 0:
        return 0.0
    start = time.perf_counter()
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    return time.perf_counter() - start


def dcp_storage_setup(checkpoint_id: str) -> None:
    """What `dcp.save(state, checkpoint_id=...)` does before planning (torch's
    `_storage_setup`): pick the storage writer for the id, importing the fsspec writer on the first
    call (a DCP program pays that import inside its first save) and asking each candidate's
    `validate_checkpoint_id`, which looks at the id's parent folders (stat, access) as the program's
    does. Only for local paths: the caller checks."""
    from torch.distributed.checkpoint._storage_utils import _storage_setup

    _storage_setup(None, checkpoint_id, reader=False)
