"""How long keras_tfdata's loop blocks in each epoch's last next() on its tf.data iterator.

    .venv/bin/python benchmarks/realapps/tfdata_teardown.py [--size tiny] [--files 16] [--runs 8]
        [--json benchmarks/results/tfdata_teardown.json]

LoopClock (loop_clock.py) counts the loop's time in next() as data wait, but not the last call of
an epoch, the one that raises StopIteration: it ends the loop's `for`, and with it the iterator,
whose deletion stops tf.data's threads. Issue 22's profile of keras_tfdata's Darshan log was 1.56x
and 1.74x the program's compute per step in 2 of 9 quiet runs, where that call took over a second
and nothing was read (so the log dates nothing then and the profile counts it as compute).

This runs the program as fidelity.py does (same dataset and arguments), alternating two variants
run for run: as written, and with `tf.data.Options().autotune.enabled = False` on its dataset, the
only difference. Per run it prints the seconds of each epoch's last next() and the wall time the
program's clock leaves uncounted (wall less compute, data wait and saves). If the long calls go
away with autotuning off, the time is tf.data's autotuner stopping, paid by any program that uses
AUTOTUNE. The emulation's pipeline (engine/tf_reader.py) sets its parallelism and prefetch
depth, so it should not pay it (not measured).

Run inside the real program (fidelity's command with this file as the script), it installs the
timer (and, if asked, the option) and runs the program's main.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

OUT_ENV = "DLIO_CKPT_TEARDOWN_OUT"
AUTOTUNE_ENV = "DLIO_CKPT_TEARDOWN_AUTOTUNE"  # "0": the dataset with autotuning off


def _inside() -> None:
    """In the program's process: time each epoch's last next(), optionally turn autotuning off, run
    its main and append this run's figures."""
    import loop_clock
    import tensorflow as tf

    import keras_tfdata

    last_calls: list[float] = []
    original = loop_clock.LoopClock.batches

    def batches(clock, loader):
        inner = original(clock, loader)
        while True:
            began = time.perf_counter()
            try:
                batch = next(inner)
            except StopIteration:  # the loader's last next(), and the iterator's deletion with the loop
                last_calls.append(time.perf_counter() - began)
                return
            yield batch

    loop_clock.LoopClock.batches = batches
    if os.environ[AUTOTUNE_ENV] == "0":
        make = keras_tfdata.make_dataset

        def without_autotune(*args, **kwargs):
            options = tf.data.Options()
            options.autotune.enabled = False
            return make(*args, **kwargs).with_options(options)

        keras_tfdata.make_dataset = without_autotune
    metrics = Path(sys.argv[sys.argv.index("--metrics") + 1])
    keras_tfdata.main(sys.argv[1:])
    figures = json.loads(metrics.read_text())
    counted = figures["compute_s"] + figures["data_wait_s"] + sum(figures["checkpoint_s"])
    with open(os.environ[OUT_ENV], "a") as out:
        out.write(json.dumps({"autotune": os.environ[AUTOTUNE_ENV] != "0", "last_next_s": last_calls,
                              "uncounted_s": figures["wall_s"] - counted, "compute_s": figures["compute_s"],
                              "wall_s": figures["wall_s"]}) + "\n")


def measure(size_name: str, files: int, runs: int, workdir: Path) -> list[dict]:
    import dataclasses

    from fidelity import Bench, run
    from programs import PROGRAMS

    program = PROGRAMS["keras_tfdata"]
    size = program.sizes[size_name]
    bench = Bench(program, dataclasses.replace(size, files=files or size.files), workdir, timeout=600)
    bench.generate()
    out = workdir / "teardown.jsonl"
    for number in range(2 * runs):
        autotune = number % 2 == 0  # alternating, so the machine's load falls on both alike
        cmd = program.real_command(bench.data, bench.real_checkpoints, bench.size, workdir / f"metrics-{number}.json")
        cmd = [str(Path(__file__)) if part == str(HERE / program.script) else part for part in cmd]
        os.environ.update({OUT_ENV: str(out), AUTOTUNE_ENV: "1" if autotune else "0"})
        run(cmd, bench.log, bench.timeout)
        shutil.rmtree(bench.real_checkpoints, ignore_errors=True)
        row = json.loads(out.read_text().splitlines()[-1])
        print(f"autotune {'on ' if autotune else 'off'}: last next() per epoch "
              f"{', '.join(f'{s:.4f}' for s in row['last_next_s'])} s; uncounted {row['uncounted_s']:.4f} s "
              f"of {row['wall_s']:.3f} s", flush=True)
    return [json.loads(line) for line in out.read_text().splitlines()]


def summary(rows: list[dict]) -> dict:
    """Per variant: the calls, their median and largest, and how many took over 50 ms."""
    out = {}
    for autotune in (True, False):
        calls = [s for row in rows if row["autotune"] == autotune for s in row["last_next_s"]]
        out["autotune_on" if autotune else "autotune_off"] = {
            "calls": len(calls), "median_s": statistics.median(calls), "max_s": max(calls),
            "over_50ms": sum(s > 0.05 for s in calls), "over_500ms": sum(s > 0.5 for s in calls)}
    return out


def main(argv=None) -> None:
    if OUT_ENV in os.environ and AUTOTUNE_ENV in os.environ:
        _inside()
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="tiny", choices=("tiny", "small"))
    p.add_argument("--files", type=int, default=16, help="dataset files (16: tests/test_profile.py's keras_tfdata size)")
    p.add_argument("--runs", type=int, default=8, help="runs of each variant")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tfdata-teardown-"))
    try:
        rows = measure(args.size, args.files, args.runs, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {"size": args.size, "files": args.files, "runs": args.runs, "loadavg_at_end": os.getloadavg(), "rows": rows,
              "summary": summary(rows)}
    for name, figures in result["summary"].items():
        print(f"{name}: {figures['calls']} last calls, median {figures['median_s']:.4f} s, largest "
              f"{figures['max_s']:.4f} s, {figures['over_50ms']} over 50 ms, {figures['over_500ms']} over 0.5 s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
