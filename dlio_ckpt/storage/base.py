"""The storage seam: what every backend (POSIX, S3, ...) promises, and what it can do.

The engine, the checkpoint code and the tracer talk to a `StorageBackend` only through the
members below, so a new backend is one module plus one registry line. What a backend cannot do
is stated in its `Capabilities`, and the loader refuses a dataset format, checkpoint format or
feature that needs a capability the chosen backend lacks (one line, exit 2, nothing written),
so no code path has to discover it at run time.

Every member a caller uses is declared here. Most are required of every backend; where a
capability is False the backend still has the member and it raises io.UnsupportedOperation
(`fsync_dir` without `fsync`, a handle's `write_at`/`truncate` without `seekable_write`), because
callers ask the capability first. Two groups are optional instead, because callers ask for the
member itself (hasattr) and fall back to other calls when it is missing, as the emulated program
would: `Renames.rename` (exactly where `atomic_rename`) and `StreamWrites.writev`/`write_stream`
(exactly where `stream_writes`). OPTIONAL_MEMBERS ties each group to its flag; the protocol tests
check every backend against it (tests/test_storage_protocol.py).

Paths stay absolute strings under `storage.root`; a backend maps them into its own namespace
(POSIX uses them as they are; an object store turns `root/a/b` into `prefix/a/b` and refuses a
path outside the root). Only datasets and checkpoints go through a backend; the run folder
(summary.json, events, traces) is always the local file system.

Commit rule (the same on every backend): whole files are written through `open_staged`, which
publishes nothing at `path` until `close()` returns, and the checkpoint manifest is written last
with `write_atomic`; the manifest is the commit, so a reader never trusts a file the manifest
does not list.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; the loader checks a run's needs against these before it starts."""

    atomic_rename: bool  # rename(src, dst) is atomic and cheap (POSIX yes, S3 no: copy + delete)
    fsync: bool  # a per-file durability call exists; where False, a file is durable once close() returns
    seekable_write: bool  # a writer may seek back and rewrite (zip header patching, h5py); else append only
    direct_io: bool  # O_DIRECT: transfers bypass the page cache
    ranged_read: bool  # read_at at any offset without reading what precedes it
    listing: bool  # listdir names what lies directly below a folder/prefix
    local_paths: bool  # paths are files of the local kernel: a library may open them itself
    #                    (torch.save, TensorFlow's SaveV2), and the page cache can be dropped
    # The two below default to False, the answer that is always safe (callers issue `write`; the
    # reader keeps to threads), so a backend written before them still builds its Capabilities.
    stream_writes: bool = False  # handles offer writev / write_stream (writev(2), write(2) at the
    #                              descriptor's own offset: a buffered stream's calls); else `write`
    fork_safe: bool = False  # the client survives a fork: the loader's worker processes may read
    #                          through it (obstore's runtime threads hang in a forked child)

    def missing(self, needs: "tuple[str, ...] | frozenset[str]") -> list[str]:
        """The capabilities among `needs` this backend lacks (unknown names are a bug: KeyError)."""
        known = {f.name for f in fields(self)}
        unknown = set(needs) - known
        if unknown:
            raise KeyError(f"unknown storage capabilities {sorted(unknown)}; known: {sorted(known)}")
        return [name for name in sorted(needs) if not getattr(self, name)]


CAPABILITY_MEANING = {
    "atomic_rename": "atomic rename",
    "fsync": "per-file fsync",
    "seekable_write": "seekable writes (a writer that seeks back and rewrites, as HDF5 does)",
    "direct_io": "O_DIRECT",
    "ranged_read": "ranged reads",
    "listing": "listing a folder",
    "local_paths": "files a library can open by path on the local file system",
    "stream_writes": "writev and write(2) at the descriptor's own offset (a buffered stream's calls)",
    "fork_safe": "reading from forked worker processes",
}


def write_staged(backend: "StorageBackend", path: str, data: bytes) -> None:
    """`data` at `path` all or nothing through `backend.open_staged`: the usual `write_atomic`."""
    handle = backend.open_staged(path)
    try:
        handle.write(data)
        handle.fsync()
    except BaseException:
        handle.abort()
        raise
    handle.close()


class PositionalReads:
    """read / readinto / readall at a current position (`_position`), on top of a handle's
    read_at / read_at_into / size: the file-like half that numpy, h5py and the TFRecord code use,
    the same on every backend."""

    _position: int

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


