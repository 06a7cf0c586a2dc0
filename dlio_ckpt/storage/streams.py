"""A file opened as Python's `open(path, "rb")` opens it, over a traced handle.

Libraries that take a path (np.load, PIL.Image.open) read through a BufferedReader around a
FileIO: reads of st_blksize (4 KiB on most file systems) into the buffer, reads larger than the
buffer straight from the file, and an lseek for every seek and tell. A format that emulates such a
library must issue exactly those calls, so `open_buffered` builds the same stack, the C
BufferedReader around `FileStream`, a raw stream that makes FileIO's system calls (lseek, read
at the descriptor's position, fstat in readall) on the traced handle's descriptor and records each
one as the handle records its own (seek, read and stat events): the summary, Darshan and strace
then count the same calls. A handle without a descriptor (S3) gets the BufferedReader around the
handle itself: the same buffering, with the backend's ranged reads.
"""

from __future__ import annotations

import io
import os
from time import perf_counter
from typing import Any

from dlio_ckpt.storage.events import OP_CODE, OP_READ, pack_event

_OP_SEEK, _OP_STAT = OP_CODE["seek"], OP_CODE["stat"]
DEFAULT_BLOCK = io.DEFAULT_BUFFER_SIZE  # what io.open uses where st_blksize is unknown


class FileStream(io.RawIOBase):
    """FileIO's system calls on a traced POSIX handle's descriptor, each recorded as one event."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._fd = handle.fileno()
        self._trace = getattr(handle, "_trace", None)
        # Kept here, as asking the kernel would be a call FileIO does not make. The handle reads
        # with pread, which never moves the descriptor, so it is where open() left it: 0.
        self._position = 0

    def _record(self, op: int, offset: int, length: int, start: float, end: float) -> None:
        if self._trace is not None:
            phase, file, extend, _, _ = self._trace
            extend(pack_event(op, phase, file, offset, length, start, end))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        start = perf_counter()
        self._position = position = os.lseek(self._fd, offset, whence)
        self._record(_OP_SEEK, position, 0, start, perf_counter())
        return position

    def tell(self) -> int:
        return self.seek(0, io.SEEK_CUR)

    def readinto(self, buffer) -> int:
        start = perf_counter()
        count = os.readv(self._fd, [buffer])
        end = perf_counter()
        self._record(OP_READ, self._position, count, start, end)
        self._position += count
        return count

    def block_size(self) -> int:
        """st_blksize, from the fstat FileIO makes when it opens a file (recorded as a stat)."""
        start = perf_counter()
        block = os.fstat(self._fd).st_blksize
        self._record(_OP_STAT, -1, 0, start, perf_counter())
        return block or DEFAULT_BLOCK

    def readall(self) -> bytes:
        """FileIO.readall: the position, fstat for the size, one read of what is left plus one
        byte, then reads until one returns nothing (the trailing empty read is a call too)."""
        position = self.tell()
        start = perf_counter()
        size = os.fstat(self._fd).st_size
        self._record(_OP_STAT, -1, 0, start, perf_counter())
        chunks, want = [], max(size - position, 0) + 1
        while True:
            buffer = bytearray(want)
            count = self.readinto(buffer)
            if count == 0:
                break
            chunks.append(bytes(memoryview(buffer)[:count]))
            want = max(want - count, 1)
        return b"".join(chunks)

    def close(self) -> None:
        """The handle is closed (and its close recorded) by whoever opened it; the stream only
        lets go of it, as a BufferedReader over a FileIO with closefd=False would."""
        super().close()


def open_buffered(handle: Any) -> io.BufferedReader:
    """`handle` read as `open(path, "rb")` reads a file (module doc). The buffer size is the file
    system's st_blksize, as io.open picks it."""
    try:
        fd = handle.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        fd = None
    if fd is None or fd < 0:
        return io.BufferedReader(handle, DEFAULT_BLOCK)
    raw = FileStream(handle)
    block = raw.block_size()  # FileIO's fstat when it opens; the BufferedReader then asks the position (an lseek)
    return io.BufferedReader(raw, block if block > 1 else DEFAULT_BLOCK)
