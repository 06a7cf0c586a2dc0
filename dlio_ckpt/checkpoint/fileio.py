"""Writing and verifying one checkpoint file through the traced storage, in bounded memory.

Contents come chunk by chunk (from the ByteSource, or from an async staging buffer), pass through
the format and a checksumming wrapper, and go to the storage; nothing holds a whole file. A file
counts as written only after its fsync (when checkpoint.fsync is on).
"""

from __future__ import annotations

import io
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from dlio_ckpt.content import tensor_key  # noqa: F401 (the checkpoint engine imports it from here)
from dlio_ckpt.plan.model import TensorSpec

def new_hasher(name: str):
    """A streaming checksum; xxh3_128 by default (fast, 16 bytes), blake3 when asked."""
    if name == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    if name == "blake3":
        import blake3

        return blake3.blake3()
    return None


@dataclass(frozen=True)
class FileWrite:
    """What writing one file did: its size on disk and checksum (for the manifest), the bytes
    its write calls moved as the tracer counted them, and its two timed parts, kept apart
    because the read-back for a checksum is not part of the write (MLPerf times the write).

    `write_calls_s` and `fsync_s` are the parts of `write_s` spent inside the write and fsync
    calls; the rest is the format building its container (pickling, headers, CRCs, copies): the
    serialization share. None where the framework makes its own calls (TensorFlow)."""

    size: int
    checksum: str
    bytes_written: int
    write_s: float  # from just before its open to just after its fsync (its last write when fsync is off;
    #                 its close, which publishes it, on a backend without fsync)
    verify_s: float = 0.0  # reading it back for the checksum (formats that seek back)
    write_calls_s: float | None = 0.0
    fsync_s: float = 0.0
    prepare_s: float = 0.0  # assembling the tensors in memory before a framework save (torch), and
    #                         freeing them after it: not in write_s
    records: tuple | None = None  # (tensor, offset, length) per record where the format reports them (DCP)
    prepare_cpu_s: float = 0.0  # the thread's CPU seconds in prepare (to leave out of the save's CPU)


@dataclass(frozen=True)
class FileEntry:
    """One data file of a checkpoint: what the manifest records (`as_dict`), and what writing it
    cost this rank (`bytes_written`, `write_s`, `verify_s`; see FileWrite), which stays out of it."""

    path: str  # relative to the checkpoint folder
    size: int
    checksum: str
    owner: int  # rank whose state it holds
    writer: int  # rank that wrote it (and reads it back on restore)
    bytes_written: int = 0
    write_s: float = 0.0
    verify_s: float = 0.0
    encoding: dict | None = None  # an encoded file's container (checkpoint/encoded.py), for the manifest
    logical_bytes: int = 0  # the state the file represents
    encode_s: float = 0.0
    stats: dict | None = None  # the codec's figures for this file (not in the manifest)
    write_calls_s: float | None = 0.0  # the part of write_s inside write calls (None: the framework's own calls)
    fsync_s: float = 0.0  # the part of write_s inside fsync
    prepare_s: float = 0.0  # the tensors assembled in memory before the save (see FileWrite)
    records: tuple | None = None  # (tensor, offset, length): for the coordinator's index (DCP), not the manifest
    prepare_cpu_s: float = 0.0  # the thread's CPU seconds in prepare (see FileWrite)

    def as_dict(self) -> dict[str, Any]:
        entry = {"path": self.path, "size": self.size, "checksum": self.checksum, "owner": self.owner, "writer": self.writer}
        if self.encoding is not None:
            entry["encoding"] = self.encoding
        if self.records is not None:  # travels to the coordinator; _write_manifest leaves it out
            entry["records"] = [list(r) for r in self.records]
        return entry


