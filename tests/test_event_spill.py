"""A recorder's memory does not grow with the events and files it records (storage/event_spill.py):
past a block it spills them, and everything the run reports is computed from the blocks read back.

Memory is tracemalloc's count of what the recorder holds (numpy reports its arrays to it), never
time. The event file is read back with numpy.load alone (test_event_file.read_independently);
the figures from blocks are checked against the same functions given all events as one array.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from dlio_ckpt.analysis.run_inputs import checked_blocks, open_checked_events
from dlio_ckpt.errors import UserError
from dlio_ckpt.metrics import latency, summary
from dlio_ckpt.metrics.timing import UnionLength, busy_seconds
from dlio_ckpt.storage import events as events_module
from dlio_ckpt.storage.events import EVENT_BYTES, OPS, EventRecorder, JobClock, RankEvents
from test_event_file import FILE_OPS, read_independently


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 512 events and a cache of 256 paths, so a few thousand files spill many times."""
    monkeypatch.setattr(events_module, "COMPACT_EVENTS", 128)
    monkeypatch.setattr(events_module, "SPILL_ROWS", 512)
    monkeypatch.setattr(events_module, "PATH_CACHE", 256)


def record_files(recorder: EventRecorder, files: int, epochs: int = 1, keep: bool = True) -> list[tuple]:
    """What a generation then `epochs` - 1 read epochs leave: five events a file, each file's
    path new in each epoch's order; returns every event as (op, phase, path, offset, length,
    start, end), in order."""
    recorded = []
    for epoch in range(epochs):
        phase = "generate" if epoch == 0 else "train"
        for i in range(files):
            path = f"/data/train/{i % 100:03d}/img_{i:08d}_of_{10**7}.raw"
            at = epoch * files + i
            for k, (op, offset, length) in enumerate(FILE_OPS):
                event = (op, phase, path, offset, length, at + 0.1 * k, at + 0.1 * k + 0.05)
                recorder.record(*event)
                if keep:
                    recorded.append(event)
    return recorded


def held_after(files: int) -> int:
    tracemalloc.start()
    try:
        recorder = EventRecorder(rank=0, clock=JobClock.start())
        record_files(recorder, files, keep=False)
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def test_the_recorder_holds_no_more_for_100k_events_than_for_10k(small_blocks):
    """2,000 files (10k events) and 20,000 files (100k events): what the recorder holds differs by
    less than 60 KB (the cache filling to its 256 paths, 16 bytes per block spilled, numpy's cache of
    small allocations), where the events alone differ by 3.4 MB and a dict of the paths by ~3.5 MB."""
    few, many = held_after(2_000), held_after(20_000)
    assert many - few < 60_000, (few, many)
    assert 90_000 * EVENT_BYTES > 50 * 60_000


def test_the_event_file_of_a_spilled_run_is_every_event_recorded(tmp_path, small_blocks):
    """3,000 files, then a second epoch over them (the cache long past each path by then, so each
    path has a second index): the file read with numpy has every event in order, each naming its
    path; the recorder's reader merges the table to one entry a path."""
    recorder = EventRecorder(rank=2, clock=JobClock.start(), spill_dir=tmp_path)
    recorded = record_files(recorder, 3_000, epochs=2)
    assert recorder._spill.rows > 0 and recorder._spill.paths > 0  # it did spill, both
    assert recorder._stored < events_module.SPILL_ROWS + events_module.COMPACT_EVENTS
    assert list(tmp_path.iterdir()) == []  # the spill files are unlinked
    target = recorder.save(tmp_path / "events", "h")
    events, paths, meta = read_independently(target)
    assert meta["rank"] == 2 and len(events) == len(recorded) == 30_000
    assert len(paths) == 6_000  # each path twice: once per epoch
    got = [(OPS[e["op"]], events_module.PHASES[e["phase"]], paths[e["file"]], int(e["offset"]), int(e["length"]),
            float(e["start"]), float(e["end"])) for e in events]
    assert got == recorded
    loaded = RankEvents.load(target)
    assert len(loaded.paths) == len(set(loaded.paths)) == 3_000
    assert [loaded.paths[f] for f in loaded.events["file"]] == [event[2] for event in recorded]
    for name in ("op", "phase", "offset", "length", "start", "end"):
        assert loaded.events[name].tolist() == events[name].tolist()


def test_a_worker_recorder_sends_spilled_events_and_paths_once(small_blocks):
    """take_packed and paths_since after spills: every event once, the paths from where the last
    message stopped."""
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    record_files(recorder, 400)
    first = recorder.take_packed()
    sent = recorder.paths_since(0)
    record_files(recorder, 500)  # the same 400 paths again (some past the cache), then 100 new
    second = recorder.take_packed()
    more = recorder.paths_since(len(sent))
    assert len(first) == 2_000 * EVENT_BYTES and len(second) == 2_500 * EVENT_BYTES
    assert sent == [f"/data/train/{i % 100:03d}/img_{i:08d}_of_{10**7}.raw" for i in range(400)]
    rows = np.frombuffer(second, events_module.EVENT_DTYPE)
    table = sent + more
    assert [table[f] for f in rows["file"][::5]] == [f"/data/train/{i % 100:03d}/img_{i:08d}_of_{10**7}.raw"
                                                     for i in range(500)]
    assert recorder.take_packed() == b""


