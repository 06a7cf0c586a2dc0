"""The streamed Darshan writer (trace/darshan_stream.py, darshan_shared.py, darshan_spill.py):
the same log as the in-memory one, read from event files a block at a time, in memory that does
not grow with the number of files, and nothing left behind.

The reference is `encode_log(build_log_contents(...))`, the writer that held every record (kept for
this comparison); PyDarshan reads the streamed log back independently.
"""

from __future__ import annotations

import os
import random
import struct
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

darshan = pytest.importorskip("darshan")

from dlio_ckpt.storage import events as events_module  # noqa: E402
from dlio_ckpt.storage.events import (  # noqa: E402
    EVENT_DTYPE, OP_CODE, EventFile, EventRecorder, JobClock, RankEvents,
)
from dlio_ckpt.trace import darshan_spill, darshan_stream  # noqa: E402
from dlio_ckpt.trace import darshan_writer as writer_module  # noqa: E402
from dlio_ckpt.trace.darshan_check import check_log  # noqa: E402
from dlio_ckpt.trace.darshan_hash import darshan_hash  # noqa: E402
from dlio_ckpt.trace.darshan_spill import BucketSpill  # noqa: E402
from dlio_ckpt.trace.darshan_writer import JobInfo, build_log_contents, encode_log, write_darshan_log  # noqa: E402
from trace_events import JOB_START, Timeline  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from memory_per_file import darshan_event_file  # noqa: E402

HEADER = 1328


def job(nprocs: int, mpi: bool) -> JobInfo:
    return JobInfo(nprocs=nprocs, jobid=7, uid=0, start_wall=JOB_START, end_wall=JOB_START + 50.0, exe="python3 x",
                   hostnames=tuple(f"node{r}" for r in range(nprocs)), metadata={"run_id": "s"}, mpi=mpi)


def varied_ranks(root: Path, nprocs: int, seed: int = 5) -> list[RankEvents]:
    """Ranks that share a dataset (every rank reads every shared file, in its own order), where
    ranks 0 and 1 also share a file the others never touch, and each rank writes, fsyncs and
    renames its own files; a file first unlinked, one first renamed, one only stat'ed; files
    touched in an order other than their path index, first read before first opened elsewhere;
    the last rank has only metadata calls (no DXT trace, no heat map)."""
    rng = random.Random(seed)
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "ckpt").mkdir(parents=True, exist_ok=True)
    shared = [str(root / "data" / f"s{k}.bin") for k in range(6)]
    ranks = []
    for rank in range(nprocs):
        own = [str(root / "ckpt" / f"r{rank}-{k}.pt") for k in range(4)]
        pair = [str(root / "data" / "pair.bin")] if rank < 2 else []
        line = Timeline(rank, [*reversed(own), *shared, *pair, str(root / "ckpt" / "latest"), "rel/x.tmp"])
        index = {path: i for i, path in enumerate(line.paths)}
        if rank == nprocs - 1 and nprocs > 2:
            for path in shared:
                line.add("stat", "other", index[path])
                line.add("open", "train", index[path])
                line.add("close", "train", index[path])
            ranks.append(line.events())
            continue
        line.add("unlink", "other", index[own[0]])  # before anything: no record yet
        line.add("rename", "other", index[own[1]])  # likewise
        order = list(shared) + pair
        rng.shuffle(order)
        for path in order:
            line.add("stat", "train", index[path])
            line.add("open", "train", index[path])
        for path in reversed(order):  # first reads in another order than the opens
            for k in range(rng.randint(1, 5)):
                line.add("read", "train", index[path], rng.choice([0, 4096, 8192 + k]),
                         rng.choice([0, 100, 4096, 65536]), duration=rng.choice([0.001, 0.0003, 0.02]))
            line.add("seek", "train", index[path], 0)
            line.add("close", "train", index[path])
        for path in own:
            line.add("open", "checkpoint", index[path])
            for k in range(rng.randint(1, 4)):
                line.add("write", "checkpoint", index[path], k * 1024, 1024 + rank, duration=0.002)
            line.add("fsync", "checkpoint", index[path], duration=0.003)
            line.add("read", "restore", index[path], 0, 512)
            line.add("close", "checkpoint", index[path])
            line.add("rename", "checkpoint", index[path])
        line.add("unlink", "checkpoint", index[own[2]])
        line.add("stat", "other", index["rel/x.tmp"])
        line.overlapping("read", "train", index[shared[0]], 0, 10, line.t, line.t + 0.4)  # overlaps the next
        line.overlapping("read", "train", index[shared[0]], 10, 10, line.t + 0.1, line.t + 0.2)
        ranks.append(line.events())
    return ranks


