"""The traced POSIX handle (TracedPosixFile) records its own events; every other backend's handles
are wrapped (TracedFile). The same calls must give the same events either way, and the bytes the
events count must be the bytes on disk. Where the C extension is built (it is here: test_trace_c.py
checks), the handle is TracedPosixFileC; `tracer` runs a test both in C and in pure Python."""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from dlio_ckpt.storage import events as events_module
from dlio_ckpt.storage import traced as traced_module
from dlio_ckpt.storage.events import OPS, PHASES, EventRecorder, JobClock
from dlio_ckpt.storage.posix import PosixFile, PosixStorage
from dlio_ckpt.storage.traced import TracedFile, TracedPosixFile, TracedPosixFileC, TracedStorage


@pytest.fixture(params=["c", "python"])
def tracer(request, monkeypatch) -> str:
    """The tracer's C paths (the default where the extension is built), or its pure-Python ones:
    events._trace_c is the one switch, read as views, handles and paths are made."""
    if request.param == "python":
        monkeypatch.setattr(events_module, "_trace_c", None)
    else:
        assert events_module._trace_c is not None
    return request.param


@dataclass(frozen=True)
class WrappedPosix(PosixStorage):
    """POSIX without the hook: TracedStorage wraps its handles, as it does S3's."""

    traced_handle = None


def o_direct_works(folder) -> bool:
    """tmpfs and some overlay file systems refuse O_DIRECT."""
    probe = folder / "probe.bin"
    probe.write_bytes(b"\0" * 4096)
    try:
        handle = PosixStorage(direct_io=True).open_read(str(probe))
    except OSError:
        return False
    try:
        return handle.direct and handle.read_at_into(bytearray(4096), 0) == 4096
    except OSError:
        return False
    finally:
        handle.close()
        probe.unlink()


def run_calls(storage: TracedStorage, folder) -> dict:
    """Every data call of a handle, in the ways the engine, the formats and write_atomic make
    them; returns what the reads returned."""
    got = {}
    rng = np.random.default_rng(7)  # the same bytes for both ways of tracing
    parts = [rng.bytes(5000), rng.bytes(3000), rng.bytes(4096 * 3)]
    writer = storage.with_phase("generate").open_write(str(folder / "a.bin"))
    writer.write(parts[0])  # at the position, which moves
    writer.write_at(parts[1], 5000)  # explicit offset, position unchanged
    writer.seek(8000)
    writer.write(memoryview(parts[2]))
    writer.fsync()
    writer.close()
    data = b"".join(parts)
    reader = storage.with_phase("train").open_read(str(folder / "a.bin"))
    buffer = bytearray(4096)
    got["into"] = [reader.read_at_into(buffer, offset) for offset in (0, 4096, 100, 4096 * 4)]  # first, second, fast path, short
    got["at"] = [reader.read_at(10, 5000), reader.read_at(7, 0), reader.read_at(len(data) - 3, 100)]
    reader.seek(4096)
    got["readinto"] = reader.readinto(buffer)
    got["read"] = [reader.read(100), reader.read(), reader.read()]  # then the rest, then nothing
    reader.close()
    assert got["at"][0] == data[10:5010] and got["at"][2] == data[-3:] and got["read"][1] == data[8292:]
    staged = storage.with_phase("checkpoint").open_staged(str(folder / "b.bin"))
    staged.write(data[:4096])
    staged.fsync()
    assert not (folder / "b.bin").exists()  # published only by close
    staged.close()
    dropped = storage.with_phase("checkpoint").open_staged(str(folder / "c.bin"))
    dropped.write(b"never published")
    dropped.abort()
    dropped.abort()  # a no-op, as is close after abort
    dropped.close()
    storage.with_phase("checkpoint").write_atomic(str(folder / "d.json"), b'{"step": 1}')
    got["whole"] = storage.with_phase("restore").read_whole(str(folder / "d.json"))
    return got


def calls_of(recorder: EventRecorder) -> list[tuple]:
    events = recorder.array()
    return [(OPS[e["op"]], PHASES[e["phase"]], recorder.paths[e["file"]].rsplit("/", 1)[-1], int(e["offset"]), int(e["length"]))
            for e in events]


