"""The tracing wrapper's hot paths: every call of a traced handle is one exact event, also when
threads read at once and the recorder moves its events into numpy chunks meanwhile."""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

from dlio_ckpt.storage import events as events_module
from dlio_ckpt.storage.events import OP_CODE, PHASE_CODE, EventRecorder, JobClock
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.traced import TracedStorage


def run_in_threads(work, arguments: list) -> None:
    """work(argument) in one thread per argument, all at once, with the GIL handed over as often
    as Python allows (a switch interval of 1 us), so that their appends interleave. What a thread
    raises (an assert in `work` included) is raised here once all have ended: a thread's own
    exception would otherwise only be printed, and the test would pass."""
    raised: list[BaseException] = []

    def guarded(argument) -> None:
        try:
            work(argument)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread below
            raised.append(exc)

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=guarded, args=(argument,)) for argument in arguments]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(previous)
    if raised:
        raise raised[0]


def test_what_a_thread_raises_fails_the_test():
    def work(index: int) -> None:
        assert index != 2, "thread 2 failed"

    with pytest.raises(AssertionError, match="thread 2 failed"):
        run_in_threads(work, [0, 1, 2, 3])


def test_each_call_of_a_traced_handle_is_one_event_with_its_offset_length_and_time(tmp_path):
    clock = JobClock.start(job_start_wall=0.0)  # an origin long ago: times are large, as on a real job
    recorder = EventRecorder(rank=0, clock=clock)
    storage = TracedStorage(PosixStorage(), recorder).with_phase("checkpoint")
    path = str(tmp_path / "f.bin")
    before = clock.now()
    handle = storage.open_write(path)
    assert handle.write_at(b"x" * 10, 0) == 10 and handle.write_at(b"y" * 6, 10) == 6
    handle.fsync()
    handle.close()
    reader = storage.with_phase("restore").open_read(path)
    buffer = bytearray(7)
    assert reader.read_at_into(buffer, 9) == 7 and bytes(buffer) == b"xyyyyyy"
    assert reader.read_at(0, 100) == b"x" * 10 + b"y" * 6
    reader.close()
    after = clock.now()
    events = recorder.array()
    ops = [events_module.OPS[code] for code in events["op"]]
    assert ops == ["open", "write", "write", "fsync", "close", "open", "read", "read", "close"]
    assert [events_module.PHASES[code] for code in events["phase"]] == ["checkpoint"] * 5 + ["restore"] * 4
    assert events["offset"].tolist() == [-1, 0, 10, -1, -1, -1, 9, 0, -1]
    assert events["length"].tolist() == [0, 10, 6, 0, 0, 0, 7, 16, 0]
    assert recorder.paths == [path] and set(events["file"].tolist()) == {0}
    assert np.all(events["start"] <= events["end"]) and np.all(np.diff(events["start"]) >= 0)
    assert before <= events["start"][0] and events["end"][-1] <= after


def test_threads_reading_through_traced_handles_lose_no_event_across_compactions(tmp_path, monkeypatch):
    monkeypatch.setattr(events_module, "COMPACT_EVENTS", 100)  # many compactions while threads append
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    storage = TracedStorage(PosixStorage(), recorder).with_phase("train")
    files = []
    for index in range(4):
        path = tmp_path / f"f{index}.bin"
        path.write_bytes(os.urandom(4096 * 8))
        files.append(str(path))
    rounds = 150

    def work(path: str) -> None:
        buffer = bytearray(4096)
        for _ in range(rounds):
            handle = storage.open_read(path)
            for block in range(8):
                handle.read_at_into(buffer, block * 4096)
            handle.close()

    run_in_threads(work, files)
    assert recorder._stored > 10 * 100  # the events really went through the numpy store, compacted > 10 times
    events = recorder.array()
    assert len(events) == 4 * rounds * 10
    for index, path in enumerate(files):
        mine = events[events["file"] == recorder.paths.index(path)]
        reads = mine[mine["op"] == OP_CODE["read"]]
        assert len(reads) == rounds * 8 and int(reads["length"].sum()) == rounds * 8 * 4096
        assert sorted(reads["offset"].tolist()) == sorted(list(range(0, 8 * 4096, 4096)) * rounds)
        assert int((mine["op"] == OP_CODE["open"]).sum()) == int((mine["op"] == OP_CODE["close"]).sum()) == rounds
        assert np.all(np.diff(mine["start"]) >= 0)  # one thread per file: its events stay in order
    assert set(events["phase"].tolist()) == {PHASE_CODE["train"]}
    assert recorder.bytes_read == {"train": 4 * rounds * 8 * 4096}


