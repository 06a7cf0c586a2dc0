"""Is training after a restart the training an uninterrupted run would have done? (Rojas et al.)

The truth is an uninterrupted run computed from the configuration alone, never from what the run
saved (UninterruptedRun):
- samples: the (file, sample) rows the uninterrupted run reads at global step s: the epochs'
  orders rebuilt with the configured shuffle seed, step s located by counting batches from the
  start (not from the checkpoint's resume point);
- state: the xxh3_128 of the rank's logical checkpoint state at step s, from a fresh RankState
  of the same configuration advanced straight to s (the state at a step is a function of the seed
  and the step: dlio_ckpt/state/models.py), not from the bytes the run saved or restored.
With failures on (where a restart can happen), the run's rows are compared with the truth at
every step (so at every step after each restart), its state at every checkpoint and right after
each restore. The first mismatch (step, rank, what) is kept; summary.json `resume` reports it.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import xxhash

from dlio_ckpt.plan.resume import batch_digest, order_digest, order_entry
from dlio_ckpt.state.rank_state import RankState


def _state_holder(checkpoints: Any) -> Any:
    """The engine that holds the rank's state (multi-level: the levels share the first's), or None
    without an evolving state (checkpointing off)."""
    engines = getattr(checkpoints, "engines", None)
    holder = engines[0] if engines else checkpoints
    if getattr(holder, "plan", None) is None or getattr(holder, "world", None) is None or not hasattr(holder, "state"):
        return None
    return holder


def rank_state_digest(state: Any, files: Any) -> str:
    """One digest of a rank's state (its files' digests in plan order)."""
    hasher = xxhash.xxh3_128()
    for pf in files:
        hasher.update(f"{pf.relpath}:{state.digest(pf)};".encode())
    return hasher.hexdigest()


def state_digest(checkpoints: Any) -> str | None:
    """One digest of this rank's checkpoint state now, or None without an evolving state."""
    holder = _state_holder(checkpoints)
    if holder is None:
        return None
    return rank_state_digest(holder.state, holder.plan.files_by_rank[holder.world.rank])


def truth_state_factory(checkpoints: Any) -> tuple[Callable[[], Any] | None, tuple]:
    """A maker of fresh states of this rank's files, configured as the run's, and the files
    (None, (): no evolving state)."""
    holder = _state_holder(checkpoints)
    if holder is None:
        return None, ()

    files = holder.plan.files_by_rank[holder.world.rank]
    return (lambda: RankState(files, holder.cfg, holder.config.seed, holder.source, layout=holder.plan.files_by_rank)), files


class UninterruptedRun:
    """What an uninterrupted run reads and holds at any global step, from the configuration alone.

    `epoch_plan(epoch)` gives the uninterrupted run's plan of an epoch (the configured shuffle
    seed); `new_state()` a fresh state (None: no evolving state). Digests are cached per step; the
    reference state only moves forward, and is rebuilt from step 0 when asked for an earlier step."""

    def __init__(self, epoch_plan: Callable[[int], Any], epochs: int, new_state: Callable[[], Any] | None = None,
                 files: Any = ()) -> None:
        self._epoch_plan = epoch_plan
        self._epochs = epochs
        self._new_state = new_state
        self._files = files
        self._plan: tuple[int, int, Any] | None = None  # (epoch, its first global step, its plan)
        self._state: Any = None
        self._digests: dict[int, str] = {}

    def rows(self, step: int) -> np.ndarray | None:
        """The rows of global step `step` (counted from 1), or None past the last epoch."""
        epoch, first, plan = self._plan if self._plan is not None and self._plan[1] <= step else (1, 1, None)
        plan = plan if plan is not None else self._epoch_plan(1)
        while step >= first + plan.num_batches:
            if epoch >= self._epochs:
                return None
            first += plan.num_batches
            epoch += 1
            plan = self._epoch_plan(epoch)
        self._plan = (epoch, first, plan)
        return plan.batch(step - first)

    def state_digest(self, step: int) -> str | None:
        if self._new_state is None:
            return None
        if step not in self._digests:
            if self._state is None or self._state.step > step:
                if self._state is not None:
                    self._state.close()
                self._state = self._new_state()
            self._state.advance(step)
            self._digests[step] = rank_state_digest(self._state, self._files)
        return self._digests[step]

    def close(self) -> None:
        if self._state is not None:
            self._state.close()
            self._state = None


