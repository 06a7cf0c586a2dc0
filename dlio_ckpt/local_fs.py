"""Facts about the local file system asked by path: the nearest folder that exists, its free
space, whether a path is a kernel file system, and which file system holds it.

Below every layer (it imports only the standard library and, for the mount table, psutil when
asked), so the ground floor can use it: errors.py names the free space in a full-disk message
without importing a storage backend, and the loader checks local folders without naming one.
The POSIX backend (storage/posix.py) answers its own questions through these same functions.
"""

from __future__ import annotations

import os
import shutil

# Kernel file systems: what is written there configures the kernel or devices, it is not storage.
# /dev/shm is the exception: a RAM disk, a node-local checkpoint level (docs/levels.md).
KERNEL_FOLDERS = ("/proc", "/sys", "/dev")
RAM_DISK = "/dev/shm"


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def system_folder(path: str) -> str | None:
    """The kernel folder (/proc, /sys, /dev) that `path` (absolute, resolved) lies in, else None."""
    if _under(path, RAM_DISK):
        return None
    return next((folder for folder in KERNEL_FOLDERS if _under(path, folder)), None)


def file_system(path: str) -> str:
    """'ext4 mounted at /data (/dev/nvme0n1p1)': the file system that holds `path` (or would, for
    a path not made yet), from the mount table: the mount point that is the longest prefix."""
    import psutil

    where = os.path.realpath(nearest_existing(os.path.abspath(path)))
    mounts = [m for m in psutil.disk_partitions(all=True) if _under(where, m.mountpoint.rstrip(os.sep) or os.sep)
              or m.mountpoint == os.sep]
    if not mounts:
        return "an unknown file system"
    mount = max(mounts, key=lambda m: len(m.mountpoint))
    return f"{mount.fstype} mounted at {mount.mountpoint} ({mount.device})"


def nearest_existing(path: str) -> str:
    """`path` or its nearest existing parent folder: where the file system of a path not made yet is asked."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes_at(path: str) -> int:
    """Free bytes of the file system holding `path` (its nearest existing folder)."""
    return shutil.disk_usage(nearest_existing(os.path.abspath(path))).free
