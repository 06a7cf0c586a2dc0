"""The advisor's simulator against hand-worked timelines and Daly's analytic model."""

from __future__ import annotations

import numpy as np
import pytest

from dlio_ckpt.advisor.simulate import FailureTrace, Level, Plan, System, daly_expected_goodput, daly_s, simulate, young_s

LOCAL = Level("local", blocking_s=1.0, flush_s=0.0, restore_s=2.0, survives="process")
SHARED = Level("shared", blocking_s=9.0, flush_s=5.0, restore_s=4.0, survives="node", flushed=True)
TWO_LEVELS = System(step_s=1.0, mtbf_s=1e9, levels=(LOCAL, SHARED), downtime_s=3.0)
PLAN = Plan(interval_steps=10, every=(1, 2))  # local at steps 10, 30; shared (via local) at 20


def replay(step: int, kind: str):
    return simulate(TWO_LEVELS, PLAN, 40, FailureTrace(replicates=1, at_steps=(step,), kinds=(kind,)))


def test_node_failure_restores_the_flushed_shared_copy():
    # checkpoint 1 ends at 11 s, checkpoint 2 at 22 s, flushed to shared by 27 s; the failure at step 25
    # is at 27 s: local copies die with the node, shared step 20 restores (3 + 4 s), 21 s of run remain
    out = replay(25, "node")
    assert out.wall_s == pytest.approx(27 + 7 + 21)
    assert out.restores_by_level == {"local": 0, "shared": 1, "scratch": 0}
    assert out.restart_s == pytest.approx(7) and out.checkpoint_s == pytest.approx(3)
    assert out.lost_work_s == pytest.approx(55 - 40 - 3 - 7)
    assert out.goodput == pytest.approx(40 / 55)


def test_process_failure_takes_the_cheaper_copy_of_the_same_step():
    out = replay(25, "process")
    assert out.restores_by_level["local"] == 1 and out.wall_s == pytest.approx(27 + 5 + 21)


def test_a_flush_still_in_flight_does_not_survive():
    # at step 23 (25 s) the shared flush of step 20 ends only at 27 s: a node failure leaves nothing
    out = replay(23, "node")
    assert out.restores_by_level["scratch"] == 1 and out.wall_s == pytest.approx(25 + 3 + 43)


def test_levels_follow_the_checkpoint_number_as_dlio_ckpt_numbers_checkpoints():
    """After a restart the numbering goes on from the restored checkpoint (from 1 after a restart
    from scratch), as SCR and dlio_ckpt's levels number them: the redone checkpoint at step 4 is
    number 1 again (local), step 8 number 2 and step 16 number 4 (shared)."""
    system = System(step_s=1.0, mtbf_s=1e9, levels=(Level("local", 0.5, 0.0, 1.0, "process"),
                                                    Level("shared", 0.5, 1.0, 2.0, "node", flushed=True)))
    out = simulate(system, Plan(4, (1, 2)), 32, FailureTrace(replicates=1, at_steps=(7, 19), kinds=("node", "node")))
    # 7.5 s to the first failure (checkpoint 1, local, lost with the node: restart from scratch);
    # 19 steps and 4 stalls to the second (shared step 16, flushed by 26.5 s, restored in 2 s);
    # then steps 17..32 with checkpoints at 20, 24 and 28. Numbering by writes would have put
    # step 12 on the shared level, restored it, and taken 52.5 s.
    assert out.restores_by_level == {"local": 0, "shared": 1, "scratch": 1}
    assert out.wall_s == pytest.approx(7.5 + 21 + 2 + 17.5)


def test_failure_free_run_and_no_checkpoint_at_the_last_step():
    out = simulate(TWO_LEVELS, PLAN, 40, FailureTrace(replicates=2, seed=1))  # MTBF 1e9 s: no failure
    assert out.failures == 0 and out.wall_s == pytest.approx(43) and out.goodput == pytest.approx(40 / 43)


def test_seeded_and_deterministic():
    system = System(step_s=1.0, mtbf_s=500.0, levels=(LOCAL, SHARED), node_fraction=0.4, downtime_s=10.0)
    runs = [simulate(system, Plan(30, (1, 4)), 20_000, FailureTrace(replicates=8, seed=s)) for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0].goodput != runs[2].goodput
    assert 30 < runs[0].failures < 60  # about wall / MTBF


