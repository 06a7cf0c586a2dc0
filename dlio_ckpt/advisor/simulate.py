"""A seeded simulator of training with failures, multi-level checkpoints, restarts and lost work.

Why this shape: the advisor must score thousands of configurations a minute on one core, so the
simulator never steps through iterations. Between two failures a run is deterministic: it computes
`interval_steps` steps, stalls for the checkpoint written at their end, and repeats. The time to
reach checkpoint n from step 0 without failures, V(n), is closed-form over one period of the level
pattern (P = lcm of the levels' `every`), and so is its inverse. The simulator therefore jumps from
failure to failure (an event loop over failures, vectorised over replicates with numpy): at each
failure it finds, per level, the newest copy that was durable before the failure (written, and its
asynchronous flush finished), drops the levels the failure kind destroys, restarts from the newest
surviving copy (downtime + that level's restore time) and goes on. A failure during a restart
restarts again once noticed (after the restart's first step, as dlio_ckpt's engine notices it).

Model (docs/advisor.md has the whole list), with dlio_ckpt's own level rules (plan/levels.py, SCR):
- a checkpoint is written every `interval_steps` steps; its number n is step / interval_steps
  (dlio_ckpt, like SCR, numbers on from the restored checkpoint after a restart, and from 1 after a
  restart from scratch) and it goes to the used level with the largest `every` dividing n. A direct level is written by the ranks: training stalls for its `blocking_s`.
  A flushed level is filled by a background copy from the first level: training stalls for the
  first level's write, and the copy then lives on both;
- a copy becomes durable `flush_s` after the checkpoint's stall ends (an asynchronous persist, or
  the flush to a slower tier); one flush per level in flight: a flush longer than the gap between
  its level's copies stalls its next one by the difference (steady state);
- a failure kind is "process" (memory lost) or "node" (a node and its node-local tier lost); a
  level survives the kinds up to its `survives` ("none", "process" or "node"). The restart takes
  the newest copy that survives, the cheaper restore on a tie, from scratch when none;
- a failure strikes at its time: a checkpoint whose write it interrupts never counts (its commit
  never happened), and the work since the newest surviving copy is lost. It is *noticed*, as
  dlio_ckpt's engine notices a drawn failure (plan/failures.py), at the first step boundary at or
  after its time, or at the end of the checkpoint write it struck: the time between is lost too
  (a failure during a restart is thus noticed after the first step that follows it);
- no checkpoint is written at the job's last step (`final_checkpoint`: one is, where the interval
  divides it, as dlio_ckpt's fixed policy writes it); goodput = useful iteration time / wall time.

Failures come from a FailureTrace: exponential (or Weibull) gaps drawn once per seed in units of
the MTBF, shared by every configuration scored against it (common random numbers, so two
configurations differ by their merit and not by their luck), or failures replayed at given steps
(the way `failures.at_steps` injects them in a measured run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

KINDS = ("none", "process", "node")  # a level survives every kind up to its own


@dataclass(frozen=True)
class Level:
    """One checkpoint tier's costs, per checkpoint, as the slowest rank sees them."""

    name: str
    blocking_s: float  # training waits this long when the level is written
    flush_s: float = 0.0  # then this long in the background until the copy is durable
    restore_s: float = 0.0  # reading the copy back at a restart
    survives: str = "node"  # the worst failure kind the copy survives: none | process | node
    flushed: bool = False  # filled by a background copy from the first level, not written by the ranks


@dataclass(frozen=True)
class System:
    """What the machine and the job cost, independent of how often they checkpoint."""

    step_s: float  # one training iteration
    mtbf_s: float  # mean time between failures of the whole job
    levels: tuple[Level, ...]
    node_fraction: float = 0.0  # share of failures that take a node (the rest: a process)
    downtime_s: float = 0.0  # restart cost besides the restore (relaunch, warm-up)
    weibull_shape: float = 1.0  # 1: exponential gaps


@dataclass(frozen=True)
class Plan:
    """A checkpoint configuration: the base interval and, per level, every how many checkpoints."""

    interval_steps: int
    every: tuple[int, ...]  # one per System level; 0 = level unused

    def levels_used(self) -> tuple[int, ...]:
        return tuple(i for i, e in enumerate(self.every) if e > 0)