def saved(ranks: list[RankEvents], folder: Path) -> list[Path]:
    """Each rank's events replayed into a recorder with a tiny path cache (so paths seen again get
    a second index, as in a long run) and saved as its event file."""
    files = []
    for rank in ranks:
        recorder = EventRecorder(rank=rank.rank, clock=JobClock(JOB_START, 0.0, JOB_START))
        from_codes = {code: name for name, code in events_module.OP_CODE.items()}
        phases = {code: name for name, code in events_module.PHASE_CODE.items()}
        for row in rank.events.tolist():
            op, phase, file, offset, length, start, end = row
            recorder.record(from_codes[op], phases[phase], rank.paths[file], offset, length, start, end)
        files.append(recorder.save(folder, rank.hostname))
    return files


@pytest.fixture
def small(monkeypatch):
    """Buckets, flushes and the recorder's blocks small enough that a tiny run spans many."""
    monkeypatch.setattr(darshan_spill, "BUCKET_BYTES", 512)
    monkeypatch.setattr(darshan_spill, "BUCKET_MAX_BYTES", 2048)
    monkeypatch.setattr(darshan_spill, "FLUSH_BYTES", 1500)
    monkeypatch.setattr(events_module, "COMPACT_EVENTS", 8)
    monkeypatch.setattr(events_module, "SPILL_ROWS", 16)
    monkeypatch.setattr(events_module, "PATH_CACHE", 4)
    monkeypatch.setattr(events_module, "PATH_BLOCK", 3)
    monkeypatch.setattr(darshan_stream, "EVENT_BLOCK", 5)
    monkeypatch.setattr(darshan_stream, "PATH_BLOCK", 3)
    monkeypatch.setattr(darshan_stream, "RECORD_BLOCK", 2)
    monkeypatch.setattr(writer_module.ZlibStreams, "BUFFER", 100)


def regions(data: bytes) -> dict[str, list[bytes]]:
    """Each region of a log decompressed, stream by stream, found from the header as the format
    lays it out (darshan-log-format.md): the name region's (offset, length) at byte 32, then the
    64 modules'."""
    check_log(data)  # a complete log, every stream inflating
    maps = struct.unpack_from("<130Q", data, 32)
    spans = {"names": maps[0:2], **{f"module {m}": maps[2 + 2 * m:4 + 2 * m] for m in range(64)}}
    out = {"job": [zlib.decompressobj().decompress(data[HEADER:])]}
    for name, (offset, length) in spans.items():
        if not length:
            continue
        streams, rest = [], data[offset:offset + length]
        while rest:
            inflater = zlib.decompressobj()
            streams.append(inflater.decompress(rest))
            rest = inflater.unused_data
        out[name] = streams
    return out


@pytest.mark.parametrize("nprocs,mpi", [(3, True), (3, False), (2, True), (1, True), (1, False)])
def test_the_streamed_log_is_the_in_memory_log_byte_for_byte(tmp_path, small, nprocs, mpi):
    ranks = varied_ranks(tmp_path / "fs", nprocs)
    files = saved(ranks, tmp_path / "events")
    reference = encode_log(build_log_contents([RankEvents.load(f) for f in files], job(nprocs, mpi)), job(nprocs, mpi))
    streamed = write_darshan_log(tmp_path / "s.darshan", files, job(nprocs, mpi)).read_bytes()
    from_memory = write_darshan_log(tmp_path / "m.darshan", ranks, job(nprocs, mpi)).read_bytes()
    assert regions(streamed) == regions(reference)
    assert streamed == reference
    assert from_memory == encode_log(build_log_contents(ranks, job(nprocs, mpi)), job(nprocs, mpi))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events", "fs", "m.darshan", "s.darshan"]


def test_the_comparison_sees_the_shared_files_and_second_indices(tmp_path, small):
    """What the byte comparison covers: reduced records, a file shared by two ranks named once,
    path tables with a path at two indices."""
    ranks = varied_ranks(tmp_path / "fs", 3)
    files = saved(ranks, tmp_path / "events")
    tables = [[p for _, block in EventFile(f).path_blocks() for p in block] for f in files]
    assert all(len(table) > len(set(table)) for table in tables[:2])  # second indices in the file
    report = darshan.DarshanReport(str(write_darshan_log(tmp_path / "s.darshan", files, job(3, True))), read_all=True)
    counters = report.records["POSIX"].to_df()["counters"]
    shared = counters[counters["rank"] == -1]
    data = tmp_path / "fs" / "data"
    assert sorted(shared["id"].tolist()) == sorted(darshan_hash(str(data / f"s{k}.bin")) for k in range(6))
    pair = counters[counters["id"] == darshan_hash(str(tmp_path / "fs" / "data" / "pair.bin"))]
    assert sorted(pair["rank"].tolist()) == [0, 1]
    assert list(report.name_records.values()).count(str(tmp_path / "fs" / "data" / "pair.bin")) == 1
    assert len(report.records["DXT_POSIX"].to_df()) == 2 * 11  # ranks 0, 1: 6 shared + pair + 4 own; rank 2 none


