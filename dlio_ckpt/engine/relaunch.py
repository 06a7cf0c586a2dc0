"""The note a run stopped by an injected failure leaves for its relaunch (failures.restart=exit).

The run writes it in its run folder as it exits (RESTART_EXIT_CODE, engine/failures.py); the same
command with the same hydra.run.dir takes it (cli.py), is checked against it before it writes
anything (ownership.claim_run), resumes, and marks it done. Apart from the failures themselves so
that the run's claim on its folders can check a relaunch without importing the training loop.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dlio_ckpt.errors import UserError

RESUME_NOTE = ".dlio_ckpt_resume"  # left by a run that stopped on a failure with failures.restart=exit
RESUMED_NOTE = ".dlio_ckpt_resumed"  # the note once a relaunch took it (kept: the run's history)


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
