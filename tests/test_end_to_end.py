"""End-to-end runs of the dlio_ckpt command, serially and under `mpirun -n 2`.

Byte counts are checked against the files on disk (os.stat), not against our own bookkeeping.
"""

from __future__ import annotations

import csv
import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from cli_fork import start_forked
from conftest import BIN, cli_env, load_summary, made_once, run_cli, session_folder

TINY_RAW = ["workload=unet3d", "scale=tiny", "dataset.format=raw", "checkpoint.enabled=false", "progress=false"]


def dataset_dir(root: Path, workload: str = "unet3d") -> Path:
    """The one dataset of a test's storage root: data/<workload>/<fingerprint>/."""
    (folder,) = (root / "data" / workload).iterdir()
    return folder


def train_files(root: Path, workload: str = "unet3d") -> list[Path]:
    return sorted((dataset_dir(root, workload) / "train").rglob("*.*"))


def run_ok(args, cwd, ranks=0):
    done = run_cli(args, cwd, mpi_ranks=ranks)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def tiny_serial_run(tmp_path_factory) -> tuple[Path, Path]:
    """One tiny serial run (storage root, run folder) that the tests below only read."""
    def make(folder: Path) -> None:
        (folder / "cwd").mkdir(parents=True)
        run_ok(TINY_RAW + [f"storage.root={folder / 'store'}", f"hydra.run.dir={folder / 'run'}"], folder / "cwd")

    folder = made_once(session_folder(tmp_path_factory), "e2e-tiny-serial", make)
    return folder / "store", folder / "run"


@pytest.fixture(scope="module")
def tiny_mpi_run(tmp_path_factory) -> tuple[Path, Path]:
    """One tiny run under `mpirun -n 2` without hydra.run.dir (rank 0 picks the folder): its
    storage root and its working folder, read by the tests below."""
    def make(folder: Path) -> None:
        (folder / "cwd").mkdir(parents=True)
        run_ok(TINY_RAW + [f"storage.root={folder / 'store'}"], folder / "cwd", ranks=2)

    folder = made_once(session_folder(tmp_path_factory), "e2e-tiny-mpi", make)
    return folder / "store", folder / "cwd"


def test_serial_run_counts_the_bytes_on_disk(tiny_serial_run):
    root, run = tiny_serial_run
    summary = load_summary(run)
    on_disk = sum(p.stat().st_size for p in train_files(root))
    train = summary["train"]
    assert summary["world_size"] == 1
    assert train["epochs"] == 2
    assert train["bytes_read"] == 2 * on_disk  # every sample of every file, once per epoch
    assert train["samples"] == 2 * 8
    assert train["steps"] == 4  # 8 samples / batch 4, two epochs
    assert summary["dataset"]["bytes_on_disk"] == on_disk
    manifest = dataset_dir(root) / ".dlio_ckpt_dataset.json"
    assert summary["io"]["by_phase"]["generate"]["bytes_written"] == on_disk + manifest.stat().st_size
    assert (run / ".hydra" / "config.yaml").exists()
    assert (run / "events" / "rank-00000.npz").exists()


def test_events_file_matches_summary(tiny_serial_run):
    _, run = tiny_serial_run
    with np.load(run / "events" / "rank-00000.npz") as data:
        events = data["events"]
        phases = json.loads(str(data["meta"]))["phases"]
    train_reads = events[(events["phase"] == phases.index("train")) & (events["op"] == 2)]
    assert int(train_reads["length"].sum()) == load_summary(run)["train"]["bytes_read"]
    assert (train_reads["end"] >= train_reads["start"]).all()


def test_compute_time_is_emulated_and_accounted(workdir):
    root, run = workdir / "store", workdir / "run"
    run_ok(TINY_RAW + [f"storage.root={root}", f"hydra.run.dir={run}", "train.computation_time=0.02",
                       "train.first_step_time=0.05"], workdir / "cwd")
    train = load_summary(run)["train"]
    assert train["compute_s"] == pytest.approx(train["steps"] * 0.02 + 0.05)  # the first step's tracing once
    assert train["wall_s"] >= train["compute_s"]
    assert 0 < train["au"] <= 1


