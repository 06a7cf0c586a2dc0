"""The tracing backend: wraps any storage backend and records one event per operation.

All byte counts in summary.json come from here, so they are the bytes the backend actually
moved, not nominal sample sizes. The phase (generate, train, eval, checkpoint, restore) is part
of the view: `storage.with_phase("train")` returns a wrapper that tags its events so.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, replace
from functools import cached_property
from time import perf_counter
from typing import Any

from dlio_ckpt.storage.base import write_staged
from dlio_ckpt.storage import events as _events
from dlio_ckpt.storage.events import EVENT_FIELDS, OP_CODE, PHASE_CODE, RAW_TIMES, EventRecorder, event_code

# Op bits of an event code (events.event_code): a handle adds them to its phase and path bits.
_OPEN, _CLOSE, _READ, _WRITE = (event_code(OP_CODE[op], 0, 0) for op in ("open", "close", "read", "write"))


class TracedFile(io.RawIOBase):
    """A file-like wrapper that times and records every call of the file it wraps.

    Everything an event needs but the call's own figures (the code of phase and path, the
    clock's offset, the list to extend) is looked up once per handle, and an event is five
    numbers appended in one call, so a traced 4 KiB read from the page cache costs little more
    than the read (benchmarks/tracing_overhead.py)."""

    def __init__(self, inner: Any, path: str, trace: tuple) -> None:
        """`trace`: (code, extend, recorder): the phase and path bits of every event of this handle
        (op bits 0, and RAW_TIMES: its times are perf_counter readings, put on the job clock when
        the recorder compacts them), the recorder's extender, and the recorder
        (TracedStorage looks them up once per view). One attribute, not four, and no
        io.RawIOBase.__init__ (it does nothing): a handle is made per file opened."""
        self._inner = inner
        self.path = path
        self._trace = trace

    def read_at_into(self, buffer, offset: int) -> int:
        """The first read of a handle, recorded with look-ups by name; from the second on, a
        closure over what it records takes over (`_second_read_at_into`). Building the closure
        costs several reads' look-ups, so a file read once (one 1 MiB sample) never pays for it."""
        start = perf_counter()
        count = self._inner.read_at_into(buffer, offset)
        end = perf_counter()
        code, extend, _ = self._trace
        extend((code | _READ, offset, getattr(self._inner, "last_moved", count), start, end))
        self.read_at_into = self._second_read_at_into
        return count

    def _second_read_at_into(self, buffer, offset: int) -> int:
        fast = self.read_at_into = self._fast_read_at_into()
        return fast(buffer, offset)

    def _fast_read_at_into(self):
        """read_at_into as a closure over what it records (no look-ups by name per call).

        Where the inner handle names the one system call its read makes (`pread_call`: buffered
        POSIX), the closure makes that call itself, the same call with the same arguments, and
        times just it; otherwise it calls the inner read_at_into and records `last_moved`, what
        the system call moved (whole blocks under O_DIRECT), which can exceed what it returns."""
        inner = self._inner
        code, extend, _ = self._trace
        code |= _READ
        call = getattr(inner, "pread_call", None)
        direct_call = call() if call is not None else None

        if direct_call is not None:
            preadv, fd = direct_call

            def read_at_into(buffer, offset: int) -> int:
                start = perf_counter()
                count = preadv(fd, [buffer], offset)
                end = perf_counter()
                extend((code, offset, count, start, end))
                return count
        else:
            inner_read = inner.read_at_into

            def read_at_into(buffer, offset: int) -> int:
                start = perf_counter()
                count = inner_read(buffer, offset)
                end = perf_counter()
                extend((code, offset, inner.last_moved, start, end))
                return count

        return read_at_into

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return self._inner.writable()

    def seekable(self) -> bool:
        return self._inner.seekable()

    def fileno(self) -> int:
        return self._inner.fileno()

    def tell(self) -> int:
        return self._inner.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._inner.seek(offset, whence)

    def size(self) -> int:
        return self._inner.size()

    def _timed(self, op: str, offset: int, call, *args):
        start = perf_counter()
        result = call(*args)
        end = perf_counter()
        if op == "read":
            # What the system call moved (whole blocks under O_DIRECT), not just what was asked for.
            length = getattr(self._inner, "last_moved", None)
            if length is None:
                length = result if isinstance(result, int) else len(result)
        else:
            length = result if isinstance(result, int) else len(result) if result is not None else 0
        code, extend, _ = self._trace
        extend((code | event_code(OP_CODE[op], 0, 0), offset, length, start, end))
        return result

    def read(self, size: int = -1) -> bytes:
        return self._timed("read", self._inner.tell(), self._inner.read, size)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        return self._timed("read", self._inner.tell(), self._inner.readinto, buffer)

    def read_at(self, offset: int, size: int) -> bytes:
        return self._timed("read", offset, self._inner.read_at, offset, size)

    def write(self, data) -> int:
        return self._timed("write", self._inner.tell(), self._inner.write, data)

    # The call every writer makes per transfer: _timed written out, no look-ups by name.
    def write_at(self, data, offset: int) -> int:
        start = perf_counter()
        count = self._inner.write_at(data, offset)
        end = perf_counter()
        code, extend, _ = self._trace
        extend((code | _WRITE, offset, count, start, end))
        return count

    def truncate(self, size: int | None = None) -> int:
        return self._inner.truncate(size)

    def flush(self) -> None:
        self._inner.flush()

    def fsync(self) -> None:
        self._timed("fsync", -1, lambda: (self._inner.fsync(), 0)[1])

    def close(self) -> None:
        if not self.closed:
            try:
                start = perf_counter()
                self._inner.close()
                end = perf_counter()
                code, extend, recorder = self._trace
                extend((code | _CLOSE, -1, 0, start, end))
                # the recorder's list, against the threshold of EventRecorder.compact (which takes a lock)
                if len(extend.__self__) >= _events.COMPACT_EVENTS * EVENT_FIELDS:
                    recorder.compact()
            finally:
                io.RawIOBase.close(self)

    def __del__(self) -> None:
        # Collected unclosed (an exception path): never publish; the inner handle cleans up after itself.
        if not self.closed:
            io.RawIOBase.close(self)

    def abort(self) -> None:
        """Discard the inner handle's writes (nothing published); not data I/O, not traced."""
        if not self.closed:
            try:
                self._inner.abort()
            finally:
                super().close()


