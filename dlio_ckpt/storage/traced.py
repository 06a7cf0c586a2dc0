"""The tracing backend: wraps any storage backend and records one event per operation.

All byte counts in summary.json come from here, so they are the bytes the backend actually
moved, not nominal sample sizes. The phase (generate, train, eval, checkpoint, restore) is part
of the view: `storage.with_phase("train")` returns a wrapper that tags its events so.

A handle of any backend is wrapped in a TracedFile. A backend may instead offer handles that
record their own events (its `traced_handle`, part of the protocol in base.py; None: wrapped): POSIX does (TracedPosixFile), so a traced POSIX
file is one object, not a handle plus a wrapper, which cost about as much per file as the file's
three events. Where the optional C extension is built (events._trace_c, storage/_trace_c.c), a
traced POSIX file's open, buffered reads and plain close are each one call into it
(TracedPosixFileC, TracedStorage._opener): the same events, a few Python calls fewer per event.
At 1 MiB page-cache reads every read's copy evicts the core's cache, so what the tracer costs
there is mostly the cache lines it touches per file: code and objects kept few for that
(benchmarks/README.md, "Tracing: cache lines per file").
"""

from __future__ import annotations

import io
from contextlib import suppress
from dataclasses import dataclass, replace
from functools import cached_property
from os import preadv
from time import perf_counter
from typing import Any

from dlio_ckpt.storage import events as _events
from dlio_ckpt.storage.base import write_staged
from dlio_ckpt.storage.events import (EVENT_BYTES, OP_CLOSE, OP_FSYNC, OP_OPEN, OP_READ, OP_WRITE, PHASE_CODE,
                                      RAW_TIMES, EventRecorder, pack_event)
from dlio_ckpt.storage.posix import PosixFile, closed_file


def _record_close(trace: tuple, start: float, end: float) -> None:
    """A traced handle's close, after which the recorder compacts if its bytearray is full: checked
    here (EventRecorder.compact takes a lock) rather than per read."""
    phase, file, extend, recorder, events = trace
    extend(pack_event(OP_CLOSE, phase, file, -1, 0, start, end))
    if len(events) >= _events.COMPACT_EVENTS * EVENT_BYTES:
        recorder.compact()


class TracedFile(io.RawIOBase):
    """A file-like wrapper that times and records every call of the file it wraps: what any
    backend's handle gets (S3's, whose calls are network requests: nothing here needs to be fast)."""

    def __init__(self, inner: Any, path: str, trace: tuple) -> None:
        """`trace`: (phase, path index, extend, recorder, events), as TracedStorage looks them up
        once per view (phase with RAW_TIMES: times are perf_counter readings, put on the job clock when the
        recorder converts them). No io.RawIOBase.__init__ (it does nothing)."""
        self._inner = inner
        self.path = path
        self._trace = trace

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

    @property
    def last_moved(self) -> int:
        """What the inner handle's last read moved (the protocol's; the events already hold it)."""
        return self._inner.last_moved

    def _timed(self, op: int, offset: int, call, *args):
        if self.closed:
            raise closed_file()
        start = perf_counter()
        result = call(*args)
        end = perf_counter()
        if op == OP_READ:
            # What the system call moved (whole blocks under O_DIRECT), not just what was asked for.
            length = getattr(self._inner, "last_moved", None)
            if length is None:
                length = result if isinstance(result, int) else len(result)
        else:
            length = result if isinstance(result, int) else len(result) if result is not None else 0
        phase, file, extend, _, _ = self._trace
        extend(pack_event(op, phase, file, offset, length, start, end))
        return result

    def read_at_into(self, buffer, offset: int) -> int:
        return self._timed(OP_READ, offset, self._inner.read_at_into, buffer, offset)

    def read(self, size: int = -1) -> bytes:
        return self._timed(OP_READ, self._inner.tell(), self._inner.read, size)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        return self._timed(OP_READ, self._inner.tell(), self._inner.readinto, buffer)

    def read_at(self, offset: int, size: int) -> bytes:
        return self._timed(OP_READ, offset, self._inner.read_at, offset, size)

    def write(self, data) -> int:
        return self._timed(OP_WRITE, self._inner.tell(), self._inner.write, data)

    def write_at(self, data, offset: int) -> int:
        return self._timed(OP_WRITE, offset, self._inner.write_at, data, offset)

    def truncate(self, size: int | None = None) -> int:
        return self._inner.truncate(size)

    def flush(self) -> None:
        self._inner.flush()

    def fsync(self) -> None:
        self._timed(OP_FSYNC, -1, lambda: (self._inner.fsync(), 0)[1])

    def close(self) -> None:
        if not self.closed:
            try:
                start = perf_counter()
                self._inner.close()
                end = perf_counter()
                _record_close(self._trace, start, end)
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


