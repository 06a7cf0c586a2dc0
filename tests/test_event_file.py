"""The rank's event file and the recorder's memory per recorded file (storage/events.py).

The event file is read back here with numpy.load alone (the path table decoded by hand from its
bytes and ends), so the recorder's own reader is not what checks it; memory is checked as bytes
held (the recorder's buffers) and as tracemalloc's peak (numpy reports its arrays to it), never
as time.
"""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from dlio_ckpt.storage import events as events_module
from dlio_ckpt.storage.events import EVENT_BYTES, EVENT_DTYPE, EventRecorder, JobClock, RankEvents

# What a generated file leaves: open, write, fsync, close, stat (five events, one path).
FILE_OPS = (("open", -1, 0), ("write", 0, 64), ("fsync", -1, 0), ("close", -1, 0), ("stat", -1, 0))


def recorded(files: int, name=lambda i: f"/data/train/{i % 100:03d}/img_{i:08d}_of_{10**7}.raw") -> EventRecorder:
    recorder = EventRecorder(rank=3, clock=JobClock.start())
    for i in range(files):
        path = name(i)
        for k, (op, offset, length) in enumerate(FILE_OPS):
            recorder.record(op, "generate", path, offset, length, i + 0.1 * k, i + 0.1 * k + 0.05)
    return recorder


def read_independently(target) -> tuple[np.ndarray, list[str], dict]:
    """numpy.load of the file, the paths cut out of path_bytes at path_ends by hand."""
    with np.load(target, allow_pickle=False) as data:
        assert sorted(data.files) == ["events", "meta", "path_bytes", "path_ends"]
        events, blob, ends = data["events"], data["path_bytes"].tobytes(), data["path_ends"].tolist()
        meta = json.loads(str(data["meta"]))
    starts = [0] + ends[:-1]
    return events, [blob[a:b].decode("utf-8", "surrogatepass") for a, b in zip(starts, ends)], meta


# Non-ASCII (two-byte UTF-8) and an undecodable byte as os.fsdecode gives it (a lone surrogate).
ODD_NAMES = lambda i: ["/d/plain", "/d/é/ü-ß", "/d/bad-\udcff-byte", "", "/d/" + "x" * 300][i % 5] + f"/{i}"


@pytest.mark.parametrize("block", [3, 1 << 14])
def test_the_saved_file_read_by_numpy_gives_the_events_and_paths_recorded(tmp_path, monkeypatch, block):
    """Across path blocks (3: the table written in 4 blocks of paths) and in one block; the paths
    include non-ASCII and undecodable names, each exactly as recorded."""
    monkeypatch.setattr(events_module, "PATH_BLOCK", block)
    monkeypatch.setattr(events_module, "COMPACT_EVENTS", 7)  # several chunks joined
    recorder = recorded(11, ODD_NAMES)
    expected = recorder.array().copy()
    paths = list(recorder.paths)
    target = recorder.save(tmp_path / "events", "host-a")
    assert target.name == "rank-00003.npz" and sorted(p.name for p in target.parent.iterdir()) == [target.name]
    events, read_paths, meta = read_independently(target)
    assert events.dtype == EVENT_DTYPE and events.tobytes() == expected.tobytes() and len(events) == 55
    assert read_paths == paths == [ODD_NAMES(i) for i in range(11)]
    assert (meta["rank"], meta["hostname"]) == (3, "host-a")
    loaded = RankEvents.load(target)
    assert loaded.paths == paths and loaded.events.tobytes() == expected.tobytes()


def test_the_path_table_takes_a_byte_a_character_where_the_unicode_array_took_four(tmp_path):
    recorder = recorded(200)
    target = recorder.save(tmp_path, "h")
    with np.load(target) as data:
        path_bytes, path_ends = data["path_bytes"], data["path_ends"]
    characters = sum(len(p) for p in recorder.paths)
    assert path_bytes.nbytes == characters and path_ends.nbytes == 8 * 200
    assert np.array(recorder.paths, dtype=str).nbytes == 4 * 200 * max(map(len, recorder.paths)) > 3 * characters


def test_an_event_file_of_the_unicode_table_still_reads_as_it_did(tmp_path):
    """Run folders saved before the byte path table (a `paths` unicode array) read the same."""
    recorder = recorded(4, ODD_NAMES)
    events = recorder.array()
    np.savez(tmp_path / "rank-00003.npz", events=events, paths=np.array(recorder.paths, dtype=str),
             meta=np.array(json.dumps({"rank": 3, "hostname": "h", "job_start_wall": 1.5})))
    loaded = RankEvents.load(tmp_path / "rank-00003.npz")
    assert loaded.paths == recorder.paths and loaded.events.tobytes() == events.tobytes()


def test_a_recorder_without_events_saves_an_empty_table(tmp_path):
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    events, paths, _ = read_independently(recorder.save(tmp_path, "h"))
    assert len(events) == 0 and paths == []


@pytest.mark.parametrize("moved_pages", [False, True])
def test_the_recorder_holds_38_bytes_an_event_and_array_keeps_them_once(monkeypatch, moved_pages):
    """After N files: the buffers hold exactly 5 N events of 38 bytes, and spare room of at most
    the rows stored while a reallocation may copy (below 32 MiB), an eighth past that (here: from
    the start); array() leaves one array of them, the one it returns (read-only, since the
    recorder keeps it), and nothing else."""
    monkeypatch.setattr(events_module, "COMPACT_EVENTS", 64)
    if moved_pages:
        monkeypatch.setattr(events_module, "_COPYING_REALLOC_BYTES", 0)
    recorder = recorded(1000)
    assert recorder._stored * EVENT_BYTES + len(recorder._events) == 5000 * EVENT_BYTES
    assert recorder._stored == 5000 // 64 * 64
    spare = recorder._stored // 8 if moved_pages else recorder._stored
    assert recorder._store.nbytes <= (recorder._stored + spare + 2 * 64) * EVENT_BYTES
    events = recorder.array()
    assert events.base is recorder._store and len(recorder._events) == 0  # a view, not a copy
    assert events.nbytes == 5000 * EVENT_BYTES and not events.flags.writeable
    recorder.record("read", "train", "/x", 0, 1, 9.0, 9.5)
    again = recorder.array()
    assert len(again) == 5001 and again[:5000].tobytes() == events.tobytes() == recorded(1000).array().tobytes()


def test_array_and_save_add_at_most_a_block_to_the_memory_held(tmp_path, monkeypatch):
    """tracemalloc's peak above what the recorder held: array() (after 200 compactions) and saving
    add about a compaction's events and a block of paths, where one more copy of the events (228 KB) or the unicode path
    table (4 x 44 characters x 1,200 paths = 211 KB) would show."""
    monkeypatch.setattr(events_module, "COMPACT_EVENTS", 30)
    monkeypatch.setattr(events_module, "PATH_BLOCK", 64)
    tracemalloc.start()
    try:
        recorder = recorded(1200)
        events_bytes = 6000 * EVENT_BYTES
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        events = recorder.array()
        _, peak_array = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        held_after, _ = tracemalloc.get_traced_memory()
        recorder.save(tmp_path, "h", events)
        _, peak_save = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_array - held < events_bytes // 4
    assert peak_save - held_after < 40_000
    assert len(events) == 6000
