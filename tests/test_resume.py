"""The data loader's resume point and the determinism checks (unit level), and a restart with
every strategy and encoding: the previous checkpoint is usable, and whether the run after it is
the uninterrupted one (lossy: it is not, and the run says so)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import load_summary
from dlio_ckpt.config.load import load_config
from dlio_ckpt.engine.resume_checks import ResumeChecks, resume_section
from dlio_ckpt.formats.base import FileSpec
from dlio_ckpt.metrics.goodput import Ledger
from dlio_ckpt.plan.read import plan_epoch
from dlio_ckpt.plan.resume import ResumePoint, resume_plan
from test_failures_restart import run


def files(count: int) -> tuple[FileSpec, ...]:
    return tuple(FileSpec(index=i, path=f"f{i}", num_samples=3, sample_bytes=10) for i in range(count))


@pytest.mark.parametrize("max_batches", [None, 6])
def test_a_resumed_epoch_reads_the_rest_of_the_uninterrupted_order(max_batches):
    reader = load_config(["reader.batch_size=2"]).reader
    whole = plan_epoch(files(10), reader, 1, 2, epoch=3, sequential=False, max_batches=max_batches)
    for done in range(whole.num_batches + 1):
        rest = resume_plan(whole, ResumePoint(7, 3, done, reader.shuffle_seed, done * 2))
        assert rest.num_batches == whole.num_batches - done
        for index in range(rest.num_batches):
            assert np.array_equal(rest.batch(index), whole.batch(done + index))
    with pytest.raises(ValueError, match="do not make"):
        resume_plan(whole, ResumePoint(7, 3, 2, reader.shuffle_seed, 3))


def test_the_resume_point_round_trips_and_refuses_a_partial_one():
    point = ResumePoint(12, 2, 4, 42, 8)
    assert ResumePoint.from_dict(point.as_dict()) == point
    with pytest.raises(ValueError, match="resume point"):
        ResumePoint.from_dict({"step": 3})


def test_checks_find_the_first_divergence():
    checks = ResumeChecks(rank=1)
    rows = np.array([[0, 1], [2, 0]])
    for step in (1, 2, 3):
        checks.samples(step, rows + step, None)
    checks.saved_state(2, "aa")
    checks.restored_state(2, "aa")  # the restored state is the saved one
    checks.samples(3, rows + 3, rows + 3)  # after the resume: as the uninterrupted order and the first time
    assert checks.divergence is None and checks.states_checked == 1 and checks.samples_checked == 1
    checks.samples(4, rows, rows + 9)  # a batch other than the uninterrupted run's
    checks.restored_state(2, "bb")
    assert checks.divergence == {"step": 2, "rank": 1, "what": "state", "detail": checks.divergence["detail"]}
    section = resume_section([ResumeChecks(0).local(), checks.local()])
    assert section["deterministic"] is False and section["first_divergence"]["rank"] == 1


def test_ledger_rolls_back_the_lost_steps():
    ledger = Ledger()
    for step in range(1, 7):
        ledger.step(step, 1.0, 1.5)
    assert ledger.roll_back(4) == (2, 3.0)
    ledger.step(5, 1.0, 1.25)
    assert ledger.useful_compute_s == 5.0 and ledger.lost_compute_s == 2.0 and ledger.lost_steps == 2
    again = Ledger.from_dict(ledger.as_dict())
    assert again.steps == ledger.steps and again.lost_work_s == 3.0


@pytest.mark.parametrize("strategy,encoding", [("async", "incremental"), ("single_writer", "full"), ("sharded", "lossy")])
def test_restart_with_each_strategy_and_encoding(workdir, strategy, encoding):
    done = run(workdir, "run", [f"checkpoint.strategy={strategy}", f"checkpoint.encoding={encoding}",
                                "checkpoint.steps_between_checkpoints=3", "failures.at_steps=[8]", "train.epochs=1"])
    assert done.returncode == 0, done.stderr
    summary = load_summary(workdir / "run")
    (restart,) = summary["failures"]["restarts"]
    # async: the checkpoint of step 6 is still in flight at step 8 and is abandoned
    assert restart["restored_step"] == (3 if strategy == "async" else 6)
    assert summary["train"]["steps"] == 16
    resume = summary["resume"]
    if encoding == "lossy":  # the restored state (a delta on the full first one) is the quantised one, not the true one
        assert resume["deterministic"] is False
        assert resume["first_divergence"]["what"] == "state" and resume["first_divergence"]["step"] == 6
    else:
        assert resume["deterministic"] is True
