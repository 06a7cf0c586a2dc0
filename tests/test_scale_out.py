"""Bigger than one machine: the host of every rank in the results, the weak-scaling table built from
runs at several rank counts, and the Slurm submission a sweep would make (checked without Slurm)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import BIN, cli_env, load_summary, run_cli
from dlio_ckpt.analysis.scaling import keys_that_follow_ranks

MIB = 1 << 20
TINY = ["workload=unet3d", "scale=tiny", "dataset.format=raw", "checkpoint.enabled=false", "progress=false"]


def train_bytes_on_disk(root: Path) -> int:
    (dataset,) = (root / "data" / "unet3d").iterdir()
    return sum(p.stat().st_size for p in (dataset / "train").rglob("*.bin"))


def test_keys_that_grow_with_the_ranks_are_the_scaling_not_the_configuration():
    points = [
        {"ranks": 1, "overrides": ["dataset.num_files_train=4", "reader.batch_size=2"]},
        {"ranks": 1, "overrides": ["dataset.num_files_train=4", "reader.batch_size=4"]},
        {"ranks": 2, "overrides": ["dataset.num_files_train=8", "reader.batch_size=2"]},
        {"ranks": 2, "overrides": ["dataset.num_files_train=8", "reader.batch_size=4"]},
    ]
    assert keys_that_follow_ranks(points) == {"dataset.num_files_train"}


@pytest.mark.mpi
def test_runs_at_two_rank_counts_give_a_weak_scaling_table_and_name_each_ranks_host(workdir):
    runs = {}
    for ranks in (1, 3):
        root, run = workdir / f"store{ranks}", workdir / f"np{ranks}"
        done = run_cli(TINY + [f"dataset.num_files_train={4 * ranks}", f"storage.root={root}", f"hydra.run.dir={run}"],
                       workdir / "cwd", mpi_ranks=ranks if ranks > 1 else 0)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[ranks] = (root, run)

    summary = load_summary(runs[3][1])
    host = socket.gethostname()
    assert summary["hostnames"] == [host] * 3
    assert [(r["rank"], r["hostname"]) for r in summary["ranks"]] == [(0, host), (1, host), (2, host)]
    for rank in range(3):  # each rank's own event file records where it ran
        with np.load(runs[3][1] / "events" / f"rank-{rank:05d}.npz") as data:
            assert json.loads(str(data["meta"]))["hostname"] == host

    done = subprocess.run([str(BIN / "dlio_ckpt-analyze"), "--scaling", str(runs[1][1]), str(runs[3][1]), "--json"],
                          cwd=workdir / "cwd", env=cli_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert [r["ranks"] for r in rows] == [1, 3]
    assert {r["configuration"] for r in rows} == {"unet3d"}  # num_files_train grew with the ranks
    for row, ranks in zip(rows, (1, 3)):
        root, run = runs[ranks]
        train = load_summary(run)["train"]
        moved = train["epochs"] * train_bytes_on_disk(root)  # every file read once per epoch
        assert train["bytes_read"] == moved
        assert row["read_mib_per_s"] == pytest.approx(moved / train["read_s_max"] / MIB)
        assert row["read_mib_per_s_per_rank"] == pytest.approx(row["read_mib_per_s"] / ranks)
        assert row["hosts"] == 1
    assert rows[0]["read_mib_per_s_efficiency"] == 1.0
    assert rows[1]["read_mib_per_s_efficiency"] == pytest.approx(rows[1]["read_mib_per_s_per_rank"] / rows[0]["read_mib_per_s_per_rank"])
    assert list((workdir / "cwd").iterdir()) == []  # the table is printed, not written


def test_scaling_of_a_path_that_is_no_run_is_one_line_exit_2(workdir):
    done = subprocess.run([str(BIN / "dlio_ckpt-analyze"), "--scaling", str(workdir / "cwd")], env=cli_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "holds no run folder" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def slurm_dry_run(workdir: Path, *overrides: str) -> subprocess.CompletedProcess:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    return run_cli(["--slurm-dry-run", "-m", "hydra/launcher=slurm", *overrides, f"hydra.sweep.dir={workdir / 'sweep'}"],
                   workdir / "cwd")


def test_slurm_dry_run_prints_one_array_job_per_configuration_running_dlio_ckpt_under_srun(workdir):
    done = slurm_dry_run(workdir, "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=4", "hydra.launcher.partition=debug",
                         "hydra.launcher.timeout_min=30", "workload=unet3d,resnet,bert", "scale=tiny", "reader.batch_size=1")
    assert done.returncode == 0, done.stderr[-3000:]
    script = done.stdout[done.stdout.index("#!/bin/bash"):]
    flags = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH --")}
    assert flags["#SBATCH --array"] == "0-2%3"  # three configurations: three jobs of one array
    assert flags["#SBATCH --nodes"] == "2" and flags["#SBATCH --ntasks-per-node"] == "4"
    assert flags["#SBATCH --partition"] == "debug" and flags["#SBATCH --time"] == "30"
    lines = script.splitlines()
    (srun,) = [i for i, line in enumerate(lines) if line.startswith("srun ")]
    assert lines.index("export DLIO_CKPT_MPI=1") < srun  # every srun task joins the MPI world
    assert "-m submitit.core._submit" in lines[srun] and str(workdir / "sweep" / ".submitit") in lines[srun]
    assert "3 Slurm job(s)" in done.stdout and "8 dlio_ckpt rank(s)" in done.stdout
    assert not (workdir / "sweep" / ".submitit").exists()  # nothing pickled, nothing submitted


def test_slurm_sweep_is_checked_for_the_world_size_of_its_jobs(workdir):
    done = slurm_dry_run(workdir, "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=4", "workload=unet3d", "scale=tiny",
                         "dataset.num_files_train=4")
    assert done.returncode == 2
    assert "8 ranks but only 4 training samples" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (workdir / "sweep").exists()


def test_slurm_dry_run_needs_the_slurm_launcher(workdir):
    done = run_cli(["--slurm-dry-run", "-m", "workload=unet3d", "scale=tiny"], workdir / "cwd")
    assert done.returncode == 2 and "hydra/launcher=slurm" in done.stderr
    assert list((workdir / "cwd").iterdir()) == []


@pytest.mark.slow
def test_a_submitit_sweep_runs_each_job_in_a_process_of_its_own(workdir):
    """The local submitit launcher pickles the task into a new process, as the Slurm one does per srun task."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = workdir / "sweep"
    done = run_cli(["-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=1", *TINY,
                    f"storage.root={workdir / 'store'}", f"hydra.sweep.dir={sweep}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = load_summary(sweep / "0")
    assert summary["world_size"] == 1
    assert summary["train"]["bytes_read"] == summary["train"]["epochs"] * train_bytes_on_disk(workdir / "store")
    assert "0,workload=unet3d" in (sweep / "sweep_summary.csv").read_text()
