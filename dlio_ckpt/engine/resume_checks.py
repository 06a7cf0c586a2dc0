"""Is training after a restart the training an uninterrupted run would have done? (Rojas et al.)

Two witnesses per rank, compared as the run goes:
- samples: the (file, sample) rows of every step. After a resume they must equal the rows an
  uninterrupted run reads at that step (the epoch's order rebuilt from the configuration, not from
  the checkpoint), and a step computed again after a failure must read what it read the first time.
- state: the xxh3_128 of the rank's logical checkpoint state, taken at every save. The state
  restored at step r must equal the state saved at step r, and a checkpoint step reached again
  after a failure must hold the same state as the first time.
The first mismatch (step, rank, what) is kept; summary.json `resume` reports it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xxhash

from dlio_ckpt.plan.resume import batch_digest, order_digest


def state_digest(checkpoints: Any) -> str | None:
    """One digest of this rank's checkpoint state now (its files' digests in plan order), or None
    without an evolving state (checkpointing off)."""
    plan = getattr(checkpoints, "plan", None)
    world = getattr(checkpoints, "world", None)
    engines = getattr(checkpoints, "engines", None)  # multi-level: the levels share one state
    holder = engines[0] if engines else checkpoints
    if plan is None or world is None or not hasattr(holder, "state"):
        return None
    state = holder.state
    hasher = xxhash.xxh3_128()
    for pf in plan.files_by_rank[world.rank]:
        hasher.update(f"{pf.relpath}:{state.digest(pf)};".encode())
    return hasher.hexdigest()


class ResumeChecks:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.sample_digests: dict[int, str] = {}
        self.state_digests: dict[int, str] = {}
        self.divergence: dict[str, Any] | None = None
        self.samples_checked = 0  # steps compared with an uninterrupted run's (resumed or recomputed)
        self.states_checked = 0  # restored or re-saved states compared with the first time
        self.restores = 0

    def _diverged(self, step: int, what: str, detail: str) -> None:
        if self.divergence is None or step < self.divergence["step"]:
            self.divergence = {"step": step, "rank": self.rank, "what": what, "detail": detail}

    def samples(self, step: int, rows: np.ndarray, reference: np.ndarray | None) -> None:
        digest = batch_digest(rows)
        if reference is not None:
            self.samples_checked += 1
            if batch_digest(reference) != digest:
                self._diverged(step, "samples", "the batch after the resume differs from the uninterrupted order")
        earlier = self.sample_digests.get(step)
        if earlier is not None:
            self.samples_checked += reference is None
            if earlier != digest:
                self._diverged(step, "samples", "the recomputed step read other samples than the first time")
        self.sample_digests[step] = digest

    def saved_state(self, step: int, digest: str | None) -> None:
        if digest is None:
            return
        earlier = self.state_digests.get(step)
        if earlier is not None:
            self.states_checked += 1
            if earlier != digest:
                self._diverged(step, "state", "the state saved again at this step differs from the first time")
        self.state_digests[step] = digest

    def restored_state(self, step: int, digest: str | None) -> None:
        self.restores += 1
        earlier = self.state_digests.get(step)
        if digest is None or earlier is None:
            return
        self.states_checked += 1
        if earlier != digest:
            self._diverged(step, "state", "the restored state differs from the state saved at this step")

    def local(self) -> dict[str, Any]:
        return {"divergence": self.divergence, "samples_checked": self.samples_checked,
                "states_checked": self.states_checked, "restores": self.restores,
                "sample_order_digest": order_digest(self.sample_digests),
                "state_digests": {str(step): d for step, d in sorted(self.state_digests.items())}}

    def carried(self) -> dict[str, Any]:
        """What a relaunch needs (failures.restart=exit), JSON-ready."""
        return {"samples": {str(k): v for k, v in self.sample_digests.items()},
                "states": {str(k): v for k, v in self.state_digests.items()},
                "divergence": self.divergence, "samples_checked": self.samples_checked,
                "states_checked": self.states_checked, "restores": self.restores}

    def take_carried(self, data: dict[str, Any]) -> None:
        self.sample_digests = {int(k): v for k, v in data["samples"].items()}
        self.state_digests = {int(k): v for k, v in data["states"].items()}
        self.divergence = data["divergence"]
        self.samples_checked = int(data["samples_checked"])
        self.states_checked = int(data["states_checked"])
        self.restores = int(data["restores"])


def resume_section(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json `resume`, from every rank's ResumeChecks.local()."""
    found = [r["divergence"] for r in ranks if r["divergence"]]
    first = min(found, key=lambda d: (d["step"], d["rank"])) if found else None
    restored = any(r["restores"] for r in ranks)
    steps = sorted({int(s) for r in ranks for s in r["state_digests"]})
    combined = {}
    for step in steps:
        hasher = xxhash.xxh3_128()
        for r in ranks:
            hasher.update(f"{r['state_digests'].get(str(step), '')};".encode())
        combined[str(step)] = hasher.hexdigest()
    return {
        "deterministic": (first is None) if restored else None,  # None: no restart happened, nothing to check
        "first_divergence": first,
        "samples_checked": sum(r["samples_checked"] for r in ranks),
        "states_checked": sum(r["states_checked"] for r in ranks),
        "sample_order_digests": [r["sample_order_digest"] for r in ranks],
        "checkpoint_state_digests": combined,
    }
