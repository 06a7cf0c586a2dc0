"""The interval policies at run time: CheckFreq profiles, picks k and re-tunes by +2; Young/Daly
derives the interval from the measured cost and again when the cost drifts; end to end, the
checkpoints land on the steps the policy chose."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from conftest import load_summary
from dlio_ckpt.checkpoint.policy import PROFILE_STEPS, make_policy
from dlio_ckpt.config.load import load_config
from dlio_ckpt.plan.intervals import daly_interval, steps_for, young_interval
from dlio_ckpt.world import World
from test_failures_restart import run


def record(blocking: float, persist: float) -> SimpleNamespace:
    return SimpleNamespace(blocking_s=blocking, persist_s=persist)


def policy(*overrides: str):
    config = load_config(["checkpoint.enabled=true", *overrides])
    engine = SimpleNamespace(triggers=SimpleNamespace(steps_between=config.checkpoint.steps_between_checkpoints),
                             due=lambda step, epoch, end, trigger_step=None: step % 3 == 0)
    return make_policy(engine, World.serial(), config)


def profile(p, step_s: float = 0.1) -> None:
    for step in range(1, PROFILE_STEPS + 1):
        assert not p.due(step - 1, 1, False) or step - 1 >= PROFILE_STEPS
        p.step_done(step_s if step > 1 else 5.0, first=step == 1)  # the first step (warm-up) is left out
    assert p.due(PROFILE_STEPS, 1, False)
    assert p.probe(PROFILE_STEPS) == (p.name == "young_daly")  # checkfreq waits for no persist


def test_checkfreq_picks_k_then_adds_two_while_over_the_bound():
    p = policy("checkpoint.policy=checkfreq", "checkpoint.overhead_bound=0.1", f"checkpoint.profile_steps={PROFILE_STEPS}")
    profile(p)
    p.checkpoint_done(5, record(0.05, 0.5), window_s=20.0)  # the probe after a long profile
    assert p.iteration_s == pytest.approx(0.1)
    assert p.interval == 5  # ceil((0.5 - 0.05) / 0.1); predicted 0.05 / 0.5 = 10 %: within the bound
    assert p.budget_k == 0  # 0.05 s of 20: the run is well within its budget
    assert not p.probe(6) and not p.due(9, 1, False) and p.due(10, 1, False)
    p.checkpoint_done(10, record(0.05, 0.5), window_s=0.56)  # (0.56 - 0.5) / 0.56 = 10.7 % > 10 %
    assert p.interval == 7  # + 2 (5 * 0.107 / 0.1 = 5.4 is less)
    p.checkpoint_done(17, record(0.01, 0.5), window_s=0.71)  # 1.4 %: kept
    assert p.interval == 7
    assert [h["interval_steps"] for h in p.history] == [5, 7]
    summary = p.summary()
    assert summary["predicted_overhead"] == pytest.approx(0.05 / (7 * 0.1))
    assert summary["stall_s"] == 0.05 and summary["full_s"] == 0.5 and summary["persist_k"] == 5
    # the run's overhead as the policy counts it: the probe's wait for its persist, then each window's time beyond its steps
    assert summary["monitored_overhead"] == pytest.approx((0.05 + 0.06 + 0.01) / (20.0 + 0.56 + 0.71))


def test_checkfreq_meets_the_bound_from_the_start_and_sees_a_persist_slow_the_steps():
    """A synchronous checkpoint (stall = t_f = 0.3 s): the published k is 1 (300 % overhead); the
    policy starts at the k its own prediction needs for the bound. Steps slowed by an async
    persist count: a window 3x over the bound triples k at once."""
    p = policy("checkpoint.policy=checkfreq", "checkpoint.overhead_bound=0.05", f"checkpoint.profile_steps={PROFILE_STEPS}")
    profile(p)
    p.checkpoint_done(5, record(0.3, 0.3), window_s=0.7)
    assert p.summary()["persist_k"] == 1 and p.interval == 60  # 0.3 / (0.05 * 0.1)
    assert p.history[0]["reason"] == "profiled: k 1 -> 60 for the bound"
    # 60 steps of 0.1 s and a stall of 0.3 s, but the steps ran slower: 6.9 s, 1.2 s beyond them
    p.checkpoint_done(65, record(0.3, 0.3), window_s=7.2)
    assert p.measured_overhead == pytest.approx(1.2 / 7.2)
    assert p.interval == math.ceil(60 * (1.2 / 7.2) / 0.05)  # 200


def test_checkfreq_waits_while_the_runs_overhead_would_pass_the_bound():
    """After a probe of 0.05 s in 1 s, a window of 5 steps (0.5 s) took 2.5 s: 80 % overhead, so k
    goes from 5 to 5 x 0.8 / 0.1 = 40; but the run has now spent 2.05 of 3.5 s on checkpoints, and
    another of 2 s keeps it within 10 % only after (2.05 + 2) / 0.1 - 2 - 3.5 = 35 s: 350 steps."""
    p = policy("checkpoint.policy=checkfreq", "checkpoint.overhead_bound=0.1", f"checkpoint.profile_steps={PROFILE_STEPS}")
    profile(p)
    p.checkpoint_done(5, record(0.05, 0.5), window_s=1.0)
    assert p.interval == 5 and p.budget_k == 0
    p.checkpoint_done(10, record(0.05, 0.05), window_s=2.5)
    assert p.measured_overhead == pytest.approx(0.8) and p.interval == 40
    assert p.budget_k == 350
    assert not p.due(10 + 349, 1, False) and p.due(10 + 350, 1, False)
    assert p.summary()["budget_k"] == 350


def test_checkfreq_async_probe_is_not_waited_for_and_its_persist_is_read_later():
    """Async: the probe's persist is not finished when it returns (persist_s 0); the next save
    waited for it, so its t_f (0.95 s) is read then: k from the persist = ceil(0.9 / 0.1) = 9."""
    p = policy("checkpoint.policy=checkfreq", "checkpoint.strategy=async", "checkpoint.overhead_bound=0.5",
               f"checkpoint.profile_steps={PROFILE_STEPS}")
    profile(p)
    probe = record(0.05, 0.0)
    p.checkpoint_done(5, probe, window_s=1.0)
    assert p.interval == 1 and p.summary()["full_s"] == 0.05  # t_f not known yet: k from the stall
    probe.persist_s = 0.95  # the persist thread's figure, set when it finished
    p.checkpoint_done(6, record(0.05, 0.0), window_s=0.2)
    assert p.summary()["full_s"] == 0.95 and p.summary()["persist_k"] == 9 and p.interval == 9
    assert "the probe's persist took 0.95 s" in [h["reason"] for h in p.history]


def test_checkfreq_times_iterations_5_to_99_and_probes_at_100():
    p = policy("checkpoint.policy=checkfreq")
    assert p.profile_steps == 100
    for step in range(1, 101):  # as the engine does: the step's time, then the question
        p.step_done(1.0 if step < 5 else 0.2, first=step == 1)  # steps 1-4 slow (warm-up): not timed
        assert p.due(step, 1, False) == (step == 100)
    assert not p.probe(100)  # a synchronous save is its own persist: nothing to wait for
    p.checkpoint_done(100, record(0.1, 1.0), window_s=20.0)
    assert p.iteration_s == pytest.approx(0.2)


def test_young_daly_derives_from_the_measured_cost_and_again_on_drift():
    p = policy("checkpoint.policy=young_daly", "failures.mtbf_s=100")
    profile(p)
    p.checkpoint_done(5, record(0.5, 0.5), window_s=1.0)
    assert p.interval == steps_for(daly_interval(0.5, 100.0), 0.1) == 97
    summary = p.summary()
    assert summary["young_s"] == pytest.approx(young_interval(0.5, 100.0))
    assert summary["daly_s"] == pytest.approx(daly_interval(0.5, 100.0)) and summary["used"] == "daly"
    p.checkpoint_done(102, record(0.55, 0.55), window_s=10.0)  # mean 0.525: within 25 %, kept
    assert p.interval == 97 and len(p.history) == 1
    p.checkpoint_done(199, record(2.0, 2.0), window_s=10.0)  # mean 1.02: drifted
    assert p.interval == steps_for(daly_interval((0.5 + 0.55 + 2.0) / 3, 100.0), 0.1)
    assert len(p.history) == 2 and "drifted" in p.history[1]["reason"]
    p.restarted(150)
    assert p.last_step == 150


def test_fixed_follows_the_engine_and_reports_young_and_daly():
    p = policy("checkpoint.steps_between_checkpoints=3", "failures.mtbf_s=50")
    assert [s for s in range(1, 10) if p.due(s, 1, False)] == [3, 6, 9]
    p.step_done(0.2, first=False)
    p.checkpoint_done(3, record(0.1, 0.1), window_s=0.7)
    summary = p.summary()
    assert summary["name"] == "fixed" and summary["interval_steps"] == 3
    assert summary["young_s"] == pytest.approx(young_interval(0.1, 50.0))


@pytest.mark.parametrize("name", ["checkfreq", "young_daly"])
def test_the_checkpoints_follow_the_policy(workdir, name):
    # young_daly: M = 1 ms, below any checkpoint's cost, puts Daly's optimum at M: every step.
    # at_steps beyond the run decides the injections (none), so mtbf_s only feeds the formula.
    extra = [f"checkpoint.policy={name}", "checkpoint.strategy=async", "failures.mtbf_s=0.001",
             "failures.at_steps=[1000]", "train.computation_time=0.02",  # steps long beside a persist: k is small
             f"checkpoint.profile_steps={PROFILE_STEPS}", "checkpoint.overhead_bound=0.9"]
    done = run(workdir, "run", extra)
    assert done.returncode == 0, done.stderr
    summary = load_summary(workdir / "run")
    chosen = summary["checkpoint"]["policy"]
    steps = [c["step"] for c in summary["checkpoint"]["per_checkpoint"]]
    assert chosen["name"] == name and steps[0] == PROFILE_STEPS and len(steps) >= 2
    assert summary["failures"]["count"] == 0
    # each checkpoint after the probe lies the interval in force after the one before it
    interval = {h["step"]: h["interval_steps"] for h in chosen["history"]}
    current = None
    for before, after in zip(steps, steps[1:]):
        current = interval.get(before, current)
        assert after - before == current
    assert chosen["interval_steps"] >= 1 and chosen["iteration_s"] > 0
    if name == "young_daly":
        assert chosen["daly_s"] > 0 and chosen["young_s"] > 0
    assert "policy" in done.stdout
