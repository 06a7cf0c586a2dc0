"""Approximate replay of a Darshan log without DXT traces, from its POSIX counters (issue 13).

Expected figures come from PyDarshan reading the log's counters directly, so the plan and the
replay are checked against the log, not against themselves.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

darshan = pytest.importorskip("darshan")

from conftest import load_summary, run_cli  # noqa: E402
from dlio_ckpt.errors import ConfigError  # noqa: E402
from dlio_ckpt.plan.replay import READ  # noqa: E402
from dlio_ckpt.plan.replay_approx import SIZE_BUCKETS, call_offsets, call_sizes  # noqa: E402
from dlio_ckpt.plan.replay_log import load_replay_plan  # noqa: E402
from dlio_ckpt.trace.darshan_writer import JobInfo, build_log_contents, encode_log  # noqa: E402
from trace_events import JOB_START, two_rank_job  # noqa: E402

REAL_LOGS = Path(__file__).resolve().parents[2] / "shared" / "data" / "darshan" / "dlio_logs"


def no_dxt_log(tmp_path: Path, keep_posix: bool = True) -> Path:
    """A two-rank log with POSIX counters only (DXT and heat map left out), as production logs are."""
    job = JobInfo(nprocs=2, jobid=7, uid=0, start_wall=JOB_START, end_wall=JOB_START + 2, exe="python3",
                  hostnames=("node0", "node1"), mpi=True)
    contents = build_log_contents(two_rank_job(tmp_path / "fs"), job)
    contents = dataclasses.replace(contents, dxt=[], heatmaps=[], posix=contents.posix if keep_posix else [])
    path = tmp_path / "nodxt.darshan"
    path.write_bytes(encode_log(contents, job))
    return path


def posix_counters(log: Path) -> list[dict]:
    report = darshan.DarshanReport(str(log), read_all=True)
    frame = report.records["POSIX"].to_df()["counters"]
    names = dict(report.name_records)
    return [row | {"name": names[row["id"]]} for row in frame.to_dict("records")]


def test_call_sizes_add_up_and_follow_the_histogram():
    rng = np.random.default_rng(1)
    buckets = [0, 0, 3, 0, 0, 2, 0, 0, 0, 0]  # 3 calls of 1-10 KiB, 2 of 1-4 MiB
    sizes = call_sizes(3 * 4096 + 2 * (2 << 20), 5, buckets, rng)
    assert sizes.sum() == 3 * 4096 + 2 * (2 << 20)
    _, lo_small, hi_small = SIZE_BUCKETS[2]
    _, lo_big, hi_big = SIZE_BUCKETS[5]
    assert sorted(lo_small <= s <= hi_small for s in sizes).count(True) == 3
    assert sum(lo_big <= s <= hi_big for s in sizes) == 2


@pytest.mark.parametrize("sequential, consecutive", [(9, 9), (9, 4), (5, 2), (0, 0)])
def test_call_offsets_have_the_counted_sequential_and_consecutive_calls(sequential, consecutive):
    sizes = np.full(10, 1000, np.int64)
    offsets = call_offsets(sizes, sequential, consecutive, extent=50_000, rng=np.random.default_rng(3))
    ends = offsets + sizes
    assert int((offsets[1:] == ends[:-1]).sum()) == consecutive
    assert int((offsets[1:] >= ends[:-1]).sum()) == sequential
    assert (offsets >= 0).all()


def test_plan_from_counters_keeps_bytes_calls_and_files_per_rank(tmp_path):
    log = no_dxt_log(tmp_path)
    plan = load_replay_plan(log)
    assert plan.approximate and plan.log_ranks == 2
    records = posix_counters(log)
    assert plan.totals() == {"reads": sum(r["POSIX_READS"] for r in records),
                             "writes": sum(r["POSIX_WRITES"] for r in records),
                             "bytes_read": sum(r["POSIX_BYTES_READ"] for r in records),
                             "bytes_written": sum(r["POSIX_BYTES_WRITTEN"] for r in records)}
    index = {f.original: i for i, f in enumerate(plan.files)}
    for record in records:
        if record["rank"] < 0:
            continue  # a shared file: its calls are dealt out to every rank
        calls = plan.ops[record["rank"]]
        mine = calls[calls["file"] == index[record["name"]]]
        reads = mine[mine["op"] == READ]
        assert len(reads) == record["POSIX_READS"] and int(reads["length"].sum()) == record["POSIX_BYTES_READ"]
        assert len(mine) - len(reads) == record["POSIX_WRITES"]


def test_a_log_with_neither_dxt_nor_posix_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_replay_plan(no_dxt_log(tmp_path, keep_posix=False))
    assert str(error.value).startswith("replay.log:") and "\n" not in str(error.value)


@pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="the shared real DLIO logs are not here")
def test_real_runtime_log_without_dxt_gives_an_approximate_plan():
    log = sorted(REAL_LOGS.glob("*.darshan"))[0]
    records = [r for r in posix_counters(log) if not r["name"].startswith("<")]  # <STDERR> is no file to replay
    plan = load_replay_plan(log)
    assert plan.approximate
    assert plan.totals()["bytes_written"] == sum(r["POSIX_BYTES_WRITTEN"] for r in records)
    assert plan.totals()["reads"] == sum(r["POSIX_READS"] for r in records)


def test_replay_run_is_labelled_approximate_and_compares_with_the_log(tmp_path):
    (tmp_path / "cwd").mkdir()
    log = no_dxt_log(tmp_path)
    run = tmp_path / "run"
    done = run_cli(["workload=replay", f"replay.log={log}", "progress=false", f"storage.root={tmp_path / 'root'}",
                    f"hydra.run.dir={run}"], tmp_path / "cwd")
    assert done.returncode == 0, done.stderr
    replay = load_summary(run)["replay"]
    records = posix_counters(log)
    bytes_read = sum(r["POSIX_BYTES_READ"] for r in records)
    assert replay["approximate"] is True
    assert replay["original"]["bytes_read"] == replay["replayed"]["bytes_read"] == bytes_read
    assert replay["original"]["writes"] == replay["replayed"]["writes"] == sum(r["POSIX_WRITES"] for r in records)
    assert replay["replayed"]["read_mib_per_s"] == pytest.approx(bytes_read / replay["replayed"]["read_s"] / (1 << 20))
    lines = done.stdout.splitlines()
    assert any("approximate (from POSIX counters" in line for line in lines)
    row = next(line for line in lines if line.split()[:2] == ["bytes", "read"])
    assert row.split()[2:] == [f"{bytes_read:,}", f"{bytes_read:,}", "1.00x"]
    assert any(line.split()[:2] == ["read", "MiB/s"] for line in lines)
    assert json.loads((run / "summary.json").read_text())["replay"]["original"]["read_s"] > 0
