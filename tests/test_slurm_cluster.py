"""The Slurm path on a real one-node Slurm cluster (tests/slurm_cluster.py: Debian's slurm-wlm 22.05
and munge, started once for the session on 127.0.0.1): srun's PMI starting the ranks, a sweep
submitted through submitit and sbatch whose script is the dry run's, scancel of a checkpointing job,
and the submissions Slurm refuses. Skipped, with the reason, where Slurm is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from cli_fork import run_main_forked
from conftest import BIN, cli_env, load_summary
from slurm_cluster import SlurmCluster, missing

TINY = ["workload=unet3d", "scale=tiny", "dataset.format=raw", "checkpoint.enabled=false", "progress=false"]
# What the mpich wheel's MPI needs from srun (found on this cluster: pmi2 forms the world; none gives
# each task a world of one; pmix is not loadable without libpmix, and is not what the wheel speaks).
MPI = "pmi2"


@pytest.fixture(scope="session")
def slurm():
    reason = missing()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


def slurm_env(cluster: SlurmCluster, **extra: str) -> dict[str, str]:
    env = cli_env()
    env.update({"SLURM_CONF": str(cluster.conf), "PATH": f"{BIN}:{env['PATH']}", **extra})
    return env


def dlio(cluster: SlurmCluster, args: list[str], cwd: Path, prefix: list[str] = (), **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, str(BIN / "dlio_ckpt"), *args], cwd=cwd, env=slurm_env(cluster, **extra),
                          capture_output=True, text=True, timeout=180)


def train_bytes_on_disk(root: Path) -> int:
    (dataset,) = (root / "data" / "unet3d").iterdir()
    return sum(p.stat().st_size for p in (dataset / "train").rglob("*.bin"))


def test_srun_starts_the_ranks_of_one_mpi_world_through_pmi2(slurm, workdir):
    run = workdir / "run"
    done = dlio(slurm, [*TINY, f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}"], workdir / "cwd",
                prefix=["srun", f"--mpi={MPI}", "-n", "2"])
    assert done.returncode == 0, done.stderr[-3000:] + slurm.logs()[-2000:]
    summary = load_summary(run)
    assert summary["world_size"] == 2 and [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert summary["train"]["bytes_read"] == summary["train"]["epochs"] * train_bytes_on_disk(workdir / "store")


def test_srun_tasks_that_form_no_mpi_world_are_refused_in_one_line(slurm, workdir):
    """--mpi=none (Debian's MpiDefault) makes each task a world of one, which would run the job twice
    into one run folder: refused before anything is written."""
    done = dlio(slurm, [*TINY, f"storage.root={workdir / 'store'}", f"hydra.run.dir={workdir / 'run'}"], workdir / "cwd",
                prefix=["srun", "--mpi=none", "-n", "2"], DLIO_CKPT_MPI="1")
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("dlio_ckpt")]
    assert len(lines) == 1 and "did not join one MPI world" in lines[0] and "--mpi=pmi2" in lines[0]
    assert not (workdir / "run").exists() and not (workdir / "store").exists()


def test_a_sweep_goes_through_sbatch_runs_the_dry_run_script_and_compares(slurm, workdir):
    sweep = workdir / "sweep"
    args = ["-m", "hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2", "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.timeout_min=5", *TINY, "reader.batch_size=1,2", f"storage.root={workdir / 'store'}",
            f"hydra.sweep.dir={sweep}"]
    dry = dlio(slurm, ["--slurm-dry-run", *args], workdir / "cwd")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert not sweep.exists()
    done = dlio(slurm, args, workdir / "cwd", SLURM_MPI_TYPE=MPI)  # sbatch exports it to the job's srun
    assert done.returncode == 0, done.stderr[-3000:] + slurm.logs()[-2000:]

    (job_folder,) = [p for p in (sweep / ".submitit").iterdir() if p.name.split("_")[0].isdigit()][:1]
    array_job = job_folder.name.split("_")[0]
    ran = slurm.run(["scontrol", "write", "batch_script", array_job, "-"]).stdout  # what slurmctld ran
    assert ran.rstrip("\n") == dry.stdout[dry.stdout.index("#!/bin/bash"):].rstrip("\n")

    on_disk = train_bytes_on_disk(workdir / "store")
    for job in ("0", "1"):
        summary = load_summary(sweep / job)
        assert summary["world_size"] == 2 and [r["rank"] for r in summary["ranks"]] == [0, 1]
        assert summary["train"]["bytes_read"] == summary["train"]["epochs"] * on_disk
    compared = run_main_forked("dlio_ckpt-analyze", ["--compare", str(sweep), "--json"], workdir / "cwd",
                               cli_env(), timeout=120)
    assert compared.returncode == 0, compared.stderr
    table = json.loads(compared.stdout)
    runs = table["comparison"]["runs"]
    assert len(runs) == 2 and all(set(row["values"]) == set(runs) for row in table["comparison"]["rows"])
    # every training byte of both jobs is in the table (the events also hold the small reads around them)
    assert table["bytes_read"] >= sum(load_summary(sweep / job)["train"]["bytes_read"] for job in ("0", "1"))


CKPT = ["workload=llama3_8b", "scale=tiny", "mode=train", "progress=false", "checkpoint.drop_caches=false",
        "checkpoint.durability=commit", "checkpoint.steps_between_checkpoints=1", "checkpoint.keep_last=0"]


def test_scancel_ends_a_checkpointing_job_in_one_line_and_commits_nothing_half_way(slurm, workdir):
    """scancel sends SIGTERM to every rank (SIGKILL KillWait=5 s later): the ranks end, one line says
    so, and every checkpoint folder is either committed whole (its manifest verifies) or torn (no
    manifest), which restore skips."""
    root, run, log = workdir / "store", workdir / "run", workdir / "job.log"
    root.mkdir()  # (a new storage.root would add its note line)
    command = " ".join([str(BIN / "srun"), f"--mpi={MPI}", str(BIN / "dlio_ckpt"), *CKPT, "train.total_steps=100000",
                        "train.computation_time=0.01", f"storage.root={root}", f"hydra.run.dir={run}"]).replace(str(BIN / "srun"), "srun")
    submitted = subprocess.run(["sbatch", "--parsable", "-n", "2", f"--output={log}", f"--chdir={workdir / 'cwd'}", "--wrap",
                                command], env=slurm_env(slurm), capture_output=True, text=True, timeout=30)
    job = submitted.stdout.strip()
    assert submitted.returncode == 0 and job.isdigit(), submitted.stderr
    deadline = time.monotonic() + 120
    while not list(root.glob("checkpoints/*/global_step1/dlio_ckpt_manifest.json")):  # a checkpoint committed
        assert time.monotonic() < deadline and slurm.job_state(job) in ("PENDING", "RUNNING", "CONFIGURING"), \
            (log.read_text() if log.exists() else "") + slurm.logs()[-2000:]
        time.sleep(0.05)
    slurm.run(["scancel", job])
    state = slurm.wait_for_job(job, timeout=60)
    assert state == "CANCELLED", state + log.read_text()
    ours = [line for line in log.read_text().splitlines() if line.startswith("dlio_ckpt")]  # the rest is Slurm's
    assert len(ours) == 1 and "terminated by SIGTERM" in ours[0], log.read_text()
    (folder,) = (root / "checkpoints").iterdir()
    steps = sorted(p for p in folder.iterdir() if p.is_dir())
    committed = [p for p in steps if (p / "dlio_ckpt_manifest.json").exists()]
    assert len(committed) >= 1 and set(steps) - set(committed) <= {steps[-1]}, (steps, committed)  # only the newest may be torn

    restored = workdir / "restore"
    done = dlio(slurm, ["workload=llama3_8b", "scale=tiny", "progress=false", "checkpoint.drop_caches=false",
                        f"storage.root={root}", "mode=restore", f"checkpoint.restore_from={folder}", f"hydra.run.dir={restored}"],
                workdir / "cwd", prefix=["srun", f"--mpi={MPI}", "-n", "2"])
    assert done.returncode == 0, done.stderr[-3000:]
    ckpt = load_summary(restored)["checkpoint"]
    assert ckpt["restore_verified"] is True and ckpt["restore_step"] == int(committed[-1].name.removeprefix("global_step")), ckpt
    assert len(ckpt["restore_skipped"]) == len(steps) - len(committed), (ckpt, steps, committed)


@pytest.mark.parametrize("overrides, reason", [
    (["hydra.launcher.partition=nosuch"], "invalid partition specified: nosuch"),
    (["hydra.launcher.tasks_per_node=8", "hydra.launcher.cpus_per_task=1"], "Requested node configuration is not available"),
    (["hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1"], "Requested node configuration is not available"),
])
def test_a_job_slurm_would_refuse_is_one_line_exit_2_and_nothing_submitted(slurm, workdir, overrides, reason):
    before = slurm.run(["squeue", "--noheader", "--states=all", "--format=%i"]).stdout.split()
    done = dlio(slurm, ["-m", "hydra/launcher=slurm", *overrides, "workload=unet3d", "scale=tiny",
                        f"storage.root={workdir / 'store'}", f"hydra.sweep.dir={workdir / 'sweep'}"], workdir / "cwd")
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and reason in done.stderr and "nothing was submitted" in done.stderr
    assert slurm.run(["squeue", "--noheader", "--states=all", "--format=%i"]).stdout.split() == before
    assert not (workdir / "sweep").exists() and list((workdir / "cwd").iterdir()) == []


def test_an_unconfigured_slurm_is_one_line_exit_2(slurm, workdir):
    """The packages installed but no slurm.conf (none in /etc/slurm, no SLURM_CONF): sbatch cannot work."""
    if Path("/etc/slurm/slurm.conf").exists():
        pytest.skip("this machine has a configured Slurm of its own")
    env = cli_env()
    env.pop("SLURM_CONF", None)
    done = subprocess.run([str(BIN / "dlio_ckpt"), "-m", "hydra/launcher=slurm", "workload=unet3d", "scale=tiny",
                           f"hydra.sweep.dir={workdir / 'sweep'}"], cwd=workdir / "cwd", env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Slurm would not run" in done.stderr
    assert "configuration source" in done.stderr
    assert not (workdir / "sweep").exists()


def test_no_slurm_on_path_is_one_line_exit_2(workdir):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    env = cli_env()
    env["PATH"] = "/usr/local/nothing"  # sbatch and srun absent
    done = subprocess.run([str(BIN / "dlio_ckpt"), "-m", "hydra/launcher=slurm", "workload=unet3d", "scale=tiny",
                           f"hydra.sweep.dir={workdir / 'sweep'}"], cwd=workdir / "cwd", env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "sbatch is not on PATH" in done.stderr
    assert not (workdir / "sweep").exists()
