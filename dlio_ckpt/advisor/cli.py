"""`dlio_ckpt-advise RUN_OR_SWEEP_FOLDER`: how to checkpoint on this storage, from measured runs.

Calibrate (advisor/calibrate.py) -> candidates per measured strategy/encoding (search.py) ->
exhaustive simulation of all of them and, beside it, a surrogate trained on simulator samples
around the calibrated system that ranks them and confirms its top few (surrogate.py) -> the
answer, the Young/Daly baseline and both search times, re-scored on a fresh seed so the winner is
not flattered by the trace it won on, and expected over the calibration runs' own costs
(advisor/expectation.py: measured goodput is a mean over runs of spread costs). Bad input is one line and exit 2, with nothing written;
the plot is written only after the advice is complete.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from dlio_ckpt import __version__
from dlio_ckpt.advisor.calibrate import Calibration, calibrate
from dlio_ckpt.advisor.expectation import Member, expected_goodput, members
from dlio_ckpt.advisor.plot import write_png
from dlio_ckpt.advisor.search import Candidate, Settings, candidates, exhaustive, feature_matrix, score, young_daly
from dlio_ckpt.advisor.simulate import Outcome
from dlio_ckpt.advisor.surrogate import near, samples, search, train
from dlio_ckpt.analysis.model import plain
from dlio_ckpt.schema import MAX_PLAN_RANKS
from dlio_ckpt.errors import RUN_FAILURE_EXIT_CODE, USAGE_EXIT_CODE, OneLineArgumentParser, UserError
from dlio_ckpt.optional import check_installed, require
from dlio_ckpt.local_fs import nearest_existing, system_folder

PROG = "dlio_ckpt-advise"
DEFAULT_PLOT = "dlio_ckpt-advice.png"


def parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog=PROG, description="Advise a checkpoint configuration (levels, interval per "
                                "level, strategy/encoding) from measured dlio_ckpt runs, by simulation and a learned surrogate.")
    p.add_argument("folder", type=Path, metavar="RUN_OR_SWEEP_FOLDER", help="a run folder, a sweep folder or a folder of runs")
    p.add_argument("--mtbf-s", type=float, default=None, help="mean time between failures of the job at the advised scale "
                   "(default: the runs' failures.mtbf_s, scaled to --world-size)")
    p.add_argument("--world-size", type=int, default=None, help="advise for this many ranks (default: the largest measured); "
                   "another size is projected from curves fitted over a sweep of world sizes")
    p.add_argument("--node-failure-share", type=float, default=None,
                   help="share of failures that lose a node (default: measured from the runs' restarts; else 0.5 with a "
                        "node-local level, 0 without)")
    p.add_argument("--weibull-shape", type=float, default=1.0,
                   help="failure gaps Weibull-distributed with this shape and the MTBF as their mean (default 1: exponential)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--plot", type=Path, default=None, help=f"goodput map PNG (default without --json: ./{DEFAULT_PLOT})")
    p.add_argument("--no-plot", action="store_true", help="no goodput map (no matplotlib needed)")
    p.add_argument("--surrogate", action="store_true",
                   help="also train the learned surrogate and let it rank the configurations (not needed: exhaustive "
                        "simulation decides in well under a second; docs/advisor.md, 'Surrogate')")
    p.add_argument("--samples", type=int, default=2000, help="--surrogate: simulator samples it trains on (default 2000)")
    p.add_argument("--intervals", type=int, default=16, help="points of the interval grid per layout (default 16)")
    p.add_argument("--top", type=int, default=5, help="surrogate's best configurations confirmed in the simulator (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the failure draws and the training samples")
    return p


# Bounds of the inputs (docs/advisor.md, "Bounds"): each keeps one advice within minutes and a few
# hundred MB. The simulator's work grows with the failures a replicate meets before it finishes or
# gives up (about 40 when the MTBF is at least an iteration; 4 x iteration / MTBF below that) and
# with how clustered they are (Weibull shapes below 0.3 put most gaps near zero: a shape of 0.2
# took a minute here, 0.05 never finished); the surrogate's training with --samples.
MAX_SAMPLES = 20_000
MAX_INTERVALS = 64
MAX_TOP = 100
WEIBULL_SHAPES = (0.3, 10.0)
MAX_MTBF_S = 1e9  # about 32 years: a job's MTBF beyond it has no failures to plan for
MAX_SEED = 2**63 - 1
MIN_STEP_S = 1e-7  # a calibrated iteration below it is damage (a simulated job is MTBF / iteration steps long)
GOODPUT_DEFINITION = ("goodput = useful compute / training wall time, as the runs' summary.json measures it: the simulated "
                      "share of wall time in surviving iterations x the measured compute share of an iteration, "
                      "expected over the calibration runs' own costs (each run one draw of the machine's load; "
                      "+- the spread between them)")


def _check(args: argparse.Namespace) -> None:
    """Every option within its bounds (one line, exit 2), before a run folder is read."""
    if args.mtbf_s is not None and not (math.isfinite(args.mtbf_s) and 0 < args.mtbf_s <= MAX_MTBF_S):
        raise UserError(f"--mtbf-s: a finite positive number of seconds, at most {MAX_MTBF_S:g} (got {args.mtbf_s})")
    if args.world_size is not None and not 1 <= args.world_size <= MAX_PLAN_RANKS:
        raise UserError(f"--world-size: 1 to {MAX_PLAN_RANKS:,} ranks (got {args.world_size})")
    low, high = WEIBULL_SHAPES
    if not low <= args.weibull_shape <= high:  # nan fails both comparisons
        raise UserError(f"--weibull-shape: {low:g} to {high:g} (got {args.weibull_shape}); field studies of HPC "
                        "failures find 0.5 to 1, and shapes under 0.3 make the simulation run for hours")
    if args.node_failure_share is not None and not 0.0 <= args.node_failure_share <= 1.0:
        raise UserError(f"--node-failure-share: a share between 0 and 1 (got {args.node_failure_share})")
    for name, value, low_, high_ in (("--samples", args.samples, 50, MAX_SAMPLES), ("--intervals", args.intervals, 2, MAX_INTERVALS),
                                     ("--top", args.top, 1, MAX_TOP), ("--seed", args.seed, 0, MAX_SEED)):
        if not low_ <= value <= high_:
            raise UserError(f"{name}: {low_:,} to {high_:,} (got {value:,})")


def _check_system(system: Any, variant: str, args: argparse.Namespace) -> None:
    """The calibrated system can be simulated: an iteration takes time, and the MTBF (given, or
    the runs' scaled to the world size) is at least one iteration, so a replicate meets a bounded
    number of failures (module note above)."""
    if not (math.isfinite(system.step_s) and MIN_STEP_S <= system.step_s):
        raise UserError(f"[{variant}]: the runs' iteration time is {system.step_s:g} s; the advisor needs a training run "
                        f"whose steps took at least {MIN_STEP_S:g} s (summary.json train.step_s_mean)")
    source = "--mtbf-s" if args.mtbf_s is not None else "the runs' failures.mtbf_s scaled to the world size"
    if not system.step_s <= system.mtbf_s <= MAX_MTBF_S:
        raise UserError(f"{source}: an MTBF of {system.mtbf_s:.4g} s for [{variant}]; give one from the iteration time "
                        f"({system.step_s:.4g} s: a shorter MTBF fails every step) to {MAX_MTBF_S:g} s with --mtbf-s")
    if not all(math.isfinite(cost) for lv in system.levels for cost in (lv.blocking_s, lv.flush_s, lv.restore_s)):
        raise UserError(f"[{variant}]: a level's measured cost is not finite; the runs' summary.json is damaged")
    if not math.isfinite(system.downtime_s):
        raise UserError(f"[{variant}]: the runs' restart overhead is not finite; the runs' summary.json is damaged")


def _outcome(o: Outcome, compute_share: float) -> dict[str, Any]:
    """Shares of wall time; none when replicates were stopped unfinished (the goodput is then an
    upper bound). `goodput` is the measured runs' figure (summary.json goodput: useful compute over
    wall time): the simulated share of wall time in surviving iterations (`iteration_goodput`)
    times the measured compute share of an iteration."""
    whole = not o.censored
    return {"goodput": o.goodput * compute_share, "goodput_typical_run": o.goodput * compute_share,
            "iteration_goodput": o.goodput, "compute_share": compute_share,
            "goodput_sd": o.goodput_sd * compute_share, "failures": o.failures, "censored": o.censored,
            "checkpoint_share": o.checkpoint_s / o.wall_s if whole else None,
            "lost_work_share": o.lost_work_s / o.wall_s if whole else None,
            "restart_share": o.restart_s / o.wall_s if whole else None, "restores_by_level": o.restores_by_level}


def _expected(c: Candidate, pool: list[Member], settings: Settings) -> dict[str, Any]:
    """The row's goodput expected over the calibration runs' own costs (advisor/expectation.py), for
    the same job and failures as the typical run's figure, which stays as `goodput_typical_run`;
    with no runs at the advised world size (projected), the typical run's figure alone."""
    if not pool:
        return {"goodput_spread": None, "goodput_by_run": {}, "calibration_runs": 0}
    got = expected_goodput(pool, c.system, c.plan, settings.work_steps(c.system), settings.trace())
    return {"goodput": got.goodput, "goodput_spread": got.spread, "goodput_by_run": got.by_run, "calibration_runs": len(pool)}


