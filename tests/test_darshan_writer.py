"""The Darshan writer against PyDarshan: what it writes must come back, and mean what Darshan means."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

darshan = pytest.importorskip("darshan")

from dlio_ckpt.storage.events import OP_CODE  # noqa: E402
from dlio_ckpt.trace.darshan_hash import darshan_hash  # noqa: E402
from dlio_ckpt.trace.darshan_posix import POSIX_COUNTERS, POSIX_FCOUNTERS  # noqa: E402
from dlio_ckpt.trace.darshan_writer import (  # noqa: E402
    JobInfo,
    build_log_contents,
    darshan_log_name,
    write_darshan_log,
)
from cli_fork import run_module_forked  # noqa: E402
from trace_events import JOB_START, Timeline, two_rank_job  # noqa: E402

HASH_VECTORS = {
    "<STDIN>": 14734109647742566553,
    "<STDOUT>": 15920181672442173319,
    "<STDERR>": 7238257241479193519,
    "heatmap:POSIX": 16592106915301738621,
    "heatmap:MPIIO": 3668870418325792824,
    "heatmap:STDIO": 3989511027826779520,
    "/home/wkliao/Darshan/TEST/mpi-io-test.tmp.dat": 9347516096890457488,
}


def job_for(nprocs: int, mpi: bool = True) -> JobInfo:
    return JobInfo(nprocs=nprocs, jobid=4242, uid=os.getuid(), start_wall=JOB_START, end_wall=JOB_START + 30.0,
                   exe="/usr/bin/python3 -m dlio_ckpt workload=unet3d", hostnames=tuple(f"node{r}" for r in range(nprocs)),
                   metadata={"run_id": "test-run"}, mpi=mpi)


def frame(report, module: str, kind: str):
    return report.records[module].to_df()[kind]


def row(df, path: str, rank: int):
    match = df[(df["id"] == darshan_hash(path)) & (df["rank"] == rank)]
    assert len(match) == 1, f"expected one {path} record of rank {rank}"
    return match.iloc[0]


@pytest.mark.parametrize("name,expected", sorted(HASH_VECTORS.items()))
def test_record_id_hash_matches_real_logs(name, expected):
    assert darshan_hash(name) == expected


def test_counter_tables_match_pydarshan():
    from darshan.backend.cffi_backend import counter_names, fcounter_names

    assert list(POSIX_COUNTERS) == counter_names("POSIX")
    assert list(POSIX_FCOUNTERS) == fcounter_names("POSIX")


@pytest.fixture
def two_rank_log(tmp_path: Path):
    ranks = two_rank_job(tmp_path / "fs")
    job = job_for(2)
    log = write_darshan_log(tmp_path / "run.darshan", ranks, job)
    return ranks, job, log, darshan.DarshanReport(str(log), read_all=True)


def test_every_written_counter_comes_back(two_rank_log):
    ranks, job, _, report = two_rank_log
    contents = build_log_contents(ranks, job)
    counters, fcounters = frame(report, "POSIX", "counters"), frame(report, "POSIX", "fcounters")
    written = [record for records in contents.posix for record in records]
    assert len(counters) == len(written) == 5  # 1 shared + 2 private files per rank
    for record in written:
        back, fback = row(counters, record.name, record.rank), row(fcounters, record.name, record.rank)
        assert [int(back[name]) for name in POSIX_COUNTERS] == record.counters
        assert [float(fback[name]) for name in POSIX_FCOUNTERS] == record.fcounters


def test_bytes_and_operation_counts_equal_the_events(two_rank_log):
    ranks, _, _, report = two_rank_log
    counters = frame(report, "POSIX", "counters")
    events = np.concatenate([r.events for r in ranks])
    assert counters["POSIX_BYTES_READ"].sum() == events["length"][events["op"] == OP_CODE["read"]].sum()
    assert counters["POSIX_BYTES_WRITTEN"].sum() == events["length"][events["op"] == OP_CODE["write"]].sum()
    for op, counter in (("read", "POSIX_READS"), ("write", "POSIX_WRITES"), ("open", "POSIX_OPENS"),
                        ("fsync", "POSIX_FSYNCS"), ("stat", "POSIX_STATS"), ("rename", "POSIX_RENAME_SOURCES")):
        assert counters[counter].sum() == int((events["op"] == OP_CODE[op]).sum()), counter
    assert (counters["POSIX_SEEKS"] == 0).all()
    assert (counters["POSIX_MMAPS"] == -1).all()


def test_shared_file_is_reduced_like_the_runtime(two_rank_log, tmp_path):
    ranks, _, _, report = two_rank_log
    counters, fcounters = frame(report, "POSIX", "counters"), frame(report, "POSIX", "fcounters")
    shared = str(tmp_path / "fs" / "data" / "train.bin")
    assert sorted(counters[counters["id"] == darshan_hash(shared)]["rank"]) == [-1]  # no per-rank copies left
    c, f = row(counters, shared, -1), row(fcounters, shared, -1)
    assert (c["POSIX_OPENS"], c["POSIX_STATS"], c["POSIX_READS"]) == (2, 2, 18)
    assert c["POSIX_BYTES_READ"] == 2 * (7 * 65536 + 100)
    assert (c["POSIX_SEQ_READS"], c["POSIX_CONSEC_READS"]) == (7 + 8, 5 + 5)  # rank 1's first read is past byte 0
    assert c["POSIX_MAX_BYTE_READ"] == 4_999_999  # the 0-byte read at 5,000,000
    assert (c["POSIX_SIZE_READ_0_100"], c["POSIX_SIZE_READ_10K_100K"]) == (4, 14)
    assert [c[f"POSIX_ACCESS{i}_ACCESS"] for i in range(1, 5)] == [65536, 100, 0, 0]
    assert [c[f"POSIX_ACCESS{i}_COUNT"] for i in range(1, 5)] == [14, 2, 0, 0]
    # Strides: 3 x 64 KiB on both ranks, and each rank's jump to the end of file.
    assert [c[f"POSIX_STRIDE{i}_STRIDE"] for i in range(1, 5)] == [262144, 4_344_539, 3_344_539, 0]
    assert [c[f"POSIX_STRIDE{i}_COUNT"] for i in range(1, 5)] == [2, 1, 1, 0]
    alignment = c["POSIX_FILE_ALIGNMENT"]
    assert alignment == os.statvfs(tmp_path / "fs" / "data").f_bsize
    reads = [e for r in ranks for e in r.events if e["op"] == OP_CODE["read"] and e["file"] == 0]
    assert c["POSIX_FILE_NOT_ALIGNED"] == sum(1 for e in reads if e["offset"] % alignment)
    # Rank 1 spent longer on the file: it is the slowest, rank 0 the fastest.
    times = []
    for rank in ranks:
        mine = rank.events[rank.events["file"] == 0]
        times.append(float((mine["end"] - mine["start"]).sum()))
    assert (c["POSIX_FASTEST_RANK"], c["POSIX_SLOWEST_RANK"]) == (0, 1)
    assert c["POSIX_FASTEST_RANK_BYTES"] == c["POSIX_SLOWEST_RANK_BYTES"] == 7 * 65536 + 100
    assert f["POSIX_F_FASTEST_RANK_TIME"] == pytest.approx(times[0])
    assert f["POSIX_F_SLOWEST_RANK_TIME"] == pytest.approx(times[1])
    assert f["POSIX_F_VARIANCE_RANK_TIME"] == pytest.approx(np.var(times))
    assert f["POSIX_F_VARIANCE_RANK_BYTES"] == 0.0
    first_open = min(float(r.events[(r.events["op"] == OP_CODE["open"]) & (r.events["file"] == 0)]["start"][0]) for r in ranks)
    assert f["POSIX_F_OPEN_START_TIMESTAMP"] == first_open


def test_private_files_keep_their_rank_and_runtime_counters(two_rank_log, tmp_path):
    _, _, _, report = two_rank_log
    counters, fcounters = frame(report, "POSIX", "counters"), frame(report, "POSIX", "fcounters")
    for rank in (0, 1):
        shard = str(tmp_path / "fs" / "ckpt" / f"model-r{rank}.bin")
        c, f = row(counters, shard, rank), row(fcounters, shard, rank)
        assert (c["POSIX_OPENS"], c["POSIX_WRITES"], c["POSIX_READS"], c["POSIX_FSYNCS"]) == (2, 5, 1, 1)
        assert c["POSIX_BYTES_WRITTEN"] == 3 * 1_048_576 + 1024 + rank + 101
        assert (c["POSIX_SEQ_WRITES"], c["POSIX_CONSEC_WRITES"]) == (4, 3)
        assert c["POSIX_RW_SWITCHES"] == 2  # write -> read -> write, across a close and reopen
        assert c["POSIX_MAX_BYTE_WRITTEN"] == 3 * 1_048_576 + 1024 + rank - 1
        assert c["POSIX_MODE"] == 0o644
        assert c["POSIX_SIZE_WRITE_100K_1M"] == 3
        assert (c["POSIX_SIZE_WRITE_100_1K"], c["POSIX_SIZE_WRITE_1K_10K"]) == ((2, 0) if rank == 0 else (1, 1))
        assert [c[f"POSIX_ACCESS{i}_ACCESS"] for i in range(1, 4)] == [1_048_576, 1024 + rank, 101]
        assert [c[f"POSIX_ACCESS{i}_COUNT"] for i in range(1, 4)] == [4, 1, 1]
        assert (c["POSIX_MAX_WRITE_TIME_SIZE"], f["POSIX_F_MAX_WRITE_TIME"]) == (1_048_576, pytest.approx(0.004))
        assert f["POSIX_F_WRITE_TIME"] == pytest.approx(3 * 0.004 + 0.001 + 0.003 + 0.001)  # fsync included
        assert c["POSIX_FASTEST_RANK"] == 0 and f["POSIX_F_VARIANCE_RANK_TIME"] == 0.0  # shared-only fields
        manifest = row(counters, str(tmp_path / "fs" / "ckpt" / f"manifest-r{rank}.json.tmp"), rank)
        assert (manifest["POSIX_RENAME_SOURCES"], manifest["POSIX_FSYNCS"], manifest["POSIX_BYTES_WRITTEN"]) == (1, 1, 100)


def test_dxt_segments_equal_the_events(two_rank_log):
    ranks, _, _, report = two_rank_log
    records = report.records["DXT_POSIX"].to_df()
    names = report.name_records
    seen = 0
    for record in records:
        rank = ranks[record["rank"]]
        assert record["hostname"] == f"node{record['rank']}"
        file_index = [i for i, p in enumerate(rank.paths) if p == names[record["id"]]][0]
        mine = rank.events[rank.events["file"] == file_index]
        for op, key in (("write", "write_segments"), ("read", "read_segments")):
            expected = mine[mine["op"] == OP_CODE[op]]
            got = record[key]
            assert record[f"{op}_count"] == len(expected)
            if len(expected):
                assert got["offset"].tolist() == expected["offset"].tolist()
                assert got["length"].tolist() == expected["length"].tolist()
                assert got["start_time"].tolist() == expected["start"].tolist()
                assert got["end_time"].tolist() == expected["end"].tolist()
        seen += 1
    assert seen == 6  # every (rank, file) with data I/O, shared files not reduced


def test_heatmap_and_job_region(two_rank_log):
    ranks, job, _, report = two_rank_log
    heatmap = report.heatmaps["POSIX"]
    reads, writes = heatmap.to_df(ops=["read"]), heatmap.to_df(ops=["write"])
    assert reads.shape == writes.shape and reads.shape[0] == 2  # one row per rank, same bins
    events = np.concatenate([r.events for r in ranks])
    data = events[np.isin(events["op"], [OP_CODE["read"], OP_CODE["write"]]) & (events["length"] > 0)]
    for op, table in (("read", reads), ("write", writes)):
        total = int(events["length"][events["op"] == OP_CODE[op]].sum())
        assert abs(int(table.to_numpy().sum()) - total) <= len(data)  # each share is rounded once per bin
    meta = report.metadata
    assert meta["job"]["nprocs"] == 2 and meta["job"]["jobid"] == 4242 and meta["job"]["uid"] == os.getuid()
    assert meta["job"]["metadata"]["lib_ver"] == "3.5.0" and meta["job"]["metadata"]["writer"] == "dlio_ckpt"
    assert meta["job"]["metadata"]["run_id"] == "test-run"
    assert meta["exe"] == job.exe
    assert report.mounts  # at least one mount entry, or the exe would read back empty
    last_io = max(float(r.events["end"].max()) for r in ranks)
    assert meta["job"]["run_time"] == pytest.approx(last_io, abs=1e-6)


def test_common_values_track_only_the_first_32_distinct(tmp_path):
    line = Timeline(0, [str(tmp_path / "sizes.bin")])
    line.add("open", "checkpoint", 0)
    offset = 0
    for size in [*range(1, 41), *[40] * 10, *[7] * 5]:
        line.add("write", "checkpoint", 0, offset, size)
        offset += size
    job = job_for(1, mpi=False)
    log = write_darshan_log(tmp_path / "sizes.darshan", [line.events()], job)
    c = row(frame(darshan.DarshanReport(str(log), read_all=True), "POSIX", "counters"), str(tmp_path / "sizes.bin"), 0)
    # 40 was the 40th distinct size: never tracked, however often it came later.
    assert [c[f"POSIX_ACCESS{i}_ACCESS"] for i in range(1, 5)] == [7, 32, 31, 30]
    assert [c[f"POSIX_ACCESS{i}_COUNT"] for i in range(1, 5)] == [6, 1, 1, 1]
    assert c["POSIX_CONSEC_WRITES"] == 54 and c["POSIX_SEQ_WRITES"] == 54  # all but the first, at offset 0


def test_overlapping_reads_count_their_time_once(tmp_path):
    line = Timeline(0, [str(tmp_path / "f.bin")])
    line.overlapping("open", "train", 0, -1, 0, 0.05, 0.06)
    line.overlapping("read", "train", 0, 0, 10, 0.1, 0.3)
    line.overlapping("read", "train", 0, 10, 10, 0.2, 0.4)
    line.overlapping("read", "train", 0, 20, 10, 0.5, 0.6)
    log = write_darshan_log(tmp_path / "o.darshan", [line.events()], job_for(1, mpi=False))
    f = row(frame(darshan.DarshanReport(str(log), read_all=True), "POSIX", "fcounters"), str(tmp_path / "f.bin"), 0)
    assert f["POSIX_F_READ_TIME"] == pytest.approx(0.2 + 0.1 + 0.1)
    assert f["POSIX_F_MAX_READ_TIME"] == pytest.approx(0.2)


def test_single_rank_mpi_job_reduces_everything_and_name_follows_runtime(tmp_path):
    line = Timeline(0, [str(tmp_path / "one.bin")])
    line.add("open", "train", 0)
    line.add("read", "train", 0, 0, 4096)
    job = job_for(1, mpi=True)
    log = write_darshan_log(tmp_path, [line.events()], job)  # a folder: the runtime's name inside it
    assert re.fullmatch(r"[^_]+_python3_id4242-\d+_\d+-\d+-\d+-\d+_1\.darshan", log.name)
    assert log.name == darshan_log_name(job)
    assert not list(tmp_path.glob("*partial"))
    counters = frame(darshan.DarshanReport(str(log), read_all=True), "POSIX", "counters")
    assert counters["rank"].tolist() == [-1]


def test_darshan_summary_renders_html(two_rank_log, tmp_path):
    _, _, log, _ = two_rank_log
    out = tmp_path / "report.html"
    done = run_module_forked("darshan", ["summary", str(log), "--output", str(out)], tmp_path)  # python -m darshan
    assert done.returncode == 0, done.stderr[-2000:]
    html = out.read_text()
    assert "<html" in html.lower() and "python3" in html
    assert "Heatmap data is not available" not in html