class ResumeChecks:
    """One rank's witnesses, compared with the truth (an UninterruptedRun; None: nothing compared,
    as without failures, where the run is the uninterrupted one)."""

    def __init__(self, rank: int, truth: UninterruptedRun | None = None) -> None:
        self.rank = rank
        self.truth = truth
        # Without failures (no truth) steps only move forward: the order digest is taken as they
        # come (order_digest's input, in step order) instead of from a dict of every step's digest,
        # which grew ~150 bytes a step. With failures a restart redoes steps: each keeps its digest.
        self._order = xxhash.xxh3_128() if truth is None else None
        self._last_step = 0
        self.sample_digests: dict[int, str] = {}
        self.state_digests: dict[int, str] = {}
        self.divergence: dict[str, Any] | None = None
        self.samples_checked = 0  # steps compared with the uninterrupted run's
        self.states_checked = 0  # saved or restored states compared with the uninterrupted run's
        self.restores = 0

    def _diverged(self, step: int, what: str, detail: str) -> None:
        if self.divergence is None or step < self.divergence["step"]:
            self.divergence = {"step": step, "rank": self.rank, "what": what, "detail": detail}

    def samples(self, step: int, rows: np.ndarray) -> None:
        digest = batch_digest(rows)
        if self._order is not None:
            if step <= self._last_step:
                raise RuntimeError(f"step {step} after step {self._last_step} in a run without failures")
            self._last_step = step
            self._order.update(order_entry(step, digest))
        else:
            self.sample_digests[step] = digest
        if self.truth is None:
            return
        self.samples_checked += 1
        truth = self.truth.rows(step)
        if truth is None:
            self._diverged(step, "samples", "the run read a step the uninterrupted run does not have")
        elif batch_digest(truth) != digest:
            self._diverged(step, "samples", "the batch differs from the uninterrupted run's at this step")

    def _state(self, step: int, digest: str | None, detail: str) -> None:
        if digest is None or self.truth is None:
            return
        truth = self.truth.state_digest(step)
        if truth is None:
            return
        self.states_checked += 1
        if truth != digest:
            self._diverged(step, "state", detail)

    def saved_state(self, step: int, digest: str | None) -> None:
        if digest is not None:
            self.state_digests[step] = digest
        self._state(step, digest, "the state saved at this step differs from the uninterrupted run's")

    def restored_state(self, step: int, digest: str | None) -> None:
        self.restores += 1
        self._state(step, digest, "the restored state differs from the uninterrupted run's at this step")

    def local(self) -> dict[str, Any]:
        return {"divergence": self.divergence, "samples_checked": self.samples_checked,
                "states_checked": self.states_checked, "restores": self.restores,
                "sample_order_digest": self._order.hexdigest() if self._order is not None
                else order_digest(self.sample_digests),
                "state_digests": {str(step): d for step, d in sorted(self.state_digests.items())}}

    def carried(self) -> dict[str, Any]:
        """What a relaunch needs (failures.restart=exit), JSON-ready."""
        return {"samples": {str(k): v for k, v in self.sample_digests.items()},
                "states": {str(k): v for k, v in self.state_digests.items()},
                "divergence": self.divergence, "samples_checked": self.samples_checked,
                "states_checked": self.states_checked, "restores": self.restores}

    def take_carried(self, data: dict[str, Any]) -> None:
        self._order = None  # a relaunch carries every step's digest on
        self.sample_digests = {int(k): v for k, v in data["samples"].items()}
        self.state_digests = {int(k): v for k, v in data["states"].items()}
        self.divergence = data["divergence"]
        self.samples_checked = int(data["samples_checked"])
        self.states_checked = int(data["states_checked"])
        self.restores = int(data["restores"])
