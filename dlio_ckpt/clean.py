"""`dlio_ckpt clean RUN_FOLDER...`: remove the dataset and checkpoints a run created.

Runs leave gigabytes under storage.root, and a wrong `rm -rf` there takes another run's data. So
clean decides from what it finds on disk, never from paths in a file it is handed: the run folder
names its run id in its own marker, and each folder the run created under storage.root carries an
owner marker naming that run id and that run folder (engine/ownership.py). summary.json only says
where the run's storage was (storage.root, checkpoint.folder, levels, backend); a folder is removed
only when it lies below the realpath of storage.root (or of its level's folder), is reached with no
symbolic link in any component (each opened with O_NOFOLLOW, removed through the open parent), and
its marker names this run and this run folder. A dataset is removed only under its lease's
exclusive lock, so never while another live run uses it. Everything is checked for every run folder
given before anything is removed. The run folder itself (summary, events, traces) stays.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dlio_ckpt.engine.ownership import (MARKER_MAX_BYTES, OWNER_MARKER, RUN_MARKER, owned_by, parse_owner,
                                        read_regular, read_run_marker, safe_name, try_exclusive)
from dlio_ckpt.errors import RUN_FAILURE_EXIT_CODE, USAGE_EXIT_CODE, UserError
from dlio_ckpt.storage import make_backend

DRY_RUN_FLAG = "--dry-run"
SUMMARY_MAX_BYTES = 64 << 20  # the largest summaries (thousands of ranks, checkpoints) are a few MiB
SWEEP_MARKERS = ("multirun.yaml", "sweep_summary.csv")  # what Hydra and dlio_ckpt leave in a sweep folder


# the command line -------------------------------------------------------------------------------

def run_folders(paths: list[str]) -> list[Path]:
    """Run folders given directly, or the job folders of a sweep folder (one that Hydra or a sweep
    marked as such: a folder that merely holds run folders, such as the current one, is refused)."""
    found = []
    for given in paths:
        if not given.strip():
            raise UserError("clean: an empty folder name (an unset shell variable?); name the run folder a run printed "
                            "as 'run folder'")
        folder = Path(given)
        if (folder / "summary.json").is_file():
            found.append(folder)
            continue
        jobs = [job for job in folder.iterdir() if (job / "summary.json").is_file()] if folder.is_dir() else []
        if jobs and any((folder / name).is_file() for name in SWEEP_MARKERS):
            found += sorted(jobs, key=lambda job: (len(job.name), job.name))  # 2 before 10
        elif jobs:
            raise UserError(f"{given}: not a run folder and not a sweep folder (no {' or '.join(SWEEP_MARKERS)}), though "
                            "it holds run folders; name each run folder to clean")
        else:
            raise UserError(f"{given}: not a run folder or sweep folder (no summary.json); give the folder a run printed "
                            "as 'run folder'")
    return found


def read_summary(run_dir: Path) -> dict[str, Any]:
    """summary.json as a dict, or one line (UserError) saying how it is damaged."""
    path = run_dir / "summary.json"
    data = read_regular(path, SUMMARY_MAX_BYTES, follow=True)
    if data is None:
        raise UserError(f"{path}: not a readable regular file; a damaged run folder: remove the run's folders by hand")
    if len(data) > SUMMARY_MAX_BYTES:
        raise UserError(f"{path}: over {SUMMARY_MAX_BYTES >> 20} MiB, not a summary a run writes; remove the run's "
                        "folders by hand")
    try:
        summary = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{path}: not valid JSON ({str(exc).splitlines()[0][:120]}); a damaged summary: remove the run's "
                        "folders by hand") from None
    if not isinstance(summary, dict):
        raise UserError(f"{path}: not a JSON object; a damaged summary: remove the run's folders by hand")
    return summary


def _field(summary: dict[str, Any], path: str, kind: type | tuple[type, ...], where: Path) -> Any:
    value: Any = summary
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise UserError(f"{where}: summary.json has no `{path}` (a damaged summary, or not written by a run); "
                            "remove the run's folders by hand")
        value = value[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise UserError(f"{where}: summary.json `{path}` is a {type(value).__name__}, not what a run writes "
                        "(a damaged summary); remove the run's folders by hand")
    return value


# what to remove ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """A folder that may be this run's: `parts` below `base` (a realpath, or an object store's root)."""

    what: str
    base: str
    parts: tuple[str, ...]
    backend: Any

    @property
    def path(self) -> str:
        return os.path.join(self.base, *self.parts)

    @property
    def shown(self) -> str:
        """How a person names it: the path, or the object store's URL (the backend's `uri`)."""
        return self.backend.uri(self.path)


def _relative_parts(relative: str) -> tuple[str, ...] | None:
    """The components of a relative path below its base, or None when it climbs out or is absolute."""
    if not relative or os.path.isabs(relative):
        return None
    parts = tuple(p for p in os.path.normpath(relative).split(os.sep) if p not in ("", "."))
    return parts if parts and all(safe_name(p) for p in parts) else None


def _base(root: str, local: bool) -> str:
    return os.path.realpath(root) if local else os.path.abspath(root)


def targets(summary: dict[str, Any], run_dir: Path, run_id: str) -> tuple[list[Target], list[str]]:
    """The folders this run may have created (to be checked on disk), and notes on those refused outright."""
    storage = _field(summary, "config.storage", dict, run_dir)
    root = _field(summary, "config.storage.root", str, run_dir)
    _field(summary, "config.storage.backend", str, run_dir)
    folder = _field(summary, "config.checkpoint.folder", str, run_dir)
    levels = _field(summary, "config.checkpoint.levels", list, run_dir)
    mode = _field(summary, "config.mode", str, run_dir)
    options = _namespace(storage)
    try:
        backend = make_backend(options)
    except (UserError, OSError, TypeError, AttributeError, KeyError) as exc:
        raise UserError(f"{run_dir}: summary.json `config.storage` cannot be used ({exc}); remove the run's folders "
                        "by hand") from None
    local = backend.capabilities.local_paths
    base = _base(root, local)
    found, notes = [], []
    if local and os.path.dirname(base) == base:
        return [], [f"nothing removed: storage.root {root} is the file system's root; remove the run's folders by hand"]
    parts = _relative_parts(folder)
    if mode != "restore":
        if parts is None:
            notes.append(f"checkpoints kept: checkpoint.folder {folder!r} is not a folder below storage.root")
        else:
            found.append(Target("checkpoints", base, parts + (run_id,), backend))
    dataset = summary.get("dataset")
    if isinstance(dataset, dict) and isinstance(dataset.get("folder"), str):
        relative = os.path.relpath(os.path.abspath(dataset["folder"]), os.path.abspath(root))
        parts = _relative_parts(relative)
        if parts is None:
            notes.append(f"dataset {dataset['folder']} kept: not below storage.root {root}")
        elif dataset.get("reused") is True:
            notes.append(f"dataset {dataset['folder']} kept: this run reused it")
        else:
            found.append(Target("dataset", base, parts, backend))
    for level in levels if mode != "restore" else []:
        if not isinstance(level, dict) or not isinstance(level.get("path"), (str, type(None))):
            raise UserError(f"{run_dir}: summary.json `config.checkpoint.levels` holds a {type(level).__name__} that is "
                            "not a level (a damaged summary); remove the run's folders by hand")
        if level.get("path"):
            level_options = SimpleNamespace(**{**vars(options), "backend": level.get("backend") or options.backend,
                                               "root": os.path.abspath(level["path"])})
            try:
                level_backend = make_backend(level_options)
            except (UserError, OSError, TypeError, AttributeError, KeyError) as exc:
                raise UserError(f"{run_dir}: checkpoint level {level.get('name')} cannot be used ({exc}); remove its "
                                "folder by hand") from None
            level_base = _base(level["path"], level_backend.capabilities.local_paths)
            found.append(Target(f"checkpoint level {level.get('name')}", level_base, (run_id,), level_backend))
    return found, notes


def _namespace(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    return value


# on disk ----------------------------------------------------------------------------------------

class Opened:
    """A local target's folder and its parent, each opened without following a link."""

    def __init__(self, target: Target) -> None:
        self.fds: list[int] = []
        self.error: str | None = None
        self.gone = False
        try:
            self.fds.append(os.open(target.base, os.O_RDONLY | os.O_DIRECTORY))
        except OSError as exc:
            self.gone = exc.errno == errno.ENOENT
            self.error = f"its base {target.base} cannot be opened ({exc.strerror})"
            return
        for part in target.parts:
            try:
                self.fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fds[-1]))
            except FileNotFoundError:
                self.gone = True
                return
            except OSError as exc:  # ELOOP: a link; ENOTDIR: a file
                self.error = f"{part} in it is a symbolic link or not a folder ({exc.strerror})"
                return

    @property
    def folder(self) -> int:
        return self.fds[-1]

    @property
    def parent(self) -> int:
        return self.fds[-2]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _local_marker(opened: Opened) -> dict[str, Any] | None:
    data = read_regular(OWNER_MARKER, MARKER_MAX_BYTES, dir_fd=opened.folder)
    return None if data is None else parse_owner(data)


