"""Which process is a rank, a data-loader worker or a helper; which file is dataset, checkpoint or other.

Processes (per-process logs of a non-MPI job): Python's `multiprocessing` helpers show in the
command line (`spawn_main`: a spawned DataLoader worker; `resource_tracker`, `forkserver`:
helpers that read no data); a launcher (torchrun, mpirun) by its command line. A forked worker
has its parent's command line, so a process is a worker when another process with the same
command line started earlier and outlives it. Every other process is a rank.

Files: console streams (<STDOUT>, <STDERR>, <STDIN>) and the program's own environment (Python
modules, shared libraries, /proc, /sys, /dev, /etc, the interpreter's venv, multiprocessing's
/tmp/pymp-* folders) are `other`. Under a root the user gave, the root decides. Otherwise the
dataset is the folder that the most bytes were read from, never written, by name and extension
alike (its siblings with the same extension join it); a checkpoint is a file written (or opened
by a rank and never read: torch.save's fopen, whose writes darshan-runtime does not see) whose
path or name says checkpoint (ckpt, checkpoint, .pt, .pth, .distcp, .metadata, .index, .data-*,
.safetensors), or any file under a folder holding such a file.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass

from dlio_ckpt.profile.records import FileUse, Job, Process

DATASET, CHECKPOINT, OTHER = "dataset", "checkpoint", "other"
RANK, WORKER, HELPER, LAUNCHER = "rank", "worker", "helper", "launcher"
_HELPERS = ("resource_tracker", "forkserver", "semaphore_tracker")
_LAUNCHERS = ("torch.distributed.run", "torchrun", "mpirun", "mpiexec", "srun", "launch.py")
_SYSTEM = re.compile(r"(^/(proc|sys|dev|etc|usr|lib|lib64|bin|sbin|opt/conda/lib)/|/site-packages/|/dist-packages/"
                     r"|/lib/python3|pyvenv\.cfg$|\.py[co]?$|\.so(\.\d+)*$|^/tmp/pymp-|/__pycache__/|^/tmp/torchelastic_"
                     r"|\.json$|\.ya?ml$|\.log$|\.cfg$|\.txt$)")
_CKPT_NAME = re.compile(r"(ckpt|checkpoint|\.pt$|\.pth$|\.distcp$|\.metadata$|\.safetensors$|\.index$"
                        r"|\.data-\d+-of-\d+$|model.*\.bin$|optim.*\.bin$)", re.IGNORECASE)


@dataclass(frozen=True)
class Roles:
    """Each process's role (by index in job.processes) and each file path's class."""

    processes: tuple[str, ...]
    files: dict[str, str]
    dataset_root: str
    checkpoint_root: str

    def of(self, job: Job, role: str) -> list[Process]:
        return [p for p, r in zip(job.processes, self.processes) if r == role]


def process_roles(job: Job) -> tuple[str, ...]:
    roles = []
    for p in job.processes:
        exe = p.exe
        if any(h in exe for h in _HELPERS):
            roles.append(HELPER)
        elif "spawn_main" in exe or "multiprocessing-fork" in exe:
            roles.append(WORKER)
        elif any(launcher in exe.split(" ")[1] if len(exe.split(" ")) > 1 else False for launcher in _LAUNCHERS) \
                or any(f"-m {launcher}" in exe for launcher in _LAUNCHERS):
            roles.append(LAUNCHER if job.nprocs == 1 and len(job.processes) > 1 else RANK)
        elif any(q is not p and q.exe == exe and q.start < p.start - 0.05 and q.end >= p.end - 0.05
                 and q.log != p.log for q in job.processes):
            roles.append(WORKER)
        else:
            roles.append(RANK)
    return tuple(roles)


def system_file(path: str) -> bool:
    return path.startswith("<") or bool(_SYSTEM.search(path))


def _under(path: str, root: str) -> bool:
    return bool(root) and (path == root or path.startswith(root.rstrip("/") + "/"))


def classify(job: Job, data_root: str = "", checkpoint_root: str = "") -> Roles:
    roles = process_roles(job)
    data_root = os.path.abspath(data_root) if data_root else ""
    checkpoint_root = os.path.abspath(checkpoint_root) if checkpoint_root else ""
    uses: dict[str, list[tuple[FileUse, str]]] = defaultdict(list)
    for p, role in zip(job.processes, roles):
        for f in p.files:
            uses[f.path].append((f, role))
    files: dict[str, str] = {}
    if not data_root:
        data_root = _dataset_folder(uses, checkpoint_root)
    for path, used in uses.items():
        files[path] = _file_class(path, used, data_root, checkpoint_root)
    if not checkpoint_root:
        ckpt = [p for p, c in files.items() if c == CHECKPOINT]
        checkpoint_root = os.path.commonpath([os.path.dirname(p) for p in ckpt]) if ckpt else ""
        for path in files:  # what the framework reads back under it (TensorFlow merges its part index)
            if files[path] == OTHER and _under(path, checkpoint_root) and not system_file(path):
                files[path] = CHECKPOINT
    return Roles(_helpers_among_ranks(job, roles, files), files, data_root, checkpoint_root)


def _helpers_among_ranks(job: Job, roles: tuple[str, ...], files: dict[str, str]) -> tuple[str, ...]:
    """A would-be rank that neither read the dataset nor wrote a checkpoint, and whose command line
    no such rank shares (`uname -p` started by a library, a compiler probe), is a helper."""
    busy_exes = {p.exe for p, role in zip(job.processes, roles) if role in (RANK, WORKER)
                 and any(files.get(f.path) in (DATASET, CHECKPOINT) for f in p.files)}
    worker_parents = {p.exe for p, role in zip(job.processes, roles) if role == WORKER}
    return tuple(HELPER if role == RANK and p.exe not in busy_exes | worker_parents and busy_exes else role
                 for p, role in zip(job.processes, roles))


def _read_only(used: list[tuple[FileUse, str]]) -> bool:
    return sum(f.bytes_read for f, _ in used) > 0 and sum(f.bytes_written for f, _ in used) == 0


def _dataset_folder(uses: dict[str, list[tuple[FileUse, str]]], checkpoint_root: str) -> str:
    """The folder of the read-only, non-system files that the most bytes were read from; widened to
    the common folder of every read-only file with the same extension (train/ and valid/ shards)."""
    by_folder: dict[str, int] = defaultdict(int)
    for path, used in uses.items():
        if system_file(path) or not _read_only(used) or _under(path, checkpoint_root) or _CKPT_NAME.search(os.path.basename(path)):
            continue
        by_folder[os.path.dirname(path)] += sum(f.bytes_read for f, _ in used)
    if not by_folder:
        return ""
    best = max(by_folder, key=lambda d: (by_folder[d], d))
    ext = _extension_of_folder(uses, best)
    same = [os.path.dirname(p) for p, used in uses.items() if _read_only(used) and not system_file(p)
            and os.path.splitext(p)[1] == ext and ext]
    return os.path.commonpath(same) if len(set(same)) > 1 else best


def _extension_of_folder(uses, folder: str) -> str:
    counts: dict[str, int] = defaultdict(int)
    for path in uses:
        if os.path.dirname(path) == folder:
            counts[os.path.splitext(path)[1]] += 1
    return max(counts, key=counts.get) if counts else ""


def _file_class(path: str, used: list[tuple[FileUse, str]], data_root: str, checkpoint_root: str) -> str:
    if path.startswith("<"):
        return OTHER
    if _under(path, checkpoint_root):
        return CHECKPOINT
    if _under(path, data_root) and sum(f.bytes_written for f, _ in used) == 0 and not os.path.basename(path).startswith("."):
        return DATASET  # a hidden file beside the data (an owner mark, an index cache) is not a sample file
    if system_file(path):
        return OTHER
    written = sum(f.bytes_written for f, _ in used) > 0
    opened_by_rank_unread = any(role == RANK and f.reads == 0 and f.opens > 0 for f, role in used)
    if (written or opened_by_rank_unread) and not checkpoint_root and _CKPT_NAME.search(path):
        return CHECKPOINT
    return OTHER