def test_dataset_is_reused_and_regenerated_when_config_changes(workdir):
    root = workdir / "store"
    args = TINY_RAW + [f"storage.root={root}"]
    run_ok(args + [f"hydra.run.dir={workdir / 'a'}"], workdir / "cwd")
    run_ok(args + [f"hydra.run.dir={workdir / 'b'}"], workdir / "cwd")
    run_ok(args + [f"hydra.run.dir={workdir / 'c'}", "dataset.seed=99"], workdir / "cwd")
    assert load_summary(workdir / "a")["dataset"]["reused"] is False
    assert load_summary(workdir / "b")["dataset"]["reused"] is True
    assert load_summary(workdir / "b")["io"]["by_phase"].get("generate", {}).get("bytes_written", 0) == 0
    assert load_summary(workdir / "c")["dataset"]["reused"] is False


@pytest.mark.parametrize("fmt", ["npz", "npy", "hdf5", "tfrecord", "indexed_binary"])
def test_every_format_trains_end_to_end(workdir, fmt):
    root, run = workdir / "store", workdir / "run"
    run_ok(["workload=unet3d", "scale=tiny", f"dataset.format={fmt}", "checkpoint.enabled=false", "progress=false",
            "dataset.num_samples_per_file=2", "dataset.record_length_bytes=64KiB", "dataset.record_length_bytes_min=1KiB",
            f"storage.root={root}", f"hydra.run.dir={run}"], workdir / "cwd")
    train = load_summary(run)["train"]
    assert train["samples"] == 2 * 16
    assert train["bytes_read"] >= train["payload_bytes"] > 0


def test_generate_mode_writes_only_the_dataset(workdir):
    root, run = workdir / "store", workdir / "run"
    run_ok(TINY_RAW + [f"storage.root={root}", f"hydra.run.dir={run}", "mode=generate"], workdir / "cwd")
    summary = load_summary(run)
    assert "train" not in summary
    assert len(train_files(root)) == 8
    assert summary["io"]["bytes_read"] == 0


@pytest.mark.mpi
def test_mpi_run_shards_and_counts_bytes(tiny_mpi_run):
    root, cwd = tiny_mpi_run
    (run,) = (p for p in (cwd / "runs").glob("*/*") if p.is_dir())
    summary = load_summary(run)
    on_disk = sum(p.stat().st_size for p in train_files(root))
    assert summary["world_size"] == 2
    assert summary["train"]["bytes_read"] == 2 * on_disk
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert sum(r["train_bytes_read"] for r in summary["ranks"]) == 2 * on_disk
    # scale=tiny grows its 8 files to 16 for two ranks: 2 steps of batch 4 each an epoch, 2 epochs
    assert len(train_files(root)) == 16
    assert sum(r["samples"] for r in summary["ranks"]) == 32
    assert [r["steps"] for r in summary["ranks"]] == [4, 4]
    assert sorted(p.name for p in (run / "events").iterdir()) == ["rank-00000.npz", "rank-00001.npz"]
    assert [p.name for p in run.rglob(".hydra")] == [".hydra"]


@pytest.mark.mpi
def test_mpi_rank0_chooses_one_run_folder(tiny_mpi_run):
    _, cwd = tiny_mpi_run
    folders = [p for p in (cwd / "runs").glob("*/*") if p.is_dir()]
    assert len(folders) == 1
    assert load_summary(folders[0])["world_size"] == 2


def test_concurrent_runs_get_their_own_folders(workdir):
    cwd = workdir / "cwd"
    run_ok(TINY_RAW + [f"storage.root={workdir / 'store'}", "mode=generate"], cwd)  # dataset ready, runs race on folders only
    command = [str(BIN / "dlio_ckpt"), *TINY_RAW, f"storage.root={workdir / 'store'}"]
    procs = [start_forked(command, cwd, cli_env()) for _ in range(2)]  # two processes at once, forked (cli_fork.py)
    assert [p.wait(timeout=120).returncode for p in procs] == [0, 0]
    folders = [p for p in (cwd / "runs").glob("*/*") if (p / "summary.json").exists()]
    assert len(folders) == 3


