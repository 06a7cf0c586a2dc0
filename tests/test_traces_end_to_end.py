"""Traces of real runs: the Darshan log, the Chrome trace, replay and analysis of a run folder.

PyDarshan (the reference reader) must report the bytes and operation counts that summary.json
and the per-rank event files report.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_fork import run_main_forked, run_module_forked
from conftest import load_summary, made_once, run_cli, session_folder

darshan = pytest.importorskip("darshan")

ARGS = ["workload=unet3d", "scale=tiny", "progress=false", "trace.darshan=true", "trace.chrome=true", "checkpoint.restore=true"]


def posix_totals(log) -> dict[str, int]:
    report = darshan.DarshanReport(str(log), read_all=True)
    counters = report.records["POSIX"].to_df()["counters"]
    return {name: int(counters[f"POSIX_{name}"].sum()) for name in ("BYTES_READ", "BYTES_WRITTEN", "READS", "WRITES", "FSYNCS")}


def event_totals(run) -> dict[str, int]:
    totals = {"BYTES_READ": 0, "BYTES_WRITTEN": 0, "READS": 0, "WRITES": 0, "FSYNCS": 0}
    for path in sorted((run / "events").glob("rank-*.npz")):
        with np.load(path) as data:
            events = data["events"]
            ops = json.loads(str(data["meta"]))["ops"]
        reads, writes = events[events["op"] == ops.index("read")], events[events["op"] == ops.index("write")]
        totals["BYTES_READ"] += int(reads["length"].sum())
        totals["BYTES_WRITTEN"] += int(writes["length"].sum())
        totals["READS"] += len(reads)
        totals["WRITES"] += len(writes)
        totals["FSYNCS"] += int((events["op"] == ops.index("fsync")).sum())
    return totals


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    """The run folder of one ARGS run on `ranks` ranks (0: serial), made once per session for the
    tests here that only read it (its log, events, summary)."""
    def get(ranks: int):
        def make(folder):
            (folder / "cwd").mkdir(parents=True)
            done = run_cli(ARGS + [f"storage.root={folder / 'store'}", f"hydra.run.dir={folder / 'run'}"], folder / "cwd",
                           mpi_ranks=ranks)
            assert done.returncode == 0, done.stderr[-2000:]

        return made_once(session_folder(tmp_path_factory), f"traced-run-{ranks}", make) / "run"

    return get


@pytest.mark.parametrize("ranks", [0, pytest.param(2, marks=pytest.mark.mpi)])
def test_darshan_log_of_a_run_matches_the_summary(traced_run, ranks):
    run = traced_run(ranks)
    summary = load_summary(run)
    log = run / summary["traces"]["darshan"]
    totals = posix_totals(log)
    assert totals == event_totals(run)
    assert totals["BYTES_READ"] == summary["io"]["bytes_read"]
    assert totals["BYTES_WRITTEN"] == summary["io"]["bytes_written"]
    assert summary["checkpoint"]["writes"] == 1 and summary["checkpoint"]["restore_verified"] is True
    report = darshan.DarshanReport(str(log), read_all=True)
    assert report.metadata["job"]["nprocs"] == max(ranks, 1)
    dxt = report.records["DXT_POSIX"].to_df()
    assert sum(len(r["read_segments"]) for r in dxt) == totals["READS"]
    trace = json.loads((run / summary["traces"]["chrome"]).read_text())
    assert sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("name") == "read") == totals["READS"]


def test_darshan_summary_report_renders(traced_run, workdir):
    run = traced_run(0)
    log = run / load_summary(run)["traces"]["darshan"]
    html = workdir / "report.html"
    done = run_module_forked("darshan", ["summary", str(log), "--output", str(html)], workdir)  # python -m darshan
    assert done.returncode == 0, done.stderr[-2000:]
    assert "POSIX" in html.read_text()


@pytest.mark.parametrize("ranks", [0, pytest.param(2, marks=pytest.mark.mpi)])
def test_replaying_a_run_reproduces_its_bytes_and_operations(traced_run, workdir, ranks):
    original = traced_run(ranks)
    log = original / load_summary(original)["traces"]["darshan"]
    expected = posix_totals(log)
    replayed = workdir / "replayed"
    done = run_cli(["workload=replay", f"replay.log={log}", "progress=false", "trace.darshan=true",
                    f"storage.root={workdir / 'replay-store'}", f"hydra.run.dir={replayed}"], workdir / "cwd", mpi_ranks=ranks)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = load_summary(replayed)
    assert summary["replay"]["bytes_read"] == expected["BYTES_READ"]
    assert summary["replay"]["bytes_written"] == expected["BYTES_WRITTEN"]
    assert summary["replay"]["reads"] == expected["READS"]
    assert summary["replay"]["writes"] == expected["WRITES"]


def test_analysis_of_a_real_run_folder_agrees_with_the_summary(traced_run):
    run = traced_run(0)
    done = run_main_forked("dlio_ckpt-analyze", ["--json", str(run)], run.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    summary = load_summary(run)
    assert result["bytes_read"] == summary["io"]["bytes_read"]
    assert result["bytes_written"] == summary["io"]["bytes_written"]