def test_reading_a_sample_through_a_window_makes_the_same_calls_as_fetching_it(tmp_path):
    """`read` (training) and `fetch` (verification) issue the same transfer-sized calls at the same
    offsets; `read` only does not keep the whole sample. A truncated file still raises."""
    from dlio_ckpt.formats.base import FileSpec, FormatOptions, Scratch
    from dlio_ckpt.formats.raw import RawFormat

    sample_bytes, transfer = 10_000, 4096  # 4096 + 4096 + 1808 per sample
    data = os.urandom(3 * sample_bytes)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    spec = FileSpec(index=0, path=str(path), num_samples=3, sample_bytes=sample_bytes)
    options = FormatOptions(transfer_size=transfer)
    calls = {}
    for how in ("read", "fetch"):
        recorder = EventRecorder(rank=0, clock=JobClock.start())
        storage = TracedStorage(PosixStorage(), recorder)
        reader = RawFormat().open(lambda suffix: storage.open_read(str(path) + suffix), spec, options, Scratch())
        if how == "read":
            assert reader.read(2) == sample_bytes and reader.read(0) == sample_bytes
        else:
            assert bytes(reader.fetch(2)) == data[2 * sample_bytes:]
            assert bytes(reader.fetch(0)) == data[:sample_bytes]
        reader.close()
        events = recorder.array()
        reads = events[events["op"] == OP_CODE["read"]]
        calls[how] = list(zip(reads["offset"].tolist(), reads["length"].tolist()))
    assert calls["read"] == calls["fetch"] == [(20_000, 4096), (24_096, 4096), (28_192, 1808),
                                               (0, 4096), (4096, 4096), (8192, 1808)]
    path.write_bytes(data[: 2 * sample_bytes + 5000])
    storage = TracedStorage(PosixStorage(), EventRecorder(rank=0, clock=JobClock.start()))
    reader = RawFormat().open(lambda suffix: storage.open_read(str(path) + suffix), spec, options, Scratch())
    with pytest.raises(EOFError, match="wanted 10000 bytes at offset 20000, the file ended after 5000"):
        reader.read(2)
    reader.close()


def test_o_direct_reads_whole_blocks_straight_into_a_page_aligned_scratch(tmp_path):
    """An aligned span into the readers' scratch needs no bounce buffer; an unaligned one still
    gets exactly its bytes, and both count what the kernel moved."""
    from dlio_ckpt.formats.base import Scratch

    data = os.urandom(5 * 4096 + 100)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    handle = PosixStorage(direct_io=True).open_read(str(path))
    if not handle.direct:
        pytest.skip("no O_DIRECT here")
    try:
        scratch = Scratch()
        view = scratch.view(2 * 4096)
        try:
            assert handle.read_at_into(view, 4096) == 8192
        except OSError:  # tmpfs and some overlay file systems refuse O_DIRECT
            pytest.skip("the file system refuses O_DIRECT")
        assert bytes(view) == data[4096:12288] and handle.last_moved == 8192
        assert handle._scratch is None  # no bounce buffer was needed
        tail = scratch.view(4096)
        assert handle.read_at_into(tail, 5 * 4096) == 100 and bytes(tail[:100]) == data[5 * 4096:]
        odd = bytearray(5000)
        assert handle.read_at_into(odd, 10) == 5000 and bytes(odd) == data[10:5010]
        assert handle.last_moved == 8192  # the two blocks around it
    finally:
        handle.close()


