"""Bigger than one machine: the host of every rank in the results, the weak-scaling table built from
runs at several rank counts, and the Slurm submission a sweep would make (checked without Slurm)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cli_fork import run_main_forked
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
    for ranks in (1, 2):
        root, run = workdir / f"store{ranks}", workdir / f"np{ranks}"
        done = run_cli(TINY + [f"dataset.num_files_train={4 * ranks}", f"storage.root={root}", f"hydra.run.dir={run}"],
                       workdir / "cwd", mpi_ranks=ranks if ranks > 1 else 0)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[ranks] = (root, run)

    summary = load_summary(runs[2][1])
    host = socket.gethostname()
    assert summary["hostnames"] == [host] * 2
    assert [(r["rank"], r["hostname"]) for r in summary["ranks"]] == [(0, host), (1, host)]
    for rank in range(2):  # each rank's own event file records where it ran
        with np.load(runs[2][1] / "events" / f"rank-{rank:05d}.npz") as data:
            assert json.loads(str(data["meta"]))["hostname"] == host

    done = run_main_forked("dlio_ckpt-analyze", ["--scaling", str(runs[1][1]), str(runs[2][1]), "--json"],
                           workdir / "cwd", cli_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert [r["ranks"] for r in rows] == [1, 2]
    assert {r["configuration"] for r in rows} == {"unet3d"}  # num_files_train grew with the ranks
    for row, ranks in zip(rows, (1, 2)):
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
    done = run_main_forked("dlio_ckpt-analyze", ["--scaling", str(workdir / "cwd")], workdir, cli_env(),
                           timeout=60)
    assert done.returncode == 2
    assert "holds no run folder" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def slurm_dry_run(workdir: Path, *overrides: str) -> subprocess.CompletedProcess:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    return run_cli(["--slurm-dry-run", "-m", "hydra/launcher=slurm", *overrides, f"hydra.sweep.dir={workdir / 'sweep'}"],
                   workdir / "cwd")


def test_slurm_dry_run_prints_one_array_job_per_configuration_running_dlio_ckpt_under_srun(workdir, monkeypatch):
    monkeypatch.setenv("DLIO_CKPT_FREE_BYTES", "1")  # printed on a host without the storage: its free space is not asked
    done = slurm_dry_run(workdir, "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=4", "hydra.launcher.partition=debug",
                         "hydra.launcher.timeout_min=30", "workload=unet3d,resnet", "scale=tiny", "reader.batch_size=1")
    assert done.returncode == 0, done.stderr[-3000:]
    script = done.stdout[done.stdout.index("#!/bin/bash"):]
    flags = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH --")}
    assert flags["#SBATCH --array"] == "0-1%2"  # two configurations: two jobs of one array
    assert flags["#SBATCH --nodes"] == "2" and flags["#SBATCH --ntasks-per-node"] == "4"
    assert flags["#SBATCH --partition"] == "debug" and flags["#SBATCH --time"] == "30"
    lines = script.splitlines()
    (srun,) = [i for i, line in enumerate(lines) if line.startswith("srun ")]
    assert lines.index("export DLIO_CKPT_MPI=1") < srun  # every srun task joins the MPI world
    assert "-m submitit.core._submit" in lines[srun] and str(workdir / "sweep" / ".submitit") in lines[srun]
    assert "2 Slurm job(s)" in done.stdout and "8 dlio_ckpt rank(s)" in done.stdout
    assert not (workdir / "sweep").exists()  # nothing pickled, nothing submitted, no folder left


def test_slurm_dry_run_in_the_default_sweep_folder_leaves_nothing(workdir):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    done = run_cli(["--slurm-dry-run", "-m", "hydra/launcher=slurm", "workload=unet3d", "scale=tiny", "reader.batch_size=1"],
                   workdir / "cwd")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "/multirun/" in done.stdout  # the script names the default multirun/<date>/<time> folder
    assert list((workdir / "cwd").iterdir()) == []  # and none of it is left behind


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


FAKE_SBATCH = r'''#!/usr/bin/env python3
"""sbatch for tests: runs the array's jobs one after another in the background, as Slurm would later."""
import os, re, subprocess, sys
if sys.argv[1] == "--test-only":  # asked before submitting whether the cluster would take the job: yes
    sys.exit(print("sbatch: Job 4241 to start at now using 2 processors on nodes fake in partition fake", file=sys.stderr))
