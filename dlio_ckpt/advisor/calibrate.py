"""Measured runs -> the costs the simulator needs, with their spread, and scaling curves.

Why from summary.json only: it is what every run leaves (events may be switched off), and issue
10's contract (docs/summary-schema.md, docs/advisor.md) puts the per-checkpoint, per-level and
per-restart figures there. Optional fields are optional: what a run lacks is taken from a
simpler figure and the calibration says so in `notes`, so the advice names its assumptions.

A folder may hold one run, a sweep, or runs below it. Runs are grouped into *variants* (the
checkpoint strategy and encoding: a choice the advice may make) and, inside a variant, by world
size: costs at one world size are pooled; across world sizes each cost gets a fitted curve
(constant, linear, power or logarithmic in the world size; the one with the smallest
leave-one-out error when there are 3 or more sizes), so `--world-size` can project to a scale
that was not run, and says how far it extrapolates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dlio_ckpt.advisor.simulate import Level, System
from dlio_ckpt.advisor.summary_fields import check_summary
from dlio_ckpt.analysis.inputs import is_run_folder, is_sweep_folder
from dlio_ckpt.analysis.run_folders import read_summary
from dlio_ckpt.errors import UserError

_LOCAL_PATHS = ("/dev/shm", "/tmp", "/local", "/scratch/local")


@dataclass(frozen=True)
class Measure:
    """A cost measured over `count` checkpoints or restarts: mean and standard deviation."""

    mean: float
    sd: float = 0.0
    count: int = 0

    @staticmethod
    def of(values: list[float]) -> "Measure":
        values = [float(v) for v in values if v is not None]
        if not values:
            return Measure(0.0, 0.0, 0)
        return Measure(float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0, len(values))


@dataclass(frozen=True)
class LevelCosts:
    name: str
    survives: str  # "process" (node-local) or "node" (shared)
    flushed: bool
    every: int
    bytes: float  # per checkpoint, all ranks (bytes the write calls moved)
    blocking: Measure
    flush: Measure
    restore: Measure
    restore_assumed: bool = False  # no restore measured on this level: its write time stands in


@dataclass(frozen=True)
class RunCosts:
    """What one run measured."""

    path: str
    world_size: int
    variant: str  # "strategy/encoding"
    step_s: float
    steps: int
    interval_steps: int
    levels: tuple[LevelCosts, ...]
    goodput: float | None
    mtbf_s: float
    failures: int
    failure_steps: tuple[int, ...]
    failure_kinds: tuple[str, ...]
    restart_overhead_s: float | None  # per restart, besides the restore
    compute_share: float = 1.0  # compute / (compute + data wait) of an iteration: measured goodput counts compute only
    notes: tuple[str, ...] = ()
    checkpoints_per_step: float = 0.0  # checkpoints written / steps run (redone steps included)


@dataclass(frozen=True)
class Fit:
    """y(x) for one cost across world sizes."""

    model: str  # constant | linear | power | log
    params: tuple[float, ...]
    rel_error: float | None  # leave-one-out RMS relative error (None: too few points to measure)
    points: int
    x_name: str = "N"  # the variable: N ranks, or B bytes per rank

    def __call__(self, x: float) -> float:
        a, b = (self.params + (0.0,))[:2]
        if self.model == "constant":
            return a
        if self.model == "linear":
            return max(0.0, a + b * x)
        if self.model == "power":
            return a * x ** b
        return max(0.0, a + b * math.log(x))

    def describe(self) -> str:
        a, b, x = *(self.params + (0.0,))[:2], self.x_name
        shape = {"constant": f"{a:.4g}", "linear": f"{a:.4g} + {b:.4g}*{x}", "power": f"{a:.4g}*{x}^{b:.3f}",
                 "log": f"{a:.4g} + {b:.4g}*ln {x}"}[self.model]
        error = "exact through 2 points (error not measurable)" if self.rel_error is None else f"loo error {self.rel_error:.1%}"
        return f"{self.model} {shape} ({error})"


def find_runs(folder: Path) -> list[Path]:
    """The run folders of `folder`: itself, a sweep's jobs, or every run folder below it."""
    folder = Path(folder)
    if not folder.exists():
        raise UserError(f"{folder}: no such folder; give a run folder (summary.json) or a sweep folder")
    if is_run_folder(folder):
        return [folder]
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder; give a run folder (summary.json) or a sweep folder")
    runs = sorted({p.parent for p in folder.rglob("summary.json") if p.is_file()}, key=lambda p: (len(str(p)), str(p)))
    if not runs:
        kind = "sweep folder" if is_sweep_folder(folder) else "folder"
        raise UserError(f"{folder}: {kind} holds no runs (no summary.json below it); give a folder of training runs")
    return runs


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _survives(level: dict[str, Any], configured: dict[str, Any]) -> str:
    if level.get("survives") in ("none", "process", "node"):
        return level["survives"]
    scope = configured.get("scope", level.get("scope"))
    if scope in ("node", "shared"):
        return "process" if scope == "node" else "node"
    path = str(configured.get("path", level.get("path")) or "")
    return "process" if path.startswith(_LOCAL_PATHS) else "node"


