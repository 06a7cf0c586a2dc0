"""S3 object storage (AWS, MinIO, Ceph RGW, any S3-compatible endpoint) through obstore.

obstore (Rust object_store) moves the bytes: it was the fastest of the clients measured in
benchmarks/s3_clients.py and spends the least client CPU per request, which is what ranged reads
of a few hundred KiB are made of. boto3 only resolves credentials, so the standard AWS chain
(environment variables, shared profile, SSO, instance role) applies exactly as in the AWS CLI.

The access pattern is the POSIX reader's: every `read_at` / `read_at_into` call is one ranged GET
of exactly the bytes asked for; opening sends nothing, and the size costs one HEAD when asked for. Writes
stream: a handle keeps at most one part in its buffer, hands full parts to a multipart upload that
runs in a background thread with `storage.s3.concurrency` parts in flight, and blocks when that
many are queued, so a 14 GiB shard needs (2 x concurrency + 2) parts of memory, never the shard.
An object smaller than one part is one PUT when its handle is closed. `close()` completes the
upload (the object appears then, never before); `abort()` aborts it and nothing appears.

Paths are the engine's absolute paths under storage.root; `prefix/<path relative to the root>` is
the object key. Errors carry the object's s3:// name and one line of reason and are OSErrors, so a
failure mid-run is reported like a POSIX I/O error.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import posixpath
import queue
import threading
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import Any

import boto3
import obstore
from obstore.auth.boto3 import Boto3CredentialProvider
from obstore.exceptions import NotFoundError, PermissionDeniedError, UnauthenticatedError
from obstore.store import S3Store

from dlio_ckpt.errors import ConfigError, UserError
from dlio_ckpt.storage.base import Capabilities, PositionalReads
from dlio_ckpt.storage.s3_options import S3Options

S3_CAPABILITIES = Capabilities(
    atomic_rename=False,
    fsync=False,
    seekable_write=False,
    direct_io=False,
    ranged_read=True,
    listing=True,
    local_paths=False,
    stream_writes=False,
    fork_safe=False,  # obstore's client (its runtime's threads) hangs in a forked child, even a new one
)

# obstore raises its own classes, or Python's FileNotFoundError/PermissionError for some calls.
_NOT_FOUND = (NotFoundError, FileNotFoundError)
_DENIED = (PermissionDeniedError, UnauthenticatedError, PermissionError)

_RANGE_PAST_END = "416 Range Not Satisfiable"  # a GET that starts at or after the end of the object

_END = object()  # the last part was queued: complete the upload
_ABORT = object()  # discard: the part iterator raises, which makes obstore abort the upload


class _Aborted(Exception):
    """Raised inside the part iterator so that obstore aborts the multipart upload."""


def _reason(exc: BaseException) -> str:
    """The first line of a client error (obstore appends a multi-line debug dump)."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _object_error(exc: BaseException, uri: str, what: str) -> OSError:
    """An OSError naming the object, so the engine reports it as one line like a POSIX I/O error."""
    if isinstance(exc, _NOT_FOUND):
        return FileNotFoundError(errno.ENOENT, f"{what} {uri}: no such object")
    if isinstance(exc, _DENIED):
        code = next((c for c in _ACCESS_DENIED if c in str(exc)), "")  # obstore's text repeats the URL
        return PermissionError(errno.EACCES, f"{what} {uri}: access denied{f' ({code})' if code else ''}")
    return OSError(errno.EIO, f"{what} {uri} failed: {_reason(exc)}")


def _aws_session(region: str) -> boto3.Session:
    """The standard AWS credential chain (environment, shared profile, SSO, instance role)."""
    logging.getLogger("botocore.credentials").setLevel(logging.WARNING)  # not "Found credentials in ..." in every run's log
    return boto3.Session(region_name=region)


