"""Record the file system calls a piece of code makes, and check a commit's ordering against them.

`record_calls(monkeypatch)` wraps os.open (creations), os.mkdir, os.replace / os.rename and
os.fsync in this process, so every call the storage layer makes (any thread) is logged with the
real path (an fsync's path is read from /proc/self/fd, so it is what the kernel was asked to sync,
whatever the code thought). `strace_calls(log)` reads the same events from `strace -f` output of
another process. `check_commits(calls, top)` then checks every commit found (a rename onto a
manifest name): what power-loss durability needs, and counts what was synced.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field

MANIFESTS = ("dlio_ckpt_manifest.json", ".dlio_ckpt_dataset.json")


@dataclass
class Commit:
    manifest: str
    files: int = 0  # files listed whose data was fsynced before the manifest
    folders_before: int = 0  # folder fsyncs from the creation of the manifest's folder to its rename
    file_fsyncs_before: int = 0  # file fsyncs in the same span
    folder_after: bool = False
    problems: list[str] = field(default_factory=list)


def record_calls(monkeypatch) -> list[tuple]:
    """Start recording; returns the list the calls are appended to: ("create", path),
    ("mkdir", path), ("rename", src, dst), ("fsync", path, is_folder, (device, inode))."""
    calls: list[tuple] = []
    real_open, real_fsync, real_replace, real_rename, real_mkdir = os.open, os.fsync, os.replace, os.rename, os.mkdir

    def opened(path, flags, mode=0o777, *, dir_fd=None):
        new = bool(flags & os.O_CREAT) and dir_fd is None and not os.path.lexists(path)
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        if new:
            calls.append(("create", os.path.realpath(path)))
        return fd

    def fsynced(fd):
        number = fd if isinstance(fd, int) else fd.fileno()
        path = os.readlink(f"/proc/self/fd/{number}")
        info = os.fstat(number)
        real_fsync(fd)
        calls.append(("fsync", path, stat.S_ISDIR(info.st_mode), (info.st_dev, info.st_ino)))

    def renamer(real):
        def renamed(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
            real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            calls.append(("rename", _real_parent(src), os.path.realpath(dst)))
        return renamed

    def made(path, mode=0o777, *, dir_fd=None):
        real_mkdir(path, mode, dir_fd=dir_fd)
        calls.append(("mkdir", os.path.realpath(path)))

    monkeypatch.setattr(os, "open", opened)
    monkeypatch.setattr(os, "fsync", fsynced)
    monkeypatch.setattr(os, "replace", renamer(real_replace))
    monkeypatch.setattr(os, "rename", renamer(real_rename))
    monkeypatch.setattr(os, "mkdir", made)
    return calls


def _real_parent(path) -> str:
    """The real path a name had (its folder resolved; the name itself is gone after a rename)."""
    path = os.fspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))


_STRACE = re.compile(r'^(?:\[pid\s+\d+\]\s+|\d+\s+)?(\w+)\((.*)\)\s+=\s+(-?\d+)')
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_PID = re.compile(r'^(?:\[pid\s+(\d+)\]|(\d+))\s+')
_UNFINISHED = " <unfinished ...>"
_RESUMED = re.compile(r'<\.\.\. (\w+) resumed>')


def _joined(lines):
    """strace -f lines with each call whole: a call another thread interrupted is printed as
    `PID name(args <unfinished ...>` and later `PID <... name resumed>rest`; it is put together
    where it resumed, which is when it returned (what ordering needs)."""
    pending: dict[str, str] = {}
    for line in lines:
        match = _PID.match(line)
        pid = (match.group(1) or match.group(2)) if match else ""
        if line.endswith(_UNFINISHED):
            pending[pid] = line[: -len(_UNFINISHED)]
            continue
        resumed = _RESUMED.search(line)
        if resumed and pid in pending:
            yield pending.pop(pid) + line[resumed.end():]
            continue
        yield line


def strace_calls(log: str, cwd: str) -> list[tuple]:
    """The same events from `strace -f -y -e trace=openat,mkdir,mkdirat,rename,renameat,renameat2,fsync,fdatasync`
    output (-y prints an fsync's descriptor as <path>); failed calls are skipped."""
    calls: list[tuple] = []
    for line in _joined(log.splitlines()):
        match = _STRACE.match(line.strip())
        if not match or int(match.group(3)) < 0:
            continue
        name, args = match.group(1), match.group(2)
        quoted = [os.path.normpath(os.path.join(cwd, q)) for q in _QUOTED.findall(args)]
        if name in ("fsync", "fdatasync"):
            target = re.search(r"<(.*)>", args)
            if target:
                path = target.group(1)
                calls.append(("fsync", path, os.path.isdir(path) or _was_folder(calls, path), None))
        elif name in ("mkdir", "mkdirat") and quoted:
            calls.append(("mkdir", quoted[0]))
        elif name.startswith("rename") and len(quoted) >= 2:
            calls.append(("rename", quoted[0], quoted[1]))
        elif name in ("openat", "open") and quoted and "O_CREAT" in args:
            calls.append(("create", quoted[0]))
    return calls


def _inode(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _was_folder(calls: list[tuple], path: str) -> bool:
    return any(c[0] == "mkdir" and c[1] == path for c in calls)


def _chain(path: str, top: str) -> list[str]:
    """The folders from `path`'s parent up to `top` (excluded)."""
    chain, folder = [], os.path.dirname(path)
    while folder != top and folder.startswith(top + os.sep):
        chain.append(folder)
        folder = os.path.dirname(folder)
    return chain


def check_commits(calls: list[tuple], top: str, read=None) -> list[Commit]:
    """Every commit in `calls` (a rename onto a manifest name) checked for power-loss durability:
    before the rename, each listed file's data was fsynced (under its name or one renamed to it),
    its folder was fsynced after the file got its name there, and each folder created on its way
    down from `top` has its entry fsynced (its parent fsynced after the mkdir); the manifest was
    fsynced before its rename and its folder after it. `read(path)` returns a manifest's file list
    (default: read it from disk)."""
    top = os.path.realpath(top)
    commits, since = [], 0
    for at, call in enumerate(calls):
        if call[0] != "rename" or os.path.basename(call[2]) not in MANIFESTS:
            continue
        target, before = call[2], calls[:at]
        commit = Commit(target)
        folder = os.path.dirname(target)
        listed = (read or _listed)(target)
        for relative in listed:
            path = os.path.join(folder, relative)
            names = {path} | {c[1] for c in before if c[0] == "rename" and c[2] == path}
            inode = _inode(path)  # a rename the recorder could not see (a library's own) keeps the inode
            synced = [i for i, c in enumerate(before) if c[0] == "fsync" and (c[1] in names or (inode and c[3] == inode))]
            if not synced:
                commit.problems.append(f"{path}: data never fsynced before the manifest")
                continue
            commit.files += 1
            named = [i for i, c in enumerate(before) if (c[0] == "create" and c[1] == path)
                     or (c[0] == "rename" and c[2] == path)]
            since_named = named[-1] if named else synced[0]  # created by a library we do not see: its first fsync
            if not any(c[0] == "fsync" and c[1] == os.path.dirname(path) for c in before[since_named + 1:]):
                commit.problems.append(f"{path}: its folder not fsynced after the file was named, before the manifest")
            for created in _chain(path, top):
                made = [i for i, c in enumerate(before) if c[0] == "mkdir" and c[1] == created]
                if made and not any(c[0] == "fsync" and c[1] == os.path.dirname(created) for c in before[made[-1] + 1:]):
                    commit.problems.append(f"{created}: a new folder whose entry in {os.path.dirname(created)} "
                                           f"was not fsynced before the manifest")
        if not any(c[0] == "fsync" and c[1] == call[1] for c in before):
            commit.problems.append(f"{target}: the manifest was not fsynced before its rename")
        start = next((i for i, c in enumerate(before) if c[0] == "mkdir" and c[1] == folder), since)
        commit.folders_before = sum(1 for c in calls[start:at] if c[0] == "fsync" and c[2])
        commit.file_fsyncs_before = sum(1 for c in calls[start:at] if c[0] == "fsync" and not c[2])
        commit.folder_after = any(c[0] == "fsync" and c[1] == folder for c in calls[at + 1:])
        if not commit.folder_after:
            commit.problems.append(f"{target}: its folder was not fsynced after the rename")
        commits.append(commit)
        since = at + 1
    return commits


def _listed(manifest: str) -> list[str]:
    with open(manifest, "rb") as handle:
        data = json.load(handle)
    if "files" in data:
        return [entry["path"] for entry in data["files"]]
    return list(data.get("sizes", {}))  # a dataset manifest: path -> size
