"""Where training time went when failures strike, and goodput = useful compute / wall time.

Each rank keeps a Ledger: the compute and wall time of every step that still counts. A restart
to step r takes the steps after r out of it (their time becomes lost work: computed, then thrown
away) and adds the restart's own time (restore plus warm-up). What is left at the end is the
useful compute. The summary takes the figures of the rank with the longest wall time (the one
the job waited for).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dlio_ckpt.metrics.resume import resume_section


@dataclass
class Ledger:
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)  # step -> (compute_s, wall_s), surviving
    lost_steps: int = 0  # steps computed and then thrown away by a restart (recomputed after it)
    lost_work_s: float = 0.0  # their wall time (compute and waiting for data)
    lost_compute_s: float = 0.0
    restart_s: float = 0.0  # restore plus warm-up, over every restart
    checkpoint_s: float = 0.0  # blocked in checkpoint saves (and waits for persists)
    wall_s: float = 0.0  # training wall time (set at the end; includes earlier processes after a relaunch)
    carried_wall_s: float = 0.0  # training wall time of earlier processes (failures.restart=exit)
    # Steps no restart can take back, added up instead of kept (a run without failures: every step;
    # a dict entry a step grew ~100 bytes a step, 1.25M steps in a 10M-sample epoch at batch 8)
    keep_steps: bool = True
    summed_steps: int = 0
    summed_compute_s: float = 0.0
    summed_wall_s: float = 0.0

    def step(self, step: int, compute_s: float, wall_s: float) -> None:
        if self.keep_steps:
            self.steps[step] = (compute_s, wall_s)
        else:
            self.summed_steps += 1
            self.summed_compute_s += compute_s
            self.summed_wall_s += wall_s

    def roll_back(self, to_step: int) -> tuple[int, float]:
        """Training goes back to `to_step`: every later step's time is lost. Returns (steps, seconds)."""
        lost = [s for s in self.steps if s > to_step]
        seconds = 0.0
        for s in lost:
            compute, wall = self.steps.pop(s)
            self.lost_compute_s += compute
            seconds += wall
        self.lost_steps += len(lost)
        self.lost_work_s += seconds
        return len(lost), seconds

    @property
    def step_s_mean(self) -> float:
        """The iteration time: mean wall time of the surviving steps (compute and waiting for data)."""
        count = len(self.steps) + self.summed_steps
        return self._surviving_wall_s() / count if count else 0.0

    def _surviving_wall_s(self) -> float:
        return self.summed_wall_s + sum(wall for _, wall in self.steps.values())

    @property
    def useful_compute_s(self) -> float:
        return self.summed_compute_s + sum(compute for compute, _ in self.steps.values())

    def as_dict(self) -> dict[str, Any]:
        """What a relaunch needs to carry on (failures.restart=exit), JSON-ready."""
        data = asdict(self)
        data["steps"] = [[s, c, w] for s, (c, w) in sorted(self.steps.items())]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Ledger":
        values = dict(data)
        values["steps"] = {int(s): (float(c), float(w)) for s, c, w in data.get("steps", [])}
        return cls(**values)

    def figures(self) -> dict[str, float]:
        """This rank's where-the-time-went, for the gather."""
        surviving_wall = self._surviving_wall_s()
        useful = self.useful_compute_s
        return {"wall_s": self.wall_s, "useful_compute_s": useful, "data_wait_s": surviving_wall - useful,
                "checkpoint_s": self.checkpoint_s, "lost_work_s": self.lost_work_s, "lost_steps": self.lost_steps,
                "restart_s": self.restart_s}


def goodput_section(figures: list[dict[str, float]]) -> dict[str, Any]:
    """summary.json `goodput`: useful compute / wall time of the slowest rank, and where its time went."""
    slowest = max(figures, key=lambda f: f["wall_s"])
    wall = slowest["wall_s"]
    parts = {k: slowest[k] for k in ("useful_compute_s", "data_wait_s", "checkpoint_s", "lost_work_s", "restart_s")}
    other = wall - sum(parts.values())
    return {
        "goodput": parts["useful_compute_s"] / wall if wall > 0 else 0.0,
        "wall_s": wall,
        **parts,
        "other_s": other,  # the loop's own time, resume checks, evaluation-free gaps
        "lost_steps": int(slowest["lost_steps"]),
    }


def failures_section(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json `failures`: every restart once, with the slowest rank's times."""
    restarts = []
    for entries in zip(*(r["restarts"] for r in ranks)):
        merged = dict(entries[0])
        for key in ("restore_s", "warmup_s", "lost_work_s"):
            values = [e.get(key) for e in entries if e.get(key) is not None]
            merged[key] = max(values) if values else None
        restarts.append(merged)
    slowest = max(ranks, key=lambda r: r["ledger"]["wall_s"])["ledger"]
    return {"count": len(restarts), "lost_work_s": slowest["lost_work_s"], "lost_steps": int(slowest["lost_steps"]),
            "restart_s": slowest["restart_s"], "restarts": restarts}


FAILURE_SECTIONS = ("goodput", "time_accounting", "failures", "resume")


def failure_section(key: str, ranks: list[dict[str, Any]]) -> Any:
    return failure_sections(ranks)[key]


def failure_sections(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The top-level summary sections of issue 10 that every training run has: `goodput`,
    `time_accounting` (where the slowest rank's training wall time went), `failures`, `resume`."""
    accounting = goodput_section([r["ledger"] for r in ranks])
    return {"goodput": accounting.pop("goodput"), "time_accounting": accounting,
            "failures": failures_section(ranks), "resume": resume_section([r["resume"] for r in ranks])}