def _level_costs(summary: dict[str, Any], notes: list[str]) -> tuple[LevelCosts, ...]:
    ckpt = summary.get("checkpoint") or {}
    rows = [r for r in ckpt.get("per_checkpoint") or [] if isinstance(r, dict)]
    configured = ((summary.get("config") or {}).get("checkpoint") or {}).get("levels") or []
    restarts = [r for r in (summary.get("failures") or {}).get("restarts") or [] if isinstance(r, dict)]
    measured = [lv for lv in ckpt.get("levels") or [] if isinstance(lv, dict)]
    if not measured:  # one level: the run's checkpoint folder
        measured = [{"name": "checkpoint", "every": 1}]
    flushed = [(next((c for c in configured if isinstance(c, dict) and c.get("name") == lv.get("name")), {})
                .get("write", lv.get("write")) == "flush") for lv in measured]
    by_level = any("level" in r for r in rows)
    # training waited this long per checkpoint, by its own ledger (waits for a flush in flight included)
    waited = _number((summary.get("time_accounting") or {}).get("checkpoint_s"))
    out = []
    for number, level in enumerate(measured):
        name = str(level.get("name", f"level{number}"))
        conf = next((c for c in configured if isinstance(c, dict) and c.get("name") == name), {})
        # rows without a level: every checkpoint is written to the first level when the others are flushed from it
        everything = len(measured) == 1 or (not by_level and number == 0 and all(flushed[1:]))
        mine = rows if everything else [r for r in rows if r.get("level") in (name, number)]
        blocking = Measure.of([r.get("blocking_s_max", r.get("write_s_max")) for r in mine])
        if everything and waited and rows:
            blocking = Measure(waited / len(rows), blocking.sd, blocking.count)
        if not blocking.count and _number(level.get("write_s_mean")) is not None:
            blocking = Measure(float(level["write_s_mean"]), 0.0, 1)
        flush = Measure.of([max(0.0, (r.get("persist_s_max") or 0.0) - (r.get("blocking_s_max") or 0.0)) for r in mine
                            if _number(r.get("persist_s_max")) is not None])
        for key in ("flush_s_mean", "flush_latency_s_mean"):  # the latency (checkpoint end to durable) wins
            if _number(level.get(key)) is not None:
                flush = Measure(float(level[key]), flush.sd, max(flush.count, 1))
        restore = Measure.of([r.get("restore_s") for r in restarts  # one level: every restart that restored a step
                              if r.get("level") in (name, number) or (len(measured) == 1 and r.get("restored_step"))])
        if not restore.count and _number(level.get("restore_s_mean")) is not None:
            restore = Measure(float(level["restore_s_mean"]), 0.0, 1)
        if not restore.count and len(measured) == 1:
            single = _number(ckpt.get("restore_s")) or _number(ckpt.get("restore_s_max"))
            restore = Measure(single, 0.0, 1) if single else restore
        assumed = not restore.count
        if assumed:
            write = _number(level.get("write_s_mean")) or blocking.mean + flush.mean
            restore = Measure(write, 0.0, 0)
            notes.append(f"level {name}: no restore measured; its write time ({write:.3g} s) stands in")
        sizes = [r.get("bytes_written", r.get("bytes")) for r in mine if _number(r.get("bytes_written", r.get("bytes")))]
        copies = int(level.get("checkpoints") or 0) + int(level.get("flushes") or 0)  # issue 10: bytes are the run's total
        nbytes = float(np.mean(sizes)) if sizes else (_number(level.get("bytes")) or 0.0) / max(1, copies)
        out.append(LevelCosts(name=name, survives=_survives(level, conf), flushed=flushed[number],
                              every=int(level.get("every") or conf.get("every") or 1), bytes=nbytes,
                              blocking=blocking, flush=flush, restore=restore, restore_assumed=assumed))
    return tuple(out)


