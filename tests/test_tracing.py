"""The tracing wrapper's hot paths: every call of a traced handle is one exact event, also when
threads read at once and the recorder moves its events into numpy chunks meanwhile."""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

from dlio_ckpt.storage import events as events_module
from dlio_ckpt.storage.events import OP_CODE, PHASE_CODE, EventRecorder, JobClock
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.traced import TracedStorage


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
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work(path: str) -> None:
        buffer = bytearray(4096)
        for _ in range(rounds):
            handle = storage.open_read(path)
            for block in range(8):
                handle.read_at_into(buffer, block * 4096)
            handle.close()

    try:
        workers = [threading.Thread(target=work, args=(path,)) for path in files]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(previous)
    assert len(recorder._chunks) > 10  # the events really went through numpy chunks
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