class TracedPosixFile(PosixFile):
    """A POSIX handle that records its own events: exactly what a TracedFile around a PosixFile
    records (tests/test_traced_posix.py), without a second object per file.

    Every call that moves data is recorded once: `readinto`, `read` and `write` reach the traced
    `read_at_into`, `read_at` and `write_at` (PositionalReads, PosixFile.write), and PosixFile's
    own `read_at` reads through PosixFile.read_at_into, not this class's. `abort`, `truncate`,
    `seek` and the like are not data I/O and are not recorded, as with the wrapper.
    """

    # (phase, path index, extend, recorder, events): set by TracedStorage right after opening, before any call.
    _trace: tuple
    _read_before = False

    def read_at_into(self, buffer, offset: int) -> int:
        """The first read of a handle is recorded with look-ups by name; the second, if buffered,
        puts a closure over what it records in its place (`_fast_read_at_into`). Building the
        closure costs several reads' look-ups, so a file read once (one 1 MiB sample) never pays
        for it; an O_DIRECT read is a device read, which a few look-ups do not weigh on. A
        buffered read is the one preadv of PosixFile.read_at_into, made here: a call less. A
        closed handle raises ValueError, as a closed Python file does."""
        if self.direct:
            start = perf_counter()
            count = PosixFile.read_at_into(self, buffer, offset)
            end = perf_counter()
            moved = self.last_moved
        elif self._read_before:
            fast = self.read_at_into = self._fast_read_at_into()
            return fast(buffer, offset)
        else:
            start = perf_counter()
            try:
                self.last_moved = moved = count = preadv(self._fd, [buffer], offset)
            except OSError:
                if self._fd < 0:  # closed: -1 (PosixFile._release)
                    raise closed_file() from None
                raise
            end = perf_counter()
            self._read_before = True
        phase, file, extend, _, _ = self._trace
        extend(pack_event(OP_READ, phase, file, offset, moved, start, end))
        return count

    def _fast_read_at_into(self):
        """A buffered read_at_into as a closure over what it records: an attribute of an
        io.RawIOBase subclass costs ~15 ns more to look up than one of a plain object, and a read
        looks up several. It makes the one preadv PosixFile.read_at_into makes and times just
        that. It keeps `last_moved` current through the handle's __dict__, not the handle (which
        would then live until the garbage collector finds it); close() drops the closure. The
        descriptor is read from there too, not kept: a caller holding the closure past close()
        would otherwise read whatever file the kernel gave that number next; after close it is -1
        (PosixFile._release), and the read raises ValueError, as a closed Python file does."""
        phase, file, extend, _, _ = self._trace
        pack, state = pack_event, self.__dict__

        def read_at_into(buffer, offset: int) -> int:
            start = perf_counter()
            try:
                state["last_moved"] = count = preadv(state["_fd"], [buffer], offset)
            except OSError:
                if state["_fd"] < 0:
                    raise closed_file() from None
                raise
            end = perf_counter()
            extend(pack(OP_READ, phase, file, offset, count, start, end))
            return count

        return read_at_into

    def read_at(self, offset: int, size: int) -> bytes:
        start = perf_counter()
        data = PosixFile.read_at(self, offset, size)
        end = perf_counter()
        phase, file, extend, _, _ = self._trace
        extend(pack_event(OP_READ, phase, file, offset, self.last_moved, start, end))
        return data

    def write_at(self, data, offset: int) -> int:
        start = perf_counter()
        count = PosixFile.write_at(self, data, offset)
        end = perf_counter()
        phase, file, extend, _, _ = self._trace
        extend(pack_event(OP_WRITE, phase, file, offset, count, start, end))
        return count

    def writev(self, buffers) -> int:
        """One write event per writev (a partial one retried is one call more to the kernel, but
        rare enough on local files that one event keeps the count of the caller's calls)."""
        offset = self._position
        start = perf_counter()
        count = PosixFile.writev(self, buffers)
        end = perf_counter()
        phase, file, extend, _, _ = self._trace
        extend(pack_event(OP_WRITE, phase, file, offset, count, start, end))
        return count

    def write_stream(self, data) -> int:
        offset = self._position
        start = perf_counter()
        count = PosixFile.write_stream(self, data)
        end = perf_counter()
        phase, file, extend, _, _ = self._trace
        extend(pack_event(OP_WRITE, phase, file, offset, count, start, end))
        return count

    def fsync(self) -> None:
        start = perf_counter()
        PosixFile.fsync(self)
        end = perf_counter()
        phase, file, extend, _, _ = self._trace
        extend(pack_event(OP_FSYNC, phase, file, -1, 0, start, end))

    def close(self) -> None:
        """PosixFile.close (a staged handle publishes), recorded as the close; nothing is recorded
        when it raises (the handle is closed all the same)."""
        if self.closed:
            return
        self.__dict__.pop("read_at_into", None)
        start = perf_counter()
        PosixFile.close(self)
        end = perf_counter()
        # _record_close written out: a call less on every file
        phase, file, extend, recorder, events = self._trace
        extend(pack_event(OP_CLOSE, phase, file, -1, 0, start, end))
        if len(events) >= _events.COMPACT_EVENTS * EVENT_BYTES:
            recorder.compact()

    def __del__(self) -> None:
        """Collected unclosed (an exception path): what PosixFile does (a staged file is
        discarded, never published), but without a close event, as with the wrapper; silent, as
        io's own finalizer is, about what fails here (a handle that never finished opening)."""
        if getattr(self, "closed", True):
            return
        self.__dict__.pop("read_at_into", None)
        with suppress(Exception):
            if self._publish_as is not None:
                PosixFile.abort(self)
            else:
                PosixFile.close(self)


