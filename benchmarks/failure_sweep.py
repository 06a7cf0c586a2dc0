"""Goodput against the checkpoint interval with injected failures (issue 10's closing figure).

One small workload on this machine: 256 steps of 20 ms emulated compute, a 48 MiB model written
synchronously (sharded, fsync) every k steps, failures drawn with MTBF M seconds of training wall
time (the same seeds for every interval, so every interval meets the same failure process). For
each fixed interval k, and for checkpoint.policy=young_daly and checkfreq, it runs the workload
with each seed and reports mean goodput (useful compute / training wall time), failures, lost work,
checkpoint blocking and restart time. Beside the measured optimum (the k with the best mean
goodput) it puts Young's and Daly's prediction for the measured checkpoint cost (in steps of the
measured iteration time, from the fixed runs' summaries) and the intervals the young_daly and
checkfreq policies chose. Every figure comes from the runs' summary.json. Nothing is asserted.

    python benchmarks/failure_sweep.py [--intervals 5,10,20,30,40,60,80,120] [--seeds 1,2,3] [--mtbf 3]
                                       [--out results/failure_sweep.json]
    python benchmarks/failure_sweep.py --quick      # 3 intervals, 1 seed
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, load_json, run, table, tool, write_json

WORKLOAD = ["workload=unet3d", "scale=tiny", "dataset.num_files_train=64", "dataset.num_samples_per_file=4",
            "dataset.record_length_bytes=16KiB", "dataset.record_length_bytes_stdev=0",
            "dataset.record_length_bytes_min=1", "reader.batch_size=1", "train.epochs=1", "train.total_steps=256",
            "train.computation_time=0.02", "model.kind=explicit", "model.model_size_bytes=48MiB",
            "model.optimization_groups=[]", "model.layer_parameters=[]", "checkpoint.enabled=true",
            "checkpoint.strategy=sharded", "checkpoint.keep_last=2", "progress=false"]


def one_run(work: Path, name: str, extra: list[str]) -> dict:
    folder = work / name
    run([tool("dlio_ckpt"), *WORKLOAD, *extra, f"storage.root={work / 'store'}", f"hydra.run.dir={folder}"],
        cwd=str(work))  # a failing run stops the sweep with its output
    s = load_json(folder / "summary.json")
    policy = s["checkpoint"]["policy"]
    spent = s["time_accounting"]
    return {"name": name, "goodput": s["goodput"], "failures": s["failures"]["count"],
            "lost_steps": spent["lost_steps"], "wall_s": spent["wall_s"], "checkpoint_s": spent["checkpoint_s"],
            "lost_work_s": spent["lost_work_s"], "restart_s": spent["restart_s"],
            "checkpoints": len(s["checkpoint"]["per_checkpoint"]), "interval_steps": policy["interval_steps"],
            "iteration_s": policy["iteration_s"], "cost_s": policy.get("cost_s"), "young_s": policy.get("young_s"),
            "daly_s": policy.get("daly_s"), "stall_s": policy.get("stall_s"), "full_s": policy.get("full_s"),
            "deterministic": s["resume"]["deterministic"], "history": policy.get("history")}


def mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--intervals", default="5,10,20,30,40,60,80,120")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--mtbf", type=float, default=3.0, help="failures.mtbf_s: seconds of training wall time")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "failure_sweep.json")
    args = parser.parse_args()
    intervals = [10, 40, 120] if args.quick else [int(k) for k in args.intervals.split(",")]
    seeds = [1] if args.quick else [int(s) for s in args.seeds.split(",")]
    failures = [f"failures.mtbf_s={args.mtbf}"]

    with tempfile.TemporaryDirectory(prefix="failure_sweep-") as scratch:
        work = Path(scratch)
        env = environment(scratch)
        fixed: dict[int, list[dict]] = {k: [] for k in intervals}
        adaptive: dict[str, list[dict]] = {"young_daly": [], "checkfreq": []}
        for seed in seeds:  # seeds outermost: load drifts fall on every interval alike
            for k in intervals:
                fixed[k].append(one_run(work, f"fixed-{k}-{seed}", failures + [f"failures.seed={seed}",
                                                                                f"checkpoint.steps_between_checkpoints={k}"]))
                print(f"k={k} seed={seed}: goodput {fixed[k][-1]['goodput']:.3f}", flush=True)
            for name in adaptive:
                adaptive[name].append(one_run(work, f"{name}-{seed}", failures + [f"failures.seed={seed}",
                                                                                  f"checkpoint.policy={name}"]))
                print(f"{name} seed={seed}: goodput {adaptive[name][-1]['goodput']:.3f}, "
                      f"interval {adaptive[name][-1]['interval_steps']}", flush=True)

    every = [r for rows in fixed.values() for r in rows]
    iteration = mean(every, "iteration_s")
    cost = mean(every, "cost_s")
    young_steps = mean(every, "young_s") / iteration
    daly_steps = mean(every, "daly_s") / iteration
    best = max(intervals, key=lambda k: mean(fixed[k], "goodput"))
    rows = [[f"fixed k={k}", f"{mean(fixed[k], 'goodput'):.3f}", f"{min(r['goodput'] for r in fixed[k]):.3f}",
             f"{max(r['goodput'] for r in fixed[k]):.3f}", f"{mean(fixed[k], 'failures'):.1f}",
             f"{mean(fixed[k], 'lost_steps'):.1f}", f"{mean(fixed[k], 'checkpoint_s'):.2f}",
             f"{mean(fixed[k], 'lost_work_s'):.2f}", f"{mean(fixed[k], 'restart_s'):.2f}", f"{mean(fixed[k], 'wall_s'):.2f}"]
            for k in intervals]
    for name, runs in adaptive.items():
        rows.append([f"{name} (k={'/'.join(str(r['interval_steps']) for r in runs)})", f"{mean(runs, 'goodput'):.3f}",
                     f"{min(r['goodput'] for r in runs):.3f}", f"{max(r['goodput'] for r in runs):.3f}",
                     f"{mean(runs, 'failures'):.1f}", f"{mean(runs, 'lost_steps'):.1f}", f"{mean(runs, 'checkpoint_s'):.2f}",
                     f"{mean(runs, 'lost_work_s'):.2f}", f"{mean(runs, 'restart_s'):.2f}", f"{mean(runs, 'wall_s'):.2f}"])
    text = table(rows, ["interval", "goodput", "min", "max", "failures", "lost steps", "ckpt s", "lost s",
                        "restart s", "wall s"])
    verdict = (f"measured optimum: k={best} (goodput {mean(fixed[best], 'goodput'):.3f}); Young predicts "
               f"{young_steps:.1f} steps, Daly {daly_steps:.1f} steps (C={cost:.3f} s, M={args.mtbf} s, "
               f"t_i={iteration:.4f} s); young_daly chose {[r['interval_steps'] for r in adaptive['young_daly']]}, "
               f"checkfreq chose {[r['interval_steps'] for r in adaptive['checkfreq']]}")
    print(text)
    print(verdict)
    write_json(args.out, {"environment": env, "workload": WORKLOAD, "mtbf_s": args.mtbf, "seeds": seeds,
                          "intervals": intervals, "fixed": fixed, "adaptive": adaptive, "iteration_s": iteration,
                          "cost_s": cost, "young_steps": young_steps, "daly_steps": daly_steps, "best_interval": best,
                          "table": text, "verdict": verdict})
    args.out.with_suffix(".md").write_text(f"# Goodput against the checkpoint interval\n\n```\n{text}\n```\n\n{verdict}\n\n"
                                           f"Machine: {env.get('cpus')} CPUs, load {env.get('loadavg_at_start')}, "
                                           f"commit {env.get('dlio_ckpt_commit')}, {env.get('date_utc')}\n")


if __name__ == "__main__":
    main()
