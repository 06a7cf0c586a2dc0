"""dlio_ckpt-analyze on real Darshan logs, PyDarshan's example logs, and small fake run and sweep folders.

Expected Darshan figures are computed here with PyDarshan directly, so the test checks that the
analysis agrees with PyDarshan rather than with itself. Fake run folders use hand-chosen event
times, so every per-phase figure is known exactly.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

darshan = pytest.importorskip("darshan")
pytest.importorskip("matplotlib")
pytest.importorskip("pandas")

from dlio_ckpt.analysis.cli import main  # noqa: E402
from dlio_ckpt.analysis.inputs import detect  # noqa: E402
from dlio_ckpt.analysis.timeline import spread  # noqa: E402
from dlio_ckpt.storage.events import EventRecorder, JobClock  # noqa: E402

DLIO_LOGS = Path(__file__).resolve().parents[2] / "shared" / "data" / "darshan" / "dlio_logs"  # ../shared beside the repo
EXAMPLES = Path(darshan.__file__).parent / "examples" / "example_logs"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MIB = 1 << 20
BIN = Path(sys.executable).parent

needs_dlio_logs = pytest.mark.skipif(not DLIO_LOGS.is_dir(), reason="shared DLIO Darshan logs not present")


def pydarshan_sums(paths: list[Path], module: str = "POSIX", prefix: str = "POSIX") -> tuple[int, int]:
    """Sum of BYTES_READ / BYTES_WRITTEN over a module's records, straight from PyDarshan."""
    read = written = 0
    for path in paths:
        report = darshan.DarshanReport(str(path), read_all=True)
        if module in report.records and len(report.records[module]):
            counters = report.records[module].to_df()["counters"]
            read += int(counters[f"{prefix}_BYTES_READ"].sum())
            written += int(counters[f"{prefix}_BYTES_WRITTEN"].sum())
    return read, written


def console_bytes_written(paths: list[Path]) -> int:
    """POSIX_BYTES_WRITTEN of the <STDIN>/<STDOUT>/<STDERR> records, straight from PyDarshan."""
    total = 0
    for path in paths:
        report = darshan.DarshanReport(str(path), read_all=True)
        counters = report.records["POSIX"].to_df()["counters"]
        names = counters["id"].map(lambda i: report.name_records[i])
        total += int(counters["POSIX_BYTES_WRITTEN"][names.isin(["<STDIN>", "<STDOUT>", "<STDERR>"])].sum())
    return total