class TracedPosixFileC(TracedPosixFile):
    """TracedPosixFile with a buffered read and a plain handle's close in C (_trace_c.c): each one
    call, given the handle's trace tuple, that times the system call and appends its event, where
    Python makes five (two clock readings, the call, the packing, the append). The same events;
    O_DIRECT reads and a staged handle's close (a publish) go through TracedPosixFile. Only
    built where events._trace_c is.

    Nothing here is set on the handle beyond what PosixFile sets and `_trace`: an attribute found
    on the class instead, or the handle's __dict__ asked for, costs a type look-up or a dict made
    from the handle's values, and after a 1 MiB read's copy each such step runs from cold cache
    lines (TracedPosixFile's closure for the reads after the first is not worth it here: the C
    call already does what it saves)."""

    def read_at_into(self, buffer, offset: int) -> int:
        if self.direct:
            return TracedPosixFile.read_at_into(self, buffer, offset)
        try:
            self.last_moved = count = _read_into(self._trace, OP_READ, self._fd, buffer, offset)
        except OSError:  # as os.preadv's; a closed handle's -1 (EBADF) is told apart only here, at no cost before
            if self._fd < 0:
                raise closed_file() from None
            raise
        return count

    def close(self) -> None:
        """A buffered handle that publishes nothing has one descriptor to close: close(2), timed
        in C, then what io.RawIOBase.close does (PosixFile._release has nothing else to do for
        it). As there, the handle is closed even when close(2) fails, and nothing is recorded.
        close_fd returns the number of events in the bytearray, for the compaction check."""
        if self.direct or self._publish_as is not None or self.closed:
            return TracedPosixFile.close(self)
        fd, self._fd = self._fd, -1  # a closed handle's reads raise ValueError (PosixFile._release)
        try:
            count = _close_fd(self._trace, OP_CLOSE, fd)
        finally:
            _iobase_close(self)
        if count >= _events.COMPACT_EVENTS:
            self._trace[3].compact()


# bound once: io.RawIOBase.close through the module and the class is three look-ups a close
_iobase_close = io.RawIOBase.close

# The C functions TracedPosixFileC calls, bound once (None where the extension is not built).
_read_into, _close_fd = (None, None) if _events._trace_c is None else (_events._trace_c.read_into, _events._trace_c.close_fd)


def traced_posix_handle() -> type[PosixFile]:
    """What PosixStorage.traced_handle offers: TracedPosixFileC where the C extension is to be
    used (events._trace_c), else TracedPosixFile."""
    return TracedPosixFile if _events._trace_c is None else TracedPosixFileC