class S3ReadFile(PositionalReads, io.RawIOBase):
    """An object opened for reading: one ranged GET per read call and nothing else. Opening sends
    no request (the reader opens a file per thread, and a HEAD each time would double the requests
    of one-sample reads); a missing object is reported by the first read, the size by one HEAD
    when asked for."""

    def __init__(self, store: S3Store, path: str, key: str, uri: str) -> None:
        super().__init__()
        self.path = path
        self._store = store
        self._key = key
        self._uri = uri
        self._size: int | None = None  # one HEAD, only if a caller asks for the size
        self._position = 0
        self.last_moved = 0

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation(f"{self._uri} is an object, not a file descriptor")

    def size(self) -> int:
        if self._size is None:
            try:
                self._size = int(obstore.head(self._store, self._key)["size"])
            except Exception as exc:
                raise _object_error(exc, self._uri, "stat") from None
        return self._size

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position}.get(whence)
        self._position = (self.size() if base is None else base) + offset
        return self._position

    def _get(self, offset: int, size: int):
        """One ranged GET of [offset, offset + size); S3 returns less at the end. None past the end."""
        if self._size is not None:
            size = min(size, self._size - offset)
        if size <= 0:
            self.last_moved = 0
            return None
        try:
            data = obstore.get_range(self._store, self._key, start=offset, length=size)
        except Exception as exc:
            if _RANGE_PAST_END in str(exc):
                self.last_moved = 0
                return None
            raise _object_error(exc, self._uri, f"read {size} bytes at {offset} of") from None
        self.last_moved = len(data)
        return data

    def read_at(self, offset: int, size: int) -> bytes:
        data = self._get(offset, size)
        return b"" if data is None else bytes(data)

    def read_at_into(self, buffer, offset: int) -> int:
        view = memoryview(buffer).cast("B")
        data = self._get(offset, len(view))
        if data is None:
            return 0
        count = len(data)
        view[:count] = memoryview(data)
        return count

    def write(self, data) -> int:
        raise io.UnsupportedOperation(f"{self._uri} is open for reading")

    def write_at(self, data, offset: int) -> int:
        raise io.UnsupportedOperation(f"{self._uri} is open for reading")

    def flush(self) -> None:
        """Nothing is buffered on a read handle (and flush must work after close, as on POSIX)."""

    def fsync(self) -> None:
        """Nothing to make durable on a read handle."""

    def abort(self) -> None:
        self.close()


class _Upload:
    """A multipart upload in flight: the parts queue and the thread that streams it to obstore.

    Kept apart from the handle so that the thread refers to this and never to the S3WriteFile: a
    thread's target holds its object alive while the thread lives, and this thread lives until it
    is told to end, so a handle dropped unclosed (an exception path) was never collected, its
    __del__ (the abort) never ran, the thread waited forever and the upload stayed incomplete on
    the server. Now the handle is collected as soon as it is dropped, and aborts."""

    def __init__(self, store: S3Store, key: str, part_size: int, concurrency: int) -> None:
        self.parts: queue.Queue = queue.Queue(maxsize=concurrency)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(store, key, part_size, concurrency),
                                       name=f"s3-upload {key}", daemon=True)
        self.thread.start()

    def _part_iterator(self):
        while True:
            item = self.parts.get()
            if item is _END:
                return
            if item is _ABORT:
                raise _Aborted()
            yield item

    def _run(self, store: S3Store, key: str, part_size: int, concurrency: int) -> None:
        try:
            obstore.put(store, key, self._part_iterator(), use_multipart=True, chunk_size=part_size,
                        max_concurrency=concurrency)
        except BaseException as exc:  # reported by the writing thread, which owns the handle
            self.error = exc


