"""The Chrome trace written from event files a block at a time (issue 26, item 3).

The writer used to take every rank's events and path table whole (RankEvents.load): ~40 million
events and 10 million path strings a rank at 10 million files. It now reads each event file a
block at a time with only the paths that block names. The trace must be byte for byte the one the
old writer made (kept below, as it was, as the reference), and its memory must not grow with the
events and paths.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path
from typing import Iterator, Sequence, TextIO

import numpy as np
import pytest

from dlio_ckpt.storage import events as events_module
from dlio_ckpt.storage.events import OPS, PHASES, EventFile, EventRecorder, JobClock, RankEvents, iter_event_blocks
from dlio_ckpt.trace.chrome import write_chrome_trace
from varied_events import write_varied_run


# ---- the writer as it was before it streamed (dlio_ckpt/trace/chrome.py at 61b7924) ----------

def _old_metadata_events(rank: RankEvents) -> Iterator[dict]:
    yield {"name": "process_name", "ph": "M", "pid": rank.rank, "tid": 0,
           "args": {"name": f"rank {rank.rank} ({rank.hostname})"}}
    yield {"name": "process_sort_index", "ph": "M", "pid": rank.rank, "tid": 0, "args": {"sort_index": rank.rank}}
    for code, phase in enumerate(PHASES):
        yield {"name": "thread_name", "ph": "M", "pid": rank.rank, "tid": code, "args": {"name": phase}}
        yield {"name": "thread_sort_index", "ph": "M", "pid": rank.rank, "tid": code, "args": {"sort_index": code}}


def _old_slices(rank: RankEvents) -> Iterator[dict]:
    events = rank.events
    for first in range(0, len(events), 65536):
        chunk = events[first : first + 65536]
        for op, phase, file_index, offset, length, start, end in zip(
            chunk["op"].tolist(), chunk["phase"].tolist(), chunk["file"].tolist(), chunk["offset"].tolist(),
            chunk["length"].tolist(), chunk["start"].tolist(), chunk["end"].tolist(),
        ):
            args: dict = {"file": rank.paths[file_index]}
            if offset >= 0:
                args["offset"] = offset
            if OPS[op] in ("read", "write"):
                args["length"] = length
            yield {"name": OPS[op], "cat": PHASES[phase], "ph": "X", "ts": round(start * 1e6, 3),
                   "dur": round(max(end - start, 0.0) * 1e6, 3), "pid": rank.rank, "tid": phase, "args": args}


def _old_write_events(out: TextIO, ranks: Sequence[RankEvents]) -> None:
    separator = "\n"
    for rank in ranks:
        for source in (_old_metadata_events(rank), _old_slices(rank)):
            for event in source:
                out.write(separator)
                out.write(json.dumps(event, separators=(",", ":")))
                separator = ",\n"


def old_chrome_trace(path: Path, ranks: Sequence[RankEvents], metadata: dict | None = None) -> Path:
    with open(path, "w", encoding="utf-8") as out:
        out.write('{"displayTimeUnit":"ms","otherData":')
        out.write(json.dumps({"generator": "dlio_ckpt", **(metadata or {})}, default=str))
        out.write(',"traceEvents":[')
        _old_write_events(out, sorted(ranks, key=lambda r: r.rank))
        out.write("\n]}\n")
    return path


# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("block_rows", [7, 1 << 16])
def test_the_streamed_trace_is_the_old_writers_byte_for_byte(tmp_path, monkeypatch, block_rows):
    files = write_varied_run(tmp_path / "run", monkeypatch)
    monkeypatch.setattr(events_module, "EVENT_BLOCK_ROWS", block_rows)
    loaded = [RankEvents.load(path) for path in files]
    assert any(len(set(r.paths)) < len(r.paths) for r in [_raw(path) for path in files])  # a path indexed twice
    meta = {"jobid": 7, "nprocs": 3, "start_wall": 1.5}
    old = old_chrome_trace(tmp_path / "old.json", loaded, meta).read_bytes()
    new = write_chrome_trace(tmp_path / "new.json", list(reversed(files)), meta).read_bytes()
    assert new == old
    assert write_chrome_trace(tmp_path / "loaded.json", loaded, meta).read_bytes() == old
    trace = json.loads(new)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == sum(len(r.events) for r in loaded) == sum(EventFile(p).events.count for p in files)
    assert sum(e["args"]["length"] for e in slices if e["name"] == "read") == sum(
        int(r.events["length"][r.events["op"] == OPS.index("read")].sum()) for r in loaded)
    assert {e["args"]["file"] for e in slices} >= {"/data/é ü.npz", "/data/new\nline.npz"}
    assert not list(tmp_path.glob("*.partial"))


def _raw(path: Path) -> RankEvents:
    """An event file's path table as stored (before merged_paths folds a twice-indexed path)."""
    with np.load(path) as data:
        return RankEvents(0, "", 0.0, events_module.decoded_paths(data["path_bytes"], data["path_ends"]),
                          data["events"])


