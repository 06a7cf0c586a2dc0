"""Numbers MLPerf Storage and DLIO users can take as they are (issue 27, items 1-4 and 11).

- MLPerf checkpoint throughput: DLIO divides the whole checkpoint's size by each rank's duration
  and MLPerf takes the minimum over ranks, so a checkpoint's figure is all ranks' bytes / the
  slowest rank's duration, in GiB (DLIO's "GB"). Checked on a real 2-rank run, from the run's own
  per-rank bytes and times, and the bytes against the checkpoint files on disk.
- DLIO's [METRIC] lines, parsed as text, and DLIO's summary.json `metric` keys and the top-level
  keys mlpstorage reads.
- run.repeats=N: N per-repeat summaries; mean (std) and min..max equal numpy's over them.
- latency: min, p90, p99.9, stdev beside p50/p99/max, with no 1,000 s cap.
- `dlio_ckpt --version`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import load_summary, made_run, run_cli
from dlio_ckpt import __version__
from dlio_ckpt.metrics import latency
from dlio_ckpt.storage.events import EVENT_DTYPE, OP_CODE, PHASE_CODE, load_run_events

GIB = float(1 << 30)
MIB = float(1 << 20)
# The [METRIC] lines as DLIO's StatsCounter.end_run formats them: "name: mean (std)", or a word.
METRIC_LINE = re.compile(r"^\[METRIC\] (?P<name>[^:]+): (?P<mean>-?\d+\.\d+) \((?P<std>-?\d+\.\d+)\)$")
METRIC_WORD = re.compile(r"^\[METRIC\] (?P<name>[a-z_]+): (?P<word>\w+)$")
DLIO_CHECKPOINT_KEYS = {
    "save_checkpoint_io_mean_GB_per_second", "save_checkpoint_io_stdev_GB_per_second",
    "save_checkpoint_duration_mean_seconds", "save_checkpoint_duration_stdev_seconds",
    "load_checkpoint_io_mean_GB_per_second", "load_checkpoint_io_stdev_GB_per_second",
    "load_checkpoint_duration_mean_seconds", "load_checkpoint_duration_stdev_seconds", "checkpoint_size_GB",
}
DLIO_TRAIN_KEYS = {
    "train_au_percentage", "train_au_mean_percentage", "train_au_meet_expectation", "train_au_stdev_percentage",
    "train_throughput_samples_per_second", "train_throughput_mean_samples_per_second",
    "train_throughput_stdev_samples_per_second", "train_io_mean_MB_per_second", "train_io_stdev_MB_per_second",
}


def metric_lines(stdout: str) -> dict[str, tuple[float, float] | str]:
    found: dict[str, tuple[float, float] | str] = {}
    for line in stdout.splitlines():
        if match := METRIC_LINE.match(line):
            found[match["name"]] = (float(match["mean"]), float(match["std"]))
        elif match := METRIC_WORD.match(line):
            found[match["name"]] = match["word"]
    return found


@pytest.fixture(scope="module")
def two_rank_checkpoint_run(tmp_path_factory) -> tuple[dict, str, Path]:
    """Made once per session (made_run): the tests only read it."""
    base, stdout = made_run(tmp_path_factory, "mlperf-two-rank-checkpoint", lambda base: [
        "workload=llama3_8b", "scale=tiny", "mode=checkpoint", "progress=false", "checkpoint.drop_caches=false",
        "checkpoint.num_checkpoints_write=3", "checkpoint.num_checkpoints_read=2", "checkpoint.keep_last=0",
        f"storage.root={base / 'store'}", f"hydra.run.dir={base / 'run'}"], mpi_ranks=2)
    return load_summary(base / "run"), stdout, base / "store"


def test_mlperf_throughput_is_the_whole_checkpoint_over_the_slowest_rank(two_rank_checkpoint_run):
    summary, _, store = two_rank_checkpoint_run
    ckpt = summary["checkpoint"]
    figures = ckpt["mlperf"]
    assert figures["writes"] == 3 and figures["reads"] == 2
    expected = []
    for row, ranks in zip(ckpt["per_checkpoint"], figures["per_rank_writes"]):
        assert sorted(r["rank"] for r in ranks) == [0, 1]
        whole = sum(r["bytes"] for r in ranks)
        assert whole == row["bytes"]
        # DLIO: each rank's throughput is the whole checkpoint / its own duration; MLPerf: the min over ranks
        expected.append(min(whole / GIB / r["write_s"] for r in ranks))
        assert row["write_s_max"] == max(r["write_s"] for r in ranks)
    assert figures["write_throughput_gib_per_s_each"] == pytest.approx(expected, rel=1e-12)
    assert figures["write_throughput_gib_per_s_mean"] == pytest.approx(np.mean(expected), rel=1e-12)
    assert figures["write_throughput_gib_per_s_std"] == pytest.approx(np.std(expected), rel=1e-9, abs=1e-15)
    # not rank bytes / rank time (what dlio_ckpt reported before: about 1/N of it)
    per_rank_own = [min(r["bytes"] / GIB / r["write_s"] for r in ranks) for ranks in figures["per_rank_writes"]]
    assert np.mean(per_rank_own) < 0.75 * figures["write_throughput_gib_per_s_mean"]
    reads = [min(sum(x["bytes"] for x in ranks) / GIB / x["read_s"] for x in ranks) for ranks in figures["per_rank_reads"]]
    assert figures["read_throughput_gib_per_s_mean"] == pytest.approx(np.mean(reads), rel=1e-12)
    # the bytes the formula divides are the checkpoint data files' bytes on disk (keep_last=0 kept all three)
    (root,) = (store / "checkpoints").iterdir()
    for row in ckpt["per_checkpoint"]:
        files = [p for p in (root / row["folder"]).iterdir() if p.name != "dlio_ckpt_manifest.json"]
        assert len(files) == row["files"] == 4 and sum(p.stat().st_size for p in files) == row["bytes"]


def test_dlio_metric_lines_and_summary_keys(two_rank_checkpoint_run):
    summary, stdout, _ = two_rank_checkpoint_run
    metric = summary["metric"]
    assert set(metric) == DLIO_CHECKPOINT_KEYS
    figures = summary["checkpoint"]["mlperf"]
    assert metric["save_checkpoint_io_mean_GB_per_second"] == pytest.approx(figures["write_throughput_gib_per_s_mean"])
    assert metric["save_checkpoint_duration_mean_seconds"] == pytest.approx(figures["write_duration_s_mean"])
    assert metric["load_checkpoint_io_stdev_GB_per_second"] == pytest.approx(figures["read_throughput_gib_per_s_std"])
    assert metric["checkpoint_size_GB"] == pytest.approx(summary["checkpoint"]["bytes"] / GIB, rel=1e-6)
    lines = metric_lines(stdout)
    assert set(lines) == {"Checkpoint save duration (seconds)", "Checkpoint save I/O Throughput (GB/second)",
                          "Checkpoint load duration (seconds)", "Checkpoint load I/O Throughput (GB/second)"}
    assert "[METRIC] Number of Simulated Accelerators: 2 " in stdout.splitlines()
    for name, key in (("Checkpoint save I/O Throughput (GB/second)", "save_checkpoint_io"),
                      ("Checkpoint load I/O Throughput (GB/second)", "load_checkpoint_io")):
        assert lines[name] == (round(metric[f"{key}_mean_GB_per_second"], 4), round(metric[f"{key}_stdev_GB_per_second"], 4))
    assert lines["Checkpoint save duration (seconds)"] == (round(metric["save_checkpoint_duration_mean_seconds"], 4),
                                                           round(metric["save_checkpoint_duration_stdev_seconds"], 4))
    # what mlpstorage's reporting reads from a DLIO summary.json besides `metric` (mlpstorage/rules.py)
    assert summary["num_accelerators"] == 2 and summary["num_hosts"] == 1 and summary["start"]
    assert sum(summary["host_memory_GB"]) * GIB == pytest.approx(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    assert sum(summary["host_cpu_count"]) == os.cpu_count()


def test_training_metric_lines_are_dlios(tmp_path):
    (tmp_path / "cwd").mkdir()
    run = tmp_path / "run"
    done = run_cli(["workload=unet3d", "scale=tiny", "progress=false", "train.computation_time=0.01",
                    f"storage.root={tmp_path / 'store'}", f"hydra.run.dir={run}"], tmp_path / "cwd")
    assert done.returncode == 0, done.stderr
    summary = load_summary(run)
    metric, train = summary["metric"], summary["train"]
    assert DLIO_TRAIN_KEYS <= set(metric)
    assert metric["train_au_percentage"] == [pytest.approx(train["au"] * 100)]
    assert metric["train_throughput_samples_per_second"] == [pytest.approx(train["dlio_samples_per_s"])]
    nominal = summary["config"]["dataset"]["record_length_bytes"]
    assert metric["train_io_mean_MB_per_second"] == pytest.approx(train["dlio_samples_per_s"] * nominal / MIB)
    lines = metric_lines(done.stdout)
    assert lines["Training Accelerator Utilization [AU] (%)"] == (round(train["au"] * 100, 4), 0.0)
    assert lines["Training Throughput (samples/second)"] == (round(train["dlio_samples_per_s"], 4), 0.0)
    assert lines["Training I/O Throughput (MB/second)"] == (round(metric["train_io_mean_MB_per_second"], 4), 0.0)
    assert lines["train_au_meet_expectation"] == ("success" if train["au"] >= train["au_target"] else "fail")


def test_repeats_give_per_repeat_records_and_numpy_spread(tmp_path):
    (tmp_path / "cwd").mkdir()
    run, store = tmp_path / "run", tmp_path / "store"
    done = run_cli(["workload=llama3_8b", "scale=tiny", "mode=checkpoint", "progress=false", "checkpoint.drop_caches=false",
                    "run.repeats=3", f"storage.root={store}", f"hydra.run.dir={run}"], tmp_path / "cwd")
    assert done.returncode == 0, done.stderr
    summary = load_summary(run)
    assert summary["repeats"] == 3 and len(summary["per_repeat"]) == 3
    each = [load_summary(run / f"repeat-{i}") for i in (1, 2, 3)]
    assert [r["run_dir"] for r in summary["per_repeat"]] == [str(run / f"repeat-{i}") for i in (1, 2, 3)]
    rates = [r["checkpoint"]["mlperf"]["write_throughput_gib_per_s_mean"] for r in each]
    spread = summary["repeat_figures"]["checkpoint.mlperf.write_throughput_gib_per_s_mean"]
    assert spread["each"] == pytest.approx(rates)
    assert spread["mean"] == pytest.approx(np.mean(rates)) and spread["std"] == pytest.approx(np.std(rates))
    assert (spread["min"], spread["max"]) == (pytest.approx(min(rates)), pytest.approx(max(rates)))
    durations = [r["checkpoint"]["write_s_max"] for r in each]
    assert summary["repeat_figures"]["checkpoint.write_s_max"]["mean"] == pytest.approx(np.mean(durations))
    # DLIO's metric pools every save of every repeat, as DLIO pools a run's saves
    saves = [c["bytes"] / GIB / c["write_s_max"] for r in each for c in r["checkpoint"]["per_checkpoint"]]
    assert summary["metric"]["save_checkpoint_io_mean_GB_per_second"] == pytest.approx(np.mean(saves))
    assert all("save_checkpoint_io_mean_GB_per_second" in r["metric"] for r in each)  # each repeat: one mlpstorage run
    # one checkpoint folder on disk, holding the last repeat's checkpoints only
    folders = sorted((store / "checkpoints").iterdir())
    assert len(folders) == 1
    assert sorted(Path(c["folder"]).name for c in each[-1]["checkpoint"]["per_checkpoint"]) == \
        sorted(p.name for p in folders[0].iterdir() if p.is_dir())
    assert "over 3 repeats" in done.stdout and done.stdout.count("[METRIC] Number of Simulated Accelerators") == 1


def test_repeats_reuse_the_dataset(tmp_path):
    (tmp_path / "cwd").mkdir()
    run = tmp_path / "run"
    done = run_cli(["workload=unet3d", "scale=tiny", "progress=false", "run.repeats=2", "checkpoint.enabled=false",
                    f"storage.root={tmp_path / 'store'}", f"hydra.run.dir={run}"], tmp_path / "cwd")
    assert done.returncode == 0, done.stderr
    first, second = load_summary(run / "repeat-1"), load_summary(run / "repeat-2")
    assert first["dataset"]["reused"] is False and second["dataset"]["reused"] is True
    summary = load_summary(run)
    assert summary["created"]["dataset"] == first["dataset"]["folder"]  # so `clean` removes what repeat 1 generated
    assert summary["metric"]["train_au_percentage"] == [pytest.approx(first["train"]["au"] * 100),
                                                        pytest.approx(second["train"]["au"] * 100)]


@pytest.mark.parametrize("args, words", [
    (["run.repeats=0"], "run.repeats: runs the job N times"),
    (["run.repeats=2", "mode=plan"], "mode=plan does no I/O"),
    (["run.repeats=2", "mode=generate"], "generate.force=true"),
])
def test_bad_repeats_are_refused_in_one_line(tmp_path, args, words):
    (tmp_path / "cwd").mkdir()
    done = run_cli(["workload=unet3d", "scale=tiny", *args, f"storage.root={tmp_path / 'store'}",
                    f"hydra.run.dir={tmp_path / 'run'}"], tmp_path / "cwd")
    assert done.returncode == 2 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists() and not (tmp_path / "store").exists()


def test_version_prints_dlio_ckpts_version(tmp_path):
    done = run_cli(["--version"], tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == f"dlio_ckpt {__version__}"


# -- latency ------------------------------------------------------------------------------------

def _events(durations: list[float], phase: str = "checkpoint", op: str = "fsync") -> np.ndarray:
    events = np.zeros(len(durations), EVENT_DTYPE)
    events["op"], events["phase"] = OP_CODE[op], PHASE_CODE[phase]
    events["start"] = np.arange(len(durations)) * 1e5
    events["end"] = events["start"] + np.asarray(durations)
    return events


def _bound(value: float) -> float:
    return max(value, latency.SMALLEST_S) * 10 ** (1 / latency.BINS_PER_DECADE) * (1 + 1e-9)


def test_latency_has_fios_figures_and_no_upper_cap():
    rng = np.random.default_rng(3)
    durations = list(rng.lognormal(-7, 2, 2000)) + [1500.0, 4000.0, 86400.0 * 3]  # a 3-day fsync among them
    events = [_events(durations[0::2]), _events(durations[1::2])]  # two ranks
    row = latency.latency_section([{"latency": latency.rank_latency(e)} for e in events])["checkpoint"]["fsync"]
    took = np.concatenate([e["end"] - e["start"] for e in events])  # the recorded durations
    assert row["count"] == len(took) and row["min_s"] == took.min() and row["max_s"] == took.max()
    assert row["mean_s"] == pytest.approx(took.mean(), rel=1e-12)
    assert row["stdev_s"] == pytest.approx(np.std(took, ddof=1), rel=1e-9)  # fio's (sample) standard deviation
    for percent in (50, 90, 99, 99.9):
        true = np.percentile(took, percent, method="inverted_cdf")
        got = row[latency.percentile_key(percent)]
        assert true <= got * (1 + 1e-12) and got <= _bound(true), percent
    # the 1,000 s cap is gone: the 99.9th of 2,003 calls (nearest rank 2,001) is the 1,500 s one
    assert 1500.0 <= row["p99_9_s"] <= 1500.0 * 1.024


def test_latency_bins_hold_their_values():
    values = np.array([0.0, 1e-9, 1e-7, 1.0000001e-7, 1e-3, 0.5, 1.0, 999.9, 1000.0, 1e6])
    bins = latency.bin_of(values)
    assert np.all(latency.bin_edge(bins) >= values)
    assert np.all((bins == 0) | (latency.bin_edge(bins - 1) < values))


def test_run_latency_percentiles_match_numpy_over_the_event_files(tmp_path):
    (tmp_path / "cwd").mkdir()
    run = tmp_path / "run"
    done = run_cli(["workload=unet3d", "scale=tiny", "progress=false", "checkpoint.enabled=false",
                    f"storage.root={tmp_path / 'store'}", f"hydra.run.dir={run}"], tmp_path / "cwd")
    assert done.returncode == 0, done.stderr
    reads = load_summary(run)["latency"]["train"]["read"]
    events = load_run_events(run)[0].events
    mask = (events["phase"] == PHASE_CODE["train"]) & (events["op"] == OP_CODE["read"])
    took = events["end"][mask] - events["start"][mask]
    assert reads["count"] == len(took) and reads["min_s"] == pytest.approx(took.min()) and reads["max_s"] == pytest.approx(took.max())
    assert reads["stdev_s"] == pytest.approx(np.std(took, ddof=1), rel=1e-6)
    for percent in (50, 90, 99, 99.9):
        true = np.percentile(took, percent, method="inverted_cdf")
        assert true <= reads[latency.percentile_key(percent)] * (1 + 1e-9) <= _bound(true) * (1 + 1e-9)
    line = next(l for l in done.stdout.splitlines() if l.startswith("train reads"))
    assert f"p99.9 {reads['p99_9_s'] * 1e3:.3f}" in line and f"stdev {reads['stdev_s'] * 1e3:.3f}" in line


def test_a_percentile_past_1000_s_is_not_capped():
    """Before: the histogram ended at 1,000 s, and p99 of these calls read 1,000 s for 4,000 s."""
    durations = [0.01] * 10 + [1500.0, 4000.0]
    row = latency.latency_section([{"latency": latency.rank_latency(_events(durations))}])["checkpoint"]["fsync"]
    assert np.percentile(durations, 99, method="inverted_cdf") == 4000.0
    assert row["p99_s"] == 4000.0 and row["p90_s"] == pytest.approx(1500.0, rel=0.024) and row["p90_s"] >= 1500.0