def _variant(ckpt: dict[str, Any], ck_conf: dict[str, Any], levels: tuple[LevelCosts, ...]) -> str:
    """What the advice may choose between: strategy/encoding, and the level set when there are several
    (a single-level run keeps its own measured write cost as a layout of its own)."""
    encoding = "+".join(ck_conf.get("codecs") or []) or ck_conf.get("encoding") or "full"  # a codec pipeline's label
    name = f"{ckpt.get('strategy') or ck_conf.get('strategy') or '?'}/{encoding}"
    return name + (":" + "+".join(lv.name for lv in levels) if len(levels) > 1 else "")


def run_costs(run_dir: Path) -> RunCosts:
    """One run folder's costs; UserError naming what is missing, or the field of the wrong type
    (summary_fields.py), when it cannot calibrate."""
    summary = read_summary(run_dir)
    check_summary(summary, run_dir)
    ckpt = summary.get("checkpoint") or {}
    if not ckpt.get("per_checkpoint"):
        raise UserError(f"{run_dir}: the run wrote no checkpoints (summary.json checkpoint.per_checkpoint is empty); "
                        "the advisor calibrates from training runs with checkpoint.enabled=true")
    train = summary.get("train") or {}
    notes: list[str] = []
    steps = int(train.get("steps") or 0)
    step_s = _number(train.get("step_s_mean"))
    if step_s is None:
        wall, in_loop = _number(train.get("wall_s")), _number(train.get("checkpoint_s_in_loop")) or 0.0
        if not steps or wall is None:
            raise UserError(f"{run_dir}: summary.json has neither train.step_s_mean nor train.wall_s and train.steps; "
                            "the advisor needs the iteration time of a training run")
        step_s = max(wall - in_loop, 0.0) / steps
        notes.append(f"{run_dir.name}: iteration time from (train.wall_s - checkpoint_s_in_loop) / steps = {step_s:.4g} s")
    accounting = summary.get("time_accounting") or {}
    if _number(accounting.get("other_s")) and steps:  # the loop's own time is part of every iteration
        per_step = max(0.0, accounting["other_s"]) / (steps + int(accounting.get("lost_steps") or 0))
        step_s += per_step
        notes.append(f"{run_dir.name}: iteration time includes {per_step:.3g} s of the loop's own time per step")
    useful_compute = _number(accounting.get("useful_compute_s"))
    compute_share = min(1.0, useful_compute / (steps * step_s)) if useful_compute and steps and step_s > 0 else 1.0
    config = summary.get("config") or {}
    ck_conf = config.get("checkpoint") or {}
    failures = summary.get("failures") or {}
    fail_conf = config.get("failures") or {}
    restarts = [r for r in failures.get("restarts") or [] if isinstance(r, dict)]
    overheads = [float(r["warmup_s"]) for r in restarts if _number(r.get("warmup_s")) is not None]
    if not overheads and restarts and _number(failures.get("restart_s")) is not None:
        overheads = [(float(failures["restart_s"]) - sum(r.get("restore_s") or 0.0 for r in restarts)) / len(restarts)]
    policy = ckpt.get("policy") or {}
    interval = int(policy.get("interval_steps") or ck_conf.get("steps_between_checkpoints") or 0)
    if not interval:
        rows = ckpt.get("per_checkpoint") or []
        gaps = np.diff([r.get("step", 0) for r in rows]) if len(rows) > 1 else []
        interval = int(np.median(gaps)) if len(gaps) else max(steps, 1)
    levels = _level_costs(summary, notes)
    return RunCosts(
        path=str(run_dir), world_size=int(summary.get("world_size") or 1),
        variant=_variant(ckpt, ck_conf, levels), step_s=float(step_s), steps=steps, interval_steps=max(interval, 1),
        levels=levels,
        goodput=_number(summary.get("goodput")), mtbf_s=float(fail_conf.get("mtbf_s") or 0.0),
        failures=int(failures.get("count") or len(restarts)),
        failure_steps=tuple(int(r["step"]) for r in restarts if _number(r.get("step")) is not None),
        failure_kinds=tuple(str(r.get("kind", fail_conf.get("kind", "process"))) for r in restarts),
        restart_overhead_s=float(np.mean(overheads)) if overheads else None,
        compute_share=compute_share, notes=tuple(notes),
        checkpoints_per_step=len(ckpt["per_checkpoint"]) / max(1, steps + int(accounting.get("lost_steps") or 0)),
    )


