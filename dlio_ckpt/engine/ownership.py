"""Which folders under storage.root a run created, as the run itself marks them on disk.

`dlio_ckpt clean` must never delete what is not the run's. A path recorded in summary.json cannot
prove that: the file can be edited, copied or belong to another run. So the run leaves proof where
the folders are: its run folder holds RUN_MARKER (its run id), and each folder it creates under
storage.root (its checkpoint folder, its folder in each checkpoint level, a dataset it generated)
holds OWNER_MARKER naming that run id and the run folder (path and inode). clean removes a folder
only when the two agree; a copied run folder (new inode, new path) or another run's folder fails.

A dataset outlives the run that generated it: later runs reuse it. Each run using a POSIX dataset
holds a shared `flock` on LEASE in the dataset folder for as long as it runs (rank 0; released by
the kernel if the process dies), and clean deletes a dataset only under the exclusive lock, so it
never deletes a dataset a live run reads. Markers and leases are bookkeeping, not the emulated
program's I/O: they go through the untraced backend.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Any

from dlio_ckpt.engine.relaunch import check_relaunch, give_back_note
from dlio_ckpt.errors import RunFailure, UserError, storage_failure
from dlio_ckpt.storage import make_backend

RUN_MARKER = ".dlio_ckpt_run_id"  # in the run folder: {"run_id"}
OWNER_MARKER = ".dlio_ckpt_owner"  # in each folder the run created under storage.root
LEASE = ".dlio_ckpt_lease"  # in a dataset folder: shared flock while a run uses it
MARKER_MAX_BYTES = 4096


def created_paths(config: Any, checkpoint_root: str | None, dataset: dict[str, Any] | None) -> dict[str, Any]:
    """summary.json `created`: what this run created (a record for people and tools; clean itself
    decides from the markers on disk). Its checkpoint folder (not in mode=restore, which reads an
    earlier run's), the dataset folder when it generated rather than reused it, and its folder in
    each checkpoint level that has a folder of its own."""
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


def owner_record(run_id: str, run_dir: Path, what: str) -> dict[str, Any]:
    folder = os.path.realpath(run_dir)
    return {"run_id": run_id, "run_folder": folder, "run_folder_inode": os.stat(folder).st_ino, "what": what}


def write_run_marker(run_dir: Path, run_id: str) -> None:
    """Rank 0, before anything is written under storage.root (a relaunch keeps its run id)."""
    path = Path(run_dir) / RUN_MARKER
    temporary = path.with_name(f"{RUN_MARKER}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps({"run_id": run_id}))
    os.replace(temporary, path)


def read_regular(path: str | Path, limit: int, dir_fd: int | None = None, follow: bool = False) -> bytes | None:
    """Up to `limit` + 1 bytes of a regular file, None when it is missing, a link (unless `follow`),
    or not a regular file: a FIFO or a device put in a marker's place must not hang or feed clean."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return handle.read(limit + 1)


def read_run_marker(run_dir: Path) -> str | None:
    """The run id the run folder's own marker names; None when it has none (or not a valid one)."""
    data = read_regular(Path(run_dir) / RUN_MARKER, MARKER_MAX_BYTES)
    if data is None:
        return None
    try:
        run_id = json.loads(data)["run_id"]
    except (ValueError, TypeError, KeyError):
        return None
    return run_id if safe_name(run_id) else None


def safe_name(name: Any) -> bool:
    """One path component that names a folder below its parent: no separator, not `.` or `..`."""
    return (isinstance(name, str) and bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name
            and (not os.altsep or os.altsep not in name))


def parse_owner(data: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(data[:MARKER_MAX_BYTES])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def owned_by(record: dict[str, Any] | None, run_id: str, run_dir: Path) -> str | None:
    """None when `record` (an OWNER_MARKER's content) names this run and its run folder, else why not."""
    if record is None:
        return f"no valid {OWNER_MARKER} in it (not marked by a run)"
    if record.get("run_id") != run_id:
        return f"its {OWNER_MARKER} names run {record.get('run_id')!r}, not this run ({run_id})"
    folder = os.path.realpath(run_dir)
    if record.get("run_folder_inode") != os.stat(folder).st_ino and record.get("run_folder") != folder:
        return f"its {OWNER_MARKER} names run folder {record.get('run_folder')}, not {folder} (a copy of a run folder?)"
    return None


def claim_folder(backend: Any, folder: str, run_id: str, run_dir: Path, what: str) -> None:
    """Rank 0: create `folder` (this run's) with its OWNER_MARKER. Refused when the folder is a link
    or already marked by another run: a relaunch must not follow a link swapped in for its folder."""
    if backend.capabilities.local_paths and os.path.islink(folder):
        raise UserError(f"{what} folder {folder} is a symbolic link; this run writes only into a folder it made "
                        "itself: remove the link (or choose another storage.root)")
    marker = os.path.join(folder, OWNER_MARKER)
    if backend.exists(marker):
        reason = owned_by(parse_owner(backend.read_whole(marker)), run_id, run_dir)
        if reason is not None:
            raise UserError(f"{what} folder {folder} is not this run's: {reason}; choose a new run folder")
        return
    if backend.isdir(folder) and backend.listdir(folder):
        raise UserError(f"{what} folder {folder} already holds files no run marked as its own; "
                        "move them away, or choose another storage.root")
    backend.makedirs(folder)
    backend.write_atomic(marker, json.dumps(owner_record(run_id, run_dir, what)).encode())


def mark_dataset(backend: Any, folder: str, run_id: str, run_dir: Path) -> None:
    """Rank 0, when this run (re)generates the dataset: it is now this run's to clean."""
    try:
        backend.write_atomic(os.path.join(folder, OWNER_MARKER), json.dumps(owner_record(run_id, run_dir, "dataset")).encode())
    except OSError as exc:
        raise _failure(exc) from None


class DatasetLease:
    """Rank 0 holds a shared lock on the dataset's LEASE while the run uses it (POSIX; an object
    store has no locks, and clean keeps datasets there). `take` before the dataset is checked for
    reuse when its folder exists, and again once generated (a no-op when held): a folder that does
    not exist yet is made and marked by this run, so no other run's clean removes it meanwhile."""

    def __init__(self, backend: Any, folder: str, is_root: bool) -> None:
        self.folder = folder
        self.applies = is_root and backend.capabilities.local_paths
        self.fd: int | None = None

    def take(self) -> None:
        if not self.applies or self.fd is not None:
            return
        path = os.path.join(self.folder, LEASE)
        for _ in range(5):  # clean removed the folder while this waited: the lock is on a deleted file
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            except FileNotFoundError:
                return  # no dataset folder (yet): generation makes it, then this is taken again
            except OSError:  # a read-only dataset: nobody's clean can remove it either
                self.applies = False
                return
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # clean refuses such a lease too
                os.close(fd)
                self.applies = False
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
            except OSError as exc:  # a file system without flock: clean keeps the dataset then
                os.close(fd)
                if exc.errno in (errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    self.applies = False
                    return
                raise
            try:
                current = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            held = os.fstat(fd)
            if current is not None and (current.st_ino, current.st_dev) == (held.st_ino, held.st_dev):
                self.fd = fd
                return
            os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock
            self.fd = None


def try_exclusive(dir_fd: int, create: bool) -> tuple[int | None, str | None]:
    """clean: (fd holding the exclusive lock on LEASE in the open folder `dir_fd`, None) or
    (None, why not): a live run holds it shared, or the file system has no flock. Without
    `create` (a dry run writes nothing), a missing LEASE means no run holds it: (None, None)."""
    try:
        fd = os.open(LEASE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_CREAT if create else 0), 0o644,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot open its lease file ({exc.strerror})"
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None, f"its {LEASE} is not a regular file; remove it by hand when no run uses it"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None, "a running run is using it (it holds the dataset's lease); clean it once that run ends"
        return None, f"its lease cannot be locked on this file system ({exc.strerror}); remove it by hand when no run uses it"
    return fd, None


def own_checkpoint_folders(config: Any, run_id: str) -> list[tuple[Any, str, str]]:
    """(untraced backend, folder, what) for each checkpoint folder this run writes: its own under
    storage.root and its folder in each checkpoint level with a folder of its own. None in
    mode=restore (it reads an earlier run's) or without checkpoints."""
    if config.mode not in ("train", "checkpoint") or config.workload == "replay" or not config.checkpoint.enabled:
        return []
    root = os.path.abspath(os.path.join(config.storage.root, config.checkpoint.folder, run_id))
    found = [(make_backend(config.storage), root, "checkpoint")]
    for level in config.checkpoint.levels:
        if level.path:
            folder = os.path.abspath(level.path)
            options = dataclasses.replace(config.storage, backend=level.backend or config.storage.backend, root=folder)
            found.append((make_backend(options, folder), os.path.join(folder, run_id), f"checkpoint level {level.name}"))
    return found


def claim_run(config: Any, run_dir: Path, run_id: str, world_size: int, make_root: Any = None) -> None:
    """Rank 0, first thing in a run: a relaunch is checked against the run it resumes, then
    `make_root` (storage.root made where missing, before anything is written under it), then the
    run folder's marker and this run's checkpoint folders, each marked as its own."""
    try:
        check_relaunch(run_dir, config, world_size)
        if make_root is not None:
            make_root()
        write_run_marker(run_dir, run_id)
        for backend, folder, what in own_checkpoint_folders(config, run_id):
            claim_folder(backend, folder, run_id, run_dir, what)
    except UserError:
        give_back_note(run_dir)  # refused before writing anything: the right relaunch can still resume
        raise
    except OSError as exc:  # storage that cannot be written: one line per rank, exit 1
        raise _failure(exc) from None


def _failure(exc: OSError) -> RunFailure:
    failure = storage_failure(exc, exc.filename) if exc.filename else RunFailure(exc.strerror or str(exc))
    failure.known_everywhere = True  # raised on rank 0, then on every rank by root_first
    return failure
