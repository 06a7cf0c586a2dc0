"""Replay round trip: events -> Darshan log -> replay plan -> replayed, traced I/O -> same calls and bytes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

darshan = pytest.importorskip("darshan")

from dlio_ckpt.config.load import load_config  # noqa: E402
from dlio_ckpt.engine.context import RunContext  # noqa: E402
from dlio_ckpt.engine.replay import run_replay  # noqa: E402
from dlio_ckpt.errors import ConfigError  # noqa: E402
from dlio_ckpt.plan.replay import READ, WRITE  # noqa: E402
from dlio_ckpt.plan.replay_log import load_replay_plan  # noqa: E402
from dlio_ckpt.storage.events import OP_CODE, PHASE_CODE, EventRecorder, JobClock, RankEvents  # noqa: E402
from dlio_ckpt.storage.posix import PosixStorage  # noqa: E402
from dlio_ckpt.storage.traced import TracedStorage  # noqa: E402
from dlio_ckpt.trace.darshan_writer import JobInfo, write_darshan_log  # noqa: E402
from dlio_ckpt.world import World  # noqa: E402
from trace_events import JOB_START, two_rank_job  # noqa: E402


def job(nprocs: int) -> JobInfo:
    return JobInfo(nprocs=nprocs, jobid=7, uid=os.getuid(), start_wall=JOB_START, end_wall=JOB_START + 2,
                   exe="python3 -m dlio_ckpt", hostnames=tuple(f"node{r}" for r in range(nprocs)))


@pytest.fixture
def original(tmp_path: Path):
    ranks = two_rank_job(tmp_path / "fs")
    log = write_darshan_log(tmp_path / "orig.darshan", ranks, job(2))
    return ranks, log


def context(tmp_path: Path, log: Path, world: World, *extra: str) -> RunContext:
    config = load_config(["workload=replay", f"replay.log={log}", f"storage.root={tmp_path / 'root'}",
                          "generate.pool_bytes=1MiB", *extra])
    clock = JobClock.start()
    recorder = EventRecorder(rank=world.rank, clock=clock)
    return RunContext(config=config, world=world, run_dir=tmp_path / "run", run_id=f"replay-{world.rank}",
                      clock=clock, recorder=recorder, storage=TracedStorage(PosixStorage(), recorder))


def data_calls(events: np.ndarray, paths: list[str], op: str, phase: str | None = None) -> list[tuple]:
    """(file name under its top folder, offset, length) of every read or write, in start order."""
    chosen = events[events["op"] == OP_CODE[op]]
    if phase is not None:
        chosen = chosen[chosen["phase"] == PHASE_CODE[phase]]
    chosen = chosen[np.argsort(chosen["start"], kind="stable")]
    return [("/".join(Path(paths[e["file"]]).parts[-2:]), int(e["offset"]), int(e["length"])) for e in chosen]


def test_plan_holds_every_traced_call(original):
    ranks, log = original
    plan = load_replay_plan(log)
    assert plan.log_ranks == plan.nprocs == 2
    events = np.concatenate([r.events for r in ranks])
    reads, writes = events[events["op"] == OP_CODE["read"]], events[events["op"] == OP_CODE["write"]]
    assert plan.totals() == {"reads": len(reads), "writes": len(writes), "bytes_read": int(reads["length"].sum()),
                             "bytes_written": int(writes["length"].sum())}
    relative = {f.relative: f for f in plan.files}
    assert set(relative) == {"data/train.bin", "ckpt/model-r0.bin", "ckpt/model-r1.bin",
                             "ckpt/manifest-r0.json.tmp", "ckpt/manifest-r1.json.tmp"}
    assert relative["data/train.bin"].size == 5_000_000 and relative["data/train.bin"].read  # the 0-byte read at EOF
    assert relative["ckpt/model-r1.bin"].size == 3 * 1_048_576 + 1025
    assert not relative["ckpt/manifest-r0.json.tmp"].read
    for rank in (0, 1):
        assert np.all(np.diff(plan.ops[rank]["start"]) >= 0)
        assert plan.ops_for(rank, 2)["start"].tolist() == plan.ops[rank]["start"].tolist()
    assert plan.ranks_for(0, 1) == [0, 1]  # a smaller world folds log ranks onto its ranks


def test_round_trip_reproduces_calls_and_bytes_per_rank(original, tmp_path):
    ranks, log = original
    replayed = []
    for rank in (0, 1):  # two ranks of a 2-rank world, one after the other (no MPI needed)
        ctx = context(tmp_path, log, World(rank=rank, size=2, comm=None))
        summary = run_replay(ctx)
        events = ctx.recorder.array()
        source = ranks[rank]
        for op, phase in (("read", "train"), ("write", "checkpoint")):
            assert data_calls(events, ctx.recorder.paths, op, phase) == data_calls(source.events, source.paths, op)
        mine = source.events
        assert summary["reads"] == int((mine["op"] == OP_CODE["read"]).sum())
        assert summary["writes"] == int((mine["op"] == OP_CODE["write"]).sum())
        assert summary["bytes_read"] == int(mine["length"][mine["op"] == OP_CODE["read"]].sum())
        assert summary["bytes_written"] == int(mine["length"][mine["op"] == OP_CODE["write"]].sum())
        assert summary["wall_s"] >= 0 and summary["log_ranks"] == 2
        replayed.append(RankEvents(rank=rank, hostname=f"node{rank}", job_start_wall=ctx.clock.job_start_wall,
                                   paths=list(ctx.recorder.paths), events=events))
    # The replay's own Darshan log (without the generate phase) counts what the original log counts.
    timed = [RankEvents(r.rank, r.hostname, r.job_start_wall, r.paths,
                        r.events[r.events["phase"] != PHASE_CODE["generate"]]) for r in replayed]
    again = darshan.DarshanReport(str(write_darshan_log(tmp_path / "again.darshan", timed, job(2))), read_all=True)
    first = darshan.DarshanReport(str(log), read_all=True)
    for name in ("POSIX_READS", "POSIX_WRITES", "POSIX_BYTES_READ", "POSIX_BYTES_WRITTEN"):
        assert (first.records["POSIX"].to_df()["counters"][name].sum()
                == again.records["POSIX"].to_df()["counters"][name].sum()), name
    assert dxt_totals_per_rank(first) == dxt_totals_per_rank(again)


def dxt_totals_per_rank(report) -> dict[int, tuple[int, int]]:
    """rank -> (calls, bytes) over its DXT_POSIX segments."""
    totals: dict[int, tuple[int, int]] = {}
    for record in report.records["DXT_POSIX"].to_df():
        calls, moved = totals.get(record["rank"], (0, 0))
        for key in ("read_segments", "write_segments"):
            segments = record[key]
            calls += len(segments)
            moved += int(segments["length"].sum()) if len(segments) else 0
        totals[record["rank"]] = (calls, moved)
    return totals


def test_serial_world_replays_every_log_rank(original, tmp_path):
    _, log = original
    ctx = context(tmp_path, log, World.serial(), "replay.gaps=true")
    summary = run_replay(ctx)
    expected = load_replay_plan(log).totals()
    assert {k: summary[k] for k in expected} == expected
    generated = ctx.recorder.array()
    assert (generated["phase"] == PHASE_CODE["generate"]).any()  # the read files were recreated first
    root = Path(summary["root"])
    assert root == (tmp_path / "root" / "replay" / "orig").resolve()
    assert (root / "data" / "train.bin").stat().st_size == 5_000_000


@pytest.mark.parametrize("case", ["empty", "missing", "not_a_log"])
def test_bad_logs_are_one_line_config_errors(tmp_path, case):
    if case == "empty":
        path = ""
    elif case == "missing":
        path = str(tmp_path / "nope.darshan")
    else:
        path = str(tmp_path / "junk.darshan")
        Path(path).write_bytes(b"not a darshan log" * 100)
    with pytest.raises(ConfigError) as error:
        load_replay_plan(path)
    message = str(error.value)
    assert message.startswith("replay.log:") and "\n" not in message
    # a log without DXT traces is replayed approximately: tests/test_replay_approx.py


def test_read_and_write_codes_are_distinct():
    assert READ != WRITE