def typical(values: list[float]) -> float:
    """The pooled value of one cost over runs: their median. Why not the mean: each run is one draw
    of the machine's load, and on a machine shared with other jobs the load comes in spikes that
    make one run in a few cost up to twice as much (a held-out sweep here: one of six fitted runs at
    0.080 s an iteration and 0.44 s a checkpoint, the other five 0.046-0.065 s and 0.20-0.32 s);
    a mean of six runs follows that one run, the median does not. Over the 46 runs of another sweep
    the median and the mean of the runs agree (iteration 0.0440 / 0.0442 s, checkpoint stall
    0.192 / 0.196 s: docs/advisor.md), so the median estimates the same typical cost."""
    return float(np.median(values))


def pooled_restore(levels: list[LevelCosts]) -> float:
    """One level's restore time over several runs: the typical run's mean restore among the runs that
    restored from it; a run that restored nothing lends its write time only when no run measured a
    restore: a stand-in is not a measurement (pooled with them, failure-free runs put their write
    time in the restore)."""
    measured = [lv for lv in levels if not lv.restore_assumed and lv.restore.count]
    return typical([lv.restore.mean for lv in (measured or levels)])


def split_iteration(runs: list[RunCosts]) -> tuple[float, float]:
    """(seconds per step, seconds per checkpoint) in the runs' iteration time: the line
    step_s = per_step + per_checkpoint x checkpoints_per_step through the typical run of each
    interval (least squares over the intervals' medians).

    Why: a checkpoint also slows the steps after it (the data pipeline waits longer and the loop's
    own time grows after a save; over 46 runs of a held-out sweep, about 7 ms of data wait and
    3 ms of loop time per checkpoint, docs/advisor.md), time that the mean iteration spreads over
    every step. Calibrated at one interval, it is right at that interval only: a longer interval
    gets the shorter one's slower steps. Split, it travels with the checkpoints to any interval.
    It needs runs at two or more intervals; with runs at one, or a slope below zero (noise), all of
    the time is per step (per_checkpoint 0)."""
    groups = sorted({r.interval_steps for r in runs})
    if len(groups) < 2:
        return typical([r.step_s for r in runs]), 0.0
    x = np.array([typical([r.checkpoints_per_step for r in runs if r.interval_steps == k]) for k in groups])
    y = np.array([typical([r.step_s for r in runs if r.interval_steps == k]) for k in groups])
    if np.ptp(x) <= 0:
        return typical([r.step_s for r in runs]), 0.0
    slope = float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))
    per_step = float(y.mean() - slope * x.mean())
    if slope <= 0 or per_step <= 0:
        return typical([r.step_s for r in runs]), 0.0
    return per_step, slope


