"""The C extension that records the traced POSIX handle's events (dlio_ckpt/storage/_trace_c.c):
built here, recording exactly what the pure-Python tracer records, on perf_counter's clock, with
os.preadv's and os.close's errors, and losing nothing when threads append at once."""

from __future__ import annotations

import errno
import os
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

from dlio_ckpt.storage import events as events_module
from dlio_ckpt.storage.events import (EVENT_BYTES, EVENT_DTYPE, OP_CLOSE, OP_OPEN, OP_READ, PHASE_CODE, RAW_TIMES,
                                      EventRecorder, JobClock)
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.traced import TracedPosixFile, TracedPosixFileC, TracedStorage, traced_posix_handle

from test_traced_posix import run_calls
from test_tracing import run_in_threads

trace_c = events_module._trace_c
PHASE = PHASE_CODE["train"] | RAW_TIMES


def test_the_extension_is_built_and_used():
    """An install with a compiler builds it (CI has gcc): a silent fallback to pure Python fails here."""
    from dlio_ckpt.storage import _trace_c

    assert trace_c is _trace_c
    assert traced_posix_handle() is TracedPosixFileC
    assert time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)"


def test_without_the_extension_or_with_another_clock_the_tracer_is_pure_python(monkeypatch):
    """An install without a compiler has no module to import; a perf_counter on another clock
    would not mix with the module's times. Either way the loader says None, and the tracer then
    builds pure-Python handles."""
    import dlio_ckpt.storage

    monkeypatch.setitem(sys.modules, "dlio_ckpt.storage._trace_c", None)  # importing it raises ImportError
    monkeypatch.delattr(dlio_ckpt.storage, "_trace_c")
    assert events_module._load_trace_c() is None
    monkeypatch.undo()
    assert events_module._load_trace_c() is trace_c
    other = SimpleNamespace(implementation="clock_gettime(CLOCK_MONOTONIC_RAW)")
    monkeypatch.setattr(time, "get_clock_info", lambda name: other)
    assert events_module._load_trace_c() is None
    monkeypatch.setattr(events_module, "_trace_c", None)
    assert traced_posix_handle() is TracedPosixFile


def a_trace(file: int = 3) -> tuple:
    """A trace tuple as TracedStorage builds it: (phase, file, extend, recorder, events)."""
    events = bytearray()
    return (PHASE, file, events.extend, None, events)


def unpacked(events: bytearray) -> list[tuple]:
    return [tuple(row) for row in np.frombuffer(bytes(events), EVENT_DTYPE).tolist()]


@pytest.fixture
def data_file(tmp_path):
    data = os.urandom(10_000)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    try:
        os.close(fd)
    except OSError:
        pass  # a test closed it


def test_the_c_and_the_pure_python_tracer_record_the_same_events_but_for_their_times(tmp_path, monkeypatch):
    """Every data call of run_calls (opens, reads first, second and later, short and empty,
    writes, fsync, closes plain and staged, abort), traced once with the C paths and once in pure
    Python: the packed events agree byte for byte, RAW_TIMES flags included, times aside."""
    packed, paths = {}, {}
    for name in ("c", "python"):
        if name == "python":
            monkeypatch.setattr(events_module, "_trace_c", None)
        folder = tmp_path / name
        folder.mkdir()
        recorder = EventRecorder(rank=0, clock=JobClock.start())
        run_calls(TracedStorage(PosixStorage(), recorder), folder)
        rows = np.frombuffer(bytes(recorder._events), EVENT_DTYPE).copy()
        assert (rows["start"] <= rows["end"]).all() and (rows["phase"] & RAW_TIMES).any()
        rows["start"] = rows["end"] = 0.0
        packed[name] = rows.tobytes()
        paths[name] = [path.rsplit("/", 1)[-1] for path in recorder.paths]
    assert len(packed["c"]) == 32 * EVENT_BYTES
    assert packed["c"] == packed["python"] and paths["c"] == paths["python"]