class _Hashing(io.RawIOBase):
    """Forwards to the traced file, times the write calls (the rest of a file's write time is the
    format's own work) and checksums bytes as long as the writer only appends (no hasher: none)."""

    def __init__(self, handle: Any, hasher: Any) -> None:
        super().__init__()
        self._h = handle
        self._hasher = hasher
        self.path = getattr(handle, "path", "")  # the file's name (torch.save names its zip's folder after it)
        self.expected = 0
        self.sequential = True
        self.moved = 0  # what the traced write calls returned: the bytes the tracer counted
        self.calls_s = 0.0  # inside the write calls
        if hasattr(handle, "writev"):
            self.writev = self._writev  # only where the handle has it (filebuf.py falls back without)
        if hasattr(handle, "write_stream"):
            self.write_stream = self._write_stream  # write(2) at the descriptor's offset (buffered streams)

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._h.seekable()  # an object upload cannot seek back; zipfile then streams

    def write(self, data) -> int:
        position = self._h.tell()
        start = time.perf_counter()
        count = self._h.write(data)
        self.calls_s += time.perf_counter() - start
        self._passed(position, count, (data,))
        return count

    def _write_stream(self, data) -> int:
        position = self._h.tell()
        start = time.perf_counter()
        count = self._h.write_stream(data)
        self.calls_s += time.perf_counter() - start
        self._passed(position, count, (data,))
        return count

    def _passed(self, position: int, count: int, buffers) -> None:
        """Count what a write call moved, and hash it while the writer only appends."""
        self.moved += count
        if self.sequential and position == self.expected and count == sum(len(memoryview(b).cast("B")) for b in buffers):
            if self._hasher is not None:
                for buffer in buffers:
                    self._hasher.update(buffer)
            self.expected += count
        else:
            self.sequential = False

    def _writev(self, buffers) -> int:
        position = self._h.tell()
        start = time.perf_counter()
        count = self._h.writev(buffers)
        self.calls_s += time.perf_counter() - start
        self._passed(position, count, buffers)
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


def read_back(handle: Any, size: int, hasher: Any, buffer: memoryview, sink: Any = None) -> int:
    """Read `size` bytes of a file through one reused buffer into `hasher` (and `sink.write_at`,
    when given: a restore keeps the bytes it verified); return the bytes read."""
    offset = 0
    while offset < size:
        count = handle.read_at_into(buffer[: min(len(buffer), size - offset)], offset)
        if count <= 0:
            break
        if hasher is not None:
            hasher.update(buffer[:count])
        if sink is not None:
            sink.write_at(offset, buffer[:count])
        offset += count
    return offset


def _checksum_by_reading(storage: Any, abspath: str, size: int, checksum: str, chunk_bytes: int) -> tuple[str, float]:
    """The checksum of the file at `abspath` read back through a read handle of the storage (a
    write handle may not be readable: an object upload), and the seconds that took."""
    hasher = new_hasher(checksum)
    if hasher is None:
        return "", 0.0
    clock = storage.recorder.clock
    start = clock.now()
    handle = storage.open_read(abspath)
    try:
        read_back(handle, size, hasher, memoryview(bytearray(min(chunk_bytes, max(size, 1)))))
    finally:
        handle.close()
    return hasher.hexdigest(), clock.now() - start


def write_file(storage: Any, abspath: str, tensors: tuple[TensorSpec, ...], fmt: Any,
               chunks: Callable[[TensorSpec], Iterator[memoryview]], fsync: bool, checksum: str,
               chunk_bytes: int) -> FileWrite:
    """Write one file, fsync it (when `fsync`), and checksum it (as it passes, or by reading it
    back; `checksum` "none": not at all). A format with `prepare` (torch) gets the file's tensors
    into memory before the file is opened: that is the program's state, not its save, and so is
    freeing them after the last write (~0.2 ms for 9.8 MB in 112 tensors): both are `prepare_s`."""
    prepare = getattr(fmt, "prepare", None)
    clock = storage.recorder.clock
    start, cpu = clock.now(), time.thread_time()
    prepared = prepare(tensors, chunks) if prepare is not None else None
    prepare_s, prepare_cpu_s = clock.now() - start, time.thread_time() - cpu
    start = clock.now()
    handle = storage.open_write(abspath)
    fsync_s = 0.0
    try:
        wrapper = _Hashing(handle, new_hasher(checksum))
        if prepare is not None:
            records = fmt.write_prepared(wrapper, prepared)
        else:
            records = fmt.write(wrapper, tensors, chunks)
        if fsync:
            synced = clock.now()
            handle.fsync()
            fsync_s = clock.now() - synced
        write_s = clock.now() - start
        size = handle.size()
    except BaseException:
        handle.abort()
        raise
    released, cpu = clock.now(), time.thread_time()
    del prepared  # the emulator's copies (a program keeps its tensors): counted with their assembly
    prepare_s, prepare_cpu_s = prepare_s + clock.now() - released, prepare_cpu_s + time.thread_time() - cpu
    handle.close()  # an object store publishes the file here; the manifest still commits the checkpoint
    if not storage.capabilities.fsync:  # no fsync: the file is durable once close() has published it
        write_s = clock.now() - start
    verify_s = 0.0
    if checksum == "none":
        digest = ""
    elif wrapper.sequential and wrapper.expected == size:
        digest = wrapper._hasher.hexdigest()
    else:
        digest, verify_s = _checksum_by_reading(storage, abspath, size, checksum, chunk_bytes)
    return FileWrite(size, digest, wrapper.moved, write_s, verify_s, wrapper.calls_s, fsync_s, prepare_s, records,
                     prepare_cpu_s)


