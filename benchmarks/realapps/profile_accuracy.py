"""How close dlio_ckpt-profile's compute per step comes to a reference program's own, run after run.

    .venv/bin/python benchmarks/realapps/profile_accuracy.py keras_tfdata [--runs 12] [--epochs 2]
        [--files 16 --samples-per-file 8 --batch-size 4] [--json benchmarks/results/profile_accuracy.json]

tests/test_profile.py checks one run of each program; this repeats it to show the spread. Each run
generates the program's dataset, runs the program under the real darshan-runtime
(../shared/tools/darshan-runtime-3.4.7/, non-MPI, DXT), profiles its logs as the test does and sets
the inferred compute per step (`train.computation_time` plus `train.first_step_time` over the
run's steps; `dlio_ckpt-profile` in a process of its own, as a user runs it) beside the program's
own clock (loop_clock.py) of the same run:
- `vs_compute`: over the time the program held its batches;
- `vs_loop`: over that plus the time its loop spent in the loader's next() that no log dates (the
  waits for batches after each epoch's first, and each epoch's last next(), which ends the iterator).
The test asserts the second within 10 % (and the first at least 0.25); the first is the issue's
figure. Per run it prints both, each epoch's last next() and the profile's per-epoch values.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RUNTIME = REPO.parent / "shared" / "tools" / "darshan-runtime-3.4.7" / "nonmpi" / "libdarshan.so"
sys.path.insert(0, str(HERE))

from omegaconf import OmegaConf  # noqa: E402
from loop_clock import undated_loop_s  # noqa: E402
from programs import PROGRAMS, Size, traced_environment  # noqa: E402


def one_run(name: str, size: Size, work: Path) -> dict:
    """Generate, run traced, profile: the program's figures and the profile's, for one run."""
    program = PROGRAMS[name]
    storage, logs, metrics = work / "storage", work / "logs", work / "metrics.json"
    logs.mkdir(parents=True)
    subprocess.run(program.generate_command(storage, work / "generate", size), check=True, capture_output=True)
    cmd = program.real_command(storage / "data" / name, storage / "real_checkpoints", size, metrics)
    done = subprocess.run(cmd, env=traced_environment(RUNTIME, logs), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{name} failed: {done.stderr[-2000:]}")
    own = json.loads(metrics.read_text())
    # the command a user runs, in a process of its own: the stand-ins it times (a TensorFlow save's
    # first-time work above all) must find a cold process, as they do there
    workload = work / "workload.yaml"
    subprocess.run([str(REPO / ".venv" / "bin" / "dlio_ckpt-profile"), str(logs), "-o", str(workload),
                    "--batch-size", str(size.batch_size)], check=True, capture_output=True)
    train = OmegaConf.load(workload).train
    steps = max(1, own["steps"])
    inferred = train.computation_time + train.first_step_time / steps
    loader = undated_loop_s(own) / steps
    (why,) = [line for line in workload.read_text().splitlines() if line.strip().startswith("computation_time:")]
    return {"load": os.getloadavg()[0], "steps": own["steps"], "compute_s_per_step": own["compute_s_per_step"],
            "undated_loader_s_per_step": loader, "last_waits_s": own["last_waits_s"],
            "computation_time": train.computation_time, "first_step_time": train.first_step_time,
            "inferred_s_per_step": inferred, "vs_compute": inferred / own["compute_s_per_step"],
            "vs_loop": inferred / (own["compute_s_per_step"] + loader),
            "per_epoch": why.split("(", 1)[1].split(" s)", 1)[0],
            "ready_next_ms": (why.split("tf.data has ready, ", 1)[1].split(" ms", 1)[0]
                              if "tf.data has ready, " in why else None)}


def summary(rows: list[dict]) -> dict:
    def spread(key: str) -> dict:
        values = [r[key] for r in rows]
        return {"min": min(values), "median": statistics.median(values), "max": max(values),
                "within_10pct": sum(abs(v - 1) <= 0.10 for v in values)}

    return {"runs": len(rows), "vs_compute": spread("vs_compute"), "vs_loop": spread("vs_loop"),
            "runs_with_a_last_wait_over_50ms": sum(any(s > 0.05 for s in r["last_waits_s"]) for r in rows)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("program", choices=sorted(PROGRAMS))
    p.add_argument("--runs", type=int, default=12)
    p.add_argument("--files", type=int, default=16)
    p.add_argument("--samples-per-file", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if not RUNTIME.is_file():
        raise SystemExit(f"darshan-runtime not found at {RUNTIME} (../shared/tools/darshan-runtime-3.4.7/)")
    size = Size(args.files, args.samples_per_file, args.batch_size, args.epochs)
    rows = []
    for number in range(args.runs):
        work = Path(tempfile.mkdtemp(prefix="dlio_ckpt-profile-accuracy-"))
        try:
            row = one_run(args.program, size, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rows.append(row)
        print(f"run {number + 1}: vs compute {row['vs_compute']:.3f}, vs loop {row['vs_loop']:.3f}; last next() "
              f"{', '.join(f'{s:.3f}' for s in row['last_waits_s'])} s; per epoch {row['per_epoch']} s "
              f"(load {row['load']:.1f})", flush=True)
    result = {"program": args.program, "size": vars(size), "rows": rows, "summary": summary(rows)}
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
