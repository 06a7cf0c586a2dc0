"""`dlio_ckpt clean RUN_FOLDER...`: remove the dataset and checkpoints a run created.

Runs leave gigabytes under storage.root. A person cleaning up by hand has to find the run's
checkpoint folder (named after the run id) and the dataset folder (named after its fingerprint);
a wrong `rm -rf` there can take another run's data. So each run records in summary.json
(`created`) exactly what it created, and clean removes only those paths, only when they lie
strictly inside the run's storage.root and are not symbolic links. A dataset the run reused was
made by an earlier run and is kept. The run folder itself (summary, events, traces) stays.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dlio_ckpt.errors import USAGE_EXIT_CODE, UserError

DRY_RUN_FLAG = "--dry-run"


def created_paths(config: Any, checkpoint_root: str | None, dataset: dict[str, Any] | None) -> dict[str, Any]:
    """What this run created under storage.root: its own checkpoint folder (not in mode=restore,
    which reads an earlier run's) and the dataset folder when it generated rather than reused it;
    and, outside it, its folder in each checkpoint level that has a folder of its own
    (`checkpoint_levels`: the level's folder, this run's folder in it, the level's backend)."""
    ours = checkpoint_root if checkpoint_root and config.mode != "restore" else None
    return {
        "storage_root": os.path.abspath(config.storage.root),
        "checkpoints": ours,
        "dataset": dataset["folder"] if dataset and not dataset.get("reused") else None,
        "checkpoint_levels": [{"folder": os.path.abspath(level.path),
                               "checkpoints": os.path.join(os.path.abspath(level.path), os.path.basename(ours)),
                               "backend": level.backend or config.storage.backend}
                              for level in config.checkpoint.levels if level.path] if ours else [],
    }


def _namespace(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    return value


def inside(path: str, root: str) -> bool:
    """`path` lies strictly inside `root` (after resolving links on POSIX paths)."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path != root and os.path.commonpath([path, root]) == root


def run_folders(paths: list[str]) -> list[Path]:
    """Run folders given directly, or the job folders of a sweep folder."""
    found = []
    for given in paths:
        folder = Path(given)
        if (folder / "summary.json").is_file():
            found.append(folder)
        elif folder.is_dir() and any((job / "summary.json").is_file() for job in folder.iterdir() if job.is_dir()):
            jobs = [job for job in folder.iterdir() if (job / "summary.json").is_file()]
            found += sorted(jobs, key=lambda job: (len(job.name), job.name))  # 2 before 10
        else:
            raise UserError(f"{given}: not a run folder or sweep folder (no summary.json); give the folder a run printed as 'run folder'")
    return found


def plan_removal(run_dir: Path) -> tuple[Any, list[tuple[str, str]], list[str]]:
    """(storage config, [(what, path, its storage config)] to remove, notes about what is kept) for one run folder."""
    summary = json.loads((run_dir / "summary.json").read_text())
    created = summary.get("created")
    if created is None:
        raise UserError(f"{run_dir}: its summary.json does not record what the run created (a run from before "
                        "`dlio_ckpt clean` existed); remove its folders under storage.root by hand")
    storage = _namespace(summary["config"]["storage"])
    root = created["storage_root"]
    remove, notes = [], []
    for what in ("checkpoints", "dataset"):
        path = created.get(what)
        if path is None:
            if what == "dataset" and summary.get("dataset", {}).get("reused"):
                notes.append(f"dataset {summary['dataset']['folder']} kept: this run reused it")
            continue
        if os.path.islink(path) or not inside(path, root):
            notes.append(f"{what} {path} kept: not strictly inside storage.root {root}")
            continue
        remove.append((what, path, storage))
    for level in created.get("checkpoint_levels", []):  # each only inside its own level's folder
        path = level["checkpoints"]
        if os.path.islink(path) or not inside(path, level["folder"]):
            notes.append(f"checkpoint level folder {path} kept: not strictly inside its level's folder {level['folder']}")
            continue
        options = SimpleNamespace(**{**vars(storage), "backend": level["backend"], "root": level["folder"]})
        remove.append(("checkpoints", path, options))
    return storage, remove, notes


def clean(paths: list[str], dry_run: bool, out: Any = sys.stdout) -> list[str]:
    """Remove what the runs created; return the paths removed (or that would be, with dry_run)."""
    from dlio_ckpt.storage import make_backend

    done = []
    for run_dir in run_folders(paths):
        _, remove, notes = plan_removal(run_dir)
        for what, path, storage in remove:
            backend = make_backend(storage)
            if not backend.exists(path) and not backend.isdir(path):
                print(f"{run_dir}: {what} {path} already gone", file=out)
                continue
            if not dry_run:
                backend.remove_tree(path)
            print(f"{run_dir}: {'would remove' if dry_run else 'removed'} {what} {path}", file=out)
            done.append(path)
        for note in notes:
            print(f"{run_dir}: {note}", file=out)
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
