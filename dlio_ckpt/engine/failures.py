"""Injected failures and the restart that follows (failures.*; docs/failures.md).

A failure is real for the emulated job: every rank drops its in-memory state (the checkpoint
engine's `fail`: state, encoder memory, an async checkpoint in flight, which is never committed),
its reader position, prefetched batches and open files (the training loop leaves the reader),
and the page cache is dropped when storage.drop_caches=true; then every rank restores through
the engine's normal verified restore (real reads) and training goes on from the restored step.

With failures.restart=exit the job instead shuts down cleanly and exits with RESTART_EXIT_CODE,
leaving a note in the run folder (relaunch.py); the same command with the same hydra.run.dir takes the note
(cli.py), keeps the run's id (so its checkpoint folder), restores and goes on, as a Slurm job
with --requeue would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlio_ckpt.engine.page_cache import drop_page_cache
from dlio_ckpt.engine.resume_checks import _state_holder
from dlio_ckpt.plan.failures import FailureEvent, FailureSchedule

RESTART_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): try again; the run folder resumes on relaunch


class InjectedFailure(Exception):
    """Raised inside the training loop at the step a failure strikes; the loop unwinds to restart."""

    def __init__(self, event: FailureEvent, step: int, torn_step: int | None = None) -> None:
        super().__init__(f"injected {event.kind} failure {event.index} (rank {event.rank}) after step {step}")
        self.event = event
        self.step = step
        self.torn_step = torn_step  # the checkpoint being written when it struck: never committed
        self.at = time.perf_counter()  # the restart's time runs from here (leaving the reader is part of it)


class RestartExit(Exception):
    """failures.restart=exit: the job ends here (clean shutdown) with RESTART_EXIT_CODE."""

    def __init__(self, note: Path) -> None:
        super().__init__(f"injected failure: the job stops with exit code {RESTART_EXIT_CODE}; to resume, run the "
                         f"same command with hydra.run.dir={note.parent} (the note: {note.name})")


@dataclass
class FailureInjector:
    """Decides, at each step boundary, whether the next failure of the schedule strikes now.
    Step failures are the same on every rank by construction; time failures are decided by
    rank 0's clock and broadcast, so every rank fails at the same step."""

    schedule: FailureSchedule
    world: Any
    next_index: int = 0
    restarts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return self.schedule.enabled

    def strikes(self, step: int, elapsed_s: float) -> FailureEvent | None:
        event = self.schedule.event(self.next_index)
        if event is None:
            return None
        if event.step is not None:
            hit = step >= event.step
        else:
            hit = bool(self.world.bcast(elapsed_s >= event.at_s))
        if not hit:
            return None
        self.next_index += 1
        return event

    def strikes_during_write(self, elapsed_s: float) -> FailureEvent | None:
        """At the end of a checkpoint's save: a drawn failure (mtbf_s) whose time fell inside the
        save. It struck before the checkpoint's commit, so, as in training, that checkpoint never
        counts and the work since the one before is lost; noticed only at the next step boundary,
        it would have let the checkpoint commit. Failures at steps strike before a step's save."""
        if self.schedule.by_steps:
            return None
        return self.strikes(0, elapsed_s)


def fail_and_restore(ctx: Any, checkpoints: Any, event: FailureEvent, torn_step: int | None = None) -> Any:
    """Collective: what the failure destroys, then the restore. Returns the RestoreRecord (None: none)."""
    drop_state(checkpoints, event, torn_step)
    return restore_for_restart(ctx, checkpoints)


def drop_state(checkpoints: Any, event: FailureEvent, torn_step: int | None = None) -> None:
    """Collective: the checkpoint side of the failure (the engine's `fail`); a node failure names
    the failed rank's node, whose node-local checkpoint levels are lost (checkpoint/levels.py).
    `torn_step`: the checkpoint whose write the failure struck is withdrawn (`tear`), as its
    commit never happened."""
    fail = getattr(checkpoints, "fail", None)
    if fail is None:
        return
    node_of = getattr(checkpoints, "node_of", None)
    if event.kind == "node" and node_of is not None:
        fail(event.kind, node=node_of(event.rank))
    else:
        fail(event.kind)
    tear = getattr(checkpoints, "tear", None)
    if torn_step is not None and tear is not None:
        tear(torn_step)


def restore_for_restart(ctx: Any, checkpoints: Any) -> Any:
    """Collective: from a cold page cache when storage.drop_caches=true, the newest checkpoint that
    survives, loaded into the ranks' state (None: none, or checkpointing off)."""
    if ctx.config.storage.drop_caches:
        drop_page_cache()
    ctx.world.barrier()
    if not ctx.config.checkpoint.enabled:
        return None
    return checkpoints.restore(load_state=True)


def perturb_state(checkpoints: Any, rank: int) -> None:
    """A test's divergence (DLIO_CKPT_FAULT=resume@<rank>:perturb-state): flip the first byte of the
    rank's restored state, as a restore that brought back a wrong byte would."""
    holder = _state_holder(checkpoints)
    files = holder.plan.files_by_rank[rank] if holder is not None else ()
    if not files:
        return
    view = holder.state.view(files[0])
    view.write_at(0, bytes([bytes(view.read_at(0, 1))[0] ^ 0xFF]))


def restored_step(record: Any) -> int:
    """The step training goes on from: the checkpoint's, or 0 when none could be restored."""
    if record is None:
        return 0
    return max(0, int(getattr(record, "checkpoint_step", -1)))
