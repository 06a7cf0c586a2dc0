"""POSIX storage: buffered or O_DIRECT file access with explicit offsets, and fsync.

Implements the StorageBackend protocol of storage/base.py with every capability. Files are
file-like objects (read, readinto, write, seek, tell, truncate, flush) so that numpy, h5py and
the TFRecord code can work through them, plus `read_at` for explicit-offset reads. Every
operation goes through os.pread / os.pwrite on a descriptor, so the bytes counted are the bytes
the kernel returned, and the tracer (traced.TracedPosixFile) sees one call per system call.
"""

from __future__ import annotations

import ctypes
import io
import mmap
import os
import secrets
import shutil
from dataclasses import dataclass
from typing import Any

from dlio_ckpt.errors import ConfigError
from dlio_ckpt.local_fs import file_system, free_bytes_at, nearest_existing, system_folder  # noqa: F401 (also this module's API)
from dlio_ckpt.storage.base import Capabilities, PositionalReads, write_staged

DIRECT_ALIGNMENT = 4096


def _aligned_buffer(size: int) -> mmap.mmap:
    """Anonymous memory is page aligned, which is what O_DIRECT asks of buffers."""
    return mmap.mmap(-1, max(size, DIRECT_ALIGNMENT))


def _address(view: memoryview) -> int:
    """Where a writable buffer starts in memory (O_DIRECT needs it block aligned)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def staging_name(path: str) -> str:
    """A temporary name beside `path`, unique over processes and threads (pid + random), so two
    writers of one file never share a temporary file and a crash leaves a recognisable `.tmp-`."""
    return f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


def fsync_folder(path: str) -> None:
    """Make a rename durable: fsync the folder that holds the new name."""
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PosixFile(PositionalReads, io.RawIOBase):
    """A file opened for reading, or for reading and writing, at explicit offsets.

    A staged write handle (`publish_as` set) writes under a temporary name and renames it to
    `publish_as` when closed (then fsyncs the folder if the data was fsynced), so nothing is at
    the final name until close() returns; abort() removes the temporary file instead.
    """

    def __init__(self, path: str, writable: bool, direct: bool, publish_as: str | None = None) -> None:
        super().__init__()
        self.path = publish_as or path
        self._open_path = path
        self._publish_as = publish_as
        self._writable = writable
        self._synced = False
        self.direct = direct and hasattr(os, "O_DIRECT")
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC if writable else os.O_RDONLY
        self._fd = os.open(path, flags, 0o644)
        # O_DIRECT gets its own descriptor so unaligned pieces (headers, tails) can use the other.
        try:
            self._direct_fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_DIRECT) if self.direct else -1
        except OSError:
            os.close(self._fd)
            raise
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
        if self._fd < 0:
            raise closed_file()
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
        if self._fd < 0:
            raise closed_file()
        return os.fstat(self._fd).st_size

    def write(self, data) -> int:
        count = self.write_at(data, self._position)
        self._position += count
        return count

    def truncate(self, size: int | None = None) -> int:
        size = self._position if size is None else size
        if self._fd < 0:
            raise closed_file()
        os.ftruncate(self._fd, size)
        return size

    def flush(self) -> None:
        """Writes go straight to the kernel; durability is `fsync`."""

    def _release(self) -> None:
        """Close the descriptors and mark the handle closed (publishing is the caller's business).
        The descriptor numbers become -1 at once: the kernel hands a closed number to the next
        file opened, so a read through a closed handle would read that file; with -1 it raises
        ValueError, as a closed Python file does (closed_file)."""
        try:
            if self._direct_fd >= 0:
                os.close(self._direct_fd)
                self._direct_fd = -1
            fd, self._fd = self._fd, -1
            os.close(fd)
            if self._scratch is not None:
                self._scratch.close()
                self._scratch = None
        finally:
            super().close()

    def close(self) -> None:
        """Release the descriptors; a staged handle then publishes its file under the final name."""
        if self.closed:
            return
        self._release()
        if self._publish_as is not None:
            try:
                os.replace(self._open_path, self._publish_as)
            except BaseException:
                _unlink_quietly(self._open_path)
                raise
            if self._synced:
                fsync_folder(os.path.dirname(self._publish_as))

    def __del__(self) -> None:
        # A staged handle dropped unclosed (an exception path) must never publish a partial file.
        if not getattr(self, "closed", True) and getattr(self, "_publish_as", None) is not None:
            self.abort()
        else:
            super().__del__()

    def abort(self) -> None:
        """Discard: close, and remove what a write handle wrote (its temporary file when staged)."""
        if self.closed:
            return
        self._release()
        if self._writable:
            _unlink_quietly(self._open_path)

    def _aligned(self, size: int) -> mmap.mmap:
        if self._scratch is None or len(self._scratch) < size:
            if self._scratch is not None:
                self._scratch.close()
            self._scratch = _aligned_buffer(size)
        return self._scratch

    # explicit offsets ------------------------------------------------------------------
    def read_at(self, offset: int, size: int) -> bytes:
        if self._fd < 0:
            raise closed_file()
        if size <= 0:
            self.last_moved = 0
            return b""
        if self.direct:
            buffer = bytearray(size)
            # PosixFile's own, not an override's: a traced handle records this read_at as one read
            count = PosixFile.read_at_into(self, buffer, offset)
            return bytes(buffer[:count])
        data = os.pread(self._fd, size, offset)
        self.last_moved = len(data)
        return data

    def read_at_into(self, buffer, offset: int) -> int:
        if not self.direct:
            # One system call and nothing around it: readers make one such call per transfer
            # (a 4 KiB read from the page cache costs ~1 us, so Python work here shows); a
            # closed handle's -1 fails in preadv (EBADF), told apart only then (no cost before).
            try:
                self.last_moved = moved = os.preadv(self._fd, [buffer], offset)
            except OSError:
                if self._fd < 0:
                    raise closed_file() from None
                raise
            return moved
        if self._direct_fd < 0:
            raise closed_file()
        view = memoryview(buffer).cast("B")
        size = len(view)
        if size == 0:
            self.last_moved = 0
            return 0
        if (offset | size) % DIRECT_ALIGNMENT == 0 and _address(view) % DIRECT_ALIGNMENT == 0:
            # Whole blocks into a page-aligned buffer (the readers' scratch is one): straight in,
            # no bounce buffer and no copy, as fio reads.
            self.last_moved = os.preadv(self._direct_fd, [view], offset)
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
        if self._fd < 0:
            raise closed_file()
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            count = self._write_once(view[done:], offset + done)
            if count <= 0:
                raise OSError(f"write to {self.path} made no progress at offset {offset + done}")
            done += count
        return done

    def writev(self, buffers) -> int:
        """Write `buffers` one after another at the current position in one writev(2), at the
        descriptor's own offset, as a C++ stream does (checkpoint/filebuf.py); more calls only
        when the kernel moves less."""
        if self._fd < 0:
            raise closed_file()
        views = [memoryview(b).cast("B") for b in buffers]
        if self.direct:  # O_DIRECT needs aligned pieces: the usual aligned write path
            done = PosixFile.write_at(self, b"".join(views), self._position)
            self._position += done
            return done
        self._seek_descriptor()
        total, done = sum(len(v) for v in views), 0
        while done < total:
            count = os.writev(self._fd, _remaining(views, done))
            if count <= 0:
                raise OSError(f"write to {self.path} made no progress at offset {self._position + done}")
            done += count
        self._position += done
        self._fd_offset = self._position
        return done

    def write_stream(self, data) -> int:
        """write(2) of all of `data` at the descriptor's own offset: what a buffered stream (a C++
        ofstream, Python's BufferedWriter) issues, where `write` is a positional pwrite."""
        if self._fd < 0:
            raise closed_file()
        view = memoryview(data).cast("B")
        if self.direct:
            done = PosixFile.write_at(self, view, self._position)
            self._position += done
            return done
        self._seek_descriptor()
        done = 0
        while done < len(view):
            count = os.write(self._fd, view[done:])
            if count <= 0:
                raise OSError(f"write to {self.path} made no progress at offset {self._position + done}")
            done += count
        self._position += done
        self._fd_offset = self._position
        return done

    def _seek_descriptor(self) -> None:
        """The descriptor's offset to the handle's position, where a positional call or a seek
        left them apart (never for a stream that only appends: no lseek is issued then)."""
        if getattr(self, "_fd_offset", 0) != self._position:  # set on first use only: reads never pay for it
            os.lseek(self._fd, self._position, os.SEEK_SET)
            self._fd_offset = self._position

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
        if self._fd < 0:
            raise closed_file()
        os.fsync(self._fd)
        self._synced = True


def closed_file() -> ValueError:
    """What a closed Python file raises on I/O (io's own message)."""
    return ValueError("I/O operation on closed file.")


def _remaining(views: list[memoryview], done: int) -> list[memoryview]:
    """What is left of `views` after the first `done` bytes (a partial pwritev)."""
    left = []
    for view in views:
        if done >= len(view):
            done -= len(view)
            continue
        left.append(view[done:])
        done = 0
    return left


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


POSIX_CAPABILITIES = Capabilities(atomic_rename=True, fsync=True, seekable_write=True, direct_io=hasattr(os, "O_DIRECT"),
                                  ranged_read=True, listing=True, local_paths=True, stream_writes=True,
                                  fork_safe=True)


@dataclass(frozen=True)
class PosixStorage:
    """Local or parallel file system through the POSIX API."""

    direct_io: bool = False
    root: str = ""  # storage.root; check() looks at it, paths are used as they are

    name = "posix"
    capabilities = POSIX_CAPABILITIES
    options = None  # no storage.posix.* section: direct_io, fsync, drop_caches are general keys (docs/architecture.md)

    @classmethod
    def from_config(cls, config: Any, root: str) -> "PosixStorage":
        """The backend for StorageConfig `config` (POSIX has no options of its own)."""
        return cls(direct_io=config.direct_io, root=root)

    @property
    def traced_handle(self) -> type[PosixFile]:
        """TracedStorage's hook (storage/traced.py): the PosixFile subclass that records its own
        events, which the openers below build when given it, so a traced file is one object:
        TracedPosixFileC where the C extension is built, else TracedPosixFile."""
        from dlio_ckpt.storage.traced import traced_posix_handle  # the tracer imports this module

        return traced_posix_handle()

    def open_read(self, path: str, handle_class: type[PosixFile] = PosixFile) -> PosixFile:
        return handle_class(path, writable=False, direct=self.direct_io)

    def open_write(self, path: str, handle_class: type[PosixFile] = PosixFile) -> PosixFile:
        return handle_class(path, writable=True, direct=self.direct_io)

    def open_staged(self, path: str, handle_class: type[PosixFile] = PosixFile) -> PosixFile:
        return handle_class(staging_name(path), writable=True, direct=self.direct_io, publish_as=path)

    def write_atomic(self, path: str, data: bytes) -> None:
        write_staged(self, path, data)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create `path` holding `data` unless it exists (O_EXCL): False when another got there
        first. An advisory claim, not a commit: not fsynced."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return True

    def read_whole(self, path: str) -> bytes:
        with open(path, "rb") as handle:
            return handle.read()

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def file_size(self, path: str) -> int:
        return os.stat(path).st_size

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def remove(self, path: str) -> None:
        os.unlink(path)

    def remove_tree(self, path: str) -> list[str]:
        removed = sorted(os.path.join(folder, name) for folder, _, names in os.walk(path) for name in names)
        shutil.rmtree(path, ignore_errors=False)
        return removed

    def rename(self, source: str, target: str) -> None:
        """Move `source` to `target` (replacing it): a framework's own rename (DCP's `.metadata`)."""
        os.replace(source, target)

    def uri(self, path: str) -> str:
        """A file is named by its path."""
        return path

    def fsync_dir(self, path: str) -> None:
        """Make renames in folder `path` durable (POSIX only: for files a framework wrote by path)."""
        fsync_folder(path)

    def free_bytes(self, path: str) -> int | None:
        """Free bytes of the file system holding `path` (its nearest existing folder)."""
        return free_bytes_at(path)

    def check(self) -> None:
        """storage.root must be a folder we can create or write in: checked without writing."""
        if not self.root:
            return
        root = os.path.abspath(self.root)
        kernel = system_folder(os.path.realpath(root))
        if kernel is not None:
            raise ConfigError(f"storage.root: {root} is under {kernel}, a kernel file system, not storage; choose a folder "
                              "on a disk, a parallel file system or /dev/shm")
        probe = nearest_existing(root)
        if not os.path.isdir(probe):
            raise ConfigError(f"storage.root: {probe} is not a folder, so {root} cannot be used; choose a folder path")
        if not os.access(probe, os.W_OK | os.X_OK):
            raise ConfigError(f"storage.root: no permission to write in {probe}; choose a writable folder for storage.root")