def test_an_open_in_c_adds_its_path_and_event_only_once_the_file_is_open(tmp_path):
    """open_traced, TracedStorage's open in C: a file that fails to open leaves no path and no
    event; a bad view is refused before the opener runs (no file created)."""
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    storage = TracedStorage(PosixStorage(), recorder).with_phase("checkpoint")
    with pytest.raises(FileNotFoundError):
        storage.open_read(str(tmp_path / "missing.bin"))
    assert recorder.paths == [] and len(recorder._events) == 0
    before = time.perf_counter()
    handle = storage.open_write(str(tmp_path / "w.bin"))
    after = time.perf_counter()
    handle.close()
    assert recorder.paths == [str(tmp_path / "w.bin")]
    assert handle._trace == (PHASE_CODE["checkpoint"] | RAW_TIMES, 0, recorder._events.extend, recorder, recorder._events)
    (op, phase, file, offset, length, start, end), close = unpacked(recorder._events)
    assert (op, phase, file, offset, length) == (OP_OPEN, PHASE_CODE["checkpoint"] | RAW_TIMES, 0, -1, 0)
    assert before <= start <= end <= after and close[0] == OP_CLOSE
    opened = []
    view = (lambda path, handle_class: opened.append(path), TracedPosixFileC, {}, [], PHASE, None, None, b"", OP_OPEN,
            "_trace")
    with pytest.raises(TypeError, match="bytearray"):
        trace_c.opener(view)
    with pytest.raises(TypeError, match="view must be"):
        trace_c.opener(view[:9])
    with pytest.raises(ValueError, match="op must be in 0..255"):
        trace_c.opener(view[:7] + (bytearray(), 256, "_trace"))
    open_traced = trace_c.opener(view[:7] + (bytearray(), OP_OPEN, "_trace"))
    with pytest.raises(TypeError, match="takes 1 arguments"):
        open_traced(str(tmp_path / "never.bin"), TracedPosixFileC)
    assert opened == []


def test_a_bad_trace_or_op_is_refused_before_any_io(data_file):
    fd, _ = data_file
    buffer = bytearray(b"\0" * 16)
    events = bytearray()
    for trace, op, error in (((PHASE, 0, None, None, b"not a bytearray"), OP_READ, TypeError),
                             ((PHASE, 0, None, events), OP_READ, TypeError),  # four items
                             ([PHASE, 0, None, None, events], OP_READ, TypeError),  # a list
                             ((PHASE, -1, None, None, events), OP_READ, OverflowError),
                             ((PHASE, 1 << 32, None, None, events), OP_READ, OverflowError),
                             ((256, 0, None, None, events), OP_READ, ValueError),
                             ((PHASE, 0, None, None, events), -1, ValueError)):
        with pytest.raises(error):
            trace_c.read_into(trace, op, fd, buffer, 0)
    assert buffer == bytearray(16) and events == bytearray()
    with pytest.raises(TypeError, match="takes 5 arguments"):
        trace_c.read_into((PHASE, 0, None, None, events), OP_READ, fd, buffer)
    os.fstat(fd)  # still open: close_fd refuses a bad trace before closing
    with pytest.raises(TypeError):
        trace_c.close_fd((PHASE, 0, None, None, None), OP_CLOSE, fd)
    os.fstat(fd)


def test_reads_whole_short_and_past_the_end_record_what_the_system_call_moved(data_file):
    fd, data = data_file
    trace = a_trace(file=9)
    buffer = bytearray(4096)
    view = memoryview(buffer)
    got = [trace_c.read_into(trace, OP_READ, fd, buffer, 0)]
    assert bytes(buffer) == data[:4096]
    got.append(trace_c.read_into(trace, OP_READ, fd, view[10:110], 5000))
    assert bytes(buffer[10:110]) == data[5000:5100] and bytes(buffer[:10]) == data[:10]
    got.append(trace_c.read_into(trace, OP_READ, fd, buffer, 8192))  # short: the file ends
    assert bytes(buffer[: 10_000 - 8192]) == data[8192:]
    got += [trace_c.read_into(trace, OP_READ, fd, buffer, 10_000), trace_c.read_into(trace, OP_READ, fd, view[:0], 0)]
    assert got == [4096, 100, 10_000 - 8192, 0, 0]
    events = unpacked(trace[4])
    assert [(op, phase, file, offset, length) for op, phase, file, offset, length, _, _ in events] == \
        [(OP_READ, PHASE, 9, offset, moved) for offset, moved in zip((0, 5000, 8192, 10_000, 0), got)]
    assert all(start <= end for *_, start, end in events)


