"""Disk space: a run that cannot fit is refused before anything is written (exit 2, the sizes);
a disk that fills up during generation or a checkpoint ends the run in one line per failing rank
naming the file and the free space (exit 1), with no partial files left behind."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ckpt_util import SMALL_MODEL
from cli_fork import run_forked
from conftest import BIN, cli_env
from dlio_ckpt.config.load import load_config
from dlio_ckpt.config.space import FREE_BYTES_VARIABLE, check_free_space
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.faults import VARIABLE
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME
from dlio_ckpt.plan.dataset import MANIFEST_NAME as DATASET_MANIFEST, plan_dataset

MIB = 1 << 20
# 4 files x 2 samples x 1 MiB = 8 MiB of dataset; checkpoints of SMALL_MODEL are 6 MiB (3 MiB model + optimizer)
DATASET = ["dataset.num_files_train=4", "dataset.num_files_eval=0", "dataset.num_samples_per_file=2",
           "dataset.record_length_bytes=1MiB", "dataset.record_length_bytes_stdev=0", "dataset.format=npy",
           "reader.batch_size=1", "model.layer_parameters=[]"]
CHECKPOINT_BYTES = 6 * MIB


def config(tmp_path: Path, *extra: str):
    return load_config([f"storage.root={tmp_path / 'store'}", "workload=unet3d", *SMALL_MODEL, *DATASET, *extra])


def refusal(cfg, free: int) -> str:
    with pytest.raises(ConfigError) as refused:
        check_free_space(cfg, 1, free_bytes=free)
    return str(refused.value)


def test_a_run_that_cannot_fit_is_refused_with_the_sizes(tmp_path):
    cfg = config(tmp_path, "checkpoint.steps_between_checkpoints=0", "checkpoint.epochs_between_checkpoints=1",
                 "checkpoint.checkpoint_after_epoch=1",
                 "train.epochs=3", "checkpoint.keep_last=0")
    needed = 8 * MIB + 3 * CHECKPOINT_BYTES  # dataset + one checkpoint per epoch, all kept
    check_free_space(cfg, 1, free_bytes=needed)
    message = refusal(cfg, needed - 1)
    assert message.startswith("storage.root: the run needs at least 26.0 MiB (dataset 8.0 MiB not generated yet + "
                              "3 checkpoints x 6.0 MiB) but ")
    assert "has 26.0 MiB free" in message


def test_keep_last_bounds_the_checkpoints_counted(tmp_path):
    cfg = config(tmp_path, "mode=checkpoint", "checkpoint.num_checkpoints_write=5", "checkpoint.keep_last=2")
    check_free_space(cfg, 1, free_bytes=2 * CHECKPOINT_BYTES)  # mode=checkpoint generates no dataset
    assert "(2 checkpoints x 6.0 MiB)" in refusal(cfg, 2 * CHECKPOINT_BYTES - 1)
    everything = config(tmp_path, "mode=checkpoint", "checkpoint.num_checkpoints_write=5", "checkpoint.keep_last=0")
    assert "(5 checkpoints x 6.0 MiB)" in refusal(everything, 2 * CHECKPOINT_BYTES)


def test_a_dataset_already_generated_is_not_counted(tmp_path):
    cfg = config(tmp_path, "checkpoint.enabled=false")
    assert "(dataset 8.0 MiB not generated yet)" in refusal(cfg, MIB)
    plan = plan_dataset(cfg, "npy")
    os.makedirs(plan.folder)
    Path(plan.folder, DATASET_MANIFEST).write_text(json.dumps({"fingerprint": plan.fingerprint}))
    check_free_space(cfg, 1, free_bytes=0)


def run(workdir: Path, args: list[str], env_extra: dict[str, str], ranks: int = 0) -> subprocess.CompletedProcess:
    env = cli_env()
    env.update(env_extra)
    command = [str(BIN / "dlio_ckpt"), "workload=unet3d", *SMALL_MODEL, *DATASET, "progress=false",
               f"storage.root={workdir / 'store'}", f"hydra.run.dir={workdir / 'run'}", *args]
    if not ranks:
        return run_forked(command, workdir / "cwd", env, 120)
    command = [str(BIN / "mpirun"), "-n", str(ranks), *command]
    return subprocess.run(command, cwd=workdir / "cwd", env=env, capture_output=True, text=True, timeout=120)


def test_the_cli_refuses_a_run_that_cannot_fit_before_writing_anything(workdir):
    done = run(workdir, [], {FREE_BYTES_VARIABLE: str(MIB)})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("dlio_ckpt: error: storage.root: the run needs at least ") and "has 1.0 MiB free" in line
    assert not (workdir / "run").exists() and not (workdir / "store").exists()


@pytest.mark.parametrize("ranks,rank", [(0, 0), pytest.param(2, 1, marks=pytest.mark.mpi)])
def test_a_full_disk_while_generating_names_the_file_and_leaves_no_partial_file(workdir, ranks, rank):
    done = run(workdir, ["mode=generate"], {VARIABLE: f"generate-write@{rank}:enospc"}, ranks)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("dlio_ckpt:")]
    assert len(lines) == 1, done.stderr
    prefix = f"dlio_ckpt: error (rank {rank}): " if ranks else "dlio_ckpt: error: "
    assert lines[0].startswith(prefix + "dataset generation failed: ")
    assert ".npy: No space left on device (" in lines[0] and " MiB free on " in lines[0]
    files = [p.name for p in (workdir / "store").rglob("*") if p.is_file()]
    assert not [name for name in files if ".tmp" in name]  # no partial (staged) file
    assert DATASET_MANIFEST not in files  # and the dataset is not taken for complete


def _small_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def test_a_real_full_disk_mid_checkpoint(workdir):
    disk = workdir / "disk"
    if not _small_tmpfs(disk, "8m"):
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        env = cli_env()
        env[FREE_BYTES_VARIABLE] = str(1 << 40)  # let the run start, so that the disk fills up during it
        done = subprocess.run([str(BIN / "dlio_ckpt"), "workload=unet3d", *SMALL_MODEL, "mode=checkpoint",
                               "model.layer_parameters=[]", "checkpoint.num_checkpoints_write=2", "progress=false",
                               f"storage.root={disk}",
                               f"hydra.run.dir={workdir / 'run'}"], cwd=workdir / "cwd", env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 1 and "Traceback" not in done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith("dlio_ckpt: error: checkpoint step_00000002 not committed: ")
        assert "rank_00000.bin: No space left on device (" in line and " MiB free on " in line
        (root,) = (disk / "checkpoints").iterdir()
        assert sorted(p.name for p in root.iterdir()) == [".dlio_ckpt_owner", "step_00000001"]  # the run's marker (clean.py)
        assert (root / "step_00000001" / MANIFEST_NAME).exists()
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