@dataclass(frozen=True)
class Outcome:
    """Means over replicates (goodput as total useful time over total wall time)."""

    goodput: float
    goodput_sd: float  # spread between replicates
    wall_s: float
    useful_s: float
    checkpoint_s: float  # stalls on the path that survived to the end
    lost_work_s: float  # recomputed work, including the stalls of lost intervals
    restart_s: float
    failures: float
    restores_by_level: dict[str, float] = field(default_factory=dict)  # mean count per replicate; "scratch": none
    censored: float = 0.0  # share of replicates stopped at 4x the failure-free time (their work unfinished)
    torn: float = 0.0  # failures that struck a checkpoint's write (never committed), per replicate


@dataclass
class FailureTrace:
    """Failure gaps and kinds per replicate, drawn lazily and deterministically from a seed.

    Gaps are unit exponential draws; a System turns them into seconds (and Weibull gaps, through
    E ** (1 / shape)), so one trace serves every MTBF and every configuration. `at_steps`, when given,
    replaces the draws: failure j strikes right after the run computes step at_steps[j] (in order).
    `at_s`, when given, replaces them by failure times in seconds of training wall time, as
    `failures.mtbf_s` draws them for a measured run (plan/failures.py: failure_time).
    """

    replicates: int = 16
    seed: int = 0
    at_steps: tuple[int, ...] = ()
    kinds: tuple[str, ...] = ()  # with at_steps or at_s: each failure's kind
    at_s: tuple[float, ...] = ()
    _gaps: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)
    _uniform: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)
    _chunks: int = 0

    def ensure(self, count: int) -> None:
        """Draw until each replicate has at least `count` failures (chunk by chunk, each chunk from
        its own SeedSequence child, so the draws do not depend on who asked first)."""
        while self._gaps.shape[1] < count:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, self._chunks]))
            size = (self.replicates, max(64, self._gaps.shape[1]))
            gaps, uniform = rng.standard_exponential(size), rng.random(size)
            self._gaps = np.concatenate([self._gaps.reshape(self.replicates, -1), gaps], axis=1)
            self._uniform = np.concatenate([self._uniform.reshape(self.replicates, -1), uniform], axis=1)
            self._chunks += 1

    def gaps_s(self, system: System, j: int) -> np.ndarray:
        if self.at_s:
            gap = self.at_s[j] - (self.at_s[j - 1] if j else 0.0) if j < len(self.at_s) else math.inf
            return np.full(self.replicates, gap)
        self.ensure(j + 1)
        unit = self._gaps[:, j]
        if system.weibull_shape != 1.0:
            unit = unit ** (1.0 / system.weibull_shape) / math.gamma(1.0 + 1.0 / system.weibull_shape)
        return unit * system.mtbf_s

    def node_failure(self, system: System, j: int) -> np.ndarray:
        if self.at_steps or self.at_s:
            return np.full(self.replicates, self.kinds[j] == "node" if j < len(self.kinds) else False)
        self.ensure(j + 1)
        return self._uniform[:, j] < system.node_fraction


