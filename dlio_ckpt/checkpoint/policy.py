"""When to checkpoint at run time (`checkpoint.policy=`): fixed triggers, Young/Daly, CheckFreq.

`fixed` asks the engine's triggers (steps, epochs, seconds) as before. The two adaptive
policies measure, then decide an interval in steps; they replace the step and seconds triggers
(epoch-end checkpoints are not taken: the interval is all they follow).

- Profiling: the iteration time t_i is the mean wall time of a step (compute and waiting for
  data, checkpoints excluded) without the first step after a start or restart (pipeline
  warm-up); a probe checkpoint at step PROFILE_STEPS (CheckFreq profiles early in the run, then
  checkpoints) measures the cost. For the probe the persist is waited for, so the full
  snapshot+persist time t_f is known (async: that wait is blocking time, as in CheckFreq).
- young_daly: C = the mean blocking time of a checkpoint (what training loses), M =
  failures.mtbf_s; both Young's and Daly's intervals are reported and Daly's is used (it is the
  more accurate when C is not tiny against M), in steps of t_i. The interval is derived again
  when the measured C drifts by more than DRIFT from the C it was derived from.
- checkfreq: stall = the probe's blocking time, t_f = its persist time (from the save call to
  durable); k = max(ceil((t_f - stall)/t_i), 1); after every later checkpoint the measured
  overhead (its blocking time over the wall time since the previous checkpoint) is compared with
  checkpoint.overhead_bound and k += 2 when it exceeds it, as the paper does.

Every rank must take the same checkpoints, so every measurement is the maximum over ranks
(one allgather per checkpoint) and every rank derives the same interval from the same numbers.
A restart (engine/failures.py) keeps what was learned: the policy is the job's, not a rank's
memory; a relaunch (failures.restart=exit) profiles again.
"""

from __future__ import annotations

import math
from typing import Any

from dlio_ckpt.plan.intervals import (checkfreq_k, checkfreq_overhead, checkfreq_retune, daly_interval,
                                      expected_waste, steps_for, young_interval)

PROFILE_STEPS = 5  # the probe checkpoint's step (CheckFreq profiles from iteration 5; a tiny run is short)
DRIFT = 0.25  # young_daly: derive again when the measured cost moves this much from the one in use


class AdaptivePolicy:
    """The shared part of young_daly and checkfreq: measure, then checkpoint every `interval` steps."""

    name = ""

    def __init__(self, checkpoints: Any, world: Any, config: Any) -> None:
        self.checkpoints = checkpoints
        self.world = world
        self.config = config
        self.interval: int | None = None  # steps; None while profiling
        self.last_step = 0
        self._step_s: list[float] = []
        self.iteration_s = 0.0
        self.history: list[dict[str, Any]] = []

    def due(self, step: int, epoch: int, epoch_end: bool, trigger_step: int | None = None) -> bool:
        if epoch_end or not self.config.checkpoint.enabled:
            return False
        if self.interval is None:  # the probe, once the steps before it are measured (a relaunch measures anew)
            return len(self._step_s) >= PROFILE_STEPS - 1 and step > self.last_step
        return step - self.last_step >= self.interval

    def probe(self, step: int) -> bool:
        """The checkpoint about to be taken is the profiling probe (its persist is waited for)."""
        return self.interval is None

    def step_done(self, wall_s: float, first: bool) -> None:
        if not first:
            self._step_s.append(wall_s)

    def restarted(self, step: int) -> None:
        self.last_step = step

    def _agreed(self, *values: float) -> list[float]:
        """Each value's maximum over the ranks (the slowest rank sets the pace)."""
        everyone = self.world.allgather(tuple(values))
        return [max(v[i] for v in everyone) for i in range(len(values))]

    def _iteration(self) -> float:
        return sum(self._step_s) / len(self._step_s) if self._step_s else 0.0

    def checkpoint_done(self, step: int, record: Any, window_s: float) -> None:
        """Collective: called on every rank after each save."""
        self.last_step = step
        blocking, persist, iteration, window = self._agreed(record.blocking_s, max(record.persist_s, record.blocking_s),
                                                            self._iteration(), window_s)
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
        self.stall_s = self.full_s = 0.0
        self.measured_overhead: float | None = None

    def _measured(self, step: int, blocking: float, persist: float, window: float) -> None:
        if self.interval is None:
            self.stall_s, self.full_s = blocking, persist
            self._set(step, checkfreq_k(self.iteration_s, self.stall_s, self.full_s), "profiled")
            return
        self.measured_overhead = blocking / window if window > 0 else math.inf
        k = checkfreq_retune(self.interval, self.measured_overhead, self.bound)
        self._set(step, k, f"overhead {self.measured_overhead:.3f} > {self.bound}")

    def summary(self) -> dict[str, Any]:
        k = self.interval or 0
        return {"name": self.name, "interval_steps": self.interval, "interval_s": k * self.iteration_s,
                "iteration_s": self.iteration_s, "stall_s": self.stall_s, "full_s": self.full_s,
                "overhead_bound": self.bound, "measured_overhead": self.measured_overhead,
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
