"""Interval formulas (Young, Daly, CheckFreq's k) against hand-computed values, and the seeded
failure schedule: the same failures on every rank count and run, counts as the exponential law says."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dlio_ckpt.plan.failures import FailureSchedule, failure_time
from dlio_ckpt.plan.intervals import (checkfreq_bound_k, checkfreq_budget_k, checkfreq_k, checkfreq_overhead, checkfreq_retune,
                                      checkfreq_window_overhead, daly_interval, expected_waste, steps_for,
                                      young_interval)


def test_young_is_sqrt_2cm():
    assert young_interval(10.0, 3600.0) == pytest.approx(math.sqrt(2 * 10 * 3600))  # 268.33 s
    assert young_interval(0.0, 3600.0) == 0.0


def test_daly_matches_the_series_and_its_limits():
    c, m = 10.0, 3600.0
    r = c / (2 * m)
    assert daly_interval(c, m) == pytest.approx(math.sqrt(2 * c * m) * (1 + math.sqrt(r) / 3 + r / 9) - c)
    assert daly_interval(c, m) == pytest.approx(261.70, abs=0.01)  # Young 268.33 x 1.0126 less C
    assert daly_interval(300.0, 100.0) == 100.0  # C >= 2M: checkpoint every M
    # for a small C/M the two agree to first order
    assert daly_interval(0.01, 1e6) / young_interval(0.01, 1e6) == pytest.approx(1.0, abs=1e-3)


def test_the_optimum_minimises_the_first_order_waste():
    c, m = 5.0, 1000.0
    tau = young_interval(c, m)
    waste = expected_waste(c, tau, m)
    assert waste == pytest.approx(math.sqrt(2 * c / m))
    assert all(expected_waste(c, tau * f, m) > waste for f in (0.5, 0.8, 1.25, 2.0))


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        young_interval(1.0, 0.0)
    with pytest.raises(ValueError):
        daly_interval(-1.0, 10.0)


def test_steps_for_rounds_to_whole_steps():
    assert steps_for(2.6, 1.0) == 3
    assert steps_for(0.1, 1.0) == 1
    assert steps_for(5.0, 0.0) == 1


def test_checkfreq_k():
    # t_i = 0.1 s, stall 0.05 s, full 0.5 s: the persist (0.45 s) needs 5 iterations
    assert checkfreq_k(0.1, 0.05, 0.5) == 5
    assert checkfreq_k(0.1, 0.05, 0.51) == 5
    assert checkfreq_k(0.1, 0.05, 0.56) == 6  # 4.6 -> 5, 5.1 -> 6
    assert checkfreq_k(0.1, 0.3, 0.3) == 1  # a synchronous checkpoint: nothing to overlap
    assert checkfreq_overhead(0.05, 5, 0.1) == pytest.approx(0.1)
    assert checkfreq_retune(5, 0.055, 0.05) == 7  # CheckFreq's +2 (5 * 0.055 / 0.05 = 5.5 -> 6 is less)
    assert checkfreq_retune(5, 0.15, 0.05) == 15  # 3x over the bound: 3x the interval, in one window
    assert checkfreq_retune(5, 0.04, 0.05) == 5
    assert checkfreq_retune(5, math.inf, 0.05) == 7


def test_checkfreq_bound_k_and_window_overhead():
    # a synchronous checkpoint of 0.3 s at t_i = 0.1 s: CheckFreq's k is 1 (predicted 300 %);
    # within 5 % takes k = 0.3 / (0.05 * 0.1) = 60
    assert checkfreq_k(0.1, 0.3, 0.3) == 1 and checkfreq_bound_k(0.1, 0.3, 0.05) == 60
    assert checkfreq_overhead(0.3, 60, 0.1) == pytest.approx(0.05)
    assert checkfreq_bound_k(0.1, 0.0, 0.05) == 1 and checkfreq_bound_k(0.0, 0.3, 0.05) == 1
    # 10 steps of 0.1 s took 1.25 s: 0.25 s beyond them, 20 % of the window
    assert checkfreq_window_overhead(1.25, 10, 0.1) == pytest.approx(0.2)
    assert checkfreq_window_overhead(0.9, 10, 0.1) == 0.0  # faster than profiled: no overhead
    assert checkfreq_window_overhead(0.0, 10, 0.1) == 0.0


def test_failures_at_steps_in_order():
    schedule = FailureSchedule.from_config(type("F", (), {"at_steps": [7, 3], "mtbf_s": 0.0, "seed": 1,
                                                          "kind": "node"})(), 4)
    events = [schedule.event(i) for i in range(3)]
    assert [e.step for e in events[:2]] == [3, 7] and events[2] is None
    assert all(0 <= e.rank < 4 and e.kind == "node" for e in events[:2])


def test_failure_times_are_seeded_and_independent_of_the_world():
    a = FailureSchedule((), 60.0, 5, "process", 1)
    b = FailureSchedule((), 60.0, 5, "process", 64)
    assert [a.event(i).at_s for i in range(5)] == [b.event(i).at_s for i in range(5)]
    assert a.event(4).at_s == failure_time(60.0, 5, 4) > a.event(3).at_s
    assert FailureSchedule((), 60.0, 6, "process", 1).event(0).at_s != a.event(0).at_s


def test_failure_counts_follow_the_exponential_law():
    """Over 400 seeds, failures within a horizon of 10 MTBFs: mean 10 and variance 10 (Poisson)."""
    counts = np.array([FailureSchedule((), 30.0, seed, "process", 2).count_before(300.0) for seed in range(400)])
    assert abs(counts.mean() - 10.0) < 0.5  # standard error 0.16
    assert 7.0 < counts.var() < 13.5
    # a fixed seed gives a fixed count (what the end-to-end runs rely on)
    assert FailureSchedule((), 30.0, 3, "process", 2).count_before(300.0) == counts[3]


def test_checkfreq_budget_waits_until_the_runs_overhead_allows_the_next_checkpoint():
    # 1 s of 10 s spent on checkpoints, the next costs 0.5 s, bound 5 %: the run must reach
    # (1 + 0.5) / 0.05 = 30 s including the checkpoint: 19.5 s more of steps, 195 of 0.1 s
    assert checkfreq_budget_k(1.0, 10.0, 0.5, 0.1, 0.05) == 195
    assert (1.0 + 0.5) / (10.0 + 195 * 0.1 + 0.5) == pytest.approx(0.05)
    assert checkfreq_budget_k(0.1, 100.0, 0.1, 0.1, 0.05) == 0  # well within: no wait
    assert checkfreq_budget_k(1.0, 10.0, 0.5, 0.0, 0.05) == 0