@pytest.mark.parametrize("direct", [False, True])
def test_every_read_of_a_traced_handle_counts_what_the_system_call_moved(tmp_path, direct):
    """A handle's first read, its second (which sets up the per-handle fast path) and later ones
    record the same thing: buffered, the bytes returned (short at the end of the file); under
    O_DIRECT, the whole blocks the kernel moved, which can exceed what was asked."""
    data = os.urandom(3 * 4096 + 100)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    storage = TracedStorage(PosixStorage(direct_io=direct), recorder).with_phase("train")
    handle = storage.open_read(str(path))
    if direct and not handle.direct:
        pytest.skip("no O_DIRECT here")
    buffer = bytearray(5000)
    got = []
    try:
        for offset in (10, 4000, 0, 3 * 4096):
            got.append(handle.read_at_into(buffer, offset))
            assert bytes(buffer[: got[-1]]) == data[offset : offset + got[-1]]
    except OSError:  # tmpfs and some overlay file systems refuse O_DIRECT
        pytest.skip("the file system refuses O_DIRECT")
    finally:
        handle.close()
    assert got == [5000, 5000, 5000, 100]
    reads = recorder.array()
    reads = reads[reads["op"] == OP_CODE["read"]]
    assert reads["offset"].tolist() == [10, 4000, 0, 3 * 4096]
    # O_DIRECT: blocks 0-1, 0-2, 0-1, then the last block, which the kernel ends at the file's end.
    assert reads["length"].tolist() == ([8192, 12288, 8192, 100] if direct else got)
    assert recorder.bytes_read == {"train": sum(reads["length"].tolist())}


def test_offsets_and_lengths_beyond_float_precision_stay_exact_through_compaction(monkeypatch):
    """Offsets and lengths are kept as int64, so one past float64's exact 2^53 (a sparse file, a
    huge object) goes through compaction unrounded."""
    monkeypatch.setattr(events_module, "COMPACT_EVENTS", 4)
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    huge = (1 << 53) + 1  # rounds to 2^53 in float64
    for index in range(10):
        recorder.record("write", "checkpoint", f"/f{index % 3}", huge + index, huge + 2 * index, 0.5 * index, 0.5 * index + 0.25)
    recorder.record("read", "restore", "/f1", 7, 4096, 6.0, 6.5)
    assert recorder._stored == 8  # compacted twice, 3 events left in the bytearray
    events = recorder.array()
    assert recorder._stored == 11 and len(recorder._events) == 0 and len(events) == 11  # stored, held once
    assert events["offset"].tolist() == [huge + i for i in range(10)] + [7]
    assert events["length"].tolist() == [huge + 2 * i for i in range(10)] + [4096]
    assert events["file"].tolist() == [0, 1, 2] * 3 + [0, 1]
    assert [events_module.OPS[c] for c in events["op"]] == ["write"] * 10 + ["read"]
    assert [events_module.PHASES[c] for c in events["phase"]] == ["checkpoint"] * 10 + ["restore"]
    assert events["start"].tolist() == [0.5 * i for i in range(10)] + [6.0]
    assert recorder.bytes_written == {"checkpoint": sum(huge + 2 * i for i in range(10))}


@pytest.mark.parametrize("huge_offset", [False, True])
def test_traced_handles_times_land_on_the_job_clock_through_compaction(tmp_path, monkeypatch, huge_offset):
    """Handles append perf_counter readings (RAW_TIMES) and the recorder takes the clock's shift
    off when it converts them, in a chunk and in the tail, next to events that `record` appended
    on the job clock already (with an offset past 2^53 too)."""
    monkeypatch.setattr(events_module, "COMPACT_EVENTS", 3)
    clock = JobClock.start(job_start_wall=time.time() - 100.0)  # a job that started 100 s ago
    recorder = EventRecorder(rank=0, clock=clock)
    storage = TracedStorage(PosixStorage(), recorder).with_phase("train")
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(4096 * 4))
    before = clock.now()
    handle = storage.open_read(str(path))
    buffer = bytearray(4096)
    for block in range(4):
        handle.read_at_into(buffer, block * 4096)
    handle.close()  # six events: compacted into a chunk
    again = storage.open_read(str(path))  # one more in the list, beside a `record`ed one
    after = clock.now()
    offset = (1 << 53) + 1 if huge_offset else 5
    recorder.record("write", "checkpoint", "/elsewhere", offset, 10, 1.25, 1.5)
    events = recorder.array()
    assert len(events) == 8  # six compacted, and a tail of two
    again.close()
    traced, recorded = events[:-1], events[-1]
    assert [events_module.OPS[c] for c in traced["op"]] == ["open", "read", "read", "read", "read", "close", "open"]
    assert set(traced["phase"].tolist()) == {events_module.PHASE_CODE["train"]} and set(traced["file"].tolist()) == {0}
    assert before <= traced["start"].min() and traced["end"].max() <= after and after > 100.0
    assert (traced["start"] <= traced["end"]).all()
    assert (recorded["op"], recorded["offset"], recorded["start"], recorded["end"]) == (OP_CODE["write"], offset, 1.25, 1.5)