def test_exact_counters_of_a_known_input_read_back_by_pydarshan(tmp_path, small):
    """N files, each opened, read twice (4 KiB at 0 and 4096) and closed, from an event file."""
    n = 40
    recorder = EventRecorder(rank=0, clock=JobClock(JOB_START, 0.0, JOB_START))
    for i in range(n):
        path, t = f"/data/f{i:03d}.bin", 0.01 * i
        recorder.record("open", "train", path, -1, 0, t, t + 0.001)
        recorder.record("read", "train", path, 0, 4096, t + 0.002, t + 0.003)
        recorder.record("read", "train", path, 4096, 4096, t + 0.004, t + 0.006)
        recorder.record("close", "train", path, -1, 0, t + 0.007, t + 0.008)
    event_file = recorder.save(tmp_path / "events", "h")
    log = write_darshan_log(tmp_path / "one.darshan", [event_file], job(1, False))
    report = darshan.DarshanReport(str(log), read_all=True)
    counters = report.records["POSIX"].to_df()["counters"]
    fcounters = report.records["POSIX"].to_df()["fcounters"]
    assert counters["id"].tolist() == [darshan_hash(f"/data/f{i:03d}.bin") for i in range(n)]  # first-touch order
    assert set(counters["POSIX_OPENS"]) == {1} and set(counters["POSIX_READS"]) == {2}
    assert set(counters["POSIX_BYTES_READ"]) == {8192} and set(counters["POSIX_MAX_BYTE_READ"]) == {8191}
    assert set(counters["POSIX_CONSEC_READS"]) == {1} and set(counters["POSIX_SEQ_READS"]) == {1}
    assert set(counters["POSIX_SIZE_READ_1K_10K"]) == {2} and set(counters["POSIX_ACCESS1_ACCESS"]) == {4096}
    assert fcounters["POSIX_F_READ_TIME"].tolist() == pytest.approx([0.003] * n)
    assert fcounters["POSIX_F_OPEN_START_TIMESTAMP"].tolist() == pytest.approx([0.01 * i for i in range(n)])
    dxt = report.records["DXT_POSIX"].to_df()
    assert len(dxt) == n and all(len(r["read_segments"]) == 2 and len(r["write_segments"]) == 0 for r in dxt)
    assert dxt[7]["read_segments"]["offset"].tolist() == [0, 4096]
    assert report.metadata["job"]["run_time"] == pytest.approx(0.01 * (n - 1) + 0.008, abs=1e-6)


