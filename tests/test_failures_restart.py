"""Injected failures end to end: every rank loses its state and restores, training goes on from the
restored step, and the run after the restart is the uninterrupted run's (same samples per step,
same checkpoint bytes on disk); the accounting counts the lost steps; failures.restart=exit stops
with exit code 75 and the same command resumes the run folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_util import data_files
from conftest import load_summary, run_cli
from dlio_ckpt.plan.failures import failure_time

# 32 one-sample files, batch 2: 16 steps an epoch, 2 epochs; a 2 MiB model with float optimizer state
# (lossy has floats to quantise) that changes sparsely
RUN = ["workload=unet3d", "scale=tiny", "dataset.num_files_train=32", "dataset.num_samples_per_file=1",
       "dataset.record_length_bytes=16KiB", "dataset.record_length_bytes_stdev=0", "dataset.record_length_bytes_min=1",
       "reader.batch_size=2", "train.epochs=2", "train.computation_time=0.001", "model.kind=explicit",
       "model.model_size_bytes=2MiB", "model.optimization_groups=[65536]", "model.layer_parameters=[]",
       "model.parallelism.zero_stage=3", "checkpoint.enabled=true", "checkpoint.update=sparse",
       "checkpoint.update_chunk_bytes=4KiB", "checkpoint.keep_last=0", "progress=false",
       "checkpoint.durability=commit"]  # the uninterrupted reference run too (runs with failures use commit anyway)


def run(workdir: Path, name: str, extra: list[str], ranks: int = 0):
    """RUN with `extra` (whose keys replace RUN's), in run folder `name`."""
    replaced = {item.split("=", 1)[0] for item in extra}
    base = [item for item in RUN if item.split("=", 1)[0] not in replaced]
    return run_cli([*base, *extra, f"storage.root={workdir / 'store'}", f"hydra.run.dir={workdir / name}"],
                   cwd=workdir / "cwd", mpi_ranks=ranks)


def checkpoint_bytes(workdir: Path, summary: dict) -> dict[str, dict[str, bytes]]:
    """step folder -> {data file: bytes} of a run's committed checkpoints, read back from disk."""
    root = Path(summary["config"]["storage"]["root"]) / "checkpoints"
    (own,) = [p for p in root.iterdir() if p.name.startswith(Path(summary["run_dir"]).name + "-")]
    return {folder.name: {str(f.relative_to(folder)): f.read_bytes() for f in data_files(folder)}
            for folder in sorted(own.iterdir()) if (folder / "dlio_ckpt_manifest.json").exists()}


@pytest.mark.parametrize("ranks", [0, pytest.param(2, marks=pytest.mark.mpi)])
def test_restart_resumes_exactly_where_an_uninterrupted_run_is(workdir, ranks):
    every = ["checkpoint.steps_between_checkpoints=4"]
    plain = run(workdir, "plain", every, ranks)
    assert plain.returncode == 0, plain.stderr
    failed = run(workdir, "failed", every + ["failures.at_steps=[6,13]"], ranks)
    assert failed.returncode == 0, failed.stderr
    a, b = load_summary(workdir / "plain"), load_summary(workdir / "failed")

    failures = b["failures"]
    assert failures["count"] == 2
    assert [(r["step"], r["restored_step"], r["lost_steps"]) for r in failures["restarts"]] == [(6, 4, 2), (13, 12, 1)]
    assert failures["lost_steps"] == 3 and failures["lost_work_s"] > 0 and failures["restart_s"] > 0
    assert all(r["restore_s"] > 0 for r in failures["restarts"])
    steps = 32 // max(ranks, 1)
    assert b["train"]["steps"] == a["train"]["steps"] == steps
    assert b["train"]["samples"] == a["train"]["samples"] + 3 * 2 * max(ranks, 1)  # the 3 lost steps read again

    # the same samples at every step, on every rank, as the uninterrupted run
    assert b["resume"]["sample_order_digests"] == a["resume"]["sample_order_digests"]
    assert b["resume"]["deterministic"] is True and b["resume"]["first_divergence"] is None
    assert b["resume"]["states_checked"] >= 2 * max(ranks, 1)  # each restore and checkpoint against the uninterrupted run
    assert a["resume"]["deterministic"] is None  # no restart: nothing to check
    # and the same bytes in every checkpoint (state after the restarts = uninterrupted state)
    plain_bytes, failed_bytes = checkpoint_bytes(workdir, a), checkpoint_bytes(workdir, b)
    assert list(plain_bytes) == [f"step_{s:08d}" for s in range(4, steps + 1, 4)]
    assert failed_bytes == plain_bytes

    # goodput: useful compute over wall; the lost and restart time are in the wall time
    spent = b["time_accounting"]
    assert 0 < b["goodput"] < 1
    assert b["goodput"] == pytest.approx(spent["useful_compute_s"] / spent["wall_s"])
    parts = sum(spent[k] for k in ("useful_compute_s", "data_wait_s", "checkpoint_s", "lost_work_s", "restart_s"))
    assert parts + spent["other_s"] == pytest.approx(spent["wall_s"])
    assert spent["other_s"] >= -1e-6
    assert "goodput" in failed.stdout and "lost work" in failed.stdout


def test_a_failure_before_any_checkpoint_restarts_from_step_zero(workdir):
    done = run(workdir, "run", ["checkpoint.steps_between_checkpoints=8", "failures.at_steps=[3]", "train.epochs=1"])
    assert done.returncode == 0, done.stderr
    summary = load_summary(workdir / "run")
    (restart,) = summary["failures"]["restarts"]
    assert (restart["step"], restart["restored_step"], restart["lost_steps"]) == (3, 0, 3)
    assert summary["train"]["steps"] == 16
    assert summary["resume"]["deterministic"] is True


def test_an_async_checkpoint_in_flight_is_abandoned_and_the_previous_one_restored(workdir):
    """Async commits happen at the next save: a failure right after a save finds that checkpoint
    in flight; it is never committed, and training restores the one before."""
    done = run(workdir, "run", ["checkpoint.strategy=async", "checkpoint.steps_between_checkpoints=4",
                                "failures.at_steps=[9]", "train.epochs=1"])
    assert done.returncode == 0, done.stderr
    summary = load_summary(workdir / "run")
    (restart,) = summary["failures"]["restarts"]
    assert (restart["step"], restart["restored_step"]) == (9, 4)  # step 8 was in flight
    assert summary["resume"]["deterministic"] is True
    assert list(checkpoint_bytes(workdir, summary)) == ["step_00000004", "step_00000008", "step_00000012",
                                                        "step_00000016"]


@pytest.mark.parametrize("ranks", [0, pytest.param(2, marks=[pytest.mark.mpi, pytest.mark.slow])])
def test_failures_restart_exit_stops_and_the_same_command_resumes(workdir, ranks):
    extra = ["checkpoint.steps_between_checkpoints=4", "failures.at_steps=[10]", "failures.restart=exit"]
    steps = 32 // max(ranks, 1)
    first = run(workdir, "run", extra, ranks)
    assert first.returncode == 75, first.stderr
    assert "Traceback" not in first.stderr and "resume" in first.stderr
    assert not (workdir / "run" / "summary.json").exists()
    assert (workdir / "run" / ".dlio_ckpt_resume").exists()

    second = run(workdir, "run", extra, ranks)
    assert second.returncode == 0, second.stderr
    summary = load_summary(workdir / "run")
    (restart,) = summary["failures"]["restarts"]
    assert (restart["step"], restart["restored_step"], restart["restart"]) == (10, 8, "exit")
    assert summary["failures"]["lost_steps"] == 2
    assert summary["train"]["steps"] == steps
    # every checkpoint of both processes and the restore, on every rank, against the uninterrupted run
    checked = max(ranks, 1) * (len(range(4, steps + 1, 4)) + 1)
    assert summary["resume"]["deterministic"] is True and summary["resume"]["states_checked"] == checked
    assert summary["time_accounting"]["wall_s"] > summary["train"]["wall_s"]  # the first process's time counts too
    # one run id over both processes: its checkpoints are in one folder
    assert list(checkpoint_bytes(workdir, summary)) == [f"step_{s:08d}" for s in range(4, steps + 1, 4)]

    third = run(workdir, "run", extra, ranks)  # the run is complete: the folder is taken
    assert third.returncode == 2 and "already holds another run" in third.stderr


def test_failures_faster_than_any_progress_stop_the_run(workdir):
    done = run(workdir, "run", ["checkpoint.enabled=false", "failures.mtbf_s=0.000001"])
    assert done.returncode == 1, done.stderr
    assert "no progress" in done.stderr and "failures.mtbf_s" in done.stderr and "Traceback" not in done.stderr


def test_failure_keys_are_checked(workdir):
    done = run(workdir, "run", ["failures.at_steps=[0]"])
    assert done.returncode == 2 and "failures.at_steps" in done.stderr
    assert not (workdir / "run").exists()
    done = run(workdir, "run", ["checkpoint.policy=young_daly"])
    assert done.returncode == 2 and "failures.mtbf_s" in done.stderr


def test_reaching_total_steps_still_takes_the_epoch_end_checkpoint(workdir):
    done = run(workdir, "run", ["train.step_counting=global", "train.total_steps=10", "failures.at_steps=[7]",
                                "checkpoint.epochs_between_checkpoints=1", "checkpoint.checkpoint_after_epoch=1"])
    assert done.returncode == 0, done.stderr
    summary = load_summary(workdir / "run")
    assert [c["step"] for c in summary["checkpoint"]["per_checkpoint"]] == [10]
    assert summary["failures"]["restarts"][0]["restored_step"] == 0  # nothing to restore at step 7
    assert summary["train"]["steps"] == 10


def test_failures_drawn_from_the_mtbf_strike_at_their_seeded_times(workdir):
    # reader threads: forking worker processes again after each restart (~0.1 s here) would leave a
    # 0.15 s MTBF no time to reach a checkpoint, which is what such a loader does, not what is tested
    done = run(workdir, "run", ["checkpoint.steps_between_checkpoints=4", "train.computation_time=0.01",
                                "failures.mtbf_s=0.15", "failures.seed=1", "reader.workers=threads"])  # at 0.16, 0.25, 0.35 s, ...
    assert done.returncode == 0, done.stderr
    summary = load_summary(workdir / "run")
    restarts = summary["failures"]["restarts"]
    assert restarts, "a 0.15 s MTBF over a run of 32 x 10 ms steps and 8 checkpoints meets failures"
    assert [r["at_s"] for r in restarts] == [pytest.approx(failure_time(0.15, 1, i)) for i in range(len(restarts))]
    assert restarts[-1]["at_s"] < summary["time_accounting"]["wall_s"]
    assert summary["train"]["steps"] == 32 and summary["resume"]["deterministic"] is True