@dataclass(frozen=True)
class TracedStorage:
    """A storage backend whose every operation is recorded under the current phase."""

    inner: Any
    recorder: EventRecorder
    phase: str = "other"

    @property
    def name(self) -> str:
        return self.inner.name

    def with_phase(self, phase: str) -> "TracedStorage":
        return replace(self, phase=phase)

    @cached_property
    def _constants(self) -> tuple:
        """What every handle of this view records with: the phase bits of an event code, the
        recorder's extender and its path -> index table, read without the lock (a path not there
        yet goes through `path_id`, which takes it); looked up once per view. The phase bits carry
        RAW_TIMES: handles append perf_counter readings as they are (no subtraction per event)."""
        recorder = self.recorder
        return event_code(0, PHASE_CODE[self.phase], 0) | RAW_TIMES, recorder.extender(), recorder.path_table()

    def _open(self, path: str, opener) -> TracedFile:
        start = perf_counter()
        inner = opener(path)
        end = perf_counter()
        phase_bits, extend, paths = self._constants
        recorder = self.recorder
        index = paths.get(path)
        code = phase_bits | (recorder.path_id(path) if index is None else index)
        extend((code | _OPEN, -1, 0, start, end))
        return TracedFile(inner, path, (code, extend, recorder))

    def open_read(self, path: str) -> TracedFile:
        return self._open(path, self.inner.open_read)

    def open_write(self, path: str) -> TracedFile:
        return self._open(path, self.inner.open_write)

    def open_staged(self, path: str) -> TracedFile:
        """The backend's commit primitive; its publish step is traced as the handle's close."""
        return self._open(path, self.inner.open_staged)

    @property
    def capabilities(self):
        return self.inner.capabilities

    def _meta(self, op: str, path: str, call, *args):
        clock = self.recorder.clock
        start = clock.now()
        result = call(*args)
        self.recorder.record(op, self.phase, path, -1, 0, start, clock.now())
        return result

    def file_size(self, path: str) -> int:
        return self._meta("stat", path, self.inner.file_size, path)

    def remove(self, path: str) -> None:
        self._meta("unlink", path, self.inner.remove, path)

    def remove_tree(self, path: str) -> list[str]:
        """Deleting a folder (retention, a failed checkpoint) is recorded as one unlink per file
        removed: the first carries the call's time (the backend removes them in one call: rmtree,
        or DeleteObjects of up to 1,000 keys), the others are instants at its end."""
        clock = self.recorder.clock
        start = clock.now()
        removed = self.inner.remove_tree(path)
        end = clock.now()
        for index, file in enumerate(removed):
            self.recorder.record("unlink", self.phase, file, -1, 0, end if index else start, end)
        return removed

    # Operations below are bookkeeping on folders; they are not data I/O and are not traced.
    def makedirs(self, path: str) -> None:
        self.inner.makedirs(path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def isdir(self, path: str) -> bool:
        return self.inner.isdir(path)

    def free_bytes(self, path: str) -> int | None:
        return self.inner.free_bytes(path)

    def check(self) -> None:
        self.inner.check()

    def fsync_dir(self, path: str) -> None:
        """POSIX only (capability local_paths): files a framework wrote by path."""
        self.inner.fsync_dir(path)

    def write_atomic(self, path: str, data: bytes) -> None:
        """All or nothing through the backend's commit primitive; traced as open, write, fsync, close."""
        write_staged(self, path, data)

    def read_whole(self, path: str) -> bytes:
        handle = self.open_read(path)
        try:
            return handle.read_at(0, handle.size())
        finally:
            handle.close()
