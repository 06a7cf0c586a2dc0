"""Writing and verifying one checkpoint file through the traced storage, in bounded memory.

Contents come chunk by chunk (from the ByteSource, or from an async staging buffer), pass through
the format and a checksumming wrapper, and go to the storage; nothing holds a whole file. A file
counts as written only after its fsync (when checkpoint.fsync is on).
"""

from __future__ import annotations

import io
import os
import resource
import time
import zlib
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

from dlio_ckpt.plan.model import TensorSpec

_STEP_MIX = 0x9E3779B1


def new_hasher(name: str):
    """A streaming checksum; xxh3_128 by default (fast, 16 bytes), blake3 when asked."""
    if name == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    if name == "blake3":
        import blake3

        return blake3.blake3()
    return None


def tensor_key(owner: int, name: str, step: int) -> int:
    """A ByteSource key per (rank, tensor, step): contents differ between ranks, tensors and
    checkpoints, so the storage can neither deduplicate nor skip unchanged blocks."""
    return (zlib.crc32(name.encode()) << 20) ^ (owner * 1_000_003) ^ (step * _STEP_MIX)


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(frozen=True)
class FileEntry:
    """One data file of a checkpoint, as the manifest records it."""

    path: str  # relative to the checkpoint folder
    size: int
    checksum: str
    owner: int  # rank whose state it holds
    writer: int  # rank that wrote it (and reads it back on restore)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Hashing(io.RawIOBase):
    """Forwards to the traced file and checksums bytes as long as the writer only appends."""

    def __init__(self, handle: Any, hasher: Any) -> None:
        super().__init__()
        self._h = handle
        self._hasher = hasher
        self.expected = 0
        self.sequential = True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data) -> int:
        position = self._h.tell()
        count = self._h.write(data)
        if self.sequential and position == self.expected and count == len(memoryview(data).cast("B")):
            if self._hasher is not None:
                self._hasher.update(data)
            self.expected += count
        else:
            self.sequential = False
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._h.seek(offset, whence)

    def tell(self) -> int:
        return self._h.tell()

    def read(self, size: int = -1) -> bytes:
        return self._h.read(size)

    def readinto(self, buffer) -> int:
        return self._h.readinto(buffer)

    def truncate(self, size: int | None = None) -> int:
        self.sequential = False
        return self._h.truncate(size)

    def flush(self) -> None:
        self._h.flush()

    def fileno(self) -> int:
        return self._h.fileno()


def read_back(handle: Any, size: int, hasher: Any, buffer: memoryview) -> int:
    """Read `size` bytes of a file through one reused buffer into `hasher`; return the bytes read."""
    offset = 0
    while offset < size:
        count = handle.read_at_into(buffer[: min(len(buffer), size - offset)], offset)
        if count <= 0:
            break
        if hasher is not None:
            hasher.update(buffer[:count])
        offset += count
    return offset


def write_file(storage: Any, abspath: str, tensors: tuple[TensorSpec, ...], fmt: Any,
               chunks: Callable[[TensorSpec], Iterator[memoryview]], fsync: bool, checksum: str,
               chunk_bytes: int) -> tuple[int, str]:
    """Write one file, fsync it, and return (size on disk, checksum)."""
    handle = storage.open_write(abspath)
    try:
        wrapper = _Hashing(handle, new_hasher(checksum))
        fmt.write(wrapper, tensors, chunks)
        if fsync:
            handle.fsync()
        size = handle.size()
        if checksum == "none":
            digest = ""
        elif wrapper.sequential and wrapper.expected == size:
            digest = wrapper._hasher.hexdigest()
        else:
            hasher = new_hasher(checksum)
            read_back(handle, size, hasher, memoryview(bytearray(min(chunk_bytes, max(size, 1)))))
            digest = hasher.hexdigest()
    finally:
        handle.close()
    return size, digest


def verify_file(storage: Any, abspath: str, size: int, checksum: str, algorithm: str,
                buffer: memoryview) -> tuple[int, str | None]:
    """Read a whole file; return (bytes read, problem or None). Every byte is read, as a restore would."""
    if not os.path.exists(abspath):
        return 0, "missing"
    handle = storage.open_read(abspath)
    try:
        actual = handle.size()
        hasher = new_hasher(algorithm)
        read = read_back(handle, actual, hasher, buffer)
    finally:
        handle.close()
    if actual != size:
        return read, f"size {actual} bytes, manifest says {size} (truncated or torn)"
    if hasher is not None and checksum and hasher.hexdigest() != checksum:
        return read, f"{algorithm} checksum mismatch (corrupted contents)"
    return read, None


def now() -> float:
    return time.perf_counter()