class S3WriteFile(io.RawIOBase):
    """A streaming upload: nothing is visible at the key until fsync() or close() completes it."""

    def __init__(self, store: S3Store, path: str, key: str, uri: str, part_size: int, concurrency: int) -> None:
        super().__init__()
        self.path = path
        self._store = store
        self._key = key
        self._uri = uri
        self._part_size = part_size
        self._concurrency = concurrency
        self._part: bytearray | None = None  # the part being filled
        self._filled = 0
        self._written = 0
        self._upload: _Upload | None = None  # from the first full part on
        self._published = False
        self.last_moved = 0

    def readable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def fileno(self) -> int:
        raise io.UnsupportedOperation(f"{self._uri} is an object, not a file descriptor")

    def size(self) -> int:
        return self._written

    def tell(self) -> int:
        return self._written

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = {io.SEEK_SET: 0, io.SEEK_CUR: self._written, io.SEEK_END: self._written}[whence] + offset
        if target != self._written:
            raise io.UnsupportedOperation(f"{self._uri}: S3 objects are written in order; cannot seek to {target} (at {self._written})")
        return target

    def write(self, data) -> int:
        if self.closed or self._published:
            raise ValueError(f"write to {self._uri}, which is already complete (closed or fsynced)")
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):  # one copy: into the part being filled, which is then handed over whole
            if self._part is None:
                self._part, self._filled = bytearray(self._part_size), 0  # allocated once, never grown
            take = min(self._part_size - self._filled, len(view) - done)
            self._part[self._filled : self._filled + take] = view[done : done + take]
            self._filled += take
            done += take
            if self._filled == self._part_size:
                part, self._part = self._part, None
                self._queue_part(part)
        self._written += len(view)
        return len(view)

    def read_at(self, offset: int, size: int) -> bytes:
        raise io.UnsupportedOperation(f"{self._uri} is open for writing")

    def read_at_into(self, buffer, offset: int) -> int:
        raise io.UnsupportedOperation(f"{self._uri} is open for writing")

    def write_at(self, data, offset: int) -> int:
        """Refused: S3 objects are written in order (capability seekable_write is False, so the
        loader has refused every run that writes in place)."""
        raise io.UnsupportedOperation(f"{self._uri}: S3 objects are written in order; cannot write at {offset}")

    def truncate(self, size: int | None = None) -> int:
        """Refused, as write_at is: an object's length is what was written when it completes."""
        raise io.UnsupportedOperation(f"{self._uri}: S3 objects are written in order; cannot truncate")

    def _pending(self) -> memoryview:
        """The bytes of the part being filled (possibly none)."""
        return memoryview(self._part)[: self._filled] if self._part is not None else memoryview(b"")

    def flush(self) -> None:
        """Parts leave as they fill; the object appears on fsync() or close()."""

    def fsync(self) -> None:
        """Complete the upload now. S3 has no durability call apart from completing an object, so
        this is where a write becomes durable, and the transfer's tail is timed as the fsync, as
        the write-back is on POSIX; the object is then published, later writes are refused and
        close() only releases the handle (the checkpoint manifest, written last, stays the commit)."""
        self._publish()

    def _queue_part(self, item) -> None:
        """Hand a part (or _END/_ABORT) to the uploader; blocks while `concurrency` parts wait."""
        if self._upload is None:
            self._upload = _Upload(self._store, self._key, self._part_size, self._concurrency)
        upload = self._upload
        while True:
            if upload.error is not None and item is not _ABORT:
                raise _object_error(upload.error, self._uri, "upload") from None
            try:
                upload.parts.put(item, timeout=0.2)
                return
            except queue.Full:
                if not upload.thread.is_alive():
                    if item is _ABORT:
                        return
                    raise _object_error(upload.error or RuntimeError("uploader stopped"), self._uri, "upload") from None

    def _publish(self) -> None:
        """One PUT for a small object, else the last part and CompleteMultipartUpload."""
        if self._published:
            return
        try:
            if self._upload is None:
                try:
                    obstore.put(self._store, self._key, self._pending(), use_multipart=False)
                except Exception as exc:
                    raise _object_error(exc, self._uri, "upload") from None
            else:
                if self._filled:
                    self._queue_part(self._pending())
                self._queue_part(_END)
                self._upload.thread.join()
                if self._upload.error is not None:
                    raise _object_error(self._upload.error, self._uri, "upload") from None
        except BaseException:
            self._discard()
            raise
        finally:
            self._part, self._filled = None, 0
        self._published = True

    def close(self) -> None:
        """Publish (unless fsync already did) and release the handle."""
        if self.closed:
            return
        self._publish()
        super().close()

    def abort(self) -> None:
        """Discard: the multipart upload (if one started) is aborted and nothing appears; an
        object that fsync already published is deleted."""
        if self.closed:
            return
        if self._published:
            try:
                obstore.delete(self._store, self._key)
            except Exception:
                pass  # best effort: without the manifest, a checkpoint's files are never trusted
        else:
            self._discard()
        super().close()

    def _discard(self) -> None:
        self._part, self._filled = None, 0
        if self._upload is not None and self._upload.thread.is_alive():
            self._queue_part(_ABORT)
            self._upload.thread.join()

    def __del__(self) -> None:
        # io.IOBase.__del__ would close(), which publishes; a handle nobody closed is discarded.
        try:
            self.abort()
        except Exception:
            pass