class Timeline:
    """One plan's schedule: V(n), the failure-free time to the end of checkpoint n, its inverse,
    and which levels hold a copy of each checkpoint (over one period of the level pattern)."""

    def __init__(self, system: System, plan: Plan) -> None:
        if plan.interval_steps < 1:
            raise ValueError(f"interval_steps must be >= 1 (got {plan.interval_steps})")
        if len(plan.every) != len(system.levels):
            raise ValueError(f"the plan names {len(plan.every)} levels, the system has {len(system.levels)}")
        used = plan.levels_used()
        if not used:
            raise ValueError("the plan uses no level")
        if any(system.levels[i].flushed for i in used) and (plan.every[0] != 1 or system.levels[0].flushed):
            raise ValueError("a flushed level copies from the first level, which must be direct and take every checkpoint")
        if min(plan.every[i] for i in used) != 1:
            raise ValueError("one used level must take every checkpoint (every=1)")
        self.used = used
        self.tau = plan.interval_steps * system.step_s
        self.period = math.lcm(*(plan.every[i] for i in used))
        positions = np.arange(self.period)  # checkpoint n sits at position n % period (0: a multiple of it)
        chosen = np.zeros(self.period, dtype=np.int64)
        for i in sorted(used, key=lambda i: plan.every[i]):  # the largest interval dividing n wins
            chosen = np.where(positions % plan.every[i] == 0, i, chosen)
        level_of = system.levels
        writer = np.where([level_of[c].flushed for c in chosen], 0, chosen)
        # holds[u, j]: used level u has a copy of the checkpoint at position j
        self.holds = np.array([(chosen == i) | ((writer == i) & (chosen != i)) for i in used])
        stall = np.array([level_of[w].blocking_s for w in writer])
        for u, i in enumerate(used):  # one flush per level in flight
            copies = int(self.holds[u].sum())
            gap = (self.period * self.tau + stall.sum()) / copies
            stall = stall + self.holds[u] * max(0.0, level_of[i].flush_s - gap)
        per_checkpoint = self.tau + np.roll(stall, -1)  # the checkpoint at position j+1 follows j
        self.cum = np.concatenate([[0.0], np.cumsum(per_checkpoint)])
        self.span = float(self.cum[-1])  # one period
        # running[u, j]: the largest position <= j that level u holds (-1: none in this period)
        running = np.maximum.accumulate(np.where(self.holds, positions[None, :], -1), axis=1)
        self.newest = np.where(running >= 0, running, running[:, -1:] - self.period)

    def time_at(self, n: np.ndarray) -> np.ndarray:
        n = np.asarray(n)
        return (n // self.period) * self.span + self.cum[n % self.period]

    def last_before(self, v: np.ndarray) -> np.ndarray:
        """The largest n >= 0 whose end V(n) <= v (-1 where v < 0)."""
        v = np.asarray(v, dtype=float)
        q = np.floor(v / self.span)
        j = np.searchsorted(self.cum, v - q * self.span, side="right") - 1
        return np.where(v < 0, -1, q.astype(np.int64) * self.period + np.minimum(j, self.period - 1))

    def noticed(self, v: np.ndarray, start: np.ndarray, step_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Where, in failure-free time, a failure that strikes at `v` is noticed by an attempt that
        started at `start` (the V of its restored checkpoint): the first step end at or after `v`,
        or the end of the checkpoint write `v` falls in; after the attempt's first step when `v`
        is before its start (the failure struck during the restart). Also: whether it struck a write."""
        v = np.asarray(v, dtype=float)
        never = ~np.isfinite(v)  # no failure left: the attempt finishes
        v = np.maximum(np.where(never, start, v), start)
        n = self.last_before(v)
        base = self.time_at(n)
        into = v - base
        steps = np.maximum(1.0, np.ceil(into / step_s - 1e-9))
        in_write = (into > self.tau + 1e-12) & ~never
        seen = np.where(in_write, self.time_at(n + 1), base + steps * step_s)
        return np.where(never, np.inf, seen), in_write

    def newest_held(self, n: np.ndarray) -> np.ndarray:
        """For n of shape (rows, used levels): per column u, the newest checkpoint <= n that used
        level u holds (<= 0 when none)."""
        n = np.asarray(n)
        q, j = n // self.period, n % self.period
        return q * self.period + self.newest[np.arange(n.shape[1])[None, :], j]


def simulate(system: System, plan: Plan, work_steps: int, trace: FailureTrace, final_checkpoint: bool = False,
             give_up: float = 4.0) -> Outcome:
    """Run the job `work_steps` steps long under `plan` against the failures of `trace`.

    Levels are chosen by the checkpoint's number, which after a restart goes on from the restored
    checkpoint (SCR's fetch sets its id to the fetched one's; dlio_ckpt's levels do the same), so a
    checkpoint redone after a restart goes to the level it went to before. A replicate still
    running at `give_up` x the failure-free time stops there (censored); `final_checkpoint`: one is
    written at the last step where the interval divides it.
    """
    line = Timeline(system, plan)
    used = line.used
    flush = np.array([system.levels[i].flush_s for i in used])
    restore = np.array([system.levels[i].restore_s for i in used])
    survives = np.array([KINDS.index(system.levels[i].survives) for i in used])
    k = plan.interval_steps
    last_checkpoint = (work_steps if final_checkpoint else work_steps - 1) // k  # none at the last step unless asked
    tail_s = (work_steps - last_checkpoint * k) * system.step_s
    give_up_s = give_up * work_steps * system.step_s  # the search never wants such configurations
    r = trace.replicates
    rows = np.arange(r)
    t = np.zeros(r)  # wall time at which the current attempt starts computing
    n0 = np.zeros(r, dtype=np.int64)  # the checkpoint (step / interval) it restarted from (0: the start)
    newest = np.full((r, len(used)), -1, dtype=np.int64)  # per level, the newest durable copy (checkpoint number)
    fail_at = np.zeros(r)
    restart = np.zeros(r)
    failures = np.zeros(r)
    torn = np.zeros(r)
    restored = np.zeros((r, len(used) + 1))  # last column: from scratch
    wall = np.full(r, np.nan)
    active = np.ones(r, dtype=bool)
    censored = np.zeros(r, dtype=bool)
    j = 0
    while active.any():
        start = line.time_at(n0)
        if trace.at_steps:
            fail_at = np.where(active, _replayed_failure(line, system, k, trace, j, t, n0), fail_at)
            v_now = start + (fail_at - t)  # how far the attempt got, in failure-free time
            v_seen, in_write = v_now, np.zeros(r, dtype=bool)  # a replayed failure strikes at a step boundary
        else:
            fail_at = fail_at + trace.gaps_s(system, j)
            v_now = start + (fail_at - t)
            v_seen, in_write = line.noticed(v_now, start, system.step_s)
        seen_at = t + (v_seen - start)  # wall time the failure is noticed: the restart starts here
        v_end = line.time_at(last_checkpoint) + tail_s
        finished = active & (v_now >= v_end)
        wall[finished] = (t + (v_end - start))[finished]
        hopeless = active & ~finished & (seen_at > give_up_s)  # goodput under 25 %: censored here
        wall[hopeless] = seen_at[hopeless]
        censored |= hopeless
        finished |= hopeless
        active &= ~finished
        if not active.any():
            break
        failures += active
        torn += active & in_write
        # per level, the newest copy written and flushed before the failure
        reached = line.newest_held(np.maximum(line.last_before(v_now[:, None] - flush[None, :]), 0))
        fresh = active[:, None] & (reached > n0[:, None]) & (reached <= last_checkpoint)
        newest = np.where(fresh, np.maximum(newest, reached), newest)
        kind = np.where(trace.node_failure(system, j), KINDS.index("node"), KINDS.index("process"))
        newest = np.where(active[:, None] & (survives[None, :] < kind[:, None]), -1, newest)
        best = newest.max(axis=1)
        candidates = np.where((newest == best[:, None]) & (best[:, None] >= 0), restore[None, :], np.inf)
        choice = np.argmin(candidates, axis=1)
        from_scratch = best < 0
        cost = system.downtime_s + np.where(from_scratch, 0.0, candidates[rows, choice])
        restored[rows[active], np.where(from_scratch, len(used), choice)[active]] += 1
        restart = np.where(active, restart + cost, restart)
        n0 = np.where(active, np.where(from_scratch, 0, best), n0)
        t = np.where(active, seen_at + cost, t)
        j += 1
    return _outcome(system, used, line, work_steps, last_checkpoint, wall, restart, failures, restored, censored, torn)


def _outcome(system: System, used: list[int], line: Timeline, work_steps: int, last_checkpoint: int, wall: np.ndarray,
             restart: np.ndarray, failures: np.ndarray, restored: np.ndarray, censored: np.ndarray,
             torn: np.ndarray) -> Outcome:
    """Means over the replicates: goodput (total useful / total wall), where the time went, restores per level."""
    r = len(wall)
    useful = work_steps * system.step_s
    stalls = last_checkpoint * (line.span / line.period - line.tau)  # kept checkpoints x mean stall
    total_wall = float(wall.sum())
    per = useful / wall
    names = [system.levels[i].name for i in used] + ["scratch"]
    return Outcome(
        goodput=useful * r / total_wall,
        goodput_sd=float(per.std(ddof=1)) if r > 1 else 0.0,
        wall_s=total_wall / r,
        useful_s=useful,
        checkpoint_s=stalls,
        lost_work_s=float(np.mean(wall - useful - stalls - restart)),
        restart_s=float(restart.mean()),
        failures=float(failures.mean()),
        restores_by_level={name: float(restored[:, i].mean()) for i, name in enumerate(names)},
        censored=float(censored.mean()),
        torn=float(torn.mean()),
    )


def _replayed_failure(line: Timeline, system: System, k: int, trace: FailureTrace, j: int,
                      t: np.ndarray, n0: np.ndarray) -> np.ndarray:
    """Wall time of replayed failure j: right after the attempt computes step at_steps[j], before
    that step's own checkpoint (inf: no more failures)."""
    if j >= len(trace.at_steps):
        return np.full_like(t, np.inf)
    step = trace.at_steps[j]
    before = (step - 1) // k  # the checkpoints strictly before the step are written first
    v_step = line.time_at(before) + (step - before * k) * system.step_s
    return t + np.maximum(0.0, v_step - line.time_at(n0))


def young_s(cost_s: float, mtbf_s: float) -> float:
    """Young's interval: compute time between checkpoints, sqrt(2 C M)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_s(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order interval (compute time between checkpoints), for C < 2M, else M."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - cost_s


def daly_expected_goodput(tau_s: float, cost_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly's exact expectation for exponential failures (one level, failures during checkpoints and
    restarts included): wall / work = M e^{R/M} (e^{(tau+C)/M} - 1) / tau."""
    return tau_s / (mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((tau_s + cost_s) / mtbf_s))
