"""Output that answers the user's question (issue 13): required bandwidth and the storage-bound
verdict, where time went, latency percentiles and IOPS, MLPerf-style checkpoint results.

One tiny async-checkpointing training run and one tiny mode=checkpoint run are shared by the
assertions (module-scoped), so the module stays fast.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import load_summary, made_run, run_cli
from dlio_ckpt.analysis.cli import main as analyze
from dlio_ckpt.metrics import bandwidth, latency, verdict
from dlio_ckpt.storage.events import OP_CODE, PHASE_CODE, load_run_events

MIB = float(1 << 20)


# The runs below are made once per session (made_run), whichever xdist worker needs one first: the
# tests only read them (reports and comparisons go to the test's own folder).
@pytest.fixture(scope="module")
def train_run(tmp_path_factory) -> tuple[Path, dict, str]:
    base, stdout = made_run(tmp_path_factory, "output-train", lambda base: [
        "workload=unet3d", "scale=tiny", "progress=false", "checkpoint.strategy=async", "reader.batch_size=2",
        "train.computation_time=0.02", f"storage.root={base / 'store'}", f"hydra.run.dir={base / 'run'}"])
    return base / "run", load_summary(base / "run"), stdout


@pytest.fixture(scope="module")
def checkpoint_run(tmp_path_factory) -> tuple[dict, str, Path]:
    base, stdout = made_run(tmp_path_factory, "output-ckpt", lambda base: [
        "workload=llama3_8b", "scale=tiny", "mode=checkpoint", "progress=false", "checkpoint.drop_caches=false",
        "checkpoint.num_checkpoints_write=3", "checkpoint.num_checkpoints_read=2",
        f"storage.root={base / 'store'}", f"hydra.run.dir={base / 'run'}"])
    return load_summary(base / "run"), stdout, base / "run"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    base, _ = made_run(tmp_path_factory, "output-sweep", lambda base: [
        "-m", "workload=unet3d", "scale=tiny", "progress=false", "checkpoint.strategy=sync,async",
        "train.computation_time=0.02", f"storage.root={base / 'store'}", f"hydra.sweep.dir={base / 'sweep'}"])
    return base / "sweep"


def _line(stdout: str, key: str) -> str:
    lines = [line for line in stdout.splitlines() if line.split("  ")[0].strip() == key]
    assert lines, f"no '{key}' row in:\n{stdout}"
    return lines[0]


# -- is the storage the bottleneck? -------------------------------------------------------------

def test_required_bandwidth_is_ranks_times_batch_times_sample_bytes_over_compute():
    need = bandwidth.required_read_bandwidth(ranks=8, batch_size=4, bytes_per_sample=140 * MIB, compute_s_per_step=1.0)
    assert need["required_mib_per_s_per_rank"] == pytest.approx(560.0)
    assert need["required_mib_per_s"] == pytest.approx(8 * 560.0)
    assert bandwidth.required_read_bandwidth(1, 4, MIB, 0.0)["required_mib_per_s"] is None


@pytest.mark.parametrize("delivered, bound, word", [(50.0, True, "storage-bound"), (105.0, False, "borderline"),
                                                    (300.0, False, "not storage-bound"), (None, None, "cannot judge")])
def test_storage_verdict_says_whether_and_by_how_much(delivered, bound, word):
    judged = verdict.judge(verdict.Evidence(fewest_steps=10, au_overall=0.5, au_target=0.9, required_mib_per_s=100.0,
                                            delivered_mib_per_s=delivered, data_wait_share=0.05, checkpoint_share=0.0,
                                            page_cache_risk=False))
    assert judged["storage_bound"] is bound
    assert judged["storage_line"].startswith(word)
    if delivered:
        assert judged["delivered_over_required"] == pytest.approx(delivered / 100.0)
        assert f"{delivered / 100.0:.{2 if delivered < 110 else 1}f}x" in judged["storage_line"]


def test_a_fast_storage_that_still_made_training_wait_says_so():
    def line(delivered, wait):
        return verdict.judge(verdict.Evidence(10, 0.5, 0.9, 100.0, delivered, wait, 0.0, False))["line"]

    assert "waited for data 40.0%" in line(300.0, 0.4) and "input pipeline" in line(300.0, 0.4)
    assert "waited" not in line(300.0, 0.05)
    assert "input pipeline" not in line(50.0, 0.9)


def test_a_run_reports_required_and_delivered_bandwidth_and_a_verdict(train_run):
    _, summary, stdout = train_run
    train, storage = summary["train"], summary["train"]["storage"]
    per_sample = train["bytes_read"] / train["samples"]
    assert storage["bytes_per_sample"] == pytest.approx(per_sample)
    assert storage["required_mib_per_s"] == pytest.approx(1 * 2 * per_sample / 0.02 / MIB)
    assert storage["delivered_mib_per_s"] == train["read_mib_per_s"]
    assert storage["delivered_over_required"] == pytest.approx(train["read_mib_per_s"] / storage["required_mib_per_s"])
    assert storage["storage_bound"] is None  # a dataset of a few MiB: the page cache served the reads
    assert _line(stdout, "storage").split("storage", 1)[1].strip() == storage["verdict"]
    assert f"{storage['required_mib_per_s']:.1f} MiB/s" in _line(stdout, "needed")


def test_the_table_shows_where_time_went_and_the_async_persist(train_run):
    _, summary, stdout = train_run
    shares = summary["train"]["time_shares"]
    time_row = _line(stdout, "time")
    for label, key in (("reading (waiting for data)", "reading"), ("computing", "computing"),
                       ("checkpointing", "checkpointing")):
        assert f"{label} {shares[key]:.1%}" in time_row
    assert f"checkpointing {shares['checkpointing']:.1%} (blocking training)" in time_row
    ckpt = summary["checkpoint"]
    assert f"{ckpt['persist_s_max']:.3f} s per checkpoint in the background" in _line(stdout, "async persist")
    # the time row's share is more than the per-save blocking time: it holds the final wait for the async saves
    assert "wait at the end of training for saves in flight" in _line(stdout, "async persist")


def test_the_page_cache_is_part_of_the_one_verdict(train_run):
    _, summary, stdout = train_run
    assert summary["dataset"]["page_cache_risk"] is True  # a few MiB always fits in memory
    assert not [line for line in stdout.splitlines() if "page cache and the verdict" in line]
    assert _line(stdout, "storage").split("storage", 1)[1].strip().startswith("not measured: reads likely served from "
                                                                               "the page cache")
    assert summary["train"]["run_verdict"]["line"] in _line(stdout, "verdict")


def test_plan_mode_without_an_accelerator_says_the_figures_are_the_workloads(workdir):
    done = run_cli(["workload=llama3_8b", "mode=plan", "metric.au=0.8", f"hydra.run.dir={workdir / 'plan'}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    plan = json.loads((workdir / "plan" / "plan.json").read_text())
    assert plan["accelerator"] is None and plan["au_target"] == 0.8
    assert _line(done.stdout, "accelerator").split("accelerator", 1)[1].strip().startswith("none named: the workload's own figures")
    assert "0.80 (metric.au)" in _line(done.stdout, "AU target")


def test_plan_mode_shows_the_dataset_side(workdir):
    run = workdir / "plan"
    done = run_cli(["workload=resnet", "mode=plan", "world.size=8", f"hydra.run.dir={run}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    plan = json.loads((run / "plan.json").read_text())
    data = plan["dataset"]
    assert data["required_mib_per_s"] == pytest.approx(8 * data["batch_size"] * data["bytes_per_sample"]
                                                        / data["compute_s_per_step"] / MIB)
    assert data["bytes"] == data["files_train"] * data["samples_per_file"] * data["bytes_per_sample"]
    assert f"{data['required_mib_per_s']:.1f} MiB/s" in _line(done.stdout, "dataset read needed")
    assert _line(done.stdout, "dataset").split("dataset", 1)[1].strip().startswith(f"{data['files_train']:,} files")
    assert plan["checkpoint"]["enabled"] is False  # resnet does not checkpoint: the table says so
    # the accelerator the compute time stands for, and the AU target a run must reach
    assert plan["accelerator"] == "h100" and plan["au_target"] == 0.9
    assert _line(done.stdout, "accelerator").endswith(f"h100: {data['compute_s_per_step']:.3f} s compute per step, "
                                                      f"batch {data['batch_size']} (accelerator=NAME picks another of the workload's)")
    assert "0.90 (metric.au)" in _line(done.stdout, "AU target")
    assert "off in this workload" in _line(done.stdout, "checkpointing")


# -- latency percentiles and IOPS ------------------------------------------------------------------

def test_latency_percentiles_and_iops_match_the_event_files(train_run):
    run, summary, stdout = train_run
    reads = summary["latency"]["train"]["read"]
    assert reads["count"] == summary["io"]["by_phase"]["train"]["reads"]
    events = load_run_events(run)[0].events
    mask = (events["phase"] == PHASE_CODE["train"]) & (events["op"] == OP_CODE["read"])
    took = events["end"][mask] - events["start"][mask]
    assert reads["max_s"] == pytest.approx(took.max())
    for percent in (50, 90, 99, 99.9):
        true = np.percentile(took, percent, method="inverted_cdf")
        key = latency.percentile_key(percent)
        # the histogram's upper bin edge: never below the true value, at most one bin above
        assert true <= reads[key] * (1 + 1e-9)
        assert reads[key] <= max(true, latency.SMALLEST_S) * 10 ** (1 / latency.BINS_PER_DECADE) * (1 + 1e-9)
    assert reads["min_s"] <= reads["p50_s"] <= reads["p90_s"] <= reads["p99_s"] <= reads["p99_9_s"] <= reads["max_s"]
    assert reads["iops"] == pytest.approx(reads["count"] / summary["ranks"][0]["train_read_s"], rel=1e-6)
    assert f"over {reads['count']:,} calls" in _line(stdout, "train reads")


# -- MLPerf Storage checkpoint results ----------------------------------------------------------

def test_checkpoint_mode_prints_mlperf_mean_and_std(checkpoint_run):
    summary, stdout, _ = checkpoint_run
    ckpt = summary["checkpoint"]
    figures = ckpt["mlperf"]
    durations = [c["write_s_max"] for c in ckpt["per_checkpoint"]]
    # DLIO / MLPerf: the whole checkpoint's bytes / the slowest rank's duration, in GiB (DLIO's "GB")
    rates = [c["bytes"] / (1 << 30) / c["write_s_max"] for c in ckpt["per_checkpoint"]]
    assert figures["writes"] == 3 and figures["reads"] == 2
    assert figures["write_duration_s_mean"] == pytest.approx(np.mean(durations))
    assert figures["write_duration_s_std"] == pytest.approx(np.std(durations))
    assert figures["write_throughput_gib_per_s_mean"] == pytest.approx(np.mean(rates))
    read_rates = [r["bytes"] / (1 << 30) / r["read_s_max"] for r in ckpt["per_read"]]
    assert figures["read_throughput_gib_per_s_std"] == pytest.approx(np.std(read_rates))
    save = _line(stdout, "save (MLPerf)")
    assert (f"duration {figures['write_duration_s_mean']:.3f} ({figures['write_duration_s_std']:.3f}) s" in save
            and f"{figures['write_throughput_gib_per_s_mean']:.3f} ({figures['write_throughput_gib_per_s_std']:.3f}) GiB/s" in save
            and "mean (std) over 3 writes" in save)
    assert "over 2 reads" in _line(stdout, "load (MLPerf)")
    assert "min over ranks = all bytes / the slowest rank's duration" in _line(stdout, "MLPerf rule")
    assert _line(stdout, "page cache").endswith("not dropped (not requested)")


# -- sweeps and comparisons ---------------------------------------------------------------------

def test_sweep_summary_has_checkpoint_time_au_and_the_verdict(sweep):
    with open(sweep / "sweep_summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["job"] for r in rows] == ["0", "1"]
    for row in rows:
        summary = load_summary(sweep / row["job"])
        ckpt, train = summary["checkpoint"], summary["train"]
        assert float(row["checkpoint_blocking_s_max"]) == pytest.approx(ckpt["blocking_s_max"])
        assert float(row["checkpoint_persist_s_max"]) == pytest.approx(ckpt["persist_s_max"])
        assert float(row["checkpoint_training_time_lost_fraction"]) == pytest.approx(ckpt["training_time_lost_fraction"])
        assert float(row["train_au_overall"]) == pytest.approx(train["au_overall"])
        assert row["train_storage_verdict"] == train["storage"]["verdict"]
        bound = train["storage"]["storage_bound"]
        assert row["train_storage_bound"] == ("" if bound is None else str(bound))
        assert row["train_verdict"] == train["run_verdict"]["verdict"]
        assert float(row["train_required_read_mib_per_s"]) == pytest.approx(train["storage"]["required_mib_per_s"])
        assert float(row["train_read_p99_s"]) == pytest.approx(summary["latency"]["train"]["read"]["p99_s"])


def _compare_json(capsys, argv: list[str]) -> dict:
    assert analyze(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)["comparison"]


def test_compare_shows_each_metric_once_under_the_folder_numbers(sweep, capsys):
    table = _compare_json(capsys, ["--compare", str(sweep)])
    metrics = [row["metric"] for row in table["rows"]]
    assert len(metrics) == len(set(metrics))
    # the sweep's own columns for figures the table has are folded into them, not repeated
    assert not {"train_samples_per_s", "train_au", "train_au_overall", "job", "status"} & set(metrics)
    assert list(table["ids"].values()) == ["job 0", "job 1"]
    by_metric = {row["metric"]: row for row in table["rows"]}
    for run, short in table["ids"].items():
        summary = load_summary(sweep / short.split()[1])
        assert by_metric["strategy"]["values"][run] == summary["checkpoint"]["strategy"]
        assert by_metric["au_overall"]["values"][run] == pytest.approx(summary["train"]["au_overall"])
    # a sweep's job folders given one by one keep their folder numbers (not positions 1, 2)
    one_by_one = _compare_json(capsys, ["--compare", str(sweep / "1"), str(sweep / "0"), "--no-plots"])
    assert list(one_by_one["ids"].values()) == ["job 1", "job 0"] and one_by_one["runs"] == table["runs"][::-1]


def test_compare_prints_a_dash_for_absent_values_within_80_columns(train_run, checkpoint_run, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)  # the report folder, named short: the line saying where it went fits 80 columns too
    train_dir, checkpoint_dir = train_run[0], checkpoint_run[2]
    assert analyze(["--compare", str(train_dir), str(checkpoint_dir), "--no-plots", "--out-dir", "cmp"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    samples = [line for line in lines if "training samples/s" in line]
    # the checkpoint-only run trained nothing: a dash, not 0
    assert samples and samples[0].rstrip(" │|").split()[-1] == "-"
    assert re.search(r"^1: run", out, re.M) and re.search(r"^2: run", out, re.M)
    # more jobs than fit: further tables, still 80 columns, every job a column somewhere
    many = [str(train_dir), str(checkpoint_dir)] * 3
    assert analyze(["--compare", *many, "--no-plots", "--out-dir", "cmp"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    headers = [line for line in out.splitlines() if line.startswith("┃ metric")]
    assert len(headers) >= 2 and sorted(re.findall(r"┃\s+(\d)\s", " ".join(headers))) == ["1", "2", "3", "4", "5", "6"]


def test_compare_against_a_baseline_gives_the_change_in_percent(sweep, capsys, tmp_path):
    table = _compare_json(capsys, ["--compare", str(sweep), "--baseline", "0"])
    assert table["baseline"].startswith("job 0")
    base, other = table["runs"]
    wall = next(row for row in table["rows"] if row["metric"] == "wall_s")
    expected = (wall["values"][other] - wall["values"][base]) / wall["values"][base] * 100
    assert wall["change_percent"][other] == pytest.approx(expected)
    assert wall["change_percent"][base] == 0
    assert analyze(["--baseline", "0", str(sweep), "--no-plots", "--out-dir", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert f"({round(expected):+d}%)" in out
    assert analyze(["--compare", str(sweep), "--baseline", "7", "--no-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--baseline 7" in err[0] and "job 0, job 1" in err[0]


def test_html_report_is_one_file_with_its_figures_and_explains_the_bandwidth(train_run, tmp_path, capsys):
    run, summary, _ = train_run
    report = tmp_path / "out" / "report.html"
    assert analyze([str(run), "--output", str(report)]) == 0
    text = report.read_text()
    images = re.findall(r"<img src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    assert len(images) == 5  # bandwidth, I/O cost, per-rank time, access sizes, heat map: inside the page
    assert all(base64.b64decode(image)[:8] == b"\x89PNG\r\n\x1a\n" for image in images)
    assert not re.search(r"src='[^d]", text)
    rate = summary["io"]["by_phase"]["train"]["bytes_read"]
    words = html.unescape(text)
    assert f"Is the storage the bottleneck? {summary['train']['storage']['verdict']}" in words
    assert "the slowest rank's" in words and "the plot averages" in words and f"{rate:,} bytes" in words


def test_the_analysis_shows_exact_latency_percentiles_and_iops(train_run, capsys, tmp_path):
    run, summary, _ = train_run
    assert analyze([str(run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    exact = doc["latency"]["train"]["read"]
    events = load_run_events(run)[0].events
    mask = (events["phase"] == PHASE_CODE["train"]) & (events["op"] == OP_CODE["read"])
    took = events["end"][mask] - events["start"][mask]
    assert exact["count"] == len(took) == summary["latency"]["train"]["read"]["count"]
    for percent in (50, 90, 99, 99.9):
        assert exact[latency.percentile_key(percent)] == pytest.approx(np.percentile(took, percent, method="inverted_cdf"))
    assert exact["min_s"] == took.min() and exact["stdev_s"] == pytest.approx(np.std(took, ddof=1))
    assert exact["p50_s"] <= summary["latency"]["train"]["read"]["p50_s"]  # the summary's bin edge is never below
    assert exact["iops"] == pytest.approx(summary["latency"]["train"]["read"]["iops"])
    assert analyze([str(run), "--no-plots", "--out-dir", str(tmp_path / "lat")]) == 0
    out = capsys.readouterr().out
    assert "latency and IOPS" in out
    assert "Latency and IOPS" in (tmp_path / "lat" / "report.md").read_text()


@pytest.mark.mpi
def test_two_ranks_need_twice_the_bandwidth_and_count_every_rank_in_the_latency(workdir):
    run = workdir / "run"
    done = run_cli(["workload=unet3d", "scale=tiny", "progress=false", "checkpoint.enabled=false", "reader.batch_size=2",
                    "train.computation_time=0.02", f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}"],
                   workdir / "cwd", mpi_ranks=2)
    assert done.returncode == 0, done.stderr
    summary = load_summary(run)
    storage, train = summary["train"]["storage"], summary["train"]
    assert storage["ranks"] == 2
    assert storage["required_mib_per_s"] == pytest.approx(2 * 2 * (train["bytes_read"] / train["samples"]) / 0.02 / MIB)
    assert storage["required_mib_per_s_per_rank"] == pytest.approx(storage["required_mib_per_s"] / 2)
    reads = summary["latency"]["train"]["read"]
    per_rank = [r.events for r in load_run_events(run)]
    assert len(per_rank) == 2
    counted = sum(int(((e["phase"] == PHASE_CODE["train"]) & (e["op"] == OP_CODE["read"])).sum()) for e in per_rank)
    assert reads["count"] == counted == summary["io"]["by_phase"]["train"]["reads"]
    slowest = max(r["train_read_s"] for r in summary["ranks"])
    assert reads["iops"] == pytest.approx(counted / slowest, rel=1e-6)