@dataclass(frozen=True)
class S3Storage:
    """A bucket and key prefix that stand in for storage.root."""

    bucket: str
    prefix: str = ""
    endpoint_url: str = ""
    region: str = "us-east-1"
    part_size: int = 16 << 20
    concurrency: int = 8
    addressing_style: str = "auto"
    root: str = ""

    name = "s3"
    capabilities = S3_CAPABILITIES
    traced_handle = None  # the tracer wraps each handle (a request costs far more than the wrapper)
    options = S3Options  # its table: storage.s3.* (storage/s3_options.py)

    @classmethod
    def from_config(cls, config: Any, root: str) -> "S3Storage":
        """The backend for StorageConfig `config`, from its own section (`config.s3`, an S3Options
        its table has validated), which must name a bucket."""
        options: S3Options = config.s3
        if not options.bucket:
            raise ConfigError("storage.s3.bucket: required for storage.backend=s3; set storage.s3.bucket=NAME")
        return cls(
            bucket=options.bucket,
            prefix=options.prefix.strip("/"),
            endpoint_url=options.endpoint_url,
            region=options.region,
            part_size=int(options.part_size),
            concurrency=int(options.concurrency),
            addressing_style=options.addressing_style,
            root=os.path.abspath(root),
        )

    # names ------------------------------------------------------------------------------
    def key(self, path: str) -> str:
        """`prefix/<path relative to storage.root>`; a path outside the root is refused."""
        relative = os.path.relpath(os.path.abspath(path), self.root) if self.root else path.lstrip("/")
        if relative == ".." or relative.startswith("../"):
            raise OSError(errno.EINVAL, f"{path} is outside storage.root {self.root}; S3 keys are only made for paths under it")
        relative = "" if relative == "." else relative.replace(os.sep, "/")
        return posixpath.join(self.prefix, relative).rstrip("/") if self.prefix else relative

    def uri(self, path: str) -> str:
        return f"s3://{self.bucket}/{self.key(path)}"

    @property
    def where(self) -> str:
        return f"endpoint {self.endpoint_url or 'AWS S3'}, bucket {self.bucket}"

    # the client ---------------------------------------------------------------------------
    def _make_store(self, retries: int, timeout_s: float) -> S3Store:
        virtual = self.addressing_style == "virtual" or (self.addressing_style == "auto" and not self.endpoint_url)
        client_options: dict[str, Any] = {"connect_timeout": f"{min(timeout_s, 10):g}s", "pool_max_idle_per_host": str(2 * self.concurrency)}
        if self.endpoint_url.startswith("http://"):
            client_options["allow_http"] = True
        return S3Store(
            self.bucket,
            endpoint=self.endpoint_url or None,
            region=self.region,
            virtual_hosted_style_request=virtual,
            credential_provider=Boto3CredentialProvider(_aws_session(self.region)),
            client_options=client_options,
            retry_config={"max_retries": retries, "retry_timeout": timedelta(seconds=timeout_s)},
        )

    @cached_property
    def store(self) -> S3Store:
        return self._make_store(retries=5, timeout_s=60)

    # handles ----------------------------------------------------------------------------
    def open_read(self, path: str) -> S3ReadFile:
        return S3ReadFile(self.store, path, self.key(path), self.uri(path))

    def open_write(self, path: str) -> S3WriteFile:
        return S3WriteFile(self.store, path, self.key(path), self.uri(path), self.part_size, self.concurrency)

    def open_staged(self, path: str) -> S3WriteFile:
        """The same as open_write: an object appears only when its upload completes."""
        return self.open_write(path)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Always granted, nothing written: an object appears whole when its upload completes, so
        writers of one key never see each other's partial bytes and need no claim."""
        return True

    def write_atomic(self, path: str, data: bytes) -> None:
        """One PUT: S3 shows the whole object or the old one, never a part."""
        try:
            obstore.put(self.store, self.key(path), bytes(data), use_multipart=False)
        except Exception as exc:
            raise _object_error(exc, self.uri(path), "upload") from None

    def read_whole(self, path: str) -> bytes:
        try:
            return bytes(obstore.get(self.store, self.key(path)).bytes())
        except Exception as exc:
            raise _object_error(exc, self.uri(path), "read") from None

    # names and folders ----------------------------------------------------------------
    def _head(self, path: str) -> dict | None:
        try:
            return obstore.head(self.store, self.key(path))
        except _NOT_FOUND:
            return None
        except Exception as exc:
            raise _object_error(exc, self.uri(path), "stat") from None

    def _folder_key(self, path: str) -> str:
        key = self.key(path)
        return f"{key}/" if key else ""

    def exists(self, path: str) -> bool:
        return self._head(path) is not None or self.isdir(path)

    def isdir(self, path: str) -> bool:
        try:
            stream = obstore.list(self.store, prefix=self._folder_key(path) or None, chunk_size=1)
            return any(len(chunk) for chunk in [next(iter(stream), [])])
        except Exception as exc:
            raise _object_error(exc, self.uri(path), "list") from None

    def file_size(self, path: str) -> int:
        meta = self._head(path)
        if meta is None:
            raise FileNotFoundError(errno.ENOENT, f"stat {self.uri(path)}: no such object")
        return int(meta["size"])

    def listdir(self, path: str) -> list[str]:
        """Names directly below `path`: one delimiter listing (objects and common prefixes)."""
        folder = self._folder_key(path)
        try:
            listing = obstore.list_with_delimiter(self.store, folder or None)
        except Exception as exc:
            raise _object_error(exc, self.uri(path), "list") from None
        names = {p.rstrip("/").rsplit("/", 1)[-1] for p in listing["common_prefixes"]}
        names.update(meta["path"].rsplit("/", 1)[-1] for meta in listing["objects"])
        return sorted(names)

    def makedirs(self, path: str) -> None:
        """Folders are implied by key names on S3."""

    def remove(self, path: str) -> None:
        if self._head(path) is None:
            raise FileNotFoundError(errno.ENOENT, f"delete {self.uri(path)}: no such object")
        try:
            obstore.delete(self.store, self.key(path))
        except Exception as exc:
            raise _object_error(exc, self.uri(path), "delete") from None

    def remove_tree(self, path: str) -> list[str]:
        """Delete every object under `path/` (never above: keys outside the root are refused), a
        DeleteObjects of up to 1,000 keys per listed page; return the removed objects' paths."""
        folder = self._folder_key(path)
        if not folder:
            raise OSError(errno.EINVAL, f"refusing to delete the whole of s3://{self.bucket}: {path} maps to no prefix")
        removed = []
        try:
            for chunk in obstore.list(self.store, prefix=folder, chunk_size=1000):
                keys = [meta["path"] for meta in chunk]
                obstore.delete(self.store, keys)
                removed.extend(os.path.join(path, key[len(folder):]) for key in keys)
        except Exception as exc:
            raise _object_error(exc, self.uri(path), "delete below") from None
        return sorted(removed)

    def fsync_dir(self, path: str) -> None:
        """Refused: a bucket has no folders to make durable (capability fsync is False, so a commit
        syncs none: storage/durable.py); an object is durable once its upload completes."""
        raise io.UnsupportedOperation(f"{self.uri(path)}: S3 has no folders to fsync; an object is durable once uploaded")

    def free_bytes(self, path: str) -> int | None:
        return None

    def check(self) -> None:
        """Credentials, endpoint, bucket and list access, in one listing, before anything is written."""
        session = _aws_session(self.region)
        if session.get_credentials() is None:
            raise UserError(
                f"storage.s3: no AWS credentials found for {self.where}; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE for a profile in ~/.aws/credentials"
            )
        probe = self._make_store(retries=1, timeout_s=10)
        try:
            obstore.list_with_delimiter(probe, self.prefix or None)
        except Exception as exc:
            raise UserError(f"storage.s3: {_check_failure(exc)} ({self.where}){_check_advice(exc)}") from None


_MISSING_BUCKET = ("NoSuchBucket", "404 Not Found")
_ACCESS_DENIED = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403 Forbidden", "401 Unauthorized")


def _check_failure(exc: BaseException) -> str:
    """What went wrong, from the error's class or the S3 error code in its text."""
    text = str(exc)
    if isinstance(exc, _NOT_FOUND) or any(code in text for code in _MISSING_BUCKET):
        return "bucket does not exist"
    if isinstance(exc, _DENIED) or any(code in text for code in _ACCESS_DENIED):
        code = next((c for c in _ACCESS_DENIED if c in text), "access denied")
        return f"access denied ({code})"
    return f"cannot reach the endpoint ({_reason(exc)})"


def _check_advice(exc: BaseException) -> str:
    failure = _check_failure(exc)
    if failure.startswith("bucket"):
        return "; create the bucket or set storage.s3.bucket"
    if failure.startswith("access"):
        return "; check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE) and the bucket policy"
    return "; check storage.s3.endpoint_url and that the server is up"