def run_json(capsys, argv: list[str]) -> dict:
    assert main(argv + ["--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def assert_png(path: str | Path) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == PNG_MAGIC, path


# ---------------------------------------------------------------------------------------------
# fake run and sweep folders (the run-folder contract of summary.json and events/)

def make_run(folder: Path, strategy: str = "sync", ckpt_items: int = 2, world_size: int = 2) -> dict:
    """A run folder with events at fixed times; returns the figures the analysis must find.

    Rank r: train reads 4 x 1 MiB of duration 0.01*(r+1) back to back; rank 1 also two 100-byte
    reads that overlap ([2.00, 2.10] and [2.05, 2.15]: busy 0.15 s, not 0.20). Checkpoint: each
    rank writes ckpt_items x 8 MiB (0.05 s each) then fsyncs (0.02 s). Restore reads them back
    (0.04 s each). Rank 0 generates the dataset: 4 x 1 MiB writes of 0.01 s.
    """
    folder.mkdir(parents=True)
    clock = JobClock.start()
    hostnames = []
    for rank in range(world_size):
        rec = EventRecorder(rank, clock)
        data = f"/data/train-{rank}.npz"
        shard = f"/ckpt/step-10/model-r{rank}.bin"
        t = 0.1
        if rank == 0:
            for k in range(4):
                rec.record("write", "generate", f"/data/train-{k % world_size}.npz", k * MIB, MIB, t, t + 0.01)
                t += 0.01
        rec.record("open", "train", data, -1, 0, 0.9, 0.901)
        t = 1.0
        for k in range(4):
            d = 0.01 * (rank + 1)
            rec.record("read", "train", data, k * MIB, MIB, t, t + d)
            t += d
        if rank == 1:
            rec.record("read", "train", data, 0, 100, 2.0, 2.1)
            rec.record("read", "train", data, 100, 100, 2.05, 2.15)
        t = 3.0
        for k in range(ckpt_items):
            rec.record("write", "checkpoint", shard, k * 8 * MIB, 8 * MIB, t, t + 0.05)
            t += 0.05
        rec.record("fsync", "checkpoint", shard, -1, 0, t, t + 0.02)
        t = 4.0
        for k in range(ckpt_items):
            rec.record("read", "restore", shard, k * 8 * MIB, 8 * MIB, t, t + 0.04)
            t += 0.04
        hostnames.append(f"node{rank}")
        rec.save(folder / "events", f"node{rank}")
    ckpt_bytes = world_size * ckpt_items * 8 * MIB
    train_bytes = world_size * 4 * MIB + 200
    summary = {
        "schema_version": 1, "tool": "dlio_ckpt", "tool_version": "0.1.0", "workload": "unet3d",
        "mode": "train", "world_size": world_size, "hostnames": hostnames, "run_dir": str(folder),
        "config": {"checkpoint": {"strategy": strategy}}, "started_at": "2025-01-01T00:00:00+00:00", "wall_s": 4.5,
        "dataset": {"folder": "/data", "format": "npz", "files_train": world_size, "files_eval": 0,
                    "samples_train": 8, "bytes_on_disk": 4 * MIB, "reused": False, "generate_s": 0.04,
                    "generate_bytes_written": 4 * MIB, "page_cache_risk": True},
        "train": {"epochs": 1, "steps": 4, "samples": 8, "samples_per_s": 100.0, "bytes_read": train_bytes,
                  "read_s_max": 0.23, "read_mib_per_s": 34.8, "wall_s": 2.0, "compute_s": 1.5, "au": 0.75,
                  "au_target": 0.9, "au_target_met": False, "reads": 10},
        "checkpoint": {"strategy": strategy, "writes": 1, "bytes": ckpt_bytes, "files": world_size,
                       "write_s_max": 0.05 * ckpt_items + 0.02, "write_gib_per_s": 1.0, "write_gib_per_s_min_rank": 0.5,
                       "blocking_s_max": 0.12 if strategy == "sync" else 0.01, "persist_s_max": 0.12,
                       "training_time_lost_fraction": 0.06 if strategy == "sync" else 0.005, "restore_s_max": 0.08,
                       "restore_gib_per_s": 2.0, "restore_verified": True, "per_checkpoint": []},
        "io": {"bytes_read": train_bytes + ckpt_bytes, "bytes_written": 4 * MIB + ckpt_bytes, "by_phase": {}},
        "ranks": [{"rank": r, "hostname": f"node{r}", "samples": 4, "steps": 4, "bytes_read": 4 * MIB,
                   "read_s": 0.04, "bytes_written": ckpt_items * 8 * MIB, "write_s": 0.12, "peak_rss_bytes": 1 << 28}
                  for r in range(world_size)],
        "traces": {"events": "events", "darshan": None, "chrome": None},
        "warnings": [],
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    return {"train_bytes": train_bytes, "ckpt_bytes": ckpt_bytes, "gen_bytes": 4 * MIB,
            "bytes_read": train_bytes + ckpt_bytes, "bytes_written": 4 * MIB + ckpt_bytes}


def make_sweep(folder: Path) -> None:
    folder.mkdir(parents=True)
    rows = [("0", "checkpoint.strategy=sync", "sync", 2), ("1", "checkpoint.strategy=async", "async", 3)]
    with open(folder / "sweep_summary.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["job", "overrides", "workload", "world_size", "samples_per_s", "checkpoint_write_gib_per_s"])
        for job, overrides, strategy, items in rows:
            make_run(folder / job, strategy=strategy, ckpt_items=items)
            writer.writerow([job, overrides, "unet3d", 2, 100.0, 1.0])


# ---------------------------------------------------------------------------------------------
# the 24 real DLIO logs

@needs_dlio_logs
def test_dlio_logs_read_as_one_job_with_pydarshan_totals(tmp_path, capsys):
    logs = sorted(DLIO_LOGS.glob("*.darshan"))
    assert len(logs) == 24
    expected = pydarshan_sums(logs)
    doc = run_json(capsys, [str(p) for p in logs] + ["--out-dir", str(tmp_path)])
    assert (doc["bytes_read"], doc["bytes_written"]) == expected
    assert doc["kind"] == "darshan" and doc["job"]["logs"] == 24 and doc["job"]["jobid"] == 3116902
    assert len(doc["per_rank"]) == 24  # one row per process
    assert sum(r["bytes_read"] for r in doc["per_rank"]) == expected[0]
    assert doc["per_phase"]["read"]["bytes_read"] == expected[0]
    console_written = console_bytes_written(logs)  # <STDERR> writes: console, not checkpoint data
    assert console_written > 0
    assert doc["per_phase"]["write"]["bytes_written"] == expected[1] - console_written
    assert doc["per_phase"]["console"]["bytes_written"] == console_written
    assert (doc["stdio"]["bytes_read"], doc["stdio"]["bytes_written"]) == pydarshan_sums(logs, "STDIO", "STDIO")
    slowest = max(doc["per_rank"], key=lambda r: r["io_s"])
    assert doc["slowest_rank"]["rank"] == slowest["rank"]
    assert doc["slowest_rank"]["rank"] == doc["slowest_rank"]["pydarshan_unique_io_slowest_rank"]
    # histogram: every read/write call lands in one bucket
    reads = sum(int(darshan.DarshanReport(str(p), read_all=True).records["POSIX"].to_df()["counters"]["POSIX_READS"].sum())
                for p in logs)
    assert sum(doc["histogram"]["read"]) == reads
    assert doc["files"]["count"] == doc["files"]["categories_pydarshan"]["total"] > 0
    assert doc["timeline_source"] == "HEATMAP"
    for name in ("heatmap", "bandwidth"):
        assert_png(doc["figures"][name])
    assert Path(doc["report"]).read_text().startswith("# dlio_ckpt I/O analysis")


@needs_dlio_logs
def test_cli_subprocess_on_log_folder_prints_one_json_document():
    proc = subprocess.run([str(BIN / "dlio_ckpt-analyze"), str(DLIO_LOGS), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # the whole of stdout is one document
    assert (doc["bytes_read"], doc["bytes_written"]) == pydarshan_sums(sorted(DLIO_LOGS.glob("*.darshan")))
    assert doc["report"] is None and doc["figures"] == {}  # --json alone writes nothing


# ---------------------------------------------------------------------------------------------
# PyDarshan's example logs

@pytest.mark.parametrize("name, timeline", [
    ("dxt.darshan", "DXT_POSIX"),
    ("ior_hdf5_example.darshan", "DXT_POSIX"),
    ("shane_macsio_id29959_5-22-32552-7035573431850780836_1590156158.darshan", "record timestamps"),
])
def test_example_logs_match_pydarshan(tmp_path, capsys, name, timeline):
    log = EXAMPLES / name
    doc = run_json(capsys, [str(log), "--out-dir", str(tmp_path)])
    assert (doc["bytes_read"], doc["bytes_written"]) == pydarshan_sums([log])
    assert doc["timeline_source"] == timeline
    assert_png(doc["figures"]["heatmap"])
    assert_png(doc["figures"]["bandwidth"])
    phases = doc["per_phase"]
    moved = sum(p["bytes_read"] + p["bytes_written"] for p in phases.values())  # read, write and console
    assert moved == doc["bytes_read"] + doc["bytes_written"]
    if "MPI-IO" in doc["job"]["modules"]:  # reported beside the POSIX totals, never added
        mpiio = (doc["mpiio"]["bytes_read"], doc["mpiio"]["bytes_written"])
        assert mpiio == pydarshan_sums([log], "MPI-IO", "MPIIO")


def test_example_log_without_posix_reports_stdio_separately(capsys):
    log = EXAMPLES / "noposix.darshan"
    doc = run_json(capsys, [str(log)])
    assert doc["bytes_read"] == 0 and doc["bytes_written"] == 0
    assert (doc["stdio"]["bytes_read"], doc["stdio"]["bytes_written"]) == pydarshan_sums([log], "STDIO", "STDIO")
    assert any("no POSIX records" in w for w in doc["warnings"])


def test_two_different_jobs_are_kept_apart(capsys):
    logs = [EXAMPLES / "dxt.darshan", EXAMPLES / "ior_hdf5_example.darshan"]
    doc = run_json(capsys, [str(p) for p in logs])
    assert len(doc["jobs"]) == 2 and doc["comparison"]["runs"]
    assert (doc["bytes_read"], doc["bytes_written"]) == pydarshan_sums(logs)


def test_same_log_twice_is_not_double_counted(capsys):
    log = EXAMPLES / "dxt.darshan"
    doc = run_json(capsys, [str(log), str(log)])
    assert (doc["bytes_read"], doc["bytes_written"]) == pydarshan_sums([log])


# ---------------------------------------------------------------------------------------------
# run folders

def test_run_folder_per_phase_totals_are_exact(tmp_path, capsys):
    run = tmp_path / "run"
    want = make_run(run)
    doc = run_json(capsys, [str(run)])
    assert doc["kind"] == "run"
    assert (doc["bytes_read"], doc["bytes_written"]) == (want["bytes_read"], want["bytes_written"])
    phases = doc["per_phase"]
    assert set(phases) == {"generate", "train", "checkpoint", "restore"}
    assert phases["train"]["bytes_read"] == want["train_bytes"]
    assert phases["train"]["bytes_written"] == 0
    assert phases["checkpoint"]["bytes_written"] == want["ckpt_bytes"]
    assert phases["restore"]["bytes_read"] == want["ckpt_bytes"]
    assert phases["generate"]["bytes_written"] == want["gen_bytes"]
    # slowest rank's busy time: rank 1 reads 4 x 0.02 s plus overlapping reads busy 0.15 s
    assert phases["train"]["read_s"] == pytest.approx(0.23)
    assert phases["train"]["read_s_sum"] == pytest.approx(0.04 + 0.23)
    assert phases["checkpoint"]["write_s"] == pytest.approx(0.12)  # writes + fsync
    assert phases["checkpoint"]["write_mib_per_s"] == pytest.approx(32 / 0.12)
    assert phases["train"]["reads"] == 10 and phases["train"]["ops"] == 12
    assert doc["slowest_rank"]["rank"] == 1
    hist = dict(zip(doc["histogram"]["buckets"], doc["histogram"]["read"]))
    assert hist == {**dict.fromkeys(doc["histogram"]["buckets"], 0), "0_100": 2, "100K_1M": 8, "4M_10M": 4}
    assert doc["files"]["count"] == 4 and doc["files"]["read_write"] == 4  # /data/train-* and the shards
    share = doc["io_time_share"]
    assert share["read"] + share["checkpoint"] + share["other"] == pytest.approx(1.0)
    assert share["checkpoint_s"] == pytest.approx(2 * 0.12 + 2 * 0.08)
    assert doc["headline"]["au"] == 0.75 and not doc["warnings"]


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_run_folder_report_and_pngs(tmp_path, capsys, fmt):
    run = tmp_path / "run"
    make_run(run)
    out = tmp_path / "out"
    report = out / f"report.{fmt}"
    assert main([str(run), "--output", str(report)]) == 0
    printed = capsys.readouterr().out
    assert str(report) in printed
    text = report.read_text()
    assert ("<html" in text) == (fmt == "html")
    pngs = sorted(out.glob("*.png"))
    assert [p.name for p in pngs] == ["run-access-sizes.png", "run-bandwidth.png", "run-heatmap.png", "run-io-cost.png",
                                      "run-ranks.png"]
    for png in pngs:
        assert_png(png)
        assert png.name in text  # the report links its figures by relative path


def test_run_folder_timeline_keeps_bytes(tmp_path):
    from dlio_ckpt.analysis.run_folders import analyse_run

    run = tmp_path / "run"
    want = make_run(run)
    analysis = analyse_run(run)
    assert analysis.timeline.source == "events"
    assert analysis.timeline.read.sum() == pytest.approx(want["bytes_read"])
    assert analysis.timeline.write.sum() == pytest.approx(want["bytes_written"])
    assert {name for name, _, _ in analysis.timeline.phase_spans} == {"generate", "train", "checkpoint", "restore"}


def test_run_folder_without_events_falls_back_to_summary(tmp_path, capsys):
    run = tmp_path / "run"
    want = make_run(run)
    for f in (run / "events").iterdir():
        f.unlink()
    (run / "events").rmdir()
    doc = run_json(capsys, [str(run)])
    assert (doc["bytes_read"], doc["bytes_written"]) == (want["bytes_read"], want["bytes_written"])
    assert any("no events" in w for w in doc["warnings"])


# ---------------------------------------------------------------------------------------------
# compare and sweeps

def test_sweep_folder_compare_table_and_plot(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    make_sweep(sweep)
    out = tmp_path / "out"
    doc = run_json(capsys, ["--compare", str(sweep), "--out-dir", str(out), "--format", "html"])
    table = doc["comparison"]
    assert table["runs"] == ["job 0: checkpoint.strategy=sync", "job 1: checkpoint.strategy=async"]
    rows = {row["metric"]: row["values"] for row in table["rows"]}
    assert list(rows["strategy"].values()) == ["sync", "async"]
    gib = 1 << 30
    assert list(rows["bytes_written"].values()) == [(4 + 32) * MIB / gib, (4 + 48) * MIB / gib]
    assert doc["bytes_written"] == (4 + 32) * MIB + (4 + 48) * MIB
    assert_png(doc["figures"]["comparison"])
    assert "Comparison" in (out / "report.html").read_text()


def test_sweep_comparison_bars_carry_the_job_folder_names(tmp_path):
    """The comparison plot's bars and legend name sweep jobs by folder ("job 0" is folder 0), as
    the table's columns do; they were numbered from 1, one off from the folders."""
    from dlio_ckpt.analysis.cli import detect_all, load
    from dlio_ckpt.analysis.compare import compare, plotted_rows
    from dlio_ckpt.analysis.plots import compare_figure

    sweep = tmp_path / "sweep"
    make_sweep(sweep)
    table = compare(load(detect_all([str(sweep)]), timeline=False))
    fig = compare_figure(plotted_rows(table), table["runs"], ids=[table["ids"][run] for run in table["runs"]])
    first = fig.axes[0]
    assert [label.get_text() for label in first.get_xticklabels()] == ["job 0", "job 1"]
    assert [text.get_text() for text in fig.legends[0].get_texts()] == ["job 0: checkpoint.strategy=sync",
                                                                        "job 1: checkpoint.strategy=async"]


def test_compare_two_runs_on_the_terminal(tmp_path, capsys):
    make_run(tmp_path / "sync", strategy="sync")
    make_run(tmp_path / "async", strategy="async", ckpt_items=1)
    assert main(["--compare", str(tmp_path / "sync"), str(tmp_path / "async"), "--out-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "comparison" in out and "sync" in out and "async" in out
    assert_png(tmp_path / "out" / "comparison.png")
    assert "| metric | 1: sync | 2: async |" in (tmp_path / "out" / "report.md").read_text()


def test_sweep_row_without_folder_still_compares(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    make_sweep(sweep)
    with open(sweep / "sweep_summary.csv", "a", newline="") as handle:
        csv.writer(handle).writerow(["2", "checkpoint.strategy=incremental", "unet3d", 2, 90.0, 2.0])
    doc = run_json(capsys, [str(sweep)])
    assert len(doc["jobs"]) == 3
    assert any("missing" in w for w in doc["jobs"][2]["warnings"])


# ---------------------------------------------------------------------------------------------
# errors

@pytest.mark.parametrize("argv", [["{missing}"], ["{not_a_log}"], ["{empty_dir}"], ["--compare", "{run}"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv):
    (tmp_path / "not_a_log.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    make_run(tmp_path / "run")
    names = {"missing": tmp_path / "nope.darshan", "not_a_log": tmp_path / "not_a_log.txt",
             "empty_dir": tmp_path / "empty", "run": tmp_path / "run"}
    argv = [a.format(**names) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dlio_ckpt-analyze: error:")
    assert argv[-1] in err


def test_missing_dependency_is_a_user_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "darshan", None)  # import darshan now raises ImportError
    assert main([str(EXAMPLES / "dxt.darshan"), "--json"]) == 2
    err = capsys.readouterr().err
    assert "pip install" in err and err.count("\n") == 1


def test_unreadable_darshan_log_is_a_user_error(tmp_path, capsys):
    bad = tmp_path / "broken.darshan"
    bad.write_bytes(b"3.41" + b"\0" * 100)
    assert main([str(bad), "--json"]) == 2
    assert str(bad) in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# units

def test_detection(tmp_path):
    make_run(tmp_path / "runs" / "a")
    make_run(tmp_path / "runs" / "b")
    make_sweep(tmp_path / "sweep")
    assert [s.kind for s in detect(tmp_path / "runs" / "a")] == ["run"]
    assert [s.kind for s in detect(tmp_path / "runs")] == ["run", "run"]  # a folder of run folders
    assert [s.kind for s in detect(tmp_path / "sweep")] == ["sweep"]
    logs = detect(EXAMPLES)
    assert [s.kind for s in logs] == ["darshan"] and len(logs[0].logs) == 6


def test_spread_keeps_every_byte_in_the_right_bins():
    rows = np.array([0, 0, 1])
    out = spread(rows, np.array([0.05, 0.5, 0.0]), np.array([0.05, 3.5, 1.0]), np.array([10, 300, 100]),
                 nrows=2, width=1.0, nbins=4)
    assert out.tolist() == [[60.0, 100.0, 100.0, 50.0], [100.0, 0.0, 0.0, 0.0]]


def test_folder_of_runs_does_not_take_their_darshan_logs_as_extra_input(tmp_path):
    make_run(tmp_path / "runs" / "a")
    make_run(tmp_path / "runs" / "b")
    (tmp_path / "runs" / "a" / "trace.darshan").write_bytes((EXAMPLES / "dxt.darshan").read_bytes())
    (tmp_path / "runs" / "loose.darshan").write_bytes((EXAMPLES / "dxt.darshan").read_bytes())
    sources = detect(tmp_path / "runs")
    assert [s.kind for s in sources] == ["run", "run", "darshan"]
    assert [p.name for p in sources[2].logs] == ["loose.darshan"]


def test_run_folder_darshan_log_is_cross_checked(tmp_path, capsys):
    """The log that the trace writer makes of a run must report the bytes of its events."""
    writer = pytest.importorskip("dlio_ckpt.trace.darshan_writer")
    from dlio_ckpt.storage.events import load_run_events

    run = tmp_path / "run"
    want = make_run(run)
    ranks = load_run_events(run)
    start = ranks[0].job_start_wall
    job = writer.JobInfo(nprocs=2, jobid=4242, uid=0, start_wall=start, end_wall=start + 5.0, exe="dlio_ckpt",
                         hostnames=("node0", "node1"), mpi=True)
    writer.write_darshan_log(run / "trace.darshan", ranks, job)
    summary = json.loads((run / "summary.json").read_text())
    summary["traces"]["darshan"] = "trace.darshan"
    (run / "summary.json").write_text(json.dumps(summary))
    doc = run_json(capsys, [str(run)])
    assert doc["darshan_crosscheck"]["agrees"] is True
    assert (doc["bytes_read"], doc["bytes_written"]) == (want["bytes_read"], want["bytes_written"])
    log_doc = run_json(capsys, [str(run / "trace.darshan")])
    assert (log_doc["bytes_read"], log_doc["bytes_written"]) == (want["bytes_read"], want["bytes_written"])


def test_missing_matplotlib_fails_before_any_work(tmp_path, monkeypatch, capsys):
    make_run(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main([str(tmp_path / "run"), "--out-dir", str(tmp_path / "out")]) == 2
    assert "matplotlib" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert main([str(tmp_path / "run"), "--out-dir", str(tmp_path / "out"), "--no-plots"]) == 0  # report still possible


def test_sweep_jobs_are_labelled_by_what_they_varied():
    from dlio_ckpt.analysis.sweeps import _distinguishing, _job_label

    rows = [{"job": 0, "overrides": "checkpoint.strategy=sharded workload=unet3d scale=tiny"},
            {"job": 1, "overrides": "checkpoint.strategy=async workload=unet3d scale=tiny"}]
    varied = _distinguishing(rows)
    assert [_job_label(r, varied) for r in rows] == ["job 0: checkpoint.strategy=sharded", "job 1: checkpoint.strategy=async"]
