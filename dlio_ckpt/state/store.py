"""ScratchStore: untraced scratch space for an evolving state, in memory or in an unlinked file.

A rank's state can be larger than its memory (a 4 GiB shard on a rank with 1 GiB to spare), and
it is the emulator's own bookkeeping, not the training job's I/O: it must neither fill memory nor
show up in the trace. Small stores stay in a bytearray; larger ones live in a file that is
unlinked as soon as it is created (a crash leaves nothing behind), read and written with
pread/pwrite through one reused buffer, so the resident memory stays at one buffer whatever the
size. The page cache may hold the file; that is the kernel's memory, not this process's.
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterator

MEMORY_LIMIT_BYTES = 64 << 20  # stores up to this size live in memory


class ScratchStore:
    """A MutableFileView (state/base.py) of `size` bytes, initially zero."""

    def __init__(self, size: int, folder: str = "", memory_limit: int = MEMORY_LIMIT_BYTES) -> None:
        if size < 0:
            raise ValueError(f"scratch store size cannot be negative ({size})")
        self._size = size
        self._fd = -1
        self._memory: memoryview | None = None
        self._buffer = bytearray()
        if size <= memory_limit:
            self._memory = memoryview(bytearray(size))
            return
        fd, path = tempfile.mkstemp(prefix="dlio_ckpt_state_", dir=folder or tempfile.gettempdir())
        try:
            os.unlink(path)
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    @property
    def size(self) -> int:
        return self._size

    @property
    def in_memory(self) -> bool:
        return self._memory is not None

    @property
    def buffer_bytes(self) -> int:
        """The read buffer's size: the memory a file-backed store holds."""
        return len(self._buffer)

    def read_at(self, offset: int, nbytes: int) -> memoryview:
        """`nbytes` bytes at `offset` (fewer at the end); valid until the next read_at."""
        nbytes = max(0, min(nbytes, self._size - offset))
        if self._memory is not None:
            return self._memory[offset : offset + nbytes]
        if len(self._buffer) < nbytes:
            self._buffer = bytearray(nbytes)
        view = memoryview(self._buffer)[:nbytes]
        done = 0
        while done < nbytes:
            count = os.preadv(self._fd, [view[done:]], offset + done)
            if count <= 0:
                raise EOFError(f"scratch store ended at {offset + done} of {self._size} bytes")
            done += count
        return view

    def stream(self, chunk_bytes: int) -> Iterator[memoryview]:
        for offset in range(0, self._size, chunk_bytes):
            yield self.read_at(offset, chunk_bytes)

    def write_at(self, offset: int, data) -> None:
        data = memoryview(data).cast("B")
        if offset < 0 or offset + len(data) > self._size:
            raise ValueError(f"write of {len(data)} bytes at {offset} outside the store ({self._size} bytes)")
        if self._memory is not None:
            self._memory[offset : offset + len(data)] = data
            return
        done = 0
        while done < len(data):
            done += os.pwrite(self._fd, data[done:], offset + done)

    def release_buffer(self) -> None:
        """Drop the read buffer (a rank with many files would keep one per file); views already
        handed out keep their bytes alive until they are dropped."""
        self._buffer = bytearray()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._memory = None
        self._buffer = bytearray()

    def __enter__(self) -> "ScratchStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
