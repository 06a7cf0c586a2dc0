"""The data loader's resume point and the determinism checks (unit level), and a restart with
every strategy and encoding: the previous checkpoint is usable, and whether the run after it is
the uninterrupted one (lossy: it is not, and the run says so)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import load_summary
from dlio_ckpt.config.load import load_config
from dlio_ckpt.content import ByteSource
from dlio_ckpt.engine.resume_checks import ResumeChecks, UninterruptedRun, rank_state_digest
from dlio_ckpt.formats.base import FileSpec
from dlio_ckpt.metrics.goodput import Ledger
from dlio_ckpt.metrics.resume import resume_section
from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.plan.read import plan_epoch
from dlio_ckpt.plan.resume import ResumePoint, resume_plan
from dlio_ckpt.state.base import BytesView
from dlio_ckpt.state.rank_state import RankState
from test_failures_restart import checkpoint_bytes, run


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


def test_checks_compare_with_the_uninterrupted_run_and_keep_the_first_divergence():
    reader = load_config(["reader.batch_size=2"]).reader
    epoch_plan = lambda epoch: plan_epoch(files(10), reader, 0, 1, epoch=epoch, sequential=False)  # 15 steps an epoch
    cfg = dataclasses.replace(load_config([]).checkpoint, update="sgd")
    pf = PlannedFile("w/{step}.bin", 0, (TensorSpec("w", 5000, 4, "model"), TensorSpec("b", 300, 1, "model")))
    new_state = lambda: RankState((pf,), cfg, 7, ByteSource(seed=3, pool_bytes=1 << 20))
    checks = ResumeChecks(rank=1, truth=UninterruptedRun(epoch_plan, 2, new_state, (pf,)))
    run = new_state()  # the run's own state, advanced on its own schedule
    for step in range(1, 31):  # two epochs, read as the uninterrupted run reads them
        epoch, index = divmod(step - 1, 15)
        checks.samples(step, epoch_plan(epoch + 1).batch(index))
        if step in (4, 11, 17):
            run.advance(step)
            checks.saved_state(step, rank_state_digest(run, (pf,)))
    assert checks.divergence is None and checks.samples_checked == 30 and checks.states_checked == 3
    restored = new_state()  # a restart: the state saved at 11 restored
    restored.load(pf, BytesView(bytearray(b"".join(bytes(p) for p in new_state_at(new_state, 11).view(pf).stream(1 << 16)))), 11)
    checks.restored_state(11, rank_state_digest(restored, (pf,)))
    restored.advance(23)
    checks.saved_state(23, rank_state_digest(restored, (pf,)))
    assert checks.divergence is None and checks.states_checked == 5
    checks.samples(20, epoch_plan(2).batch(5))  # step 20 is epoch 2's batch index 4: a skipped batch
    assert checks.divergence["step"] == 20 and checks.divergence["what"] == "samples"
    checks.restored_state(17, rank_state_digest(restored, (pf,)))  # the state of step 23 claimed as 17's
    assert checks.divergence == {"step": 17, "rank": 1, "what": "state", "detail": checks.divergence["detail"]}
    section = resume_section([ResumeChecks(0).local(), checks.local()])
    assert section["deterministic"] is False and section["first_divergence"]["rank"] == 1


def new_state_at(new_state, step):
    state = new_state()
    state.advance(step)
    return state


def test_ledger_rolls_back_the_lost_steps():
    ledger = Ledger()
    for step in range(1, 7):
        ledger.step(step, 1.0, 1.5)
    assert ledger.roll_back(4) == (2, 3.0)
    ledger.step(5, 1.0, 1.25)
    assert ledger.useful_compute_s == 5.0 and ledger.lost_compute_s == 2.0 and ledger.lost_steps == 2
    again = Ledger.from_dict(ledger.as_dict())
    assert again.steps == ledger.steps and again.lost_work_s == 3.0


def test_a_ledger_without_restarts_sums_its_steps_to_the_same_figures():
    """keep_steps=False (a run without failures): no entry a step, the same mean, compute and
    figures as the ledger that keeps them."""
    kept, summed = Ledger(), Ledger(keep_steps=False)
    rng = np.random.default_rng(3)
    for step in range(1, 1001):
        compute, wall = float(rng.random()), float(rng.random()) + 1.0
        kept.step(step, compute, wall)
        summed.step(step, compute, wall)
    assert summed.steps == {} and summed.summed_steps == 1000
    assert summed.step_s_mean == pytest.approx(kept.step_s_mean, rel=1e-12)
    assert summed.useful_compute_s == pytest.approx(kept.useful_compute_s, rel=1e-12)
    assert summed.figures() == pytest.approx(kept.figures(), rel=1e-12)


def test_checks_without_failures_digest_the_order_as_steps_come():
    """No truth (no failures): the order digest is the one of every step's digest kept, from no
    dict; a step that does not move forward is refused."""
    plan = plan_epoch(files(40), load_config(["scale=tiny", "reader.batch_size=4"]).reader, 0, 1, 1, False)
    streamed, kept = ResumeChecks(0), ResumeChecks(0)
    kept._order = None  # what a run with failures keeps: a digest a step
    for index in range(plan.num_batches):
        streamed.samples(index + 1, plan.batch(index))
        kept.samples(index + 1, plan.batch(index))
    assert streamed.sample_digests == {} and len(kept.sample_digests) == plan.num_batches == 30
    assert streamed.local()["sample_order_digest"] == kept.local()["sample_order_digest"]
    with pytest.raises(RuntimeError, match="step 30 after step 30"):
        streamed.samples(30, plan.batch(0))


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


# against an independent uninterrupted run ------------------------------------------------------
@pytest.mark.parametrize("ranks", [0, pytest.param(2, marks=pytest.mark.mpi)])
@pytest.mark.parametrize("how,at_step,what", [("perturb-state", 6, "state"), ("skip-batch", 7, "samples")])
def test_an_injected_divergence_is_caught_at_its_step_and_rank(workdir, monkeypatch, ranks, how, at_step, what):
    rank = 1 if ranks else 0
    monkeypatch.setenv("DLIO_CKPT_FAULT", f"resume@{rank}:{how}")
    done = run(workdir, "run", ["checkpoint.update=sgd", "checkpoint.steps_between_checkpoints=3",
                                "failures.at_steps=[8]", "train.epochs=1"], ranks)
    assert done.returncode == 0, done.stderr
    resume = load_summary(workdir / "run")["resume"]
    assert resume["deterministic"] is False
    first = resume["first_divergence"]
    assert (first["step"], first["rank"], first["what"]) == (at_step, rank, what)


# the scenario: update=sgd, checkpoints on a clock, failures after steps 23, 70 and 101
SCENARIO = ["dataset.num_files_train=272", "model.model_size_bytes=64KiB", "model.optimization_groups=[4096]",
            "checkpoint.update=sgd", "train.epochs=1"]


def test_a_resumed_run_holds_the_uninterrupted_runs_state_and_samples_at_every_step(workdir):
    failed = run(workdir, "failed", SCENARIO + ["checkpoint.seconds_between_checkpoints=0.03",
                                                "failures.at_steps=[23,70,101]"])
    assert failed.returncode == 0, failed.stderr
    plain = run(workdir, "plain", SCENARIO + ["checkpoint.steps_between_checkpoints=1"])  # every step saved
    assert plain.returncode == 0, plain.stderr
    a, b = load_summary(workdir / "plain"), load_summary(workdir / "failed")
    assert [r["step"] for r in b["failures"]["restarts"]] == [23, 70, 101]
    assert b["train"]["steps"] == a["train"]["steps"] == 136
    resume = b["resume"]
    assert resume["deterministic"] is True and resume["first_divergence"] is None
    assert resume["samples_checked"] >= 136 and resume["states_checked"] >= 3
    # independently of the checks: the bytes on disk of every checkpoint of the failed run are the
    # uninterrupted run's at the same step, and the samples of every step are its samples
    saved, truth = checkpoint_bytes(workdir, b), checkpoint_bytes(workdir, a)
    assert len(saved) >= 4 and len(truth) == 136
    for folder, contents in saved.items():
        assert contents == truth[folder], folder
    assert resume["sample_order_digests"] == a["resume"]["sample_order_digests"]