def one_rank_file(folder: Path, n: int) -> Path:
    """An event file of one rank whose N files each had an open, two 4 KiB reads and a close (the
    benchmark's input, benchmarks/memory_per_file.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    return darshan_event_file(folder, n)


def traced_peak(write, *args) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        write(*args)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def in_memory_writer(path: Path, files: list[Path], job_info: JobInfo) -> None:
    """The writer before streaming: every rank loaded, every record made, the log built whole."""
    ranks = [RankEvents.load(f) for f in files]
    path.write_bytes(encode_log(build_log_contents(ranks, job_info), job_info))


@pytest.mark.parametrize("write,holds_per_file", [(write_darshan_log, False), (in_memory_writer, True)])
def test_the_writer_holds_no_more_for_3k_files_than_for_300(tmp_path, monkeypatch, write, holds_per_file):
    """tracemalloc's peak while writing the log of 3k files against 300 (numpy's arrays are traced
    too): the streamed writer holds blocks and buckets of a fixed size (made small here, so that
    300 files fill them), so 10x the files may add a fifth at most (1.05x when written); the
    in-memory writer's peak grows with the files (this test's check that it can fail)."""
    monkeypatch.setattr(darshan_spill, "BUCKET_BYTES", 8 << 10)
    monkeypatch.setattr(darshan_spill, "BUCKET_MAX_BYTES", 32 << 10)
    monkeypatch.setattr(darshan_spill, "FLUSH_BYTES", 16 << 10)
    monkeypatch.setattr(darshan_spill, "MAX_BUCKETS", 16)
    monkeypatch.setattr(writer_module.ZlibStreams, "BUFFER", 8 << 10)
    monkeypatch.setattr(darshan_stream, "EVENT_BLOCK", 256)
    monkeypatch.setattr(darshan_stream, "PATH_BLOCK", 128)
    monkeypatch.setattr(darshan_stream, "RECORD_BLOCK", 32)
    peaks = {}
    for n in (30, 300, 3000):  # 30: a first run, for what is allocated once
        event_file = one_rank_file(tmp_path / f"e{n}", n)
        peaks[n] = traced_peak(write, tmp_path / f"{n}.darshan", [event_file], job(1, False))
    if holds_per_file:
        assert peaks[3000] > 5 * peaks[300]
    else:
        assert peaks[3000] < 1.2 * peaks[300]


def test_the_writers_sources_give_the_event_file_whole(tmp_path, small):
    """What the streamed writer reads of an event file (EventSource.of_file, through EventFile), in
    small blocks: every event in order, and the path table with its second indices."""
    ranks = varied_ranks(tmp_path / "fs", 2)
    [event_file, _] = saved(ranks, tmp_path / "events")
    loaded = RankEvents.load(event_file)
    with np.load(event_file) as data:
        events = data["events"]
    source = darshan_stream.EventSource.of_file(event_file)
    assert (source.rank, source.events) == (loaded.rank, len(events))
    blocks = list(source.event_blocks())
    assert {len(b) for b in blocks[:-1]} == {darshan_stream.EVENT_BLOCK} == {5}
    assert np.concatenate(blocks).tobytes() == events.tobytes()
    table = [p for block in source.path_blocks() for p in block]
    assert len(table) == source.paths
    assert list(dict.fromkeys(table)) == loaded.paths and len(table) > len(loaded.paths)


def test_bucket_spill_sorts_any_order_and_splits_big_buckets(tmp_path, monkeypatch):
    monkeypatch.setattr(darshan_spill, "BUCKET_BYTES", 256)
    monkeypatch.setattr(darshan_spill, "BUCKET_MAX_BYTES", 1024)
    monkeypatch.setattr(darshan_spill, "FLUSH_BYTES", 700)
    rng = np.random.default_rng(3)
    dtype = np.dtype([("key", "<u8"), ("then", "<u8")])
    rows = np.zeros(5000, dtype)
    rows["key"] = np.concatenate([rng.integers(0, 1 << 64, 4000, dtype=np.uint64), np.full(1000, 12345, np.uint64)])
    rows["then"] = rng.permutation(5000)
    with BucketSpill(dtype, "key", 1 << 64, 100, tmp_path, then="then") as spill:
        for start in range(0, 5000, 37):
            spill.add(rows[start:start + 37])
        chunks = list(spill.chunks())
        assert len(chunks) > 10
        assert sum(1 for c in chunks if 12345 in c["key"]) == 1  # one key's rows never split
        back = np.concatenate(chunks)
    expected = rows[np.lexsort((rows["then"], rows["key"]))]
    assert back.tobytes() == expected.tobytes()
    assert os.listdir(tmp_path) == []  # unlinked from the start


def test_a_failing_write_leaves_no_partial_log_and_no_temporary_file(tmp_path, small, monkeypatch):
    ranks = varied_ranks(tmp_path / "fs", 2)
    files = saved(ranks, tmp_path / "events")
    out = tmp_path / "out"
    out.mkdir()
    opened = []
    real = darshan_spill.tempfile.TemporaryFile

    def counting(*args, **kwargs):
        handle = real(*args, **kwargs)
        opened.append(handle)
        return handle

    monkeypatch.setattr(darshan_spill.tempfile, "TemporaryFile", counting)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer_module, "_write_body", broken)
    with pytest.raises(OSError):
        write_darshan_log(out / "x.darshan", files, job(2, True))
    assert os.listdir(out) == []
    assert opened and all(handle.closed for handle in opened)


def test_a_path_index_past_the_table_is_refused_in_one_line(tmp_path):
    rank = Timeline(0, ["/a"]).events()
    bad = RankEvents(rank=0, hostname="h", job_start_wall=JOB_START, paths=["/a"],
                     events=np.array([(OP_CODE["open"], 0, 3, -1, 0, 0.1, 0.2)], EVENT_DTYPE))
    del rank
    with pytest.raises(ValueError, match="^rank 0's events name a path its path table does not have$"):
        write_darshan_log(tmp_path / "x.darshan", [bad], job(1, False))
    assert os.listdir(tmp_path) == []


def test_an_event_file_from_before_the_byte_table_streams_too(tmp_path):
    """Event files whose path table is a numpy unicode array (`paths`) are read as RankEvents.load
    reads them."""
    ranks = varied_ranks(tmp_path / "fs", 1)
    legacy = tmp_path / "rank-00000.npz"
    np.savez(legacy, events=ranks[0].events, paths=np.array(ranks[0].paths, dtype=str),
             meta=np.array('{"rank": 0, "hostname": "node0", "job_start_wall": 1.0}'))
    reference = encode_log(build_log_contents([RankEvents.load(legacy)], job(1, False)), job(1, False))
    assert write_darshan_log(tmp_path / "l.darshan", [legacy], job(1, False)).read_bytes() == reference