@pytest.mark.mpi
def test_a_failing_rank_ends_the_job_promptly(workdir):
    env = cli_env()
    env["DLIO_CKPT_FAULT"] = "train@1"
    command = [str(BIN / "mpirun"), "-n", "2", str(BIN / "dlio_ckpt"), *TINY_RAW, f"storage.root={workdir / 'store'}",
               f"hydra.run.dir={workdir / 'run'}", "train.computation_time=5"]
    started = time.monotonic()
    done = subprocess.run(command, cwd=workdir / "cwd", env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "failure injected at train on rank 1" in done.stderr
    assert not (workdir / "run" / "summary.json").exists()
    # 2 epochs x 2 steps of 5 s would take 20 s on rank 0 if it waited for the dead rank
    assert time.monotonic() - started < 60


def test_sweep_runs_every_job_and_writes_a_table(workdir):
    sweep = workdir / "sweep"
    run_ok(["-m", "workload=unet3d,resnet", "scale=tiny", "reader.batch_size=4,8", "checkpoint.enabled=false", "progress=false",
            f"storage.root={workdir / 'store'}", f"hydra.sweep.dir={sweep}"], workdir / "cwd")
    with open(sweep / "sweep_summary.csv") as table:
        rows = list(csv.DictReader(table))
    assert len(rows) == 4
    batch = {r["job"]: next(o for o in r["overrides"].split() if o.startswith("reader.batch_size=")) for r in rows}
    assert {(r["workload"], batch[r["job"]]) for r in rows} == {
        ("unet3d", "reader.batch_size=4"), ("unet3d", "reader.batch_size=8"), ("resnet", "reader.batch_size=4"), ("resnet", "reader.batch_size=8")}
    assert all(r["status"] == "ok" and int(r["train_bytes_read"]) > 0 for r in rows)
    for row in rows:
        summary = load_summary(sweep / row["job"])
        assert summary["workload"] == row["workload"]
        # one column per swept key, the job's own value
        assert row["reader.batch_size"] == str(summary["config"]["reader"]["batch_size"])
        assert float(row["wall_s_without_generation"]) == pytest.approx(summary["wall_s"] - summary["dataset"]["generate_s"])
        assert row["dataset_reused"] == str(summary["dataset"]["reused"])
    header = next(csv.reader((sweep / "sweep_summary.csv").read_text().splitlines()))
    assert header[:4] == ["job", "overrides", "reader.batch_size", "status"]  # workload has its own column already
    assert header.count("workload") == 1 and "scale" not in header  # scale=tiny is the same in every job
    # each workload's first job generated its dataset, its second job reused it
    for workload in ("unet3d", "resnet"):
        reused = sorted(r["dataset_reused"] for r in rows if r["workload"] == workload)
        assert reused == ["False", "True"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["reader.batch_sise=4"], "did you mean 'reader.batch_size'"),
        (["workload=resnett"], "did you mean 'resnet'"),
        (["dataset.num_files_train=-3"], "dataset.num_files_train: must be at least 1"),
        (["scale=tiny", "reader.batch_size=100000"], "larger than the dataset"),
        (["scale=tiny", "storage.root={file}/data"], "is not a folder"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(workdir, args, message):
    cwd = workdir / "cwd"
    (workdir / "a-file").write_text("not a folder")
    args = [a.format(file=workdir / "a-file") for a in args]
    if not any(a.startswith("storage.root=") for a in args):
        args.append(f"storage.root={workdir / 'store'}")
    done = run_cli(args, cwd)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("dlio_ckpt: error:")
    assert list(cwd.iterdir()) == [] and not (workdir / "store").exists()


@pytest.mark.mpi
def test_bad_input_under_mpi_exits_2_once(workdir):
    cwd = workdir / "cwd"
    done = run_cli(["scale=tiny", "dataset.format=raw", "dataset.num_files_train=1", "dataset.num_samples_per_file=1",
                    "reader.batch_size=1", f"storage.root={workdir / 'store'}"], cwd, mpi_ranks=2)
    assert done.returncode == 2
    assert done.stderr.count("dlio_ckpt: error:") == 1 and "2 ranks but only 1 training samples" in done.stderr
    assert list(cwd.iterdir()) == []


def test_direct_io_reads_count_the_aligned_bytes_and_skip_the_cache_warning(workdir):
    root, run = workdir / "store", workdir / "run"
    run_ok(TINY_RAW + [f"storage.root={root}", f"hydra.run.dir={run}", "storage.direct_io=true"], workdir / "cwd")
    summary = load_summary(run)
    on_disk = sum(p.stat().st_size for p in train_files(root))
    # O_DIRECT reads whole 4 KiB blocks; a sample that ends mid-block still costs the block,
    # but the end of a file caps what the kernel returns.
    assert summary["train"]["bytes_read"] >= 2 * on_disk
    assert not any("page cache" in w for w in summary["warnings"])
    assert summary["dataset"]["page_cache_risk"] is False


def test_small_dataset_warns_about_the_page_cache(workdir):
    run = workdir / "run"
    run_ok(TINY_RAW + [f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}"], workdir / "cwd")
    summary = load_summary(run)
    assert summary["dataset"]["page_cache_risk"] is True
    assert any("storage.direct_io=true" in w for w in summary["warnings"])


def test_evaluation_reads_the_eval_files(workdir):
    root, run = workdir / "store", workdir / "run"
    run_ok(TINY_RAW + [f"storage.root={root}", f"hydra.run.dir={run}", "evaluation.enabled=true", "dataset.num_files_eval=2",
                     "train.step_counting=global"],
           workdir / "cwd")
    summary = load_summary(run)
    eval_bytes = sum(p.stat().st_size for p in (dataset_dir(root) / "eval").rglob("*.bin"))
    assert summary["eval"]["samples"] == 2 * 2
    assert summary["eval"]["bytes_read"] == 2 * eval_bytes
    assert summary["io"]["by_phase"]["eval"]["bytes_read"] == 2 * eval_bytes


@pytest.mark.slow
def test_tensorflow_reader_reads_every_tfrecord_file(workdir, tensorflow_without_keras):
    pytest.importorskip("tensorflow")
    root, run = workdir / "store", workdir / "run"
    run_ok(["workload=resnet", "scale=tiny", "reader.name=tensorflow", "progress=false", "train.epochs=1",
            f"storage.root={root}", f"hydra.run.dir={run}"], workdir / "cwd")
    summary = load_summary(run)
    on_disk = sum(p.stat().st_size for p in train_files(root, "resnet"))
    assert summary["train"]["samples"] == 8 * 8
    assert summary["train"]["bytes_read"] == on_disk
    # every pread TFRecordDataset makes, each timed by the pipeline's stamps (tf_reader.py)
    from dlio_ckpt.engine.tf_reader import tfrecord_reads

    with np.load(run / "events" / "rank-00000.npz") as data:
        events = data["events"]
    reads = events[events["op"] == 2]
    assert len(reads) == sum(len(tfrecord_reads(p.stat().st_size)) for p in train_files(root, "resnet"))
    assert summary["train"]["reads"] == len(reads) > 8
    assert (reads["end"] >= reads["start"]).all() and (reads["end"] > reads["start"]).any()
    train = summary["train"]
    assert train["read_s_max"] > 0
    assert train["read_mib_per_s"] == pytest.approx(train["bytes_read"] / train["read_s_max"] / (1 << 20))


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", ["sharded", "single_writer", "async"])
def test_mpi_checkpoints_put_the_planned_bytes_on_disk_and_restore(workdir, strategy):
    root, run = workdir / "store", workdir / "run"
    run_ok(["workload=llama3_8b", "scale=tiny", "progress=false", f"checkpoint.strategy={strategy}", "checkpoint.restore=true",
            "checkpoint.drop_caches=false", f"storage.root={root}", f"hydra.run.dir={run}"], workdir / "cwd", ranks=2)
    summary = load_summary(run)
    ckpt = summary["checkpoint"]
    folders = sorted(p for p in (root / "checkpoints").glob("*/*") if p.is_dir())
    assert ckpt["writes"] == len(folders) >= 1
    for folder, record in zip(folders, ckpt["per_checkpoint"]):
        manifest = json.loads((folder / "dlio_ckpt_manifest.json").read_text())
        data = sum((folder / f["path"]).stat().st_size for f in manifest["files"])
        assert data == record["bytes"]
    assert ckpt["restore_verified"] is True
    writers = {r["rank"]: r["bytes_written"] for r in summary["ranks"]}
    if strategy == "single_writer":
        assert writers[1] == 0  # rank 1 only sent its state to rank 0
    else:
        assert writers[1] > 0
    assert not any("only one of 2 ranks writes" in w for w in summary["warnings"])


@pytest.mark.mpi
def test_mpi_sharded_checkpoint_with_one_writer_says_so(workdir):
    run = workdir / "run"
    run_ok(["workload=unet3d", "scale=tiny", "progress=false", f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}"],
           workdir / "cwd", ranks=2)
    summary = load_summary(run)
    assert summary["checkpoint"]["writes"] == 1
    written = []
    for rank in (0, 1):
        with np.load(run / "events" / f"rank-0000{rank}.npz") as data:
            events, meta = data["events"], json.loads(str(data["meta"]))
        mask = (events["phase"] == meta["phases"].index("checkpoint")) & (events["op"] == meta["ops"].index("write"))
        written.append(int(events["length"][mask].sum()))
    assert written[0] > 0 and written[1] == 0
    assert any("only one of 2 ranks writes" in w for w in summary["warnings"])


def tiny_scale_workloads() -> list[str]:
    """The library's workloads that test_every_workload_runs_at_tiny_scale runs: the seed workloads
    run in their own sweep (test_workloads_new.py), which also checks their checkpoints' bytes; flux
    at scale=tiny still writes 8 files of 8 rows of 2 MiB (132 MiB, ~4 s here): it runs on 2 ranks
    with small rows in test_mlperf_v3.py instead."""
    from dlio_ckpt.config.groups import workload_names
    from test_workloads_new import SEED_WORKLOADS

    return [w for w in workload_names() if w not in ("replay", "flux") and w not in SEED_WORKLOADS]


# One sweep per part: a job in a sweep costs ~1 s, a run of its own ~1.6 s (Hydra's set-up), so the
# library runs as three sweeps that xdist spreads, not as one (the suite's longest test) nor as twelve.
PARTS = 3


@pytest.mark.slow
@pytest.mark.parametrize("part", range(PARTS), ids=[f"part{i + 1}of{PARTS}" for i in range(PARTS)])
def test_every_workload_runs_at_tiny_scale(workdir, part):
    """Every third workload of the library as one sweep, forked from the tests' forkserver: each job
    with its own run folder, summary and sweep_summary.csv row."""
    everything = tiny_scale_workloads()
    assert len(everything) >= 10
    names = everything[part::PARTS]
    sweep = workdir / "sweep"
    run_ok(["-m", f"workload={','.join(names)}", "scale=tiny", "train.epochs=1", "progress=false", "checkpoint.drop_caches=false",
            f"storage.root={workdir / 'store'}", f"hydra.sweep.dir={sweep}"], workdir / "cwd")
    with open(sweep / "sweep_summary.csv") as table:
        rows = list(csv.DictReader(table))
    assert sorted(r["workload"] for r in rows) == sorted(names)
    for row in rows:
        assert row["status"] == "ok", row
        summary = load_summary(sweep / row["job"])
        assert summary["workload"] == row["workload"]
        assert summary["io"]["bytes_read"] + summary["io"]["bytes_written"] > 0
        if summary["mode"] == "train":
            assert summary["train"]["steps"] >= 1


def test_direct_io_counts_whole_blocks_the_kernel_read(workdir):
    root, run = workdir / "store", workdir / "run"
    # 5000-byte samples: each O_DIRECT read moves the 4 KiB blocks around it, up to 8 KiB + 4 KiB.
    run_ok(TINY_RAW + [f"storage.root={root}", f"hydra.run.dir={run}", "storage.direct_io=true",
                       "dataset.record_length_bytes=5000", "dataset.record_length_bytes_stdev=0", "dataset.num_samples_per_file=4",
                       "dataset.record_length_bytes_min=1"], workdir / "cwd")
    summary = load_summary(run)
    with np.load(run / "events" / "rank-00000.npz") as data:
        events = data["events"]
        phases = json.loads(str(data["meta"]))["phases"]
    reads = events[(events["phase"] == phases.index("train")) & (events["op"] == 2)]
    file_size = 4 * 5000
    expected = 0
    for offset in reads["offset"]:
        first, last = offset - offset % 4096, -(-(offset + 5000) // 4096) * 4096
        expected += min(last, file_size) - first  # the kernel stops at the end of the file
    assert summary["train"]["bytes_read"] == int(reads["length"].sum()) == expected
    assert summary["train"]["payload_bytes"] == len(reads) * 5000
    assert summary["train"]["bytes_read"] > summary["train"]["payload_bytes"]


@pytest.mark.mpi
def test_mpi_sweep_runs_every_job_on_every_rank(workdir):
    sweep = workdir / "sweep"
    run_ok(["-m", "workload=unet3d,resnet", "scale=tiny", "checkpoint.enabled=false", "progress=false",
            f"storage.root={workdir / 'store'}", f"hydra.sweep.dir={sweep}"], workdir / "cwd", ranks=2)
    with open(sweep / "sweep_summary.csv") as table:
        rows = list(csv.DictReader(table))
    assert [(r["workload"], r["world_size"], r["status"]) for r in rows] == [("unet3d", "2", "ok"), ("resnet", "2", "ok")]
    assert sorted(p.parent.name for p in sweep.rglob(".hydra")) == ["0", "1"]


@pytest.mark.mpi
def test_a_rank_killed_mid_checkpoint_leaves_a_torn_checkpoint_that_restore_skips(workdir):
    root = workdir / "store"
    common = ["workload=llama3_8b", "scale=tiny", "progress=false", "checkpoint.drop_caches=false", f"storage.root={root}",
              "checkpoint.durability=commit"]  # the commit protocol is what tells a torn checkpoint apart
    env = cli_env()
    env["DLIO_CKPT_FAULT"] = "checkpoint-step:2@1:kill"  # rank 1 dies (SIGKILL) after its first file of step 2
    crashed = subprocess.run([str(BIN / "mpirun"), "-n", "2", str(BIN / "dlio_ckpt"), *common, "mode=train",
                              "checkpoint.steps_between_checkpoints=1", "train.total_steps=3", f"hydra.run.dir={workdir / 'crashed'}"],
                             cwd=workdir / "cwd", env=env, capture_output=True, text=True, timeout=120)
    assert crashed.returncode != 0
    (folder,) = (root / "checkpoints").iterdir()
    steps = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert steps == ["global_step1", "global_step2"]
    assert (folder / "global_step1" / "dlio_ckpt_manifest.json").exists()
    assert not (folder / "global_step2" / "dlio_ckpt_manifest.json").exists()
    assert any((folder / "global_step2").iterdir())  # data was written, never committed

    run = workdir / "restore"
    run_ok(common + ["mode=restore", f"checkpoint.restore_from={folder}", f"hydra.run.dir={run}"], workdir / "cwd", ranks=2)
    ckpt = load_summary(run)["checkpoint"]
    assert ckpt["restore_verified"] is True and ckpt["restore_step"] == 1
    assert any("global_step2" in s and "torn" in s for s in ckpt["restore_skipped"])
    manifest = json.loads((folder / "global_step1" / "dlio_ckpt_manifest.json").read_text())
    assert ckpt["restore_bytes"] == sum(f["size"] for f in manifest["files"])


def test_restore_mode_needs_an_existing_folder(workdir):
    done = run_cli(["workload=llama3_8b", "scale=tiny", "mode=restore", f"checkpoint.restore_from={workdir / 'none'}"], workdir / "cwd")
    assert done.returncode == 2 and "checkpoint.restore_from" in done.stderr