def _config(c: Candidate, level_bytes: dict[str, float]) -> dict[str, Any]:
    """The configuration, its interval in steps, seconds and minutes, and per level the write
    aggregate bandwidth it needs: the level's bytes per checkpoint (all ranks, as measured) over the
    time between two writes to it (interval x every), so each is written before the next."""
    interval_s = c.plan.interval_steps * c.system.step_s
    every = dict(zip((lv.name for lv in c.system.levels), c.plan.every))
    return {"description": c.describe(), "variant": c.variant, "levels": [lv.name for lv in c.system.levels],
            "interval_steps": c.plan.interval_steps, "interval_s": interval_s, "interval_min": interval_s / 60,
            "every": every,
            "bandwidth_Bps": {name: (level_bytes.get(name, 0.0) / (interval_s * e) if interval_s > 0 else None)
                              for name, e in every.items()}}


def advise(args: argparse.Namespace) -> tuple[dict[str, Any], Candidate, Settings]:
    """The advice document, the best configuration and the settings that scored it."""
    _check(args)
    calibration = calibrate(args.folder)
    settings = Settings(seed=args.seed)
    pool: list[Candidate] = []
    systems, baselines, infos = [], [], []
    spread: dict[str, list[Member]] = {}
    for variant in calibration.variants:
        system, info = calibration.system(variant, args.world_size, args.mtbf_s, args.node_failure_share)
        system = replace(system, weibull_shape=args.weibull_shape)
        _check_system(system, variant, args)
        systems.append(system)
        infos.append(info)
        pooled = [r for r in calibration.runs if r.variant == variant and r.world_size == info["world_size"]]
        spread[variant] = members(pooled, system, info["per_checkpoint_s"])  # none when projected
        pool += candidates(system, args.intervals, variant)
        baselines.append(young_daly(system, variant))

    started = time.perf_counter()
    best, best_outcome, _ = exhaustive(pool, settings)
    exhaustive_s = time.perf_counter() - started
    share = {info["variant"]: info["compute_share"] for info in infos}
    level_bytes = {info["variant"]: info["level_bytes"] for info in infos}

    fresh = replace(settings, seed=settings.seed + 1_000_003, replicates=2 * settings.replicates)
    rows = {"best": best}
    search_doc: dict[str, Any] = {"configurations": len(pool), "exhaustive_s": exhaustive_s, "decided_by": "exhaustive simulation",
                                  "surrogate": "off (--surrogate trains it: exhaustive simulation is what decides)"}
    predicted: list[float | None] = [None]
    found = None
    if args.surrogate:
        rng = np.random.default_rng(args.seed)
        per_system = 10
        around = [near(systems[i % len(systems)], rng) for i in range(max(1, args.samples // per_system))]
        started = time.perf_counter()
        X, y, groups = samples(around, per_system, replace(settings, replicates=16), seed=args.seed, with_groups=True)
        sampling_s = time.perf_counter() - started
        surrogate = train(X, y, seed=args.seed, groups=groups)  # held out: whole systems
        found = search(surrogate, pool, settings, top=args.top)
        rows["surrogate"] = found.best
        search_doc.update({
            "surrogate": "on", "surrogate_s": found.seconds, "surrogate_simulated": found.simulated,
            "speedup": exhaustive_s / found.seconds if found.seconds else None,
            "surrogate_over_optimum": found.outcome.goodput / best_outcome.goodput,
            "training_samples": surrogate.samples, "sampling_s": sampling_s, "training_s": surrogate.train_s,
            "sampling": f"{len(around)} systems around the calibrated one x {per_system} configurations",
            "models": surrogate.errors, "model_used": surrogate.chosen})
    rows.update({f"young_daly[{b.variant}]": b for b in baselines})
    if args.surrogate:
        predicted = [float(p) * share[c.variant] for c, p in zip(rows.values(), surrogate.predict(feature_matrix(list(rows.values()))))]
    else:
        predicted = [None] * len(rows)
    searched = {"best": best_outcome.goodput, "surrogate": found.outcome.goodput if found else None}
    table = {name: {"configuration": _config(c, level_bytes[c.variant]), "predicted_goodput": p,
                    "search_goodput": (searched[name] * share[c.variant] if searched.get(name) is not None else None),
                    **_outcome(score(c, fresh), share[c.variant]), **_expected(c, spread[c.variant], fresh)}
             for (name, c), p in zip(rows.items(), predicted)}
    search_doc["settings"] = {"horizon_mtbf": settings.horizon_mtbf, "replicates": settings.replicates, "seed": settings.seed,
                              "rescored_with": {"seed": fresh.seed, "replicates": fresh.replicates}}
    doc = {
        "tool": PROG, "tool_version": __version__, "folder": str(args.folder),
        "goodput": GOODPUT_DEFINITION,
        "calibration": _calibration(calibration, systems, infos),
        "advice": table,
        "search": search_doc,
    }
    return doc, best, settings


def _calibration(calibration: Calibration, systems: list, infos: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "runs": [{"path": r.path, "world_size": r.world_size, "variant": r.variant, "step_s": r.step_s,
                  "interval_steps": r.interval_steps, "goodput": r.goodput, "failures": r.failures,
                  "levels": [{"name": lv.name, "survives": lv.survives, "flushed": lv.flushed, "every": lv.every,
                              "bytes": lv.bytes, "blocking_s": lv.blocking.mean, "blocking_sd": lv.blocking.sd,
                              "flush_s": lv.flush.mean, "flush_sd": lv.flush.sd, "restore_s": lv.restore.mean,
                              "restore_sd": lv.restore.sd, "restore_assumed": lv.restore_assumed} for lv in r.levels]}
                 for r in calibration.runs],
        "systems": [{**info, "step_s": s.step_s, "mtbf_s": s.mtbf_s, "node_failure_share": s.node_fraction,
                     "restart_overhead_s": s.downtime_s, "weibull_shape": s.weibull_shape,
                     "levels": [{"name": lv.name, "blocking_s": lv.blocking_s, "flush_s": lv.flush_s,
                                 "restore_s": lv.restore_s, "survives": lv.survives, "flushed": lv.flushed} for lv in s.levels]}
                    for s, info in zip(systems, infos)],
        "notes": calibration.notes,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def _spread(row: dict[str, Any]) -> str:
    if not row.get("calibration_runs"):
        return ""
    return f" +- {100 * row['goodput_spread']:.2f} ({row['calibration_runs']} runs)"


def _rate(bps: float | None) -> str:
    """A bandwidth in B/s, in the largest unit under 1,000 of it."""
    if bps is None:
        return "-"
    for unit in ("B/s", "KB/s", "MB/s", "GB/s"):
        if bps < 1000 or unit == "GB/s":
            return f"{bps:.3g} {unit}"
        bps /= 1000
    return "-"


def format_text(doc: dict[str, Any]) -> str:
    lines = [f"{PROG}: {len(doc['calibration']['runs'])} run(s) in {doc['folder']}"]
    for s in doc["calibration"]["systems"]:
        scale = f"world size {s['world_size']}" + (" (projected: " + s["extrapolation"] + ")" if s["projected"] else " (measured)")
        lines += ["", f"[{s['variant']}] {scale}; iteration {s['step_s']:.4g} s; MTBF {s['mtbf_s']:.4g} s; "
                      f"node failures {s['node_failure_share']:.0%}; restart overhead {s['restart_overhead_s']:.3g} s"
                      + (f"; Weibull failure gaps, shape {s['weibull_shape']:g}" if s["weibull_shape"] != 1.0 else ""),
                  "| level | survives | flushed | blocking s | flush s | restore s |", "|---|---|---|---|---|---|"]
        lines += [f"| {lv['name']} | {lv['survives']} | {'yes' if lv['flushed'] else 'no'} | {lv['blocking_s']:.4g} "
                  f"| {lv['flush_s']:.4g} | {lv['restore_s']:.4g} |" for lv in s["levels"]]
        lines += [f"  fit over ranks, {key}: {text}" for key, text in (s.get("fits") or {}).items()]
        lines += [f"  fit over bytes per rank, {key}: {text}" for key, text in (s.get("size_fits") or {}).items()]
        lines += [f"  assumed: {a}" for a in s["assumed"]]
        lines.append(f"  compute share of an iteration (measured): {s['compute_share']:.1%}")
    lines += ["", doc["goodput"] + ".",
              "| | configuration | interval | bandwidth needed | predicted | goodput (simulated, fresh seed) | at the typical run's costs | checkpoint | lost work | restart |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in doc["advice"].items():
        cfg = row["configuration"]
        bandwidth = ", ".join(f"{lv} {_rate(b)}" for lv, b in cfg["bandwidth_Bps"].items())
        lines.append(f"| {name} | {cfg['description']} | {cfg['interval_steps']} steps = {cfg['interval_s']:.4g} s = "
                     f"{cfg['interval_min']:.4g} min | {bandwidth} | {_pct(row['predicted_goodput'])} | "
                     f"{_pct(row['goodput'])}{_spread(row)} | {_pct(row['goodput_typical_run'])} | {_pct(row['checkpoint_share'])} | {_pct(row['lost_work_share'])} | "
                     f"{_pct(row['restart_share'])} |")
    if doc["advice"]["best"]["censored"]:
        lines.append("warning: even the best configuration loses more than 75 % of the time in some replicates "
                     "(stopped unfinished; goodput is an upper bound): the MTBF is too short for these checkpoint costs")
    sr = doc["search"]
    if sr["surrogate"] == "on":
        models = ", ".join(f"{name} MAE {e['mae']:.4f} R2 {e['r2']:.3f}" for name, e in sr["models"].items())
        lines += ["", f"search: exhaustive simulation of {sr['configurations']} configurations {sr['exhaustive_s']:.2f} s "
                      f"(decides); surrogate ({sr['model_used']}) ranked them and simulated {sr['surrogate_simulated']} in "
                      f"{sr['surrogate_s']:.3f} s, reaching {sr['surrogate_over_optimum']:.2%} of the optimum",
                  f"surrogate training: {sr['training_samples']} samples ({sr['sampling']}) simulated in "
                  f"{sr['sampling_s']:.2f} s, both models fitted in {sr['training_s']:.2f} s; held out: {models}"]
    else:
        lines += ["", f"search: exhaustive simulation of {sr['configurations']} configurations in {sr['exhaustive_s']:.2f} s "
                      f"decides; the surrogate is off (--surrogate)"]
    if doc.get("plot"):
        lines.append(f"plot: {doc['plot']['path']} (goodput over {doc['plot']['x']} and {doc['plot']['y']})")
    notes = doc["calibration"]["notes"]
    lines += [f"note: {n}" for n in notes[:3]] + ([f"note: {len(notes) - 3} more in --json"] if len(notes) > 3 else [])
    return "\n".join(lines)


def check_plot_path(path: Path) -> None:
    """Refuse a --plot path that cannot take the PNG, before the work (one line, exit 2): a
    folder, a device or other non-file at the name, a kernel folder (/proc, /sys, /dev), or a
    folder where no file can be made (probed with a temporary file, removed at once: permission
    bits alone do not say, for root or on a read-only mount)."""
    target = os.path.realpath(os.path.abspath(path))
    if os.path.lexists(path) and not os.path.isfile(target):
        raise UserError(f"--plot: {path} exists and is not a file; give a new or regular file name, such as ./{DEFAULT_PLOT}")
    kernel = system_folder(target)
    if kernel is not None:
        raise UserError(f"--plot: {path} is under {kernel}, a kernel file system; give a path in a folder of yours")
    folder = nearest_existing(os.path.dirname(target))
    if not os.path.isdir(folder):
        raise UserError(f"--plot: {folder} is a file, so no folder can be made there; choose another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=".dlio_ckpt-advise.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"--plot: cannot write in {folder} ({exc.strerror}); choose a writable path") from None


def run(args: argparse.Namespace) -> int:
    _check(args)

    check_installed("sklearn")  # the surrogate's models: pip install 'dlio_ckpt[advisor]'
    plot_path = None if args.no_plot else (args.plot or (None if args.json else Path(DEFAULT_PLOT)))
    if plot_path is not None:
        require("matplotlib")  # fail before the work, not after it
        check_plot_path(plot_path)
    doc, best, settings = advise(args)
    if plot_path is not None:
        doc["plot"] = write_png(best, settings, plot_path)
    if args.json:
        json.dump(plain(doc), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_text(doc))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except UserError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return USAGE_EXIT_CODE
    except OSError as exc:  # at run time: the plot's folder filled up or went away after the check
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{PROG}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return RUN_FAILURE_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
