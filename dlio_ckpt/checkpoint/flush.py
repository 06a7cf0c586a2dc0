"""Copying a committed checkpoint's files from one level to another (the flush of multi-level
checkpointing), one rank's files at a time, through the traced storage of both levels.

A flushed file is published all or nothing at its final name (`open_staged`), fsynced when the
run fsyncs, and checked while it streams: its size and checksum must be what the source's
manifest says, so a damaged source file is never made durable on the slower level under a
manifest that vouches for it. The manifest itself is the caller's to write, last.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from dlio_ckpt.checkpoint.fileio import new_hasher, read_back
from dlio_ckpt.errors import RunFailure


@dataclass(frozen=True)
class CopiedFiles:
    files: int
    bytes: int  # what the copy's write calls moved into the target level
    seconds: float  # from the first open to the last file published


class _Appender:
    """read_back's sink over a write handle that may only append (an object store's upload)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def write_at(self, offset: int, data: memoryview) -> None:
        self.handle.write(data)


def copy_entries(source: Any, target: Any, source_folder: str, target_folder: str, entries: list[dict],
                 algorithm: str, fsync: bool, buffer: memoryview) -> CopiedFiles:
    """Copy the manifest `entries` (path, size, checksum) from `source_folder` on storage `source`
    to `target_folder` on `target`. Raises OSError (missing, unreadable, a full disk) or RunFailure
    (not what the manifest says), naming the file; what it published before stays, and the caller's
    missing manifest keeps it unused."""
    start = time.perf_counter()
    moved = 0
    made: set[str] = set()
    for entry in entries:
        source_path = os.path.join(source_folder, entry["path"])
        target_path = os.path.join(target_folder, entry["path"])
        parent = os.path.dirname(target_path)
        if parent not in made:
            target.makedirs(parent)
            made.add(parent)
        reader = source.open_read(source_path)
        try:
            writer = target.open_staged(target_path)
            try:
                hasher = new_hasher(algorithm)
                copied = read_back(reader, reader.size(), hasher, buffer, sink=_Appender(writer))
                problem = _mismatch(entry, copied, hasher, algorithm)
                if problem:
                    raise RunFailure(f"flush of {source_path}: {problem}")
                if fsync:
                    writer.fsync()
            except BaseException:
                writer.abort()
                raise
            writer.close()
        finally:
            reader.close()
        moved += copied
    return CopiedFiles(files=len(entries), bytes=moved, seconds=time.perf_counter() - start)


def _mismatch(entry: dict, copied: int, hasher: Any, algorithm: str) -> str | None:
    if copied != entry["size"]:
        return f"{copied} bytes, the manifest says {entry['size']} (truncated or torn)"
    if hasher is not None and algorithm != "none" and hasher.hexdigest() != entry["checksum"]:
        return f"{algorithm} checksum mismatch (corrupted contents)"
    return None