@dataclass(frozen=True)
class TracedStorage:
    """A storage backend whose every operation is recorded under the current phase."""

    inner: Any
    recorder: EventRecorder
    phase: str = "other"

    # Its handles are traced already: a TracedStorage is never wrapped again.
    traced_handle = None

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def root(self) -> str:
        return self.inner.root

    def with_phase(self, phase: str) -> "TracedStorage":
        return replace(self, phase=phase)

    def _opener(self, opener):
        """`opener`, one of the backend's, as this view's: a closure over what every handle of the
        view records with, built once per view (open_read and the like are cached properties that
        hold it), so an open is one Python call here, with no look-ups by name: the phase, with
        RAW_TIMES (handles append perf_counter readings as they are, no subtraction per event),
        the recorder's extender, its path -> index table, read without the lock (a path not there
        yet goes through `path_id`, which takes it; after the open, so a file that fails to open
        leaves no path), and the backend's `traced_handle`. Where the C extension is built
        (events._trace_c) and the backend has the hook, the opener is a builtin bound to the view
        (`opener`), whose one call does all of this: the open timed, the path's index (what
        path_id does then), the handle's `_trace` and the open event, exactly as here.

        `traced_handle`, the hook every backend declares (storage/base.py; None: none): a handle
        class whose instances record their own events, which the backend's open_read / open_write / open_staged build when given it
        as their second argument (`handle_class`), and which gets the trace tuple (phase, path
        index, extend, recorder, events: the bytearray extend appends to) as `_trace` right after
        opening. Its events must be exactly a TracedFile's; where it is None (S3),
        handles are wrapped. A backend subclass that overrides an opener overrides this too."""
        recorder = self.recorder
        phase, extend, paths = PHASE_CODE[self.phase] | RAW_TIMES, recorder.extender(), recorder.path_table()
        traced_handle, trace_c, events = self.inner.traced_handle, _events._trace_c, extend.__self__
        path_id = recorder.path_id

        def open_traced(path: str):
            start = perf_counter()
            handle = opener(path) if traced_handle is None else opener(path, traced_handle)
            end = perf_counter()
            index = paths.get(path)
            if index is None:
                index = path_id(path)
            extend(pack_event(OP_OPEN, phase, index, -1, 0, start, end))
            trace = (phase, index, extend, recorder, events)
            if traced_handle is None:
                return TracedFile(handle, path, trace)
            handle._trace = trace
            return handle

        if trace_c is None or traced_handle is None:
            return open_traced
        # the same in C, with no Python frame (nor functools.partial) around it
        return trace_c.opener((opener, traced_handle, paths, recorder.path_window(), phase, extend, recorder, events, OP_OPEN,
                               "_trace"))

    @cached_property
    def open_read(self):
        """open_read(path): the backend's, traced (`_opener`)."""
        return self._opener(self.inner.open_read)

    @cached_property
    def open_write(self):
        """open_write(path): the backend's, traced (`_opener`)."""
        return self._opener(self.inner.open_write)

    @cached_property
    def open_staged(self):
        """open_staged(path): the backend's commit primitive, traced (`_opener`); its publish step
        is traced as the handle's close."""
        return self._opener(self.inner.open_staged)

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

    @property
    def rename(self):
        """`rename(source, target)` traced as one rename of `source`, where the backend has one
        (POSIX); absent otherwise, so callers can tell (hasattr)."""
        inner = getattr(self.inner, "rename", None)
        if inner is None:
            raise AttributeError("rename")
        return lambda source, target: self._meta("rename", source, inner, source, target)

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

    def fsync_dir(self, path: str) -> None:
        """fsync folder `path` (POSIX only: capability fsync), so the entries created or renamed in
        it are durable (storage/durable.py: what a commit depends on). Traced as an fsync of the
        folder, as darshan-runtime sees the fsync of a folder's descriptor."""
        self._meta("fsync", path, self.inner.fsync_dir, path)

    # Operations below are bookkeeping on folders; they are not data I/O and are not traced.
    def makedirs(self, path: str) -> None:
        self.inner.makedirs(path)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """An advisory claim (engine/generate.py): bookkeeping, not the emulated program's I/O,
        so not traced (as makedirs)."""
        return self.inner.create_exclusive(path, data)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def isdir(self, path: str) -> bool:
        return self.inner.isdir(path)

    def free_bytes(self, path: str) -> int | None:
        return self.inner.free_bytes(path)

    def uri(self, path: str) -> str:
        return self.inner.uri(path)

    def check(self) -> None:
        self.inner.check()

    def write_atomic(self, path: str, data: bytes) -> None:
        """All or nothing through the backend's commit primitive; traced as open, write, fsync, close."""
        write_staged(self, path, data)

    def read_whole(self, path: str) -> bytes:
        handle = self.open_read(path)
        try:
            return handle.read_at(0, handle.size())
        finally:
            handle.close()