def settle_file(storage: Any, abspath: str, fsync: bool, checksum: str, chunk_bytes: int) -> FileWrite:
    """fsync a file some other writer produced and read it back for its checksum, through the
    traced storage. `write_s` covers the open and fsync; `bytes_written` is 0 (it writes nothing).
    Only for local files (capability local_paths): the loader refuses framework formats elsewhere."""
    clock = storage.recorder.clock
    start = clock.now()
    handle = storage.open_read(abspath)
    try:
        if fsync:
            handle.fsync()
        write_s = clock.now() - start
        size = handle.size()
    finally:
        handle.close()
    digest, verify_s = _checksum_by_reading(storage, abspath, size, checksum, chunk_bytes)
    return FileWrite(size, digest, 0, write_s, verify_s)


def write_framework_file(storage: Any, abspath: str, owner: int, tensors: tuple[TensorSpec, ...], fmt: Any,
                         chunks: Callable[[TensorSpec], Iterator[memoryview]], fsync: bool, checksum: str,
                         chunk_bytes: int) -> FileWrite:
    """Write one file with a format whose framework opens its own files (`fmt.writes_paths`).

    The framework's system calls bypass the traced storage, so the save call is timed here and
    the write calls it made to each file it produced are recorded (`_record_framework_writes`):
    the data file's over the whole call, its metadata files' as instants at the call's end (TF
    writes the index last, inside the same call; giving it the span too would count the call's
    time twice). The bytes recorded are each file's size on disk. The data file is
    then fsynced and read back for its checksum through the traced storage. Returns the data
    file's size and checksum, the bytes recorded for all its files, the save call plus fsync as
    `write_s` and the read-back as `verify_s`; the coordinator's merge renames it to `abspath`,
    bytes unchanged.
    """
    clock = storage.recorder.clock
    start = clock.now()
    staged = fmt.write_paths(abspath, owner, tensors, chunks)
    end = clock.now()
    calls = dict(staged.writes())  # after the call is timed
    data_size = recorded = storage.file_size(staged.data)
    _record_framework_writes(storage, staged.data, data_size, calls.get(staged.data), start, end)
    for other in staged.others:
        size = storage.file_size(other)
        _record_framework_writes(storage, other, size, calls.get(other), end, end)
        recorded += size
    if not fsync and checksum == "none":  # checkpoint.durability=framework: what TF did, nothing more
        return FileWrite(data_size, "", recorded, end - start, 0.0, None)
    settled = settle_file(storage, staged.data, fsync, checksum, chunk_bytes)
    return FileWrite(settled.size, settled.checksum, recorded, end - start + settled.write_s, settled.verify_s, None,
                     settled.write_s)


def _record_framework_writes(storage: Any, path: str, size: int, calls: tuple | None, start: float,
                             end: float) -> None:
    """Record the write calls a framework made to the `size`-byte file at `path`: `calls`
    ((offset, length) each, as its format worked them out: TensorFlow's fwrites, as
    darshan-runtime's STDIO module counts them), else one call of the whole file. TF does not time
    its calls one by one, so they share [start, end] in proportion to their bytes, one after the
    other: the call's time stays what one event per file recorded, split as the framework split
    the file. The bytes recorded are the file's size on disk, as before: calls that do not add up
    to it (a framework version whose files differ from the one measured) give way to one call.
    The file's open and close are instants at the span's ends (darshan-runtime counts each fopen)."""
    writes = calls if calls is not None and sum(length for _, length in calls) == size else ((0, size),)
    span, done = end - start, 0
    storage.recorder.record("open", storage.phase, path, -1, 0, start, start)  # the framework's fopen
    for offset, length in writes:
        first = start + span * done / size if size else start
        done += length
        storage.recorder.record("write", storage.phase, path, offset, length, first,
                                start + span * done / size if size else end)
    storage.recorder.record("close", storage.phase, path, -1, 0, end, end)


