"""POSIX storage: buffered or O_DIRECT file access with explicit offsets, and fsync.

Files are file-like objects (read, readinto, write, seek, tell, truncate, flush) so that numpy,
h5py and the TFRecord code can work through them, plus `read_at` for explicit-offset reads.
Every operation goes through os.pread / os.pwrite on a descriptor, so the bytes counted are
the bytes the kernel returned, and a tracing wrapper sees one call per system call.
"""

from __future__ import annotations

import io
import mmap
import os
import shutil
from dataclasses import dataclass

DIRECT_ALIGNMENT = 4096


def _aligned_buffer(size: int) -> mmap.mmap:
    """Anonymous memory is page aligned, which is what O_DIRECT asks of buffers."""
    return mmap.mmap(-1, max(size, DIRECT_ALIGNMENT))


class PosixFile(io.RawIOBase):
    """A file opened for reading, or for reading and writing, at explicit offsets."""

    def __init__(self, path: str, writable: bool, direct: bool, block_size: int) -> None:
        super().__init__()
        self.path = path
        self._writable = writable
        self.direct = direct and hasattr(os, "O_DIRECT")
        self.block_size = block_size
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC if writable else os.O_RDONLY
        self._fd = os.open(path, flags, 0o644)
        # O_DIRECT gets its own descriptor so unaligned pieces (headers, tails) can use the other.
        self._direct_fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_DIRECT) if self.direct else -1
        self._position = 0
        self._scratch: mmap.mmap | None = None  # reused aligned buffer for O_DIRECT transfers
        # Bytes the last read system call moved: with O_DIRECT the kernel reads whole blocks, so
        # this can exceed what the caller asked for, and it is what the tracer counts.
        self.last_moved = 0

    # io.RawIOBase protocol -------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return self._writable

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._position = offset
        elif whence == io.SEEK_CUR:
            self._position += offset
        else:
            self._position = self.size() + offset
        return self._position

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def readinto(self, buffer) -> int:
        count = self.read_at_into(buffer, self._position)
        self._position += count
        return count

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(self.size() - self._position, 0)
        data = self.read_at(self._position, size)
        self._position += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def write(self, data) -> int:
        count = self.write_at(data, self._position)
        self._position += count
        return count

    def truncate(self, size: int | None = None) -> int:
        size = self._position if size is None else size
        os.ftruncate(self._fd, size)
        return size

    def flush(self) -> None:
        """Writes go straight to the kernel; durability is `fsync`."""

    def close(self) -> None:
        if not self.closed:
            if self._direct_fd >= 0:
                os.close(self._direct_fd)
            os.close(self._fd)
            if self._scratch is not None:
                self._scratch.close()
                self._scratch = None
        super().close()

    def _aligned(self, size: int) -> mmap.mmap:
        if self._scratch is None or len(self._scratch) < size:
            if self._scratch is not None:
                self._scratch.close()
            self._scratch = _aligned_buffer(size)
        return self._scratch

    # explicit offsets ------------------------------------------------------------------
    def read_at(self, offset: int, size: int) -> bytes:
        if size <= 0:
            self.last_moved = 0
            return b""
        if self.direct:
            buffer = bytearray(size)
            count = self.read_at_into(buffer, offset)
            return bytes(buffer[:count])
        data = os.pread(self._fd, size, offset)
        self.last_moved = len(data)
        return data

    def read_at_into(self, buffer, offset: int) -> int:
        view = memoryview(buffer).cast("B")
        size = len(view)
        if size == 0:
            self.last_moved = 0
            return 0
        if not self.direct:
            self.last_moved = os.preadv(self._fd, [view], offset)
            return self.last_moved
        # O_DIRECT: read the aligned superset into an aligned buffer, copy out what was asked.
        start = offset - offset % DIRECT_ALIGNMENT
        stop = -(-(offset + size) // DIRECT_ALIGNMENT) * DIRECT_ALIGNMENT
        aligned = self._aligned(stop - start)
        with memoryview(aligned) as window:
            got = os.preadv(self._direct_fd, [window[: stop - start]], start)
            count = max(min(size, got - (offset - start)), 0)
            view[:count] = window[offset - start : offset - start + count]
        self.last_moved = got
        return count

    def write_at(self, data, offset: int) -> int:
        """Write all of `data`: one pwrite may move less (2 GiB cap, signals, network file systems)."""
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            count = self._write_once(view[done:], offset + done)
            if count <= 0:
                raise OSError(f"write to {self.path} made no progress at offset {offset + done}")
            done += count
        return done

    def _write_once(self, view: memoryview, offset: int) -> int:
        if not self.direct or offset % DIRECT_ALIGNMENT:
            return os.pwrite(self._fd, view, offset)
        whole = len(view) - len(view) % DIRECT_ALIGNMENT
        written = 0
        if whole:
            aligned = self._aligned(whole)
            with memoryview(aligned) as window:
                window[:whole] = view[:whole]
                written = os.pwrite(self._direct_fd, window[:whole], offset)
        if written < len(view):
            written += os.pwrite(self._fd, view[written:], offset + written)
        return written

    def fsync(self) -> None:
        os.fsync(self._fd)


@dataclass(frozen=True)
class PosixStorage:
    """Local or parallel file system through the POSIX API."""

    direct_io: bool = False
    block_size: int = 1 << 20

    name = "posix"

    def open_read(self, path: str) -> PosixFile:
        return PosixFile(path, writable=False, direct=self.direct_io, block_size=self.block_size)

    def open_write(self, path: str) -> PosixFile:
        return PosixFile(path, writable=True, direct=self.direct_io, block_size=self.block_size)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def file_size(self, path: str) -> int:
        return os.stat(path).st_size

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def remove(self, path: str) -> None:
        os.unlink(path)

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=False)

    def fsync_dir(self, path: str) -> None:
        """Make a rename durable: fsync the directory that holds the new name."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
