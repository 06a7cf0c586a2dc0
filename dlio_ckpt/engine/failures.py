"""Injected failures and the restart that follows (failures.*; docs/failures.md).

A failure is real for the emulated job: every rank drops its in-memory state (the checkpoint
engine's `fail`: state, encoder memory, an async checkpoint in flight, which is never committed),
its reader position, prefetched batches and open files (the training loop leaves the reader),
and the page cache is dropped when storage.drop_caches=true; then every rank restores through
the engine's normal verified restore (real reads) and training goes on from the restored step.

With failures.restart=exit the job instead shuts down cleanly and exits with RESTART_EXIT_CODE,
leaving a note in the run folder; the same command with the same hydra.run.dir takes the note
(cli.py), keeps the run's id (so its checkpoint folder), restores and goes on, as a Slurm job
with --requeue would.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlio_ckpt.plan.failures import FailureEvent, FailureSchedule

RESTART_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): try again; the run folder resumes on relaunch
RESUME_NOTE = ".dlio_ckpt_resume"  # left by a run that stopped on a failure with failures.restart=exit
RESUMED_NOTE = ".dlio_ckpt_resumed"  # the note once a relaunch took it (kept: the run's history)


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
        from dlio_ckpt.engine.phases import drop_page_cache

        drop_page_cache()
    ctx.world.barrier()
    if not ctx.config.checkpoint.enabled:
        return None
    return checkpoints.restore(load_state=True)


def perturb_state(checkpoints: Any, rank: int) -> None:
    """A test's divergence (DLIO_CKPT_FAULT=resume@<rank>:perturb-state): flip the first byte of the
    rank's restored state, as a restore that brought back a wrong byte would."""
    from dlio_ckpt.engine.resume_checks import _state_holder

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


# failures.restart=exit --------------------------------------------------------------------------

def write_resume_note(run_dir: Path, note: dict[str, Any]) -> Path:
    """Rank 0: the note a relaunch resumes from (temporary name, fsync, rename)."""
    path = run_dir / RESUME_NOTE
    temporary = run_dir / f"{RESUME_NOTE}.tmp-{os.getpid()}"
    with open(temporary, "w") as out:
        json.dump(note, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    return path


def take_resume_note(folder: Path) -> str | None:
    """cli.py, rank 0: take the note of a run stopped by failures.restart=exit in `folder` and
    return its token (so the run keeps its id and checkpoints), or None when there is none.
    The rename is atomic: of two relaunches, one takes it and the other is refused as usual."""
    try:
        os.replace(folder / RESUME_NOTE, folder / RESUMED_NOTE)
    except FileNotFoundError:
        return None
    try:
        return str(json.loads((folder / RESUMED_NOTE).read_text())["token"])
    except (OSError, ValueError, KeyError):
        return None


def read_resumed_note(run_dir: Path) -> dict[str, Any] | None:
    """The note this run was relaunched from (taken by cli.py), or None for a fresh run."""
    path = run_dir / RESUMED_NOTE
    if not path.exists():
        return None
    note = json.loads(path.read_text())
    return None if note.get("done") else note


def check_relaunch(run_dir: Path, config: Any, world_size: int) -> None:
    """Rank 0, before the relaunch writes anything: it must run as the run it resumes did (as many
    ranks, the same storage.root: its checkpoints are there). When not, the command is refused (one
    line, exit 2) and claim_run gives the note back (give_back_note) for the right relaunch."""
    from dlio_ckpt.errors import UserError

    note = read_resumed_note(run_dir)
    if note is None:
        return
    problem = None
    root = os.path.realpath(config.storage.root)
    if note.get("world_size") != world_size:
        problem = (f"the run in {run_dir} stopped on a failure with {note.get('world_size')} ranks; relaunch it with as "
                   f"many (this launch has {world_size})")
    elif note.get("storage_root") is not None and note["storage_root"] != root:
        problem = (f"storage.root: the run in {run_dir} stopped on a failure with storage.root={note['storage_root']} "
                   f"(its checkpoints are there); relaunch it with that root (this launch has {root})")
    if problem is not None:
        raise UserError(problem)


def give_back_note(run_dir: Path) -> None:
    """A relaunch refused before it wrote anything: the note it took goes back for the right one."""
    if read_resumed_note(run_dir) is not None:
        os.replace(run_dir / RESUMED_NOTE, run_dir / RESUME_NOTE)


def mark_note_done(run_dir: Path) -> None:
    """After the relaunch finished: the note stays as history, but no later run resumes from it."""
    path = run_dir / RESUMED_NOTE
    if path.exists():
        note = json.loads(path.read_text())
        note["done"] = True
        path.write_text(json.dumps(note))
