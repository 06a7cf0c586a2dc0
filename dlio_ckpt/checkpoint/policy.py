"""When to checkpoint at run time (`checkpoint.policy=`): fixed triggers, Young/Daly, CheckFreq.

`fixed` asks the engine's triggers (steps, epochs, seconds) as before. The two adaptive
policies measure, then decide an interval in steps; they replace the step and seconds triggers
(epoch-end checkpoints are not taken: the interval is all they follow).

- Profiling: the iteration time t_i is the mean wall time of a step (compute and waiting for
  data, checkpoints excluded) without the first step after a start or restart (pipeline
  warm-up); a probe checkpoint measures the cost: at step PROFILE_STEPS for young_daly, at step
  `checkpoint.profile_steps` (default 100) for checkfreq, whose t_i is then, as published, the
  mean of iterations 5 to 99 (the first four left out; all but the first when the profile is
  8 steps or fewer). For young_daly's probe the persist is waited for, so the full
  snapshot+persist time t_f is known; checkfreq does not wait (synchronous: the save is the
  persist; async: t_f is read once the next save has waited for the probe's persist).
- young_daly: C = the mean blocking time of a checkpoint (what training loses), M =
  failures.mtbf_s; both Young's and Daly's intervals are reported and Daly's is used (it is the
  more accurate when C is not tiny against M), in steps of t_i. The interval is derived again
  when the measured C drifts by more than DRIFT from the C it was derived from.
- checkfreq: stall = the probe's blocking time, t_f = its persist time (from the save call to
  durable); CheckFreq's k = max(ceil((t_f - stall)/t_i), 1) (one checkpoint in flight: k steps
  must cover the persist), raised to ceil(stall / (bound t_i)) when its own predicted overhead
  stall / (k t_i) would exceed checkpoint.overhead_bound (the published rule starts at k = 1 for
  a synchronous checkpoint, stall = t_f, and climbs by 2 per checkpoint: 6.4 % over 1,000 steps
  against a 5 % bound, issue 23). After every later checkpoint the overhead is measured as
  CheckFreq's monitor does: the window's wall time (end of the previous checkpoint to the end of
  this one) beyond its steps at the profiled t_i, as a share of the window, so a persist that
  slows the steps down counts as well as the stall (async measured 3x the stall-only
  prediction). While it exceeds the bound k grows by CheckFreq's 2, or by the factor the
  measurement says is missing (k * measured / bound) when that is more, so the bound is met
  after one window rather than after k/2 of them. The bound is the run's, so the policy also
  keeps a budget: the time the checkpoints have cost so far (the probe's stall included, and each
  window's time beyond its steps) over the run's time; the next checkpoint waits (`budget_k`
  steps, however small k is) until taking it at the last checkpoint's cost keeps that share
  within the bound. Every number in it is agreed over the ranks, so they wait alike.

Every rank must take the same checkpoints, so every measurement is the maximum over ranks
(one allgather per checkpoint) and every rank derives the same interval from the same numbers.
A restart (engine/failures.py) keeps what was learned: the policy is the job's, not a rank's
memory; a relaunch (failures.restart=exit) profiles again.
"""

from __future__ import annotations

from typing import Any

from dlio_ckpt.checkpoint.registry import strategy_declares
from dlio_ckpt.plan.intervals import (checkfreq_bound_k, checkfreq_budget_k, checkfreq_k, checkfreq_overhead,
                                      checkfreq_retune, checkfreq_window_overhead, daly_interval, expected_waste,
                                      steps_for, young_interval)

PROFILE_STEPS = 5  # young_daly's probe step (a tiny run is short); checkfreq: checkpoint.profile_steps
WARMUP_STEPS = 4  # checkfreq: iterations 1-4 are not timed (CheckFreq times iterations 5-99)
DRIFT = 0.25  # young_daly: derive again when the measured cost moves this much from the one in use


