"""How the advisor pools several runs into one system (issue 23, held-out sweeps): each cost is the
typical run's (the median over runs: one run under a load spike does not move it), a
failure-free run's stand-in restore stays out, and the iteration time of runs at two intervals
splits into a per-step and a per-checkpoint part. The run folders are synthetic summary.json
files (issue 10's fields) whose costs are chosen, so the calibrated system is compared with costs
computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlio_ckpt.advisor.calibrate import RunCosts, calibrate, split_iteration

STEPS = 96
COMPUTE_S = 0.03  # per step


def single_level_run(folder: Path, interval: int, step_s: float, stall_s: float,
                     restarts: tuple[tuple[float, float], ...] = ()) -> Path:
    """A one-level run of STEPS steps checkpointing every `interval`, each checkpoint stalling
    `stall_s`, with restarts given as (restore_s, warmup_s); no steps lost (the checkpoint count is
    exactly STEPS / interval)."""
    folder.mkdir(parents=True)
    checkpoints = STEPS // interval
    rows = [{"index": i, "step": interval * (i + 1), "encoding": "full", "logical_bytes": 1 << 20, "bytes_written": 1 << 20,
             "metadata_bytes": 0, "write_s_max": stall_s, "blocking_s_max": stall_s, "persist_s_max": stall_s}
            for i in range(checkpoints)]
    summary = {
        "schema_version": 2, "workload": "unet3d", "mode": "train", "world_size": 1,
        "config": {"checkpoint": {"strategy": "sync", "encoding": "full", "steps_between_checkpoints": interval},
                   "failures": {"mtbf_s": 5.0, "kind": "node"}},
        "train": {"steps": STEPS, "step_s_mean": step_s},
        "time_accounting": {"wall_s": STEPS * step_s + checkpoints * stall_s, "useful_compute_s": STEPS * COMPUTE_S,
                            "checkpoint_s": checkpoints * stall_s, "lost_steps": 0},
        "checkpoint": {"strategy": "sync", "per_checkpoint": rows, "policy": {"name": "fixed", "interval_steps": interval}},
        "failures": {"count": len(restarts),
                     "restarts": [{"step": 10 * (i + 1), "kind": "node", "restored_step": interval, "level": "",
                                   "restore_s": restore, "warmup_s": warmup} for i, (restore, warmup) in enumerate(restarts)]},
        "goodput": 0.5,
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def system_of(folder: Path):
    calibration = calibrate(folder)
    (variant,) = calibration.variants
    return calibration.system(variant, None, mtbf_s=5.0, node_fraction=1.0)


def test_restores_and_restarts_are_the_typical_runs_and_stand_ins_stay_out(tmp_path):
    single_level_run(tmp_path / "a", 4, 0.04, 0.2, restarts=((0.3, 0.1),) * 2)
    single_level_run(tmp_path / "b", 4, 0.04, 0.2, restarts=((0.4, 0.2),))
    single_level_run(tmp_path / "c", 4, 0.04, 0.2, restarts=((1.6, 0.9),))  # under a load spike
    single_level_run(tmp_path / "d", 4, 0.04, 2.0)  # no failure: its write time (2.0 s) stands in for a restore
    system, _ = system_of(tmp_path)
    (level,) = system.levels
    assert level.restore_s == pytest.approx(0.4)  # median of 0.3, 0.4, 1.6; the mean of the four runs was 1.075
    assert system.downtime_s == pytest.approx(0.2)  # median of 0.1, 0.2, 0.9; their mean 0.4


def test_stand_in_restore_is_used_when_no_run_restored(tmp_path):
    single_level_run(tmp_path / "a", 4, 0.04, 0.2)
    single_level_run(tmp_path / "b", 4, 0.04, 0.4)
    system, _ = system_of(tmp_path)
    assert system.levels[0].restore_s == pytest.approx(0.3) and system.downtime_s == 0.0


def test_runs_at_two_intervals_split_the_iteration_into_step_and_checkpoint_parts(tmp_path):
    # 0.040 s a step plus 0.012 s after each checkpoint: 0.046 s a step at interval 2, 0.0415 at 8;
    # one run at interval 2 under a load spike (0.080 s a step, 0.44 s a checkpoint)
    runs = [(2, 0.046, 0.20), (2, 0.046, 0.22), (2, 0.080, 0.44), (8, 0.0415, 0.18), (8, 0.0415, 0.19), (8, 0.0415, 0.21)]
    for seed, (interval, step_s, stall) in enumerate(runs):
        single_level_run(tmp_path / f"k{interval}-seed{seed}", interval, step_s, stall)
    system, info = system_of(tmp_path)
    assert info["per_step_s"] == pytest.approx(0.040) and info["per_checkpoint_s"] == pytest.approx(0.012)
    assert system.step_s == pytest.approx(0.040)
    assert system.levels[0].blocking_s == pytest.approx((0.20 + 0.21) / 2 + 0.012)  # median of the six stalls
    # goodput stays useful compute over wall: share x iteration = 0.03 s of compute per 0.040 s step
    assert info["compute_share"] == pytest.approx(COMPUTE_S / 0.040)


def test_one_interval_keeps_the_whole_iteration_per_step(tmp_path):
    single_level_run(tmp_path / "a", 4, 0.044, 0.2)
    single_level_run(tmp_path / "b", 4, 0.048, 0.2)
    system, info = system_of(tmp_path)
    assert system.step_s == pytest.approx(0.046) and info["per_checkpoint_s"] == 0.0
    assert system.levels[0].blocking_s == pytest.approx(0.2)
    # the runs' compute per step over the pooled step (0.652), not the mean of their shares (0.653)
    assert info["compute_share"] == pytest.approx(COMPUTE_S / 0.046)


def test_a_slope_below_zero_is_noise_and_stays_per_step(tmp_path):
    # steps slower at the longer interval: no per-checkpoint part (the mean, as with one interval)
    single_level_run(tmp_path / "a", 2, 0.040, 0.2)
    single_level_run(tmp_path / "b", 8, 0.050, 0.2)
    per_step, per_checkpoint = split_iteration(calibrate(tmp_path).runs)
    assert (per_step, per_checkpoint) == (pytest.approx(0.045), 0.0)


def test_split_uses_the_checkpoints_each_run_wrote_per_step():
    def run(interval: int, rate: float, step_s: float) -> RunCosts:
        return RunCosts(path=f"k{interval}", world_size=1, variant="sync/full", step_s=step_s, steps=96,
                        interval_steps=interval, levels=(), goodput=None, mtbf_s=5.0, failures=0, failure_steps=(),
                        failure_kinds=(), restart_overhead_s=None, checkpoints_per_step=rate)

    # redone checkpoints after failures raise a run's rate above 1/interval: the line goes through
    # each interval's median rate and median iteration (interval 8: 0.1375, 0.041375 s)
    runs = [run(2, 0.55, 0.040 + 0.01 * 0.55), run(8, 0.125, 0.040 + 0.01 * 0.125), run(8, 0.15, 0.040 + 0.01 * 0.15)]
    per_step, per_checkpoint = split_iteration(runs)
    assert per_step == pytest.approx(0.040) and per_checkpoint == pytest.approx(0.01)