def test_c_times_are_perf_counter_readings(data_file):
    """The module reads perf_counter's clock itself: each event's start and end lie between
    perf_counter readings taken just before and after the call, so C and Python events share a
    timeline (the recorder shifts both onto the job clock alike); start and end are read on
    either side of the system call (which takes far longer than the clock's 1 ns steps)."""
    fd, _ = data_file
    trace = a_trace()
    bounds = []
    for offset in range(0, 10_000, 1000):
        before = time.perf_counter()
        trace_c.read_into(trace, OP_READ, fd, bytearray(1000), offset)
        bounds.append((before, time.perf_counter()))
    duplicate = os.dup(fd)
    before = time.perf_counter()
    assert trace_c.close_fd(trace, OP_CLOSE, duplicate) == 11  # the events the bytearray holds now
    bounds.append((before, time.perf_counter()))
    events = unpacked(trace[4])
    assert len(events) == len(bounds) == 11
    for (*_, start, end), (before, after) in zip(events, bounds):
        assert before <= start < end <= after


def test_errors_are_os_errors_with_their_errno_and_record_nothing(data_file):
    fd, _ = data_file
    trace = a_trace()
    read, write = os.pipe()
    try:
        for bad_fd, code in ((read, errno.ESPIPE), (1 << 20, errno.EBADF), (-1, errno.EBADF)):
            with pytest.raises(OSError) as raised:
                os.preadv(bad_fd, [bytearray(10)], 0)
            assert raised.value.errno == code
            with pytest.raises(type(raised.value)) as c_raised:
                trace_c.read_into(trace, OP_READ, bad_fd, bytearray(10), 0)
            assert c_raised.value.errno == code
        with pytest.raises(OSError) as raised:
            trace_c.read_into(trace, OP_READ, fd, bytearray(10), -1)
        assert raised.value.errno == errno.EINVAL
        with pytest.raises(OSError) as raised:
            trace_c.close_fd(trace, OP_CLOSE, 1 << 20)
        assert raised.value.errno == errno.EBADF
    finally:
        os.close(read)
        os.close(write)
    assert trace[4] == bytearray()


def test_a_buffer_it_cannot_write_is_refused_as_os_preadv_refuses_it(data_file):
    fd, _ = data_file
    trace = a_trace()
    for buffer in (b"0123456789", memoryview(b"0123456789"), memoryview(bytearray(10)).toreadonly()):
        with pytest.raises(BufferError) as raised:
            os.preadv(fd, [buffer], 0)
        with pytest.raises(BufferError, match=str(raised.value)):
            trace_c.read_into(trace, OP_READ, fd, buffer, 0)
    with pytest.raises(TypeError):
        trace_c.read_into(trace, OP_READ, fd, "0123456789", 0)
    strided = np.zeros((4, 4), np.uint8)[:, 1]  # not contiguous
    with pytest.raises(Exception) as raised:
        os.preadv(fd, [strided], 0)
    with pytest.raises(type(raised.value), match=str(raised.value)):
        trace_c.read_into(trace, OP_READ, fd, strided, 0)
    assert trace[4] == bytearray()
    grown = bytearray(10)
    assert trace_c.read_into(trace, OP_READ, fd, np.frombuffer(grown, np.uint8), 0) == 10  # a writable array is fine
    assert len(trace[4]) == EVENT_BYTES


def test_an_events_bytearray_with_a_view_open_is_refused_and_the_read_is_returned_nowhere(data_file):
    """The append cannot grow a bytearray someone holds a view of (extend cannot either): the
    call raises BufferError; the recorder never holds such a view while handles append."""
    fd, _ = data_file
    trace = a_trace()
    with memoryview(trace[4]):
        with pytest.raises(BufferError):
            trace_c.read_into(trace, OP_READ, fd, bytearray(10), 0)
    assert trace_c.read_into(trace, OP_READ, fd, bytearray(10), 0) == 10 and len(trace[4]) == EVENT_BYTES
    full = bytearray(2000)  # allocated to its size: the append must grow it first (by 7/8), and cannot
    with memoryview(full):
        with pytest.raises(BufferError):
            trace_c.read_into(a_trace()[:4] + (full,), OP_READ, fd, bytearray(10), 0)
    assert full == bytearray(2000)


def test_the_events_bytearray_grows_by_seven_eighths_and_holds_exactly_its_events(data_file):
    """bytearray.extend grows a bytearray by 1/8, copying what it holds ~8 times over on the way to
    COMPACT_EVENTS events; the C append grows it by 7/8 past 1 KiB (one copy or so). Counted by the
    allocation sys.getsizeof reports: far fewer reallocations than extend makes for the same
    events, and the bytearray's length is always exactly its events, every one of them intact."""
    fd, data = data_file
    grown, extended = bytearray(), bytearray()
    trace = a_trace()[:4] + (grown,)
    sizes: dict[str, set[int]] = {"c": set(), "extend": set()}
    for index in range(5000):
        assert trace_c.read_into(trace, OP_READ, fd, bytearray(7), index) == 7
        extended.extend(grown[-EVENT_BYTES:])
        assert len(grown) == len(extended) == (index + 1) * EVENT_BYTES
        if len(grown) > 1024:
            sizes["c"].add(sys.getsizeof(grown))
            sizes["extend"].add(sys.getsizeof(extended))
    assert len(sizes["c"]) <= 12 < 40 <= len(sizes["extend"])
    assert grown == extended
    rows = np.frombuffer(bytes(grown), EVENT_DTYPE)
    assert rows["offset"].tolist() == list(range(5000)) and set(rows["length"].tolist()) == {7}