def test_a_worker_recorder_that_forgets_sent_paths_holds_none_per_file(small_blocks):
    """A worker's loop (engine/workers.py): a batch's events, the paths since the last message,
    then forget_paths. 20,000 files one batch of 8 at a time: each message's events name its own
    paths or earlier ones through the table the parent builds, and the recorder holds at most the
    cache (256 paths) where it held all 20,000."""
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    table: list[str] = []
    named: list[str] = []
    for first in range(0, 20_000, 8):
        for i in range(first, first + 8):
            path = f"/data/train/{i % 100:03d}/img_{i:08d}_of_{10**7}.raw"
            recorder.record("open", "train", path, -1, 0, float(i), float(i) + 0.5)
            recorder.record("read", "train", f"/data/train/{(i // 2) % 100:03d}/img_{i // 2:08d}_of_{10**7}.raw",
                            0, 4096, float(i), float(i) + 0.5)  # a path of an earlier batch, maybe cached
        rows = np.frombuffer(recorder.take_packed(), events_module.EVENT_DTYPE)
        table += recorder.paths_since(len(table))
        recorder.forget_paths()
        named += [table[f] for f in rows["file"]]
        assert len(recorder._window) == 1 and len(recorder._path_index) <= events_module.PATH_CACHE + 16
    assert named == [f"/data/train/{j % 100:03d}/img_{j:08d}_of_{10**7}.raw"
                     for i in range(20_000) for j in (i, i // 2)]
    assert recorder._spill.paths == 0  # forgotten, not spilled


def random_run(recorder: EventRecorder, n: int, seed: int) -> None:
    """Reads, writes and fsyncs of 4 threads' worth of overlapping calls, recorded as they end,
    and a few long calls in flight across many blocks."""
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.random(n) * 100)
    took = rng.exponential(0.05, n)
    took[rng.integers(0, n, 5)] = 30.0  # in flight across a third of the run
    ends = starts + took
    ops = rng.choice(["read", "write", "fsync", "open", "close"], n)
    phases = rng.choice(["train", "checkpoint"], n)
    for row in np.argsort(ends, kind="stable"):
        recorder.record(str(ops[row]), str(phases[row]), f"/f{row % 50}", 0, int(row % 7) * 4096,
                        float(starts[row]), float(ends[row]))


def test_figures_from_blocks_are_the_figures_of_all_events(small_blocks):
    """rank_io and rank_latency read block by block give the counts, bytes, histograms, min and
    max exactly, and mean, deviation and busy time to rounding, of the same functions given every
    event as one array."""
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    random_run(recorder, 6_000, seed=3)
    assert len(list(recorder.blocks())) > 5
    everything = recorder.array().copy()
    io_blocks, io_all = summary.rank_io(recorder.blocks()), summary.rank_io(everything)
    assert io_blocks.keys() == io_all.keys()
    for phase, figures in io_all.items():
        for key, value in figures.items():
            assert io_blocks[phase][key] == (pytest.approx(value, rel=1e-12) if key.endswith("_s") else value)
    lat_blocks, lat_all = latency.rank_latency(recorder.blocks()), latency.rank_latency(everything)
    assert {p: list(k) for p, k in lat_blocks.items()} == {p: list(k) for p, k in lat_all.items()}
    for phase, kinds in lat_all.items():
        for op, figures in kinds.items():
            got = lat_blocks[phase][op]
            assert got["bins"].tolist() == figures["bins"].tolist() and got["counts"].tolist() == figures["counts"].tolist()
            assert (got["count"], got["min_s"], got["max_s"]) == (figures["count"], figures["min_s"], figures["max_s"])
            for key in ("mean_s", "m2", "busy_s"):
                assert got[key] == pytest.approx(figures[key], rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_union_length_by_blocks_is_the_union_of_all(seed):
    """Random intervals in end order, cut into blocks of random sizes, each with the earliest
    start still to come: the same length as busy_seconds of all of them, and the periods carried
    stay few (only those a later block can reach)."""
    rng = np.random.default_rng(seed)
    n = 5_000
    starts = rng.random(n) * 50
    ends = starts + rng.exponential(0.02, n) * (1 + 500 * (rng.random(n) < 0.001))
    order = np.argsort(ends)
    starts, ends = starts[order], ends[order]
    cuts = np.sort(rng.choice(np.arange(1, n), 20, replace=False))
    union, carried = UnionLength(), []
    for first, last in zip([0, *cuts], [*cuts, n]):
        later = float(starts[last:].min()) if last < n else np.inf
        union.add(starts[first:last], ends[first:last], later)
        carried.append(len(union.starts))
    assert union.seconds() == pytest.approx(busy_seconds(starts, ends), rel=1e-12)
    assert max(carried[:-1]) < n // 10


def test_a_damaged_file_with_repeated_paths_is_refused_in_one_line(tmp_path, small_blocks):
    """Repeated paths and an event naming a file past the table: the analysis's checks name it."""
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    record_files(recorder, 300, epochs=2, keep=False)
    target = recorder.save(tmp_path / "run" / "events", "h")
    with np.load(target) as data:
        arrays = {name: data[name] for name in data.files}
    assert len(set(read_independently(target)[1])) < len(arrays["path_ends"])  # repeated paths
    arrays["events"]["file"][7] = len(arrays["path_ends"]) + 5
    np.savez(target, **arrays)
    files = open_checked_events(tmp_path / "run")  # the events are checked as they are read
    with pytest.raises(UserError, match="file numbers past its"):
        for events in files:
            for _ in checked_blocks(events):
                pass
