"""Every file system call of a command and its children, by strace, tallied per file class.

Why strace: it sees the calls a program really makes (a framework's C++ writer, a DataLoader
worker process, np.load's buffered reads), whatever the language, with no cooperation from the
program; `-ff` gives each process and thread its own output file (no interleaved
"unfinished"/"resumed" halves to pair), `-y` names the file behind each descriptor, `-s 0`
leaves out the data, `--seccomp-bpf` stops only at the traced calls. The emulation is traced the
same way, so both sides are counted by one independent counter (dlio_ckpt's own summary.json is
not used for counts here).

A call is classified by the path it touches: `emulator` (dlio_ckpt's own bookkeeping, files named
`.dlio_ckpt_*`: the dataset's manifest and lease, the run's ownership marker, and the folder that
holds that marker, opened to fsync it once when the run takes it: written before training and
untimed, never a training program's I/O, so kept apart and reported, not compared), `dataset`
(files under the dataset folder with the dataset's extension), `checkpoint` (anything under a
checkpoint folder), `other` (anything else under the storage root); calls on files outside the
storage root (Python's imports, the run folder, /proc) are not counted.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

READS = {"read", "pread64", "readv", "preadv", "preadv2"}
WRITES = {"write", "pwrite64", "writev", "pwritev", "pwritev2"}
SYNCS = {"fsync", "fdatasync"}
RENAMES = {"rename", "renameat", "renameat2"}
UNLINKS = {"unlink", "unlinkat"}
OPENS = {"open", "openat"}
SEEKS = {"lseek"}
TRACED = sorted(READS | WRITES | SYNCS | RENAMES | UNLINKS | OPENS | SEEKS)
CLASSES = ("dataset", "checkpoint", "other", "emulator")
BOOKKEEPING_PREFIX = ".dlio_ckpt_"  # dlio_ckpt/engine/ownership.py and dataset_manifest: the emulator's own files
OWNER_MARKER = ".dlio_ckpt_owner"

_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+)(?:<([^>]*)>)?")
_FD_PATH = re.compile(r"^\d+<([^>]*)>")
_DIRFD_AND_PATH = re.compile(r"(?:AT_FDCWD|\d+)<([^>]*)>,\s*\"([^\"]*)\"")
_QUOTED = re.compile(r"\"([^\"]*)\"")


def strace_available() -> str | None:
    """None when strace can trace here, else why not (for a test's skip reason)."""
    exe = shutil.which("strace")
    if not exe:
        return "strace is not installed (apt-get install strace)"
    probe = subprocess.run([exe, "-f", "-qq", "-o", os.devnull, "-e", "trace=getpid", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"strace cannot trace here (ptrace refused: {probe.stderr.strip().splitlines()[-1:] or '?'})"
    return None


def strace_command(out_prefix: Path, cmd: Sequence[str]) -> list[str]:
    return ["strace", "-ff", "--seccomp-bpf", "-qq", "-y", "-s", "0", "-o", str(out_prefix),
            "-e", "trace=" + ",".join(TRACED), *cmd]


def size_bucket(nbytes: int) -> str:
    """The power of two at or above `nbytes`, as a label ('0', '4KiB', '1MiB')."""
    if nbytes <= 0:
        return "0"
    top = 1 << (nbytes - 1).bit_length()
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if top >= size:
            return f"{top // size}{unit}"
    return f"{top}B"


@dataclass
class ClassTally:
    """What one file class saw: call counts, bytes, size histograms, distinct files."""

    opens: int = 0
    reads: int = 0
    writes: int = 0
    seeks: int = 0
    fsyncs: int = 0
    renames: int = 0
    unlinks: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    read_sizes: dict[str, int] = field(default_factory=dict)
    write_sizes: dict[str, int] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("opens", "reads", "writes", "seeks", "fsyncs", "renames", "unlinks",
                                            "bytes_read", "bytes_written")}
        d["read_sizes"] = dict(sorted(self.read_sizes.items(), key=lambda kv: _bucket_bytes(kv[0])))
        d["write_sizes"] = dict(sorted(self.write_sizes.items(), key=lambda kv: _bucket_bytes(kv[0])))
        d["files"] = len(self.files)
        return d


def _bucket_bytes(label: str) -> int:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)):
        if label.endswith(unit):
            return int(label[: -len(unit)]) * size
    return 0


@dataclass(frozen=True)
class Classifier:
    """Which class a path belongs to (see the module docstring)."""

    storage_root: str
    dataset_dir: str
    dataset_ext: str
    checkpoint_dirs: tuple[str, ...]

    def classify(self, path: str) -> str | None:
        path = os.path.normpath(path)
        if not _under(path, self.storage_root):
            return None
        if os.path.basename(path).startswith(BOOKKEEPING_PREFIX) or os.path.isfile(os.path.join(path, OWNER_MARKER)):
            return "emulator"
        if any(_under(path, d) for d in self.checkpoint_dirs):
            return "checkpoint"
        if _under(path, self.dataset_dir) and path.endswith(self.dataset_ext):
            return "dataset"
        return "other"


def _under(path: str, folder: str) -> bool:
    folder = os.path.normpath(folder)
    return path == folder or path.startswith(folder + os.sep)


def tally(trace_files: Sequence[Path], classifier: Classifier) -> dict[str, ClassTally]:
    """The per-class tallies of strace -ff output files (one per process or thread)."""
    out = {c: ClassTally() for c in CLASSES}
    for trace in trace_files:
        with open(trace, errors="replace") as f:
            for line in f:
                _count(line, classifier, out)
    return out


def _count(line: str, classifier: Classifier, out: dict[str, ClassTally]) -> None:
    m = _CALL.match(line)
    if not m:
        return
    name, args, result, result_path = m.group(1), m.group(2), int(m.group(3)), m.group(4)
    if result < 0:
        return
    if name in OPENS:
        if "O_DIRECTORY" in args:  # a folder listing (glob, os.scandir), not file I/O
            return
        path = result_path
    elif name in RENAMES or name in UNLINKS:
        path = _target_path(args)
    else:
        fd = _FD_PATH.match(args)
        path = fd.group(1) if fd else None
    if not path:
        return
    cls = classifier.classify(path)
    if cls is None:
        return
    t = out[cls]
    t.files.add(os.path.normpath(path))
    if name in OPENS:
        t.opens += 1
    elif name in READS:
        t.reads += 1
        t.bytes_read += result
        t.read_sizes[size_bucket(result)] = t.read_sizes.get(size_bucket(result), 0) + 1
    elif name in WRITES:
        t.writes += 1
        t.bytes_written += result
        t.write_sizes[size_bucket(result)] = t.write_sizes.get(size_bucket(result), 0) + 1
    elif name in SEEKS:
        t.seeks += 1
    elif name in SYNCS:
        t.fsyncs += 1
    elif name in RENAMES:
        t.renames += 1
    elif name in UNLINKS:
        t.unlinks += 1


def _target_path(args: str) -> str | None:
    """The path a rename lands on (its last path argument) or an unlink removes, made absolute
    with the directory descriptor strace names beside it."""
    pairs = _DIRFD_AND_PATH.findall(args)
    if pairs:
        folder, name = pairs[-1]
        return name if name.startswith("/") else os.path.join(folder, name)
    quoted = _QUOTED.findall(args)
    return quoted[-1] if quoted and quoted[-1].startswith("/") else None
