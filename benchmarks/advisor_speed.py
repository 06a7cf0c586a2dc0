"""dlio_ckpt-advise's search costs: simulator throughput on one core, and surrogate vs exhaustive search.

1. Simulator: configurations scored per minute (CPU time of this one-threaded process, and wall
   time, which a busy shared machine inflates), with the advisor's default settings (48 replicates
   of a job 10 MTBFs long each).
2. Search: a surrogate trained on simulator samples around a base system (two levels: node-local,
   shared flushed from it) ranks the whole configuration space of held-out systems near it and
   confirms its top 5 in the simulator; exhaustive search simulates every configuration. Reported
   per held-out system and model: the surrogate pick's goodput over the exhaustive optimum's, and
   the search times and their ratio. Training (sampling + fitting) is a one-off cost, reported apart.
Nothing here asserts a time.

    python benchmarks/advisor_speed.py [--held-out 6] [--samples 3000] [--points 16 32] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, table, write_json  # noqa: E402

from dlio_ckpt.advisor.search import Settings, candidates, exhaustive  # noqa: E402
from dlio_ckpt.advisor.surrogate import near, random_system, samples, search, train  # noqa: E402


def timed(fn, *args, **kwargs):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def simulator_rate(settings: Settings, systems: int) -> dict:
    rng = np.random.default_rng(2026)
    count = wall = cpu = 0.0
    for _ in range(systems):
        pool = candidates(random_system(rng))
        _, w, c = timed(exhaustive, pool, settings)
        count, wall, cpu = count + len(pool), wall + w, cpu + c
    return {"configurations": int(count), "cpu_s": cpu, "wall_s": wall,
            "per_minute_cpu": 60 * count / cpu, "per_minute_wall": 60 * count / wall,
            "settings": {"replicates": settings.replicates, "horizon_mtbf": settings.horizon_mtbf}}


def search_comparison(args: argparse.Namespace, settings: Settings) -> dict:
    base = random_system(np.random.default_rng(11))
    rng = np.random.default_rng(12)
    per_system = 10
    (X, y), sample_wall, sample_cpu = timed(samples, [near(base, rng) for _ in range(args.samples // per_system)],
                                            per_system, Settings(replicates=16), 1)
    surrogate, train_wall, train_cpu = timed(train, X, y, 0)
    held = np.random.default_rng(13)
    rows = []
    for number in range(args.held_out):
        system = near(base, held)
        for points in args.points:
            pool = candidates(system, points)
            (best, optimum, _), ex_wall, ex_cpu = timed(exhaustive, pool, settings)
            for model in surrogate.models:
                found, s_wall, s_cpu = timed(search, surrogate, pool, settings, 5, model)
                rows.append({"system": number, "points": points, "configurations": len(pool), "model": model,
                             "optimum_goodput": optimum.goodput, "surrogate_goodput": found.outcome.goodput,
                             "ratio": found.outcome.goodput / optimum.goodput, "simulated": found.simulated,
                             "exhaustive_cpu_s": ex_cpu, "surrogate_cpu_s": s_cpu, "speedup_cpu": ex_cpu / s_cpu,
                             "exhaustive_wall_s": ex_wall, "surrogate_wall_s": s_wall, "speedup_wall": ex_wall / s_wall,
                             "optimum": best.describe(), "pick": found.best.describe()})
    summary = {}
    for model in surrogate.models:
        for points in args.points:
            mine = [r for r in rows if r["model"] == model and r["points"] == points]
            summary[f"{model}/{points}"] = {
                "configurations": mine[0]["configurations"], "ratio_min": min(r["ratio"] for r in mine),
                "ratio_mean": statistics.mean(r["ratio"] for r in mine),
                "at_least_98_percent": sum(r["ratio"] >= 0.98 for r in mine), "systems": len(mine),
                "speedup_cpu_median": statistics.median(r["speedup_cpu"] for r in mine),
                "speedup_wall_median": statistics.median(r["speedup_wall"] for r in mine)}
    return {"training": {"samples": len(y), "sampling_cpu_s": sample_cpu, "sampling_wall_s": sample_wall,
                         "fit_cpu_s": train_cpu, "fit_wall_s": train_wall, "held_out_errors": surrogate.errors,
                         "chosen": surrogate.chosen},
            "rows": rows, "summary": summary}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--systems", type=int, default=3, help="random systems for the throughput figure")
    p.add_argument("--held-out", type=int, default=6)
    p.add_argument("--samples", type=int, default=3000)
    p.add_argument("--points", type=int, nargs="+", default=[16, 32], help="interval grid sizes (space sizes)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    settings = Settings()
    result = {"environment": environment("."), "simulator": simulator_rate(settings, args.systems),
              "search": search_comparison(args, settings)}
    sim = result["simulator"]
    print(f"simulator: {sim['configurations']} configurations, {sim['per_minute_cpu']:.0f}/min on one core "
          f"(CPU time), {sim['per_minute_wall']:.0f}/min wall")
    tr = result["search"]["training"]
    print(f"surrogate training: {tr['samples']} samples in {tr['sampling_cpu_s']:.1f} s CPU, fit {tr['fit_cpu_s']:.1f} s CPU; "
          + ", ".join(f"{k} MAE {v['mae']:.4f} R2 {v['r2']:.3f}" for k, v in tr["held_out_errors"].items()))
    print(table([[k, str(v["configurations"]), f"{v['ratio_min']:.4f}", f"{v['ratio_mean']:.4f}",
                  f"{v['at_least_98_percent']}/{v['systems']}", f"{v['speedup_cpu_median']:.1f}x", f"{v['speedup_wall_median']:.1f}x"]
                 for k, v in result["search"]["summary"].items()],
                ["model/points", "configurations", "min ratio", "mean ratio", ">= 98 %", "speedup (CPU)", "speedup (wall)"]))
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
