"""Expected measured goodput over the calibration runs' own costs, not at the typical run's costs.

Why: measured goodput, the figure the advice is checked against, is a mean over runs, and each run
is one draw of the machine's load: on a shared machine one run's stall per checkpoint varies
several-fold between identical runs (0.04 to 0.33 s over 52 runs of one sweep, docs/advisor.md).
Goodput = useful / wall is convex in the costs, so the mean goodput of runs with spread costs is
higher than the goodput at their typical (median) costs (Jensen): 2 points at interval 2 in that
sweep, where the wall time of identical runs ranged 5.6 to 18.9 s. So the advisor simulates each
calibration run's own costs (its *member* system) and averages: the expectation over the cost
distribution the runs sampled, and the spread between them (how much one run's goodput moves with
the load). The search still ranks on the typical run's costs (one system: fast); the figures printed
for the answer are these expectations.

A member keeps the parts of the pooled system that a single run cannot measure: the per-checkpoint
part of the iteration (split_iteration needs two intervals), and the restore and restart overhead
where the run restored nothing (its write time is no restore: calibrate.pooled_restore).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dlio_ckpt.advisor.calibrate import RunCosts
from dlio_ckpt.advisor.search import alone
from dlio_ckpt.advisor.simulate import FailureTrace, Plan, System, simulate


@dataclass(frozen=True)
class Member:
    """One calibration run's costs as a system, with its compute share of an iteration."""

    run: str
    system: System
    compute_share: float


def member(run: RunCosts, pooled: System, per_checkpoint_s: float) -> Member:
    """`run`'s own costs in `pooled`'s frame (levels by name; MTBF, failure kinds, Weibull shape and
    the per-checkpoint part of the iteration pooled). The compute share is the run's compute per
    step over its own per-step part, so share x simulated iteration goodput is the run's goodput."""
    per_step = run.step_s - per_checkpoint_s * run.checkpoints_per_step
    if per_step <= 0:  # the pooled per-checkpoint part exceeds this run's whole iteration: keep it whole
        per_step = run.step_s
    own = {lv.name: lv for lv in run.levels}
    levels = []
    for level in pooled.levels:
        mine = own.get(level.name)
        if mine is None:
            levels.append(level)
            continue
        restored = mine.restore.count and not mine.restore_assumed
        levels.append(replace(level, blocking_s=mine.blocking.mean + per_checkpoint_s,
                              flush_s=mine.flush.mean if mine.flush.count else level.flush_s,
                              restore_s=mine.restore.mean if restored else level.restore_s))
    downtime = run.restart_overhead_s if run.restart_overhead_s is not None else pooled.downtime_s
    system = replace(pooled, step_s=per_step, levels=tuple(levels), downtime_s=max(0.0, downtime))
    return Member(run.path, system, min(1.0, run.compute_share * run.step_s / per_step))


def members(runs: list[RunCosts], pooled: System, per_checkpoint_s: float) -> list[Member]:
    return [member(run, pooled, per_checkpoint_s) for run in runs]


def on_layout(layout: System, system: System) -> System:
    """`system`'s costs on a candidate's layout: its levels of the layout's names, written the way
    the layout writes them (a level used alone is written directly: search.alone), the layout's
    MTBF and failure model."""
    by_name = {lv.name: lv for lv in system.levels}
    levels = []
    for level in layout.levels:
        own = by_name.get(level.name, level)
        if not level.flushed:  # used alone: a flushed level's flush time is its write
            own = alone(own)
        levels.append(replace(own, survives=level.survives))
    return replace(layout, step_s=system.step_s, levels=tuple(levels), downtime_s=system.downtime_s)


@dataclass(frozen=True)
class Expectation:
    """Measured goodput expected over the members, and per member."""

    goodput: float  # mean over the members of compute share x simulated iteration goodput
    spread: float  # standard deviation between the members (0 with one)
    by_run: dict[str, float]


def expected_goodput(pool: list[Member], layout: System, plan: Plan, work_steps: int, trace: FailureTrace,
                     final_checkpoint: bool = False, give_up: float = 4.0) -> Expectation:
    """Every member on the candidate's layout and plan, for the same job (`work_steps`) against the
    same failures (`trace`, common random numbers), averaged with equal weight: each run one draw."""
    values = {}
    for m in pool:
        outcome = simulate(on_layout(layout, m.system), plan, work_steps, trace, final_checkpoint=final_checkpoint,
                           give_up=give_up)
        values[m.run] = m.compute_share * outcome.goodput
    goodputs = np.array(list(values.values()))
    return Expectation(float(goodputs.mean()), float(goodputs.std(ddof=1)) if len(goodputs) > 1 else 0.0, values)
