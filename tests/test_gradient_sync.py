"""train.gradient_sync: the ranks meet after each step, as DDP's gradient all-reduce makes them; and
the training clock starts only when every rank is ready.

A slower rank is made with DLIO_CKPT_FAULT's `delay=` (faults.py): `step@1:delay=S` before each of
rank 1's steps, `train@1:delay=S` before its training starts. The assertions compare the ranks'
figures with the injected delay, with a margin of half of it: a delay only adds time.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import BIN, cli_env, load_summary

from dlio_ckpt.config.load import load_config, validate_command_line
from dlio_ckpt.engine.step_sync import StepSync, gradient_bytes, steps_every_rank_takes
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.formats.base import FileSpec
from dlio_ckpt.plan.model import build_model_plan
from dlio_ckpt.world import World

# 2 ranks x 4 steps of 8 one-sample files, batch 1 each, no checkpoint (nothing else meets the ranks)
TINY = ["workload=unet3d", "scale=tiny", "dataset.format=raw", "checkpoint.enabled=false", "progress=false",
        "dataset.num_files_train=8", "reader.batch_size=1", "reader.workers=threads", "train.epochs=1",
        "train.computation_time=0.01"]
STEPS = 4
DDP_DCP = Path(__file__).resolve().parents[1] / "benchmarks" / "realapps" / "ddp_dcp.yaml"
DELAY = 0.15


def run_two_ranks(workdir, fault: str, *overrides: str) -> dict:
    env = {**cli_env(), "DLIO_CKPT_FAULT": fault}
    done = subprocess.run([str(BIN / "mpirun"), "-n", "2", str(BIN / "dlio_ckpt"), *TINY,
                           f"storage.root={workdir / 'store'}", f"hydra.run.dir={workdir / 'run'}", *overrides],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return load_summary(workdir / "run")


# allreduce moves the model's bytes each step: a 1 MiB model keeps the test short
@pytest.mark.parametrize("sync", [["train.gradient_sync=barrier"],
                                  ["train.gradient_sync=allreduce", "model.model_size_bytes=1MiB",
                                   "model.layer_parameters=[65536]"]], ids=["barrier", "allreduce"])
def test_ranks_meet_each_step_and_the_wait_is_compute(workdir, sync):
    summary = run_two_ranks(workdir, f"step@1:delay={DELAY}", *sync)
    fast, slow = summary["ranks"]
    assert fast["steps"] == slow["steps"] == STEPS
    # rank 0 waited for rank 1's delay at every step's meeting, not for its data
    assert fast["sync_wait_s"] > STEPS * DELAY / 2
    assert fast["sync_wait_s"] > slow["sync_wait_s"]
    assert fast["data_wait_s"] < STEPS * DELAY / 2
    # both ranks ended their last step together: their training wall times agree
    assert abs(fast["train_wall_s"] - slow["train_wall_s"]) < DELAY / 2
    train = summary["train"]
    assert train["sync_wait_s"] == fast["sync_wait_s"]
    # the wait is accounted as compute: the computation_time asked for, plus the wait
    assert train["compute_s"] == pytest.approx(STEPS * 0.01 + fast["sync_wait_s"])


def test_the_training_clock_starts_when_every_rank_is_ready(workdir):
    """A rank whose setup ends first does not count its wait for the others as training time (it
    did: ddp_dcp's intermittent extra wall time, docs/fidelity.md)."""
    summary = run_two_ranks(workdir, "train@1:delay=0.6")
    fast, slow = summary["ranks"]
    assert abs(fast["train_wall_s"] - slow["train_wall_s"]) < 0.3
    # train.gradient_sync=none (the default): the ranks never meet
    assert fast["sync_wait_s"] == slow["sync_wait_s"] == summary["train"]["sync_wait_s"] == 0.0
    assert summary["train"]["compute_s"] == pytest.approx(STEPS * 0.01)


def test_steps_every_rank_takes_is_the_smallest_share():
    files = tuple(FileSpec(index=i, path="", num_samples=1, sample_bytes=0) for i in range(9))
    # 9 samples over 2 ranks: shares of 5 and 4, batches of 2: 3 and 2 (a partial one each: 1 and 0)
    assert steps_every_rank_takes(files, 2, False, 2, False, None) == 2
    assert steps_every_rank_takes(files, 2, True, 2, False, None) == 2
    assert steps_every_rank_takes(files, 4, False, 2, False, None) == 1
    assert steps_every_rank_takes(files, 1, False, 2, False, None) == 4
    assert steps_every_rank_takes(files, 2, False, 2, False, 1) == 1  # DLIO's count: every rank the same


def test_a_single_rank_never_meets_and_allreduce_sizes_the_gradients():
    sync = StepSync(World.serial(), "barrier", 5)
    assert sync.meet(1) == 0.0 and sync.meetings == 0
    config = load_config([f"workload={DDP_DCP}"])
    plan = build_model_plan(config.model, 2)
    # the program's model tensors (DDP all-reduces the parameters' gradients; BatchNorm's buffers are a few KB)
    assert gradient_bytes(plan, 0) == gradient_bytes(plan, 1) == 4_927_496


@pytest.mark.parametrize("overrides,expected", [
    (["train.gradient_sync=sometimes"], "train.gradient_sync: 'sometimes' is not allowed; choose one of: none, barrier, allreduce"),
    (["workload=resnet", "train.gradient_sync=allreduce"], "train.gradient_sync: allreduce sends the model's gradients"),
])
def test_bad_gradient_sync_is_refused_in_one_line(tmp_path, overrides, expected):
    with pytest.raises(ConfigError) as error:
        validate_command_line(["scale=tiny", *overrides, f"storage.root={tmp_path / 'store'}"], multirun=False,
                              world_size=1)
    assert expected in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "store").exists()