def test_weibull_gaps_keep_the_mean():
    trace = FailureTrace(replicates=4000, seed=3)
    system = System(step_s=1.0, mtbf_s=100.0, levels=(LOCAL,), weibull_shape=0.7)
    assert trace.gaps_s(system, 0).mean() == pytest.approx(100.0, rel=0.05)


MTBF, COST, RESTART = 3600.0, 60.0, 120.0
ONE_LEVEL = System(step_s=1.0, mtbf_s=MTBF, levels=(Level("pfs", COST, 0.0, 0.0, "node"),), downtime_s=RESTART)


def test_goodput_matches_dalys_exact_expectation():
    trace = FailureTrace(replicates=48, seed=11)
    for tau in (200, 600, 1500):
        simulated = simulate(ONE_LEVEL, Plan(tau, (1,)), int(20 * MTBF), trace).goodput
        assert simulated == pytest.approx(daly_expected_goodput(tau, COST, RESTART, MTBF), abs=0.01)


def test_optimum_interval_matches_daly():
    """The simulated optimum (vertex of a parabola through goodput over log interval, common random
    numbers) lies within 10 % of Daly's interval, whose own error at C/M = 1/60 is well under that;
    and Daly's interval loses less than 0.3 points of goodput against the simulated best."""
    trace = FailureTrace(replicates=48, seed=5)
    daly = daly_s(COST, MTBF)
    taus = np.geomspace(daly / 2.5, daly * 2.5, 11).round().astype(int)
    goodput = np.array([simulate(ONE_LEVEL, Plan(int(t), (1,)), int(20 * MTBF), trace).goodput for t in taus])
    a, b, _ = np.polyfit(np.log(taus), goodput, 2)
    optimum = float(np.exp(-b / (2 * a)))
    assert optimum == pytest.approx(daly, rel=0.10)
    at_daly = simulate(ONE_LEVEL, Plan(int(round(daly)), (1,)), int(20 * MTBF), trace).goodput
    assert goodput.max() - at_daly < 0.003
    assert young_s(COST, MTBF) > daly  # Daly's correction shortens Young's interval here


# Drawn failures (failures.mtbf_s) strike at a time, and dlio_ckpt's engine notices them at the next
# step boundary or at the end of the checkpoint write they struck, which then never committed.
WRITES = System(step_s=1.0, mtbf_s=1e9, levels=(Level("shared", 3.0, 0.0, 0.0, "node"),))


def at_time(seconds: float):
    return simulate(WRITES, Plan(2, (1,)), 10, FailureTrace(replicates=1, at_s=(seconds,), kinds=("node",)))


def test_a_failure_during_a_step_is_noticed_at_its_end_and_keeps_the_committed_checkpoint():
    # steps 1-2 (0-2 s), checkpoint 1 (2-5 s), steps 3-4 (5-7 s): at 6.5 s, noticed at 7 s, back to
    # step 2; then steps 3-10 and checkpoints at 4, 6 and 8 (17 s)
    out = at_time(6.5)
    assert out.torn == 0 and out.restores_by_level == {"shared": 1, "scratch": 0}
    assert out.wall_s == pytest.approx(7 + 17) and out.lost_work_s == pytest.approx(2)


def test_a_failure_during_a_write_loses_that_checkpoint_and_the_work_since_the_one_before():
    # checkpoint 2 is written from 7 to 10 s: a failure at 8 s is noticed at 10 s; checkpoint 2 never
    # committed, so the run goes on from checkpoint 1 (step 2): steps 3-4 and the write are lost
    out = at_time(8.0)
    assert out.torn == 1 and out.restores_by_level == {"shared": 1, "scratch": 0}
    assert out.wall_s == pytest.approx(10 + 17) and out.lost_work_s == pytest.approx(2 + 3)


def test_a_failure_during_a_restart_is_noticed_after_the_first_step_that_follows():
    # failure 1 at 8 s (noticed at 10 s, no restart cost here), failure 2 at 10 s: the restarted run
    # computes step 3 (10-11 s) before it notices, and restarts from step 2 again
    out = simulate(WRITES, Plan(2, (1,)), 10, FailureTrace(replicates=1, at_s=(8.0, 10.0), kinds=("node", "node")))
    assert out.failures == 2 and out.torn == 1 and out.wall_s == pytest.approx(10 + 1 + 17)