def merge_framework_files(storage: Any, folder: str, data_paths: list[str], fmt: Any, fsync: bool, checksum: str,
                          chunk_bytes: int, tensors: dict | None = None) -> list[tuple[str, int, str]]:
    """The coordinator's half of a path-writing format: merge the ranks' staged files into the
    framework's final names (`fmt.merge`; `tensors`, relative path -> (owner, tensors), tells it
    the write calls of the files it writes), record what the framework did, fsync what it wrote and
    the folder (so its renames are durable), and return (path relative to `folder`, size,
    checksum) of each file it wrote, for the manifest. The merge call's time goes to the write
    calls of the file it wrote (`_record_framework_writes`); its renames and deletions are
    recorded as instants at its end (TF does not time them one by one), its reading of each staged
    index (open, TF's table reader's preads as the format works them out: 3 for a one-block index,
    close) as instants at its start."""
    clock = storage.recorder.clock
    start = clock.now()
    merged = fmt.merge([os.path.join(folder, p) for p in data_paths],
                       None if tensors is None else {os.path.join(folder, p): held for p, held in tensors.items()})
    end = clock.now()
    sizes = {path: storage.file_size(path) for path in merged.written}
    calls = dict(merged.writes())  # after the call is timed
    reads = dict(merged.reads())
    for path in merged.removed:  # the merge opens each staged index and reads its entries
        storage.recorder.record("open", storage.phase, path, -1, 0, start, start)
        for offset, length in reads.get(path, ()):
            storage.recorder.record("read", storage.phase, path, offset, length, start, start)
        storage.recorder.record("close", storage.phase, path, -1, 0, start, start)
    for path in merged.written:
        _record_framework_writes(storage, path, sizes[path], calls.get(path), start, end)
    for source, _ in merged.renamed:
        storage.recorder.record("rename", storage.phase, source, -1, 0, end, end)
    for path in merged.removed:
        storage.recorder.record("unlink", storage.phase, path, -1, 0, end, end)
    entries = []
    for path in merged.written:
        if not fsync and checksum == "none":  # checkpoint.durability=framework: what TF did, nothing more
            entries.append((os.path.relpath(path, folder), sizes[path], ""))
            continue
        settled = settle_file(storage, path, fsync, checksum, chunk_bytes)
        entries.append((os.path.relpath(path, folder), settled.size, settled.checksum))
    if fsync:
        storage.fsync_dir(folder)
    return entries


def write_framework_metadata(storage: Any, path: str, data: bytes, how: str) -> None:
    """A framework's small metadata file (a tag, DCP's `.metadata`) as the framework writes it:
    `how` is "plain" (open, write, close), "renamed" (under `<name>.tmp`, then renamed) or
    "renamed_fsync" (the same, fsynced before the rename; the folder is not fsynced: no framework
    does). A backend that cannot rename (object storage) publishes the file on close instead."""
    if how == "plain" or not hasattr(storage, "rename"):
        handle = storage.open_write(path) if how == "plain" else storage.open_staged(path)
        try:
            getattr(handle, "write_stream", handle.write)(data)  # a program's write(2)
            if how == "renamed_fsync" and storage.capabilities.fsync:
                handle.fsync()
        except BaseException:
            handle.abort()
            raise
        handle.close()
        return
    temporary = f"{path}.tmp"
    handle = storage.open_write(temporary)
    try:
        getattr(handle, "write_stream", handle.write)(data)  # a program's write(2)
        if how == "renamed_fsync":
            handle.fsync()
    except BaseException:
        handle.abort()
        raise
    handle.close()
    storage.rename(temporary, path)


def verify_file(storage: Any, abspath: str, size: int, checksum: str, algorithm: str,
                buffer: memoryview, sink: Any = None) -> tuple[int, str | None]:
    """Read a whole file; return (bytes read, problem or None). Every byte is read, as a restore would.
    Only algorithm "none" skips the checksum: an unknown name or an empty checksum is a problem.
    `sink` (a MutableFileView of `size` bytes) receives the bytes as they are read."""
    if algorithm != "none" and new_hasher(algorithm) is None:
        return 0, f"unknown checksum algorithm {algorithm!r}"
    if algorithm != "none" and not checksum:
        return 0, f"no {algorithm} checksum recorded"
    if not storage.exists(abspath):
        return 0, "missing"
    handle = storage.open_read(abspath)
    try:
        actual = handle.size()
        hasher = new_hasher(algorithm)
        read = read_back(handle, min(actual, size) if sink is not None else actual, hasher, buffer, sink)
    finally:
        handle.close()
    if actual != size:
        return read, f"size {actual} bytes, manifest says {size} (truncated or torn)"
    if hasher is not None and hasher.hexdigest() != checksum:
        return read, f"{algorithm} checksum mismatch (corrupted contents)"
    return read, None


def now() -> float:
    return time.perf_counter()
