"""Checkpoint intervals from measured costs: Young, Daly and CheckFreq's k (pure formulas).

The formulas are the ones the policies (checkpoint/policy.py) apply at run time, kept apart so
that they can be checked against the papers' numbers without a run. Sources: Young (CACM 1974),
Daly (FGCS 2006) and Mohan et al., CheckFreq (FAST 2021); see
../shared/docs/checkpoint-techniques.md, "CheckFreq" and "Multi-level checkpointing and intervals".
"""

from __future__ import annotations

import math


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum: tau = sqrt(2 C M) seconds of work between checkpoints."""
    _check(cost_s, mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum: sqrt(2CM) (1 + sqrt(C/2M)/3 + (C/2M)/9) - C for C < 2M, else M.

    Young's estimate ignores that a failure also strikes during checkpoints and recomputation;
    Daly's correction matters once the cost is a noticeable fraction of the MTBF.
    """
    _check(cost_s, mtbf_s)
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost_s


def expected_waste(cost_s: float, interval_s: float, mtbf_s: float) -> float:
    """The fraction of wall time lost, to first order: C / tau (checkpointing) + tau / 2M (work
    redone after a failure, half an interval on average)."""
    if interval_s <= 0:
        raise ValueError(f"interval must be positive (got {interval_s})")
    _check(cost_s, mtbf_s)
    return cost_s / interval_s + interval_s / (2.0 * mtbf_s)


def steps_for(interval_s: float, iteration_s: float) -> int:
    """Whole training steps closest to `interval_s` of work (at least one)."""
    if iteration_s <= 0:
        return 1
    return max(1, round(interval_s / iteration_s))


def checkfreq_k(iteration_s: float, stall_s: float, full_s: float) -> int:
    """CheckFreq's interval in iterations: k = max(ceil((t_f - stall) / t_i), 1).

    t_f is one full checkpoint (snapshot plus persist); only one checkpoint is in flight, so the
    persist of one must end before the next snapshot: k iterations must cover t_f - stall.
    """
    if iteration_s <= 0:
        return 1
    return max(math.ceil((full_s - stall_s) / iteration_s - 1e-9), 1)


def checkfreq_overhead(stall_s: float, k: int, iteration_s: float) -> float:
    """The blocking overhead CheckFreq predicts for interval k: stall / (k t_i)."""
    if k < 1 or iteration_s <= 0:
        return math.inf if stall_s > 0 else 0.0
    return stall_s / (k * iteration_s)


def checkfreq_bound_k(iteration_s: float, stall_s: float, bound: float) -> int:
    """The least k whose predicted overhead stall / (k t_i) is within the bound."""
    if iteration_s <= 0 or bound <= 0:
        return 1
    return max(math.ceil(stall_s / (bound * iteration_s) - 1e-9), 1)


def checkfreq_window_overhead(window_s: float, steps: int, iteration_s: float) -> float:
    """The overhead of one monitored window, as CheckFreq's monitor measures it: the window's wall
    time beyond its `steps` at the profiled t_i (stall, waits, and steps slowed by a persist), as
    a share of the window (0 when the steps ran faster than profiled)."""
    if window_s <= 0:
        return 0.0
    return max(0.0, window_s - steps * iteration_s) / window_s


def checkfreq_budget_k(spent_s: float, elapsed_s: float, cost_s: float, iteration_s: float, bound: float) -> int:
    """Steps the next checkpoint must wait so that the run's overhead stays within the bound:
    the least n with (spent + cost) / (elapsed + n t_i + cost) <= bound, where `spent` is what the
    checkpoints have cost the run so far over `elapsed` seconds and `cost` what the next one is
    expected to cost (0 when no wait is needed)."""
    if iteration_s <= 0 or bound <= 0:
        return 0
    need = (spent_s + cost_s) / bound - cost_s - elapsed_s
    return max(math.ceil(need / iteration_s - 1e-9), 0)


def checkfreq_retune(k: int, measured_overhead: float, bound: float) -> int:
    """CheckFreq's adaptive rule: when the measured overhead exceeds the bound, k += 2; or, when
    more, the k that the measurement says meets the bound (k * measured / bound: the overhead of
    a window falls as 1/k), so a prediction off by a factor is corrected in one window."""
    if measured_overhead <= bound:
        return k
    if bound <= 0 or math.isinf(measured_overhead):
        return k + 2
    return max(k + 2, math.ceil(k * measured_overhead / bound - 1e-9))


def _check(cost_s: float, mtbf_s: float) -> None:
    if cost_s < 0:
        raise ValueError(f"checkpoint cost cannot be negative (got {cost_s})")
    if mtbf_s <= 0:
        raise ValueError(f"the mean time between failures must be positive (got {mtbf_s})")