def examine(target: Target, run_id: str, run_dir: Path, remove: bool) -> str | None:
    """None when `target` is this run's (and, with remove, now removed); 'gone' when it does not
    exist; else why it is kept. Local folders are checked and removed through the open folders."""
    if not target.backend.capabilities.local_paths:
        return _examine_remote(target, run_id, run_dir, remove)
    opened = Opened(target)
    try:
        if opened.gone:
            return "gone"
        if opened.error:
            return f"not removed: {opened.error}"
        reason = owned_by(_local_marker(opened), run_id, run_dir)
        if reason is not None:
            return f"kept: {reason}"
        lock = None
        if target.what == "dataset":
            lock, why = try_exclusive(opened.folder, create=remove)
            if why is not None:
                return f"kept: {why}"
        try:
            if remove:
                named = os.stat(target.parts[-1], dir_fd=opened.parent, follow_symlinks=False)
                if not os.path.samestat(named, os.fstat(opened.folder)):
                    return "not removed: it was replaced while clean checked it"
                shutil.rmtree(target.parts[-1], dir_fd=opened.parent)  # no link followed (fd-based rmtree)
        finally:
            if lock is not None:
                os.close(lock)
        return None
    finally:
        opened.close()


def _examine_remote(target: Target, run_id: str, run_dir: Path, remove: bool) -> str | None:
    backend = target.backend
    if not backend.isdir(target.path):
        return "gone"
    marker = os.path.join(target.path, OWNER_MARKER)
    record = parse_owner(backend.read_whole(marker)) if backend.exists(marker) else None
    reason = owned_by(record, run_id, run_dir)
    if reason is not None:
        return f"kept: {reason}"
    if target.what == "dataset":  # an object store has no lock: whether a live run reads it is unknowable
        return "kept: on an object store clean cannot tell whether another run is reading it; remove it when none is"
    if remove:
        backend.remove_tree(target.path)
    return None