@pytest.mark.parametrize("direct", [False, True])
def test_the_traced_posix_handle_records_what_the_wrapper_records(tmp_path, direct, tracer):
    if direct and not o_direct_works(tmp_path):
        pytest.skip("no O_DIRECT here")
    results, calls = {}, {}
    for name, backend in (("in_handle", PosixStorage(direct_io=direct)), ("wrapped", WrappedPosix(direct_io=direct))):
        folder = tmp_path / name
        folder.mkdir()
        recorder = EventRecorder(rank=0, clock=JobClock.start())
        storage = TracedStorage(backend, recorder)
        handle = storage.open_write(str(folder / "kind.bin"))
        in_handle = TracedPosixFileC if tracer == "c" else TracedPosixFile
        assert type(handle) is (in_handle if name == "in_handle" else TracedFile)
        handle.abort()
        results[name] = run_calls(storage, folder)
        calls[name] = calls_of(recorder)[1:]  # the probe's open
        assert sorted(os.listdir(folder)) == ["a.bin", "b.bin", "d.json"]  # abort left nothing, not even a temporary file
        on_disk = {file: (folder / file).stat().st_size for file in ("a.bin", "b.bin", "d.json")}
        written = {}
        for op, _, file, _, length in calls[name]:
            if op == "write":
                written[file] = written.get(file, 0) + length
        assert written == {**on_disk, "c.bin": len(b"never published")}
    assert results["in_handle"] == results["wrapped"]
    assert calls["in_handle"] == calls["wrapped"]
    size = 5000 + 3000 + 4096 * 3
    # buffered: what each call returned; O_DIRECT: the whole blocks the kernel moved, up to the file's end
    blocks = (lambda offset, length: min(-(-(offset + length) // 4096) * 4096, size) - offset // 4096 * 4096) if direct \
        else (lambda offset, length: max(min(length, size - offset), 0))
    reads = [(0, 4096), (4096, 4096), (100, 4096), (4096 * 4, 4096), (10, 5000), (7, 0), (size - 3, 100), (4096, 4096),
             (8192, 100), (8292, size - 8292), (size, 0)]
    expected = [("open", "generate", "a.bin", -1, 0), ("write", "generate", "a.bin", 0, 5000), ("write", "generate", "a.bin", 5000, 3000),
                ("write", "generate", "a.bin", 8000, 4096 * 3), ("fsync", "generate", "a.bin", -1, 0), ("close", "generate", "a.bin", -1, 0),
                ("open", "train", "a.bin", -1, 0)]
    expected += [("read", "train", "a.bin", offset, blocks(offset, length) if length else 0) for offset, length in reads]
    expected += [("close", "train", "a.bin", -1, 0)]
    expected += [(op, "checkpoint", "b.bin", offset, length) for op, offset, length in
                 (("open", -1, 0), ("write", 0, 4096), ("fsync", -1, 0), ("close", -1, 0))]
    expected += [("open", "checkpoint", "c.bin", -1, 0), ("write", "checkpoint", "c.bin", 0, 15)]  # abort: no close
    expected += [(op, "checkpoint", "d.json", offset, length) for op, offset, length in
                 (("open", -1, 0), ("write", 0, 11), ("fsync", -1, 0), ("close", -1, 0))]
    expected += [("open", "restore", "d.json", -1, 0), ("read", "restore", "d.json", 0, 11),
                 ("close", "restore", "d.json", -1, 0)]
    assert calls["in_handle"] == expected


def test_reads_past_the_first_keep_last_moved_and_the_handle_keeps_only_what_it_needs(tmp_path, tracer):
    """In pure Python a closure takes over from the second read and goes with the close (no cycle
    left through the handle's __dict__). The C handle has no closure: it holds a PosixFile's
    attributes and `_trace`, nothing else, as every other attribute would be looked up on the
    class or in a dict made for it, cold after each 1 MiB copy (TracedPosixFileC)."""
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(3 * 4096 + 100))
    handle = TracedStorage(PosixStorage(), EventRecorder(rank=0, clock=JobClock.start())).open_read(str(path))
    buffer = bytearray(4096)
    for offset, moved in ((0, 4096), (4096, 4096), (3 * 4096, 100), (4096, 4096)):
        assert handle.read_at_into(buffer, offset) == moved and handle.last_moved == moved
    if tracer == "python":
        assert "read_at_into" in vars(handle)  # the fast path took over
        handle.close()
        assert "read_at_into" not in vars(handle)
    else:
        with PosixStorage().open_read(str(path)) as plain:
            assert set(vars(handle)) == set(vars(plain)) | {"_trace"}
        handle.close()


def test_a_handle_collected_unclosed_records_no_close_and_publishes_nothing(tmp_path, monkeypatch, tracer):
    """As with the wrapper: an exception path drops the handle; its descriptors are closed, a
    staged file is discarded, and no close is recorded. A file that does not open leaves no event,
    no path and nothing printed at collection."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    storage = TracedStorage(PosixStorage(), recorder).with_phase("checkpoint")
    (tmp_path / "r.bin").write_bytes(b"x" * 8192)
    staged = storage.open_staged(str(tmp_path / "s.bin"))
    staged.write(b"partial")
    reader = storage.open_read(str(tmp_path / "r.bin"))
    for offset in (0, 4096, 0):
        reader.read_at_into(bytearray(10), offset)
    descriptors = [staged.fileno(), reader.fileno()]
    del staged, reader
    gc.collect()
    with pytest.raises(FileNotFoundError):
        storage.open_read(str(tmp_path / "missing.bin"))
    gc.collect()
    assert unraisable == []
    for fd in descriptors:
        with pytest.raises(OSError):
            os.fstat(fd)
    assert sorted(os.listdir(tmp_path)) == ["r.bin"]
    assert [OPS[op] for op in recorder.array()["op"]] == ["open", "write", "open", "read", "read", "read"]
    assert recorder.paths == [str(tmp_path / "s.bin"), str(tmp_path / "r.bin")]


def test_traced_times_are_the_clock_readings_on_the_job_clock_exactly(tmp_path, monkeypatch):
    """Handles append perf_counter readings as they are; the recorder takes the clock's shift off
    each, the one float64 subtraction JobClock.now() makes, so an event's times are what now()
    would have said at those readings, to the bit. (Pure Python, whose readings can be replaced;
    the C paths read the same clock themselves: test_trace_c.py.)"""
    monkeypatch.setattr(events_module, "_trace_c", None)
    readings = iter(np.linspace(987654.123456789, 987654.223456789, 12).tolist())
    taken = []

    def clock_reading() -> float:
        taken.append(next(readings))
        return taken[-1]

    monkeypatch.setattr(traced_module, "perf_counter", clock_reading)
    clock = JobClock.start(job_start_wall=12.5)
    recorder = EventRecorder(rank=0, clock=clock)
    (tmp_path / "f.bin").write_bytes(os.urandom(8192))
    handle = TracedStorage(PosixStorage(), recorder).open_read(str(tmp_path / "f.bin"))
    for offset in (0, 4096, 0, 4096):  # the first read, the second, the fast path
        handle.read_at_into(bytearray(4096), offset)
    handle.close()
    events = recorder.array()
    assert len(taken) == 2 * len(events) == 12
    times = np.column_stack([events["start"], events["end"]]).ravel()
    assert times.tolist() == [reading - clock.shift for reading in taken]


def test_the_recorder_keeps_an_event_in_38_bytes_and_any_offset_below_2_63_exactly(monkeypatch):
    from dlio_ckpt.storage import events as events_module

    monkeypatch.setattr(events_module, "COMPACT_EVENTS", 3)
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    top = (1 << 63) - 1
    recorder.record("read", "train", "/f", top, top - 1, 0.5, 0.75)
    recorder.record("write", "checkpoint", "/g", (1 << 53) + 1, 1, 1.0, 1.25)
    assert len(recorder._events) == 2 * events_module.EVENT_BYTES == 76
    recorder.record("unlink", "checkpoint", "/g", -1, 0, 2.0, 2.0)  # the third: compacted
    recorder.record("stat", "other", "/f", -1, 0, 3.0, 3.0)
    events = recorder.array()
    assert recorder._stored == 4 and events.dtype == events_module.EVENT_DTYPE
    assert events["offset"].tolist() == [top, (1 << 53) + 1, -1, -1] and events["length"].tolist() == [top - 1, 1, 0, 0]
    assert events["file"].tolist() == [0, 1, 1, 0] and events["start"].tolist() == [0.5, 1.0, 2.0, 3.0]
    assert [OPS[op] for op in events["op"]] == ["read", "write", "unlink", "stat"]
    assert [PHASES[phase] for phase in events["phase"]] == ["train", "checkpoint", "checkpoint", "other"]


def test_posix_handles_without_the_tracer_are_plain(tmp_path):
    """The hook costs the untraced path nothing: PosixStorage's openers still build PosixFile."""
    (tmp_path / "f.bin").write_bytes(b"x")
    handle = PosixStorage().open_read(str(tmp_path / "f.bin"))
    assert type(handle) is PosixFile
    handle.close()