def test_a_closed_descriptor_is_closed_once_and_the_handle_is_closed_all_the_same(tracer_c_handle):
    handle, recorder = tracer_c_handle
    os.close(handle.fileno())  # someone else closed it: close(2) now fails
    with pytest.raises(OSError) as raised:
        handle.close()
    assert raised.value.errno == errno.EBADF and handle.closed
    handle.close()  # a no-op now
    assert [events_module.OPS[op] for op in recorder.array()["op"]] == ["open", "read"]


@pytest.fixture
def tracer_c_handle(tmp_path):
    (tmp_path / "h.bin").write_bytes(b"x" * 100)
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    handle = TracedStorage(PosixStorage(), recorder).open_read(str(tmp_path / "h.bin"))
    assert type(handle) is TracedPosixFileC
    assert handle.read_at_into(bytearray(10), 0) == 10
    return handle, recorder


def test_threads_appending_to_one_bytearray_lose_no_event(tmp_path):
    """Each thread reads its own file through read_into, all into one bytearray, with the GIL
    handed over as often as Python allows: every event is there, whole, once."""
    threads, reads = 4, 3000
    trace_events = bytearray()
    descriptors = []
    for index in range(threads):
        (tmp_path / f"t{index}.bin").write_bytes(bytes([index]) * 64)
        descriptors.append(os.open(tmp_path / f"t{index}.bin", os.O_RDONLY))

    def work(index: int) -> None:
        trace = (PHASE, index, trace_events.extend, None, trace_events)
        buffer = bytearray(8)
        for offset in range(reads):
            assert trace_c.read_into(trace, OP_READ, descriptors[index], buffer, offset % 64) == min(8, 64 - offset % 64)

    try:
        run_in_threads(work, list(range(threads)))
    finally:
        for fd in descriptors:
            os.close(fd)
    assert len(trace_events) == threads * reads * EVENT_BYTES
    rows = np.frombuffer(bytes(trace_events), EVENT_DTYPE)
    assert set(rows["op"].tolist()) == {OP_READ} and set(rows["phase"].tolist()) == {PHASE}
    for index in range(threads):
        mine = rows[rows["file"] == index]
        assert mine["offset"].tolist() == [offset % 64 for offset in range(reads)]  # in order, none lost
        assert (mine["length"] == np.minimum(8, 64 - mine["offset"])).all()


def test_threads_adding_paths_give_each_path_one_index(tmp_path):
    """path_index, what EventRecorder.path_id does here: threads adding overlapping sets of paths
    at once leave every path once in the list, at the index the table gives it and every caller
    got."""
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    got: list[dict] = [{} for _ in range(4)]

    def work(index: int) -> None:
        for number in range(2000):
            path = f"/data/{(number * (index + 1)) % 1500}.bin"
            got[index].setdefault(path, set()).add(recorder.path_id(path))

    run_in_threads(work, list(range(4)))
    assert len(recorder.paths) == len(set(recorder.paths)) == len(recorder.path_table())
    assert recorder.path_table() == {path: index for index, path in enumerate(recorder.paths)}
    for mine in got:
        assert all(indices == {recorder.path_table()[path]} for path, indices in mine.items())
    assert trace_c.path_index(recorder.path_table(), recorder.path_window(), "/elsewhere") == len(recorder.paths) - 1
    with pytest.raises(TypeError):
        trace_c.path_index(recorder.path_table(), tuple(recorder.path_window()), "/more")
    with pytest.raises(TypeError):  # the window starts with its first path's index
        trace_c.path_index(recorder.path_table(), recorder.path_window()[1:], "/more")
    # a window spilled up to index 1500 (EventRecorder._spill_paths): the next path is 1502
    assert trace_c.path_index({}, [1500, "/a"], "/b") == 1501 and trace_c.path_index({}, [1502], "/c") == 1502
