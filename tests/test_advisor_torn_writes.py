"""The advisor's simulator and dlio_ckpt's engine account for a failure alike, a failure that
strikes a checkpoint's write above all: that checkpoint never committed, so the run goes back to
the one before. The engine runs in this process on a counted clock (each step adds STEP seconds,
each save WRITE, each restart RESTART: the failures' clock, the training loop's elapsed(), reads it), so the
failures drawn from failures.mtbf_s fall where the schedule says, whatever the machine's speed,
and the simulator replays the same failure times. Counts and counted seconds, not timing."""

from __future__ import annotations

import json

import pytest

from dlio_ckpt.advisor.simulate import FailureTrace, Level, Plan, System, simulate
from dlio_ckpt.checkpoint.engine import CheckpointEngineImpl
from dlio_ckpt.config.load import load_config
from dlio_ckpt.engine import train
from dlio_ckpt.engine.compute import ComputeModel
from dlio_ckpt.engine.run import run_job
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME
from dlio_ckpt.plan.failures import failure_time
from dlio_ckpt.world import World

STEP, WRITE, RESTART = 1.0, 3.0, 0.5  # counted seconds (binary fractions: sums are exact)
MTBF, SEED, STEPS, INTERVAL = 15.0, 3, 24, 2  # seed 3: 7 failures, 3 of them in a write, 4 before any checkpoint


class CountedClock:
    def __init__(self) -> None:
        self.now = 0.0


@pytest.fixture
def clock(monkeypatch):
    counted = CountedClock()

    def compute(self) -> float:
        counted.now += STEP
        return STEP

    save, restart = CheckpointEngineImpl.save, train.fail_and_restore

    def timed_save(self, *args, **kwargs):
        record = save(self, *args, **kwargs)
        counted.now += WRITE
        return record

    def timed_restart(*args, **kwargs):
        record = restart(*args, **kwargs)
        counted.now += RESTART
        return record

    monkeypatch.setattr(ComputeModel, "run", compute)
    monkeypatch.setattr(CheckpointEngineImpl, "save", timed_save)
    monkeypatch.setattr(train, "fail_and_restore", timed_restart)
    monkeypatch.setattr(train._Training, "elapsed", lambda self: counted.now)
    return counted


def engine_run(tmp_path, clock, extra=()) -> dict:
    config = load_config([
        "workload=unet3d", "scale=tiny", f"dataset.num_files_train={STEPS}", "dataset.num_samples_per_file=1",
        "dataset.record_length_bytes=4KiB", "dataset.record_length_bytes_stdev=0", "dataset.record_length_bytes_min=1", "reader.batch_size=1",
        "train.epochs=1", "train.computation_time=0.001", "model.kind=explicit", "model.model_size_bytes=64KiB",
        "model.optimization_groups=[]", "model.layer_parameters=[]", "checkpoint.enabled=true",
        f"checkpoint.steps_between_checkpoints={INTERVAL}", "checkpoint.keep_last=0", "progress=false",
        f"failures.mtbf_s={MTBF}", f"failures.seed={SEED}", "failures.kind=node", f"storage.root={tmp_path / 'store'}",
        *extra])
    (tmp_path / "run").mkdir()
    run_job(World.serial(), config, tmp_path / "run", "torn-writes")
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def simulated(failures: int, levels=(Level("shared", WRITE, 0.0, 0.0, "node"),), every=(1,), kind="node"):
    system = System(step_s=STEP, mtbf_s=MTBF, levels=levels, downtime_s=RESTART)
    times = tuple(failure_time(MTBF, SEED, i) for i in range(failures + 5))
    trace = FailureTrace(replicates=1, at_s=times, kinds=(kind,) * len(times))
    return simulate(system, Plan(INTERVAL, every), STEPS, trace, final_checkpoint=True)  # the engine saves step 24 too


def test_a_failure_during_a_write_costs_the_same_in_the_engine_and_the_simulator(tmp_path, clock, capsys):
    summary = engine_run(tmp_path, clock)
    restarts = summary["failures"]["restarts"]
    torn = [r for r in restarts if r["torn_step"] is not None]
    out = simulated(len(restarts))
    assert summary["train"]["steps"] == STEPS
    # the schedule covers every case: failures in a write, in a step, before any checkpoint
    assert len(restarts) == out.failures == 7
    assert len(torn) == out.torn == 3
    assert sum(r["restored_step"] == 0 for r in restarts) == out.restores_by_level["scratch"] == 4
    assert clock.now == pytest.approx(out.wall_s, abs=1e-9)  # counted wall time: steps, saves and restarts alike
    for r in torn:  # the checkpoint it struck is gone; the restart went back past it
        assert r["restored_step"] < r["torn_step"] == r["step"] and r["lost_steps"] == r["step"] - r["restored_step"]
    (root,) = (tmp_path / "store" / "checkpoints").iterdir()
    committed = sorted(int(p.name.rsplit("_", 1)[-1]) for p in root.iterdir() if (p / MANIFEST_NAME).exists())
    assert committed == list(range(INTERVAL, STEPS + 1, INTERVAL))  # every checkpoint of the finished run, each once


def test_two_levels_withdraw_the_struck_checkpoint_everywhere(tmp_path, clock, capsys):
    # node-local level every checkpoint, the shared one every 2nd (flushed); process failures keep the
    # local copies, so every restart takes the newest local one: the flush's timing does not matter
    local = tmp_path / "local"
    summary = engine_run(tmp_path, clock, [
        f"checkpoint.levels=[{{name: local, path: {local}, scope: node}}, {{name: shared, every: 2, write: flush}}]",
        "failures.kind=process", "world.ranks_per_node=1"])
    restarts = summary["failures"]["restarts"]
    out = simulated(len(restarts), levels=(Level("local", WRITE, 0.0, 0.0, "process"),
                                           Level("shared", WRITE, 0.0, 0.0, "node", flushed=True)), every=(1, 2),
                    kind="process")
    torn = [r for r in restarts if r["torn_step"] is not None]
    assert len(restarts) == out.failures == 7 and len(torn) == out.torn == 3
    assert sum(r["restored_step"] == 0 for r in restarts) == out.restores_by_level["scratch"] == 4
    assert clock.now == pytest.approx(out.wall_s, abs=1e-9)
    for r in torn:
        assert r["restored_step"] < r["torn_step"]
    (local_root,) = local.iterdir()
    committed = sorted(int(p.name.rsplit("_", 1)[-1]) for p in local_root.iterdir() if (p / MANIFEST_NAME).exists())
    assert committed == list(range(INTERVAL, STEPS + 1, INTERVAL))
