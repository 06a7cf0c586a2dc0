"""The configuration space, exhaustive search in the simulator, and the Young/Daly baseline.

A candidate is a *layout* (which measured levels are used: each level alone, or all of them with
the first taking every checkpoint) with an interval in steps and, for the slower levels, every
how many checkpoints they take one. A level used alone is written directly by the ranks (a level
measured as a flush from the fast tier then costs its flush time per write). Intervals are a
geometric grid around each level's Daly interval, so the grid scales with the MTBF and the costs.

Every candidate of one system is scored against the same FailureTrace (common random numbers),
so comparisons between candidates are not at the mercy of luck.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from dlio_ckpt.advisor.simulate import KINDS, FailureTrace, Level, Outcome, Plan, System, daly_s, simulate

EVERY_CHOICES = (1, 2, 4, 8, 16, 32, 64)
MAX_LEVELS = 3  # feature slots; more measured levels are not advised on


@dataclass(frozen=True)
class Candidate:
    system: System  # the layout's levels (a subset of the measured ones)
    plan: Plan
    layout: str  # "shared" or "local+shared"
    variant: str = ""  # the measured strategy/encoding whose costs these are

    def describe(self) -> str:
        parts = [f"every {self.plan.interval_steps} steps"]
        for level, every in zip(self.system.levels[1:], self.plan.every[1:]):
            parts.append(f"{level.name} on every {every}. checkpoint" if every > 1 else f"{level.name} on every checkpoint")
        return (f"[{self.variant}] " if self.variant else "") + f"{self.layout}: " + ", ".join(parts)


@dataclass(frozen=True)
class Settings:
    """How long a simulated job is and how many replicates score it."""

    horizon_mtbf: float = 10.0  # job length in MTBFs per replicate
    replicates: int = 48
    seed: int = 0

    def work_steps(self, system: System) -> int:
        return max(1, math.ceil(self.horizon_mtbf * system.mtbf_s / system.step_s))

    def trace(self) -> FailureTrace:
        return FailureTrace(replicates=self.replicates, seed=self.seed)


def alone(level: Level) -> Level:
    """A level written directly by the ranks, as it would be with no faster tier in front."""
    if not level.flushed:
        return level
    return replace(level, blocking_s=level.flush_s, flush_s=0.0, flushed=False)


def layouts(system: System) -> list[System]:
    """Each level alone, then all levels together (when there are several)."""
    out = [replace(system, levels=(alone(level),)) for level in system.levels[:MAX_LEVELS]]
    if 1 < len(system.levels) <= MAX_LEVELS:
        out.append(system)
    return out


def interval_grid(system: System, points: int = 16) -> list[int]:
    """Geometric intervals (steps) from a fifth of the shortest Daly interval to 4x the longest."""
    dalys = [daly_s(max(level.blocking_s, 1e-9), system.mtbf_s) for level in system.levels]
    low = max(1.0, min(dalys) / 5.0 / system.step_s)
    high = max(low + 1.0, max(dalys) * 4.0 / system.step_s)
    return sorted({max(1, int(round(v))) for v in np.geomspace(low, high, points)})


def every_choices(levels: int) -> list[tuple[int, ...]]:
    """Intervals in checkpoints for levels 1.. (each a multiple of the one before, rising after
    the second level; the second may take every checkpoint too: then every one is flushed)."""
    combos: list[tuple[int, ...]] = [(1,)]
    for _ in range(levels - 1):
        combos = [c + (e,) for c in combos for e in EVERY_CHOICES if (e > c[-1] or len(c) == 1) and e % c[-1] == 0]
    return combos


def candidates(system: System, points: int = 16, variant: str = "") -> list[Candidate]:
    out = []
    for layout in layouts(system):
        name = "+".join(level.name for level in layout.levels)
        for k in interval_grid(system, points):
            for every in every_choices(len(layout.levels)):
                out.append(Candidate(layout, Plan(k, every), name, variant))
    return out


def score(candidate: Candidate, settings: Settings, trace: FailureTrace | None = None) -> Outcome:
    system = candidate.system
    return simulate(system, candidate.plan, settings.work_steps(system), trace or settings.trace())


def exhaustive(pool: list[Candidate], settings: Settings) -> tuple[Candidate, Outcome, list[Outcome]]:
    """Every candidate in the simulator (one shared trace); the best and all outcomes."""
    trace = settings.trace()
    outcomes = [score(c, settings, trace) for c in pool]
    best = int(np.argmax([o.goodput for o in outcomes]))
    return pool[best], outcomes[best], outcomes


def young_daly(system: System, variant: str = "") -> Candidate:
    """What one would do without the advisor: the most durable level alone (the cheapest of
    those that survive the worst failure), at Daly's interval for its blocking cost."""
    worst = max(KINDS.index(level.survives) for level in system.levels)
    level = min((alone(lv) for lv in system.levels if KINDS.index(lv.survives) == worst), key=lambda lv: lv.blocking_s)
    interval = max(1, int(round(daly_s(max(level.blocking_s, 1e-9), system.mtbf_s) / system.step_s)))
    return Candidate(replace(system, levels=(level,)), Plan(interval, (1,)), level.name, variant)


def features(candidate: Candidate) -> np.ndarray:
    """Dimensionless inputs for the surrogate: times over the MTBF (log10), shares, intervals (log2).
    Level slots beyond the layout's are zero with their `used` flag off."""
    s, plan = candidate.system, candidate.plan
    m = s.mtbf_s

    def lg(x: float) -> float:
        return math.log10(max(x, 1e-9) / m)

    row = [lg(plan.interval_steps * s.step_s), lg(s.downtime_s + 1e-9 * m), s.node_fraction, lg(s.step_s)]
    for slot in range(MAX_LEVELS):
        if slot < len(s.levels):
            lv = s.levels[slot]
            interval = plan.every[slot] * plan.interval_steps * s.step_s
            row += [1.0, math.log2(plan.every[slot]), lg(interval), lg(lv.blocking_s), lg(lv.flush_s + 1e-9 * m),
                    lg(lv.restore_s), math.log10(max(lv.flush_s, 1e-9) / interval), float(KINDS.index(lv.survives)),
                    float(lv.flushed)]
        else:
            row += [0.0] * 9
    return np.array(row)


def feature_matrix(pool: list[Candidate]) -> np.ndarray:
    return np.array([features(c) for c in pool])