# the command ------------------------------------------------------------------------------------

def plan_clean(paths: list[str]) -> list[tuple[Path, str, list[Target], list[str]]]:
    """(run folder, run id, targets, notes) for every run given: all checked before anything is removed."""
    planned = []
    for run_dir in run_folders(paths):
        summary = read_summary(run_dir)
        run_id = read_run_marker(run_dir)
        if run_id is None:
            raise UserError(f"{run_dir}: no valid {RUN_MARKER} (a run from before clean checked markers, or not a run "
                            "folder); remove its folders under storage.root by hand")
        found, notes = targets(summary, run_dir, run_id)
        planned.append((run_dir, run_id, found, notes))
    return planned


def clean(paths: list[str], dry_run: bool, out: Any = sys.stdout) -> list[str]:
    """Remove what the runs created; return what was removed (or would be, with dry_run)."""
    done = []
    for run_dir, run_id, found, notes in plan_clean(paths):
        said = False
        for target in found:
            outcome = examine(target, run_id, run_dir, remove=not dry_run)
            if outcome == "gone":
                continue
            said = True
            if outcome is None:
                print(f"{run_dir}: {'would remove' if dry_run else 'removed'} {target.what} {target.shown}", file=out)
                done.append(target.shown)
            else:
                print(f"{run_dir}: {target.what} {target.shown} {outcome}", file=out)
        for note in notes:
            print(f"{run_dir}: {note}", file=out)
        if not said and not notes:
            print(f"{run_dir}: nothing of this run's left under storage.root", file=out)
    return done


def main(arguments: list[str]) -> None:
    dry_run = DRY_RUN_FLAG in arguments
    paths = [a for a in arguments if a != DRY_RUN_FLAG]
    try:
        if not paths or any(p.startswith("-") for p in paths):
            raise UserError(f"usage: dlio_ckpt clean [{DRY_RUN_FLAG}] RUN_OR_SWEEP_FOLDER...")
        clean(paths, dry_run)
    except UserError as exc:
        print(f"dlio_ckpt: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE) from None
    except OSError as exc:  # removing failed part-way (permissions, a busy file system): one line, exit 1
        print(f"dlio_ckpt: error: clean: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        raise SystemExit(RUN_FAILURE_EXIT_CODE) from None