class AdaptivePolicy:
    """The shared part of young_daly and checkfreq: measure, then checkpoint every `interval` steps."""

    name = ""

    def __init__(self, checkpoints: Any, world: Any, config: Any) -> None:
        self.checkpoints = checkpoints
        self.world = world
        self.config = config
        self.interval: int | None = None  # steps; None while profiling
        self.profile_steps = PROFILE_STEPS
        self.last_step = 0
        # Step wall times (the first step of a block excluded): their count and running sums, the
        # sum from the WARMUP_STEPS-th on apart (CheckFreq's timed iterations): a list of every
        # step's time grew 32 bytes a step (1.25M steps in a 10M-sample epoch at batch 8).
        self._steps_timed = 0
        self._step_sum = 0.0
        self._step_sum_past_warmup = 0.0
        self.iteration_s = 0.0
        self.history: list[dict[str, Any]] = []

    def due(self, step: int, epoch: int, epoch_end: bool, trigger_step: int | None = None) -> bool:
        if epoch_end or not self.config.checkpoint.enabled:
            return False
        if self.interval is None:  # the probe, once the steps before it are measured (a relaunch measures anew)
            return self._steps_timed >= self.profile_steps - 1 and step > self.last_step
        return step - self.last_step >= self.interval

    def probe(self, step: int) -> bool:
        """The checkpoint about to be taken is the profiling probe (its persist is waited for)."""
        return self.interval is None

    def step_done(self, wall_s: float, first: bool) -> None:
        if not first:
            self._steps_timed += 1
            self._step_sum += wall_s
            if self._steps_timed >= WARMUP_STEPS:
                self._step_sum_past_warmup += wall_s

    def restarted(self, step: int) -> None:
        self.last_step = step

    def _agreed(self, *values: float) -> list[float]:
        """Each value's maximum over the ranks (the slowest rank sets the pace)."""
        everyone = self.world.allgather(tuple(values))
        return [max(v[i] for v in everyone) for i in range(len(values))]

    def _iteration(self) -> float:
        return self._step_sum / self._steps_timed if self._steps_timed else 0.0

    def checkpoint_done(self, step: int, record: Any, window_s: float) -> None:
        """Collective: called on every rank after each save."""
        self.window_steps = step - self.last_step
        self.last_step = step
        blocking, persist, iteration, window = self._agreed(record.blocking_s, max(record.persist_s, record.blocking_s),
                                                            self._iteration() if self.interval is None else self.iteration_s,
                                                            window_s)
        self.iteration_s = iteration
        self._measured(step, blocking, persist, window)

    def _set(self, step: int, interval: int, reason: str) -> None:
        if interval != self.interval:
            self.history.append({"step": step, "interval_steps": interval, "reason": reason})
        self.interval = interval

    def _measured(self, step: int, blocking: float, persist: float, window: float) -> None:
        raise NotImplementedError


class YoungDalyPolicy(AdaptivePolicy):
    name = "young_daly"

    def __init__(self, checkpoints: Any, world: Any, config: Any) -> None:
        super().__init__(checkpoints, world, config)
        self.mtbf_s = config.failures.mtbf_s
        self._costs: list[float] = []
        self.cost_s = 0.0  # the C the interval in use was derived from
        self.young_s = self.daly_s = 0.0

    def _measured(self, step: int, blocking: float, persist: float, window: float) -> None:
        self._costs.append(blocking)
        cost = sum(self._costs) / len(self._costs)
        drifted = self.cost_s > 0 and abs(cost - self.cost_s) > DRIFT * self.cost_s
        if self.interval is None or drifted:
            self.cost_s = cost
            self.young_s = young_interval(cost, self.mtbf_s)
            self.daly_s = daly_interval(cost, self.mtbf_s)
            reason = "profiled" if self.interval is None else f"cost drifted to {cost:.4g} s"
            self._set(step, steps_for(self.daly_s, self.iteration_s), reason)

    def summary(self) -> dict[str, Any]:
        interval_s = (self.interval or 0) * self.iteration_s
        return {"name": self.name, "interval_steps": self.interval, "interval_s": interval_s, "used": "daly",
                "young_s": self.young_s, "daly_s": self.daly_s, "cost_s": self.cost_s, "mtbf_s": self.mtbf_s,
                "iteration_s": self.iteration_s,
                "predicted_overhead": expected_waste(self.cost_s, interval_s, self.mtbf_s) if interval_s > 0 else None,
                "history": self.history}


