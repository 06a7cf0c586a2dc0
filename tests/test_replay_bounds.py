"""What a replay writes is bounded by the log's own POSIX counters and by storage.root's free space (issue 24).

A replay recreates the files a log reads and re-issues its writes, so a log that claims more than
its job did (damaged counters, DXT traces past the file's end, billions of calls) used to become
gigabytes on disk or a plan that could not fit in memory. The expected bounds are read from the
log by PyDarshan directly, not by the code under test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

darshan = pytest.importorskip("darshan")

from dlio_ckpt.config.load import validate_command_line  # noqa: E402
from dlio_ckpt.config.space import FREE_BYTES_VARIABLE  # noqa: E402
from dlio_ckpt.errors import ConfigError  # noqa: E402
from dlio_ckpt.plan.replay import MAX_CALLS, disk_bytes  # noqa: E402
from dlio_ckpt.plan.replay_log import load_replay_plan  # noqa: E402
from dlio_ckpt.trace.darshan_posix import C  # noqa: E402
from dlio_ckpt.trace.darshan_writer import JobInfo, build_log_contents, encode_log, write_darshan_log  # noqa: E402
from trace_events import JOB_START, two_rank_job  # noqa: E402

REAL_LOGS = Path(__file__).resolve().parents[2] / "shared" / "data" / "darshan" / "dlio_logs"


def job() -> JobInfo:
    return JobInfo(nprocs=2, jobid=7, uid=os.getuid(), start_wall=JOB_START, end_wall=JOB_START + 2,
                   exe="python3 -m dlio_ckpt", hostnames=("node0", "node1"))


def extents_by_name(log: Path) -> dict[str, int]:
    """Each file's furthest byte + 1 over its POSIX records, as PyDarshan reads them."""
    report = darshan.DarshanReport(str(log), read_all=True)
    names = dict(report.name_records)
    out: dict[str, int] = {}
    for row in report.records["POSIX"].to_df()["counters"].to_dict("records"):
        name = names[row["id"]]
        out[name] = max(out.get(name, 0), max(row["POSIX_MAX_BYTE_READ"], row["POSIX_MAX_BYTE_WRITTEN"]) + 1)
    return out


@pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="the shared real DLIO logs are not here")
def test_approximate_replay_files_are_never_larger_than_the_logs_files():
    log = sorted(REAL_LOGS.glob("*.darshan"))[5]  # a worker that read 11.2 GB from 35 files
    plan = load_replay_plan(log)
    extents = extents_by_name(log)
    assert plan.approximate and len(plan.files) == 36
    over = [(spec.original, spec.size, extents[spec.original]) for spec in plan.files if spec.size > extents[spec.original]]
    assert over == []  # before: 2,501,802,117 bytes of files for 2,186,736,998 bytes of extents
    assert disk_bytes(plan) <= sum(extents.values())
    for calls in plan.ops:
        ends = calls["offset"] + calls["length"]
        sizes = [plan.files[i].size for i in calls["file"]]
        assert (ends <= sizes).all()


def test_dxt_traces_past_the_posix_counters_are_refused(tmp_path):
    contents = build_log_contents(two_rank_job(tmp_path / "fs"), job())
    record = next(r for rank in contents.posix for r in rank if r.name.endswith("train.bin"))
    record.counters[C["POSIX_MAX_BYTE_READ"]] = 999  # the traces read far past byte 999
    record.counters[C["POSIX_MAX_BYTE_WRITTEN"]] = 0
    log = tmp_path / "inconsistent.darshan"
    log.write_bytes(encode_log(contents, job()))
    with pytest.raises(ConfigError) as error:
        load_replay_plan(log)
    message = str(error.value)
    assert message.startswith("replay.log:") and "train.bin" in message and "1,000" in message and "\n" not in message


def test_a_log_claiming_more_calls_than_a_plan_holds_is_refused(tmp_path):
    contents = build_log_contents(two_rank_job(tmp_path / "fs"), job())
    contents.dxt.clear()
    contents.heatmaps.clear()
    record = next(r for rank in contents.posix for r in rank if r.name.endswith("train.bin"))
    record.counters[C["POSIX_READS"]] = 1 << 40  # before: a plan array of 1e12 calls (MemoryError)
    log = tmp_path / "many.darshan"
    log.write_bytes(encode_log(contents, job()))
    with pytest.raises(ConfigError) as error:
        load_replay_plan(log)
    assert f"{MAX_CALLS:,}" in str(error.value) and str(error.value).startswith("replay.log:")


def test_replay_that_does_not_fit_the_free_space_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    log = write_darshan_log(tmp_path / "orig.darshan", two_rank_job(tmp_path / "fs"), job())
    needed = disk_bytes(load_replay_plan(log))
    store = tmp_path / "store"
    args = ["workload=replay", f"replay.log={log}", f"storage.root={store}"]
    monkeypatch.setenv(FREE_BYTES_VARIABLE, str(needed))
    validate_command_line(args, multirun=False)  # exactly enough
    monkeypatch.setenv(FREE_BYTES_VARIABLE, str(needed - 1))
    with pytest.raises(ConfigError) as error:
        validate_command_line(args, multirun=False)
    message = str(error.value)
    assert message.startswith("replay.log:") and f"{needed:,} bytes" in message and f"{needed - 1:,} bytes free" in message
    assert not store.exists()