@runtime_checkable
class StorageFile(Protocol):
    """An open file or object. A read handle supports every read method; a write handle `write`.

    A handle counts what it moves: `last_moved` is the bytes the last read call moved at the
    storage layer (whole blocks under O_DIRECT, so it may exceed what was asked), which is what
    the tracer records.
    """

    path: str
    last_moved: int

    def read_at(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes at `offset` (fewer only at the end); needs `ranged_read` for a random offset."""

    def read_at_into(self, buffer, offset: int) -> int:
        """Fill `buffer` from `offset`; return the count of bytes placed (fewer only at the end)."""

    def readinto(self, buffer) -> int:
        """Like read_at_into at the current position, which then advances."""

    def read(self, size: int = -1) -> bytes:
        """`size` bytes (all that is left when negative) at the current position, which then advances."""

    def seek(self, offset: int, whence: int = 0) -> int:
        """Move the position. On a write handle without `seekable_write` only a seek to the
        current end (a no-op) is allowed; anything else raises OSError."""

    def tell(self) -> int: ...

    def seekable(self) -> bool:
        """False for a write handle without `seekable_write`: writers that can stream instead of
        seeking back (zipfile) look at this, so npz needs no seekable writes."""

    def size(self) -> int:
        """Bytes in the file (a write handle: bytes written so far)."""

    def write(self, data) -> int:
        """Write all of `data` at the position (an append without `seekable_write`); return its length."""

    def write_at(self, data, offset: int) -> int:
        """Write all of `data` at `offset`, position unchanged (replay, h5py, the state's spill
        files write in place). Only where `capabilities.seekable_write`; else io.UnsupportedOperation."""

    def truncate(self, size: int | None = None) -> int:
        """Set the file's length (default: the position); return it. Only where
        `capabilities.seekable_write`; else io.UnsupportedOperation."""

    def flush(self) -> None:
        """A file-like caller's flush (io.BufferedWriter's): a no-op on the built-in handles, which
        hold nothing a flush could send (S3 parts leave as they fill, POSIX writes are system calls)."""

    def fileno(self) -> int:
        """The descriptor where the handle is a local file (a writer asks its block size);
        io.UnsupportedOperation on an object store."""

    def fsync(self) -> None:
        """Make what was written durable. Where `capabilities.fsync` is False there is no separate
        durability call: S3 completes the upload here (the object is published, later writes are
        refused, close() only releases), so the transfer is timed as the fsync, as write-back is on POSIX."""

    def close(self) -> None:
        """Release the handle. A write handle publishes its data: when close() returns the file is
        complete at its final name (open_staged: renamed; S3: the multipart upload completed).
        If close() raises, nothing new is published."""

    def abort(self) -> None:
        """Discard a write handle: nothing is published, temporary or partial data is removed.
        Safe after a failed write and a no-op on a closed handle; on a read handle it closes."""


@runtime_checkable
class StreamWrites(Protocol):
    """A handle's calls at the descriptor's own offset, exactly where `capabilities.stream_writes`
    (POSIX): what a buffered stream issues (a C++ ofstream's writev, a BufferedWriter's write),
    which the framework formats use to issue exactly torch.save's and DCP's calls
    (checkpoint/filebuf.py). A handle without them has neither member: callers ask (hasattr) and
    issue `write` instead, as libstdc++ does where writev is missing."""

    def writev(self, buffers) -> int:
        """Write `buffers` one after another at the position in one writev(2); return the total."""

    def write_stream(self, data) -> int:
        """write(2) of all of `data` at the position; return its length."""


@runtime_checkable
class Renames(Protocol):
    """A backend's rename, exactly where `capabilities.atomic_rename` (POSIX): a framework's own
    rename (DCP's `.metadata`), traced as one rename. A backend without it has no member: callers
    ask (hasattr) and publish the file on close instead (checkpoint/fileio.py)."""

    def rename(self, source: str, target: str) -> None:
        """Move `source` to `target`, replacing it."""


# Each optional group, the capability that says a backend has it, and whether the backend or its handles carry it.
OPTIONAL_MEMBERS = {"atomic_rename": (Renames, "backend"), "stream_writes": (StreamWrites, "handle")}


@runtime_checkable
class StorageBackend(Protocol):
    """A place where datasets and checkpoints live. Every method may raise OSError on I/O failure."""

    name: str
    capabilities: Capabilities
    root: str  # storage.root as given: the top of the folder chains a commit fsyncs (storage/durable.py)
    # The tracer's hook (storage/traced.py, TracedStorage._opener): a handle class whose instances
    # record their own events, which open_read / open_write / open_staged build when given it as
    # their second argument (POSIX: TracedPosixFile); None: the tracer wraps each handle (S3).
    traced_handle: "type | None"

    def open_read(self, path: str) -> StorageFile:
        """Open an existing file for reading; FileNotFoundError when there is none (S3 sends no
        request to open, so a missing object raises it at the first read or size())."""

    def open_write(self, path: str) -> StorageFile:
        """Create or replace `path`; on an object store it appears when the handle is closed,
        on POSIX it is visible (growing) while written. Use open_staged for all-or-nothing files."""

    def open_staged(self, path: str) -> StorageFile:
        """The commit primitive for whole files: nothing (old content, if any, stays) at `path`
        until close() returns (S3: until fsync() or close() completes the upload); abort() leaves
        no trace. POSIX: unique temporary name, fsync, rename, fsync of the folder; S3: a multipart
        upload (one PUT below one part) completed by fsync or close."""

    def write_atomic(self, path: str, data: bytes) -> None:
        """A small all-or-nothing file (a manifest): `data` at `path` in full, or nothing changed."""

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """An advisory claim: create `path` with `data` unless something is there; False if it
        was (POSIX O_EXCL). A backend whose objects appear whole when written grants every claim."""

    def read_whole(self, path: str) -> bytes:
        """The whole content of `path`."""

    def exists(self, path: str) -> bool:
        """A file, or a folder (a non-empty prefix on an object store), is at `path`."""

    def isdir(self, path: str) -> bool:
        """`path` is a folder (a prefix with objects below it on an object store)."""

    def file_size(self, path: str) -> int:
        """Bytes in the file at `path`; FileNotFoundError when there is none."""

    def listdir(self, path: str) -> list[str]:
        """Sorted names directly below `path` (files and folders); [] when it does not exist."""

    def makedirs(self, path: str) -> None:
        """Create folder `path` and its parents (no-op where folders are implied by names)."""

    def remove(self, path: str) -> None:
        """Delete one file; FileNotFoundError when there is none."""

    def remove_tree(self, path: str) -> list[str]:
        """Delete `path` and everything below it; return the paths of the files it removed (the
        tracer records one unlink each). Callers pass only a folder of their own run."""

    def fsync_dir(self, path: str) -> None:
        """Make the entries created or renamed in folder `path` durable (a commit's folders,
        storage/durable.py). Only where `capabilities.fsync`; else io.UnsupportedOperation."""

    def free_bytes(self, path: str) -> int | None:
        """Bytes that can still be written at `path`; None when unknown or unbounded (S3)."""

    def uri(self, path: str) -> str:
        """How a person names `path` on this backend, in messages (POSIX: the path; S3: s3://bucket/key)."""

    def check(self) -> None:
        """Reachability, credentials and permissions, checked before anything is written;
        raises dlio_ckpt.errors.UserError with one line naming what to fix."""


class BackendClass(Protocol):
    """What the registry (dlio_ckpt.storage.BACKENDS) points at: a class built from the config.

    A backend owns its options, as an IOR backend owns its options table: `options` is the
    dataclass of its `storage.<name>.*` section (None: it has none), typed with the builtins and
    option_types.Bytes and checking its values in `validate(key)` with one line naming the key.
    It lives in a module that imports no optional library (storage/s3_options.py), so the loader
    builds and checks the section for any backend; schema.py's StorageConfig has a field
    `<name>` of that type and conf/config.yaml the section's defaults (a test keeps the three in
    step), so an unknown key under it is refused as any other (one line, a close match, exit 2)."""

    name: str
    options: "type | None"

    def from_config(self, config, root: str) -> StorageBackend:
        """The backend for `config` (a schema.StorageConfig) serving the paths under `root`
        (absolute). Reads and validates its own options (`config.<name>`, e.g. `config.s3`) and
        raises ConfigError naming the key for an impossible one; does no I/O (that is check())."""