def fit_curve(xs: list[float], ys: list[float], x_name: str = "N") -> Fit:
    """The best of constant / linear / power / log through (world size or size, cost) points."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    sizes = np.unique(x)
    if len(sizes) < 2:
        return Fit("constant", (float(y.mean()),), None, len(x), x_name)
    models: dict[str, Callable[[np.ndarray, np.ndarray], tuple[float, ...]]] = {
        "constant": lambda a, b: (float(b.mean()),),
        "linear": lambda a, b: tuple(float(v) for v in np.polyfit(a, b, 1)[::-1]),
        "log": lambda a, b: tuple(float(v) for v in np.polyfit(np.log(a), b, 1)[::-1]),
    }
    if (y > 0).all():
        models["power"] = lambda a, b: (float(np.exp(np.polyfit(np.log(a), np.log(b), 1)[1])), float(np.polyfit(np.log(a), np.log(b), 1)[0]))
    if len(sizes) == 2:  # two sizes: every 2-parameter curve is exact; the power law keeps its shape under scaling
        name = "power" if "power" in models else "linear"
        return Fit(name, models[name](x, y), None, len(x), x_name)
    best: Fit | None = None
    for name, fit in models.items():
        errors = []
        for left_out in sizes:
            keep = x != left_out
            if len(np.unique(x[keep])) < (1 if name == "constant" else 2):
                continue
            model = Fit(name, fit(x[keep], y[keep]), None, int(keep.sum()))
            errors += [(model(xi) - yi) / max(abs(yi), 1e-12) for xi, yi in zip(x[~keep], y[~keep])]
        error = float(np.sqrt(np.mean(np.square(errors)))) if errors else math.inf
        if best is None or error < best.rel_error:
            best = Fit(name, fit(x, y), error, len(x), x_name)
    assert best is not None
    return best


@dataclass
class Calibration:
    """All runs of a folder, grouped, with pooled costs and scaling fits."""

    runs: list[RunCosts]
    notes: list[str] = field(default_factory=list)

    @property
    def variants(self) -> list[str]:
        return sorted({r.variant for r in self.runs})

    @property
    def world_sizes(self) -> list[int]:
        return sorted({r.world_size for r in self.runs})

    def _of(self, variant: str) -> list[RunCosts]:
        return [r for r in self.runs if r.variant == variant]

    def level_names(self, variant: str) -> list[str]:
        """The levels of the variant's run with the most levels (runs may use fewer)."""
        return [lv.name for lv in max(self._of(variant), key=lambda r: len(r.levels)).levels]

    def curves(self, variant: str) -> dict[str, Fit]:
        """Per cost ("step_s", "<level>.blocking_s", ...) its fit over world size."""
        runs = self._of(variant)
        points: dict[str, tuple[list[float], list[float]]] = {}

        def add(key: str, x: float, y: float) -> None:
            points.setdefault(key, ([], []))
            points[key][0].append(x)
            points[key][1].append(y)

        for run in runs:
            add("step_s", run.world_size, run.step_s)
            for lv in run.levels:
                add(f"{lv.name}.blocking_s", run.world_size, lv.blocking.mean)
                add(f"{lv.name}.flush_s", run.world_size, lv.flush.mean)
                add(f"{lv.name}.restore_s", run.world_size, lv.restore.mean)
        return {key: fit_curve(*xy) for key, xy in points.items()}

    def size_curves(self, variant: str) -> dict[str, Fit]:
        """Per level cost, its fit over the checkpoint bytes per rank, from runs of one world size
        that wrote checkpoints of different sizes (a sweep over model sizes): reported, not projected."""
        out: dict[str, Fit] = {}
        for size in sorted({r.world_size for r in self._of(variant)}):
            points: dict[str, tuple[list[float], list[float]]] = {}
            for run in (r for r in self._of(variant) if r.world_size == size):
                for lv in run.levels:
                    for cost in ("blocking", "flush", "restore"):
                        xs, ys = points.setdefault(f"{lv.name}.{cost}_s", ([], []))
                        xs.append(lv.bytes / size)
                        ys.append(getattr(lv, cost).mean)
            for key, (xs, ys) in points.items():
                if min(xs) > 0 and max(xs) >= 1.2 * min(xs) and min(ys) > 0:  # sizes that differ, costs measured
                    out[f"{key} at N={size}"] = fit_curve(xs, ys, "B")
        return out

    def system(self, variant: str, world_size: int | None, mtbf_s: float | None, node_fraction: float | None,
               ) -> tuple[System, dict[str, Any]]:
        """The simulator's System for `variant` at `world_size` (None: the largest measured), with a
        report of what was measured, fitted, projected or assumed."""
        runs = self._of(variant)
        sizes = sorted({r.world_size for r in runs})
        target = world_size or sizes[-1]
        if target not in sizes and len(sizes) < 2:
            raise UserError(f"--world-size {target}: projecting needs runs at two or more world sizes for the scaling fit; "
                            f"the folder has {variant} runs at world size {sizes[0]} only (run a sweep over world sizes)")
        curves = self.curves(variant)
        pooled = [r for r in runs if r.world_size == target]
        template = max(runs, key=lambda r: len(r.levels))

        def cost(key: str, measured: list[float]) -> float:
            return typical(measured) if pooled else curves[key](target)

        # the iteration's per-checkpoint part (measured at two or more intervals) stalls with each checkpoint
        per_step, per_checkpoint = split_iteration(pooled) if pooled else (cost("step_s", []), 0.0)
        levels = []
        for lv in template.levels:
            same = [x for r in pooled for x in r.levels if x.name == lv.name]
            levels.append(Level(
                name=lv.name,
                blocking_s=cost(f"{lv.name}.blocking_s", [x.blocking.mean for x in same]) + per_checkpoint,
                flush_s=cost(f"{lv.name}.flush_s", [x.flush.mean for x in same]),
                restore_s=pooled_restore(same) if same else curves[f"{lv.name}.restore_s"](target),
                survives=lv.survives, flushed=lv.flushed))
        # the machine's failures, whatever the runs checkpointed: taken from every run of the folder
        rank_mtbf = [r.mtbf_s * r.world_size for r in self.runs if r.mtbf_s > 0]  # independent failures: M(N) = M(1) / N
        info: dict[str, Any] = {"variant": variant, "world_size": target, "measured_world_sizes": sizes,
                                "projected": target not in sizes, "assumed": [],
                                # measured goodput counts compute only: the simulator's share of wall time in
                                # surviving iterations times the compute share of an iteration is that figure
                                "compute_share": _compute_share(pooled or runs, per_step if pooled else None),
                                "per_step_s": per_step, "per_checkpoint_s": per_checkpoint,
                                "level_bytes": {lv.name: float(np.mean([x.bytes for r in (pooled or runs) for x in r.levels
                                                                         if x.name == lv.name] or [0.0]))
                                                for lv in template.levels}}
        if mtbf_s is None:
            if not rank_mtbf:
                raise UserError("no MTBF: the runs injected no drawn failures (failures.mtbf_s=0); pass --mtbf-s SECONDS, "
                                "the mean time between failures of the job at the advised scale")
            mtbf_s = float(np.mean(rank_mtbf)) / target
            info["assumed"].append(f"MTBF {mtbf_s:.4g} s: the runs' failures.mtbf_s x world size / {target} ranks")
        kinds = [k for r in self.runs for k in r.failure_kinds]
        if node_fraction is None:
            if kinds:
                node_fraction = kinds.count("node") / len(kinds)
            else:
                node_fraction = 0.5 if any(lv.survives != "node" for lv in levels) else 0.0
                info["assumed"].append(f"share of node failures {node_fraction:g} (no failures measured)")
        overheads = [r.restart_overhead_s for r in self.runs if r.restart_overhead_s is not None]
        downtime = max(0.0, typical(overheads)) if overheads else 0.0
        if not overheads:
            info["assumed"].append("restart overhead besides the restore: 0 s (no restarts measured)")
        if len(sizes) > 1:
            info["fits"] = {key: fit.describe() for key, fit in curves.items()}
        info["size_fits"] = {key: fit.describe() for key, fit in self.size_curves(variant).items()}
        if info["projected"]:
            largest = sizes[-1]
            info["extrapolation"] = (f"world size {target} is {target / largest:.3g}x the largest measured ({largest})"
                                     if target > largest else f"world size {target} lies between measured sizes {sizes}")
        system = System(step_s=per_step, mtbf_s=mtbf_s, levels=tuple(levels),
                        node_fraction=float(node_fraction), downtime_s=downtime)
        return system, info