script = sys.argv[1]
text = open(script).read()
flags = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
first, last = map(int, re.match(r"(\d+)-(\d+)", flags.get("array", "0-0")).groups())
tasks = int(flags.get("nodes", 1)) * int(flags.get("ntasks-per-node", 1))
with open(os.environ["FAKE_SLURM_DIR"] + "/submitted.sh", "w") as copy:
    copy.write(text)
if os.fork() == 0:  # the "cluster": detached from sbatch's output, which submitit waits on
    log = os.open(os.environ["FAKE_SLURM_DIR"] + "/jobs.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.setsid()
    for index in range(first, last + 1):
        env = dict(os.environ, SLURM_ARRAY_JOB_ID="4242", SLURM_ARRAY_TASK_ID=str(index), SLURM_JOB_ID=str(5000 + index),
                   SLURM_NTASKS=str(tasks), SLURM_JOB_NUM_NODES=flags.get("nodes", "1"), SLURM_NODEID="0")
        subprocess.run(["bash", script], env=env, stdin=subprocess.DEVNULL)
    os._exit(0)
print("Submitted batch job 4242")
'''

FAKE_SRUN = r'''#!/usr/bin/env python3
"""srun for tests: SLURM_NTASKS tasks of the command, started by mpirun, each told its SLURM_PROCID."""
import os, sys
args = sys.argv[1:]
while args and args[0].startswith("--"):
    if args.pop(0) in ("--output", "--error"):
        args.pop(0)
task = ["sh", "-c", 'SLURM_PROCID=$PMI_RANK SLURM_LOCALID=$PMI_RANK exec "$@"', "task"]
os.execv(os.environ["FAKE_MPIRUN"], [os.environ["FAKE_MPIRUN"], "-n", os.environ["SLURM_NTASKS"], *task, *args])
'''


@pytest.mark.mpi
@pytest.mark.slow
def test_a_slurm_sweep_runs_each_configuration_as_a_job_of_mpi_ranks_under_srun(workdir):
    """Through the real launcher and submitit, with sbatch and srun stood in for by scripts: srun starts
    the job's tasks with mpirun, so each task must join the MPI world that srun's PMI would give it."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    fake = workdir / "fake_slurm"
    fake.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("srun", FAKE_SRUN), ("sacct", "#!/bin/sh\necho 'JobID|State|NodeList'\n")):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    env = cli_env()
    env.update(PATH=f"{fake}:{BIN}:{env['PATH']}", FAKE_SLURM_DIR=str(fake), FAKE_MPIRUN=str(BIN / "mpirun"))
    sweep = workdir / "sweep"
    done = subprocess.run([str(BIN / "dlio_ckpt"), "-m", "hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2", *TINY,
                           "reader.batch_size=1,2", f"storage.root={workdir / 'store'}", f"hydra.sweep.dir={sweep}"],
                          cwd=workdir / "cwd", env=env, capture_output=True, text=True, timeout=300)
    jobs_log = (fake / "jobs.log").read_text() if (fake / "jobs.log").exists() else ""
    assert done.returncode == 0, done.stderr[-2000:] + jobs_log[-2000:]
    assert "#SBATCH --ntasks-per-node=2" in (fake / "submitted.sh").read_text()
    on_disk = train_bytes_on_disk(workdir / "store")
    for job in ("0", "1"):
        summary = load_summary(sweep / job)
        assert summary["world_size"] == 2  # the two srun tasks formed one MPI world
        assert [r["rank"] for r in summary["ranks"]] == [0, 1]
        assert summary["train"]["bytes_read"] == summary["train"]["epochs"] * on_disk
    assert (sweep / "sweep_summary.csv").read_text().count(",ok,") == 2
