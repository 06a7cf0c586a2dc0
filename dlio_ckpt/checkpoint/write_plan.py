"""What one rank writes for one checkpoint: a pure value, computed before any byte is written.

The strategy chooses which planned files a rank writes (its own, every rank's, the staged ones);
this turns that choice and the step into the exact paths and the folders to create, in the order
the writer meets them, so the writer only carries it out (PyTorch DCP's planner/writer split:
the plan can be printed and tested without storage).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dlio_ckpt.plan.checkpoint import PlannedFile


@dataclass(frozen=True)
class FileToWrite:
    planned: PlannedFile
    relpath: str  # inside the checkpoint folder, as the manifest lists it
    path: str  # the folder joined with relpath
    makes_folder: str | None  # the parent folder to create before this file (the first file in it)


@dataclass(frozen=True)
class WritePlan:
    step: int
    folder: str  # the checkpoint folder
    files: tuple[FileToWrite, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)


def plan_write(folder: str, step: int, files: tuple[PlannedFile, ...], folder_exists: bool = False) -> WritePlan:
    """The WritePlan of `files` (in their order) for checkpoint `step` in `folder`; each parent
    folder is created once, before the first file in it, except `folder` itself when it exists
    already (a `flat` layout's checkpoint folder is the run's: a program saving into it makes none)."""
    made: set[str] = {os.path.normpath(folder)} if folder_exists else set()  # normalised: folder may end in '/'
    planned = []
    for pf in files:
        rel = pf.path_for(step)
        path = os.path.join(folder, rel)
        parent = os.path.dirname(path)
        planned.append(FileToWrite(pf, rel, path, None if os.path.normpath(parent) in made else parent))
        made.add(os.path.normpath(parent))
    return WritePlan(step, folder, tuple(planned))