def test_blocks_give_every_event_once_with_the_paths_they_name(tmp_path, monkeypatch):
    files = write_varied_run(tmp_path / "run", monkeypatch, ranks=2)
    for path in files:
        whole = RankEvents.load(path)
        seen = []
        for block, names in iter_event_blocks(path, rows=5):
            assert 0 < len(block) <= 5 and set(names) == set(np.unique(block["file"]).tolist())
            seen.extend((int(row["op"]), float(row["start"]), names[int(row["file"])]) for row in block)
        assert seen == [(int(row["op"]), float(row["start"]), whole.paths[int(row["file"])]) for row in whole.events]


def _event_file(folder: Path, files: int) -> Path:
    """One rank's event file over `files` files: an open and a read of each."""
    rec = EventRecorder(0, JobClock.start(job_start_wall=1.0))
    for k in range(files):
        path = f"/dataset/train/part-{k // 1000:03d}/img_{k:07d}_of_{files:07d}.npz"
        rec.record("open", "train", path, -1, 0, k * 1e-4, k * 1e-4 + 1e-5)
        rec.record("read", "train", path, 0, 4096, k * 1e-4 + 1e-5, k * 1e-4 + 5e-5)
    return rec.save(folder, "node0")


def _peak_bytes(files: list[Path], out: Path) -> int:
    tracemalloc.start()
    try:
        write_chrome_trace(out, files)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_writers_memory_does_not_grow_with_the_events_and_paths(tmp_path, monkeypatch):
    monkeypatch.setattr(events_module, "EVENT_BLOCK_ROWS", 256)
    small = _event_file(tmp_path / "small", 500)
    large = _event_file(tmp_path / "large", 5_000)
    write_chrome_trace(tmp_path / "warm.json", [small])  # what the first call allocates once is not the writer's
    small_peak = _peak_bytes([small], tmp_path / "small.json")
    large_peak = _peak_bytes([large], tmp_path / "large.json")
    assert large_peak < 1.5 * small_peak, (small_peak, large_peak)  # the old writer: 8.1x (it held them all)
    assert sum(1 for line in open(tmp_path / "large.json") if '"ph":"X"' in line) == 10_000
    os.unlink(large)


def test_event_files_of_older_versions_and_without_events_give_the_old_trace(tmp_path, monkeypatch):
    """A unicode path table (versions before the byte table) is read by index as well; a rank that
    recorded nothing still gets its named process and threads."""
    files = write_varied_run(tmp_path / "run", monkeypatch, ranks=2)
    with np.load(files[1]) as data:
        arrays = {name: data[name] for name in data.files if name not in ("path_bytes", "path_ends")}
        paths = events_module.decoded_paths(data["path_bytes"], data["path_ends"])
    np.savez(files[1], **arrays, paths=np.array(paths))
    empty = EventRecorder(2, JobClock.start(job_start_wall=1.0)).save(tmp_path / "run" / "events", "node9")
    loaded = [RankEvents.load(path) for path in [*files, empty]]
    assert len(loaded[2].events) == 0 and loaded[1].paths == list(dict.fromkeys(paths))
    old = old_chrome_trace(tmp_path / "old.json", loaded).read_bytes()
    assert write_chrome_trace(tmp_path / "new.json", [*files, empty]).read_bytes() == old
    assert b'"rank 2 (node9)"' in old


def test_an_event_file_that_fails_part_way_leaves_no_trace(tmp_path, monkeypatch):
    files = write_varied_run(tmp_path / "run", monkeypatch, ranks=2)
    with np.load(files[1]) as data:
        arrays = {name: data[name] for name in data.files}
    arrays["events"]["file"][-1] = len(arrays["path_ends"]) + 3  # a path past the table, in the last block
    np.savez(files[1], **arrays)
    with pytest.raises(ValueError, match="past its"):
        write_chrome_trace(tmp_path / "trace.json", files)
    assert not list(tmp_path.glob("trace.json*"))