def _compute_share(runs: list[RunCosts], per_step_s: float | None) -> float:
    """Compute over iteration time: the typical run's compute per step over the pooled iteration's
    per-step part (split_iteration), so that share x simulated iteration goodput is useful compute
    over wall time whatever part of the iteration is charged as a stall per checkpoint; projected
    (no runs at the world size), the runs' mean share."""
    if per_step_s is None or per_step_s <= 0:
        return float(np.mean([r.compute_share for r in runs]))
    return min(1.0, typical([r.compute_share * r.step_s for r in runs]) / per_step_s)


def calibrate(folder: Path) -> Calibration:
    """Every run below `folder`; runs that did not train or checkpoint are skipped with a note,
    and a folder with none usable is a UserError naming what is missing."""
    runs, notes, skipped = [], [], []
    for run_dir in find_runs(Path(folder)):
        try:
            costs = run_costs(run_dir)
        except UserError as exc:
            skipped.append(str(exc))
            continue
        runs.append(costs)
        notes.extend(costs.notes)
    if not runs:
        raise UserError(skipped[0] if len(skipped) == 1 else
                        f"{folder}: none of its {len(skipped)} runs can calibrate the advisor; first: {skipped[0]}")
    notes.extend(f"skipped: {s}" for s in skipped)
    return Calibration(runs=runs, notes=notes)