class CheckFreqPolicy(AdaptivePolicy):
    name = "checkfreq"

    def __init__(self, checkpoints: Any, world: Any, config: Any) -> None:
        super().__init__(checkpoints, world, config)
        self.bound = config.checkpoint.overhead_bound
        self.profile_steps = config.checkpoint.profile_steps
        self.stall_s = self.full_s = 0.0
        self.persist_k = self.bound_k = 0
        self.measured_overhead: float | None = None
        self._extra_s = self._window_s = 0.0  # the run so far: time the checkpoints cost, and all of it
        self._cost_s = 0.0  # what the last checkpoint cost (its window's time beyond the steps)
        self.budget_k = 0  # steps the next checkpoint waits for the run's overhead to stay within the bound
        self._async = strategy_declares(config.checkpoint.strategy, "persists_in_background")
        self._pending: Any = None  # async: the probe's record, until its persist time is known

    def probe(self, step: int) -> bool:
        """Synchronous: the save is the whole persist, nothing to wait for. Async: the probe is not
        waited for (a wait of t_f, 4-7 % of a 1,000-step run here, is more than the bound allows);
        its t_f is read when the next save has waited for it (one checkpoint in flight)."""
        return False

    def checkpoint_done(self, step: int, record: Any, window_s: float) -> None:
        if self._pending is not None:  # collective on every rank alike: _pending is set on all of them
            (full,) = self._agreed(self._pending.persist_s)
            if full > 0:
                self._pending = None
                self.full_s = full
                self.persist_k = checkfreq_k(self.iteration_s, self.stall_s, full)
                if self.persist_k > (self.interval or 0):
                    self._set(step, self.persist_k, f"the probe's persist took {full:.3g} s")
        elif self.interval is None and self._async:
            self._pending = record  # the probe: its persist time arrives with a later save
        super().checkpoint_done(step, record, window_s)

    def due(self, step: int, epoch: int, epoch_end: bool, trigger_step: int | None = None) -> bool:
        if self.interval is not None and step - self.last_step < self.budget_k:
            return False
        return super().due(step, epoch, epoch_end, trigger_step)

    def _iteration(self) -> float:
        """CheckFreq's t_i: the mean of iterations 5 to 99 of the profile (steps 2-4 are warm-up)."""
        if self.profile_steps <= 2 * WARMUP_STEPS:
            return super()._iteration()
        timed = self._steps_timed - (WARMUP_STEPS - 1)
        return self._step_sum_past_warmup / timed if timed > 0 else 0.0

    def _measured(self, step: int, blocking: float, persist: float, window: float) -> None:
        if self.interval is None:
            self.stall_s, self.full_s = blocking, persist
            self.persist_k = checkfreq_k(self.iteration_s, self.stall_s, self.full_s)
            self.bound_k = checkfreq_bound_k(self.iteration_s, self.stall_s, self.bound)
            reason = "profiled" + (f": k {self.persist_k} -> {self.bound_k} for the bound" if self.bound_k > self.persist_k else "")
            self._set(step, max(self.persist_k, self.bound_k), reason)
            self._cost_s = blocking  # what the next one should cost: its stall
            self._extra_s, self._window_s = blocking, window
        else:
            overhead = checkfreq_window_overhead(window, self.window_steps, self.iteration_s)
            self.measured_overhead = overhead
            self._cost_s = overhead * window
            self._extra_s += self._cost_s
            self._window_s += window
            self._set(step, checkfreq_retune(self.interval, overhead, self.bound), f"overhead {overhead:.3f} > {self.bound}")
        self.budget_k = checkfreq_budget_k(self._extra_s, self._window_s, self._cost_s, self.iteration_s, self.bound)

    def summary(self) -> dict[str, Any]:
        k = self.interval or 0
        return {"name": self.name, "interval_steps": self.interval, "interval_s": k * self.iteration_s,
                "iteration_s": self.iteration_s, "stall_s": self.stall_s, "full_s": self.full_s,
                "profile_steps": self.profile_steps, "persist_k": self.persist_k, "bound_k": self.bound_k,
                "budget_k": self.budget_k,
                "overhead_bound": self.bound, "measured_overhead": self.measured_overhead,
                "monitored_overhead": self._extra_s / self._window_s if self._window_s > 0 else None,  # probe included
                "predicted_overhead": checkfreq_overhead(self.stall_s, k, self.iteration_s) if k else None,
                "young_s": None, "daly_s": None, "history": self.history}


class FixedPolicy(AdaptivePolicy):
    """Today's triggers, from the engine; it measures as the others do, so that the summary can
    set Young's and Daly's intervals (when failures.mtbf_s is given) beside the one used."""

    name = "fixed"

    def __init__(self, checkpoints: Any, world: Any, config: Any) -> None:
        super().__init__(checkpoints, world, config)
        self._costs: list[float] = []
        triggers = getattr(checkpoints, "triggers", None)
        self.interval = getattr(triggers, "steps_between", 0) or None

    def due(self, step: int, epoch: int, epoch_end: bool, trigger_step: int | None = None) -> bool:
        return self.checkpoints.due(step, epoch, epoch_end, trigger_step=trigger_step)

    def probe(self, step: int) -> bool:
        return False

    def _measured(self, step: int, blocking: float, persist: float, window: float) -> None:
        self._costs.append(blocking)

    def summary(self) -> dict[str, Any]:
        cost = sum(self._costs) / len(self._costs) if self._costs else 0.0
        mtbf = self.config.failures.mtbf_s
        interval_s = (self.interval or 0) * self.iteration_s
        return {"name": self.name, "interval_steps": self.interval, "interval_s": interval_s or None,
                "iteration_s": self.iteration_s, "cost_s": cost, "mtbf_s": mtbf or None,
                "young_s": young_interval(cost, mtbf) if mtbf > 0 and self._costs else None,
                "daly_s": daly_interval(cost, mtbf) if mtbf > 0 and self._costs else None,
                "predicted_overhead": expected_waste(cost, interval_s, mtbf) if mtbf > 0 and interval_s > 0 else None,
                "history": self.history}


POLICIES = {"fixed": FixedPolicy, "young_daly": YoungDalyPolicy, "checkfreq": CheckFreqPolicy}


def make_policy(checkpoints: Any, world: Any, config: Any) -> Any:
    return POLICIES[config.checkpoint.policy](checkpoints, world, config)
