"""How long keras_tfdata's loop blocks in each epoch's last next() on its tf.data iterator.

    .venv/bin/python benchmarks/realapps/tfdata_teardown.py [--size tiny] [--files 16] [--runs 8]
        [--json benchmarks/results/tfdata_teardown.json]

LoopClock (loop_clock.py) counts the loop's time in next() as data wait, and the last call of an
epoch, the one that raises StopIteration, apart (`last_waits_s`): it ends the loop's `for`, and
with it the iterator, whose deletion stops tf.data's threads. Issue 22's profile of keras_tfdata's
Darshan log was 1.56x and 1.74x the program's compute per step in 2 of 9 quiet runs, where that
call took over a second and nothing was read (so the log dates nothing then and the profile counts it as compute).

This runs the program as fidelity.py does (same dataset and arguments), rotating three variants
run for run: as written; with `tf.data.Options().autotune.enabled = False` on its dataset, the
only difference; and dlio_ckpt's emulation of it (keras_tfdata.yaml, the last next() on its
batches in engine/train.py timed the same way). Per run it prints the seconds of each epoch's last
next() and, for the program, the wall time its clock leaves uncounted (wall less compute, data
wait and saves). If the long calls go away with autotuning off, the time is tf.data's autotuner
stopping, paid by any program that uses AUTOTUNE; the emulation's pipeline (engine/tf_reader.py)
sets its parallelism and prefetch depth instead.

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
EMULATION_ENV = "DLIO_CKPT_TEARDOWN_EMULATION"  # set: this process runs dlio_ckpt's emulation
VARIANTS = ("autotune", "no_autotune", "emulation")


def _last_call_timed(inner, last_calls: list[float]):
    """`inner`'s items; the seconds of its last next() (the StopIteration, and with it the end of the
    loader's iterator) appended to `last_calls`."""
    while True:
        began = time.perf_counter()
        try:
            item = next(inner)
        except StopIteration:
            last_calls.append(time.perf_counter() - began)
            return
        yield item


def _inside() -> None:
    """In the program's process: optionally turn autotuning off, run its main and append this run's
    figures (each epoch's last next() from its clock)."""
    import tensorflow as tf

    import keras_tfdata

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
        out.write(json.dumps({"autotune": os.environ[AUTOTUNE_ENV] != "0", "last_next_s": figures["last_waits_s"],
                              "uncounted_s": figures["wall_s"] - counted, "compute_s": figures["compute_s"],
                              "steps": figures["steps"], "wall_s": figures["wall_s"]}) + "\n")


def _inside_emulation() -> None:
    """In the emulation's process: time the last next() on each epoch's batches, run dlio_ckpt."""
    from dlio_ckpt.cli import main as dlio_ckpt
    from dlio_ckpt.engine import train

    last_calls: list[float] = []
    original = train._waiting_for

    def waiting_for(batches, result):
        yield from _last_call_timed(original(batches, result), last_calls)

    train._waiting_for = waiting_for
    try:
        dlio_ckpt(sys.argv[1:])
    except SystemExit as done:
        if done.code:
            raise
    with open(os.environ[OUT_ENV], "a") as out:
        out.write(json.dumps({"variant": "emulation", "last_next_s": last_calls}) + "\n")


def measure(size_name: str, files: int, runs: int, workdir: Path) -> list[dict]:
    import dataclasses

    from fidelity import Bench, run
    from programs import PROGRAMS

    program = PROGRAMS["keras_tfdata"]
    size = program.sizes[size_name]
    bench = Bench(program, dataclasses.replace(size, files=files or size.files), workdir, timeout=600)
    bench.generate()
    out = workdir / "teardown.jsonl"
    compute_s = 0.006  # the emulation's compute per step until a program run measured it
    for number in range(len(VARIANTS) * runs):
        variant = VARIANTS[number % len(VARIANTS)]  # rotating, so the machine's load falls on all alike
        os.environ.pop(EMULATION_ENV, None)
        os.environ.update({OUT_ENV: str(out), AUTOTUNE_ENV: "0" if variant == "no_autotune" else "1"})
        if variant == "emulation":
            os.environ[EMULATION_ENV] = "1"
            shutil.rmtree(bench.storage / "checkpoints", ignore_errors=True)
            cmd = [sys.executable, str(Path(__file__)),
                   *program.emulation_command(bench.storage, workdir / f"emulation-{number}", bench.size, compute_s)[1:]]
        else:
            metrics = workdir / f"metrics-{number}.json"
            cmd = program.real_command(bench.data, bench.real_checkpoints, bench.size, metrics)
            cmd = [str(Path(__file__)) if part == str(HERE / program.script) else part for part in cmd]
        run(cmd, bench.log, bench.timeout)
        shutil.rmtree(bench.real_checkpoints, ignore_errors=True)
        row = json.loads(out.read_text().splitlines()[-1])
        if variant != "emulation":
            row["variant"] = variant
            compute_s = row["compute_s"] / max(1, row["steps"])
        print(f"{variant:11s}: last next() per epoch {', '.join(f'{s:.4f}' for s in row['last_next_s'])} s"
              + (f"; uncounted {row['uncounted_s']:.4f} s of {row['wall_s']:.3f} s" if "uncounted_s" in row else ""),
              flush=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows:
        row.setdefault("variant", "autotune" if row.get("autotune") else "no_autotune")
    return rows


def summary(rows: list[dict]) -> dict:
    """Per variant: the calls, their median and largest, and how many took over 50 ms."""
    out = {}
    for variant in VARIANTS:
        calls = [s for row in rows if row["variant"] == variant for s in row["last_next_s"]]
        if not calls:
            continue
        out[variant] = {
            "calls": len(calls), "median_s": statistics.median(calls), "max_s": max(calls),
            "over_50ms": sum(s > 0.05 for s in calls), "over_500ms": sum(s > 0.5 for s in calls)}
    return out


def main(argv=None) -> None:
    if OUT_ENV in os.environ and EMULATION_ENV in os.environ:
        _inside_emulation()
        return
    if OUT_ENV in os.environ and AUTOTUNE_ENV in os.environ:
        _inside()
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="tiny", choices=("tiny", "small"))
    p.add_argument("--files", type=int, default=16, help="dataset files (16: tests/test_profile.py's keras_tfdata size)")
    p.add_argument("--runs", type=int, default=8, help="runs of each variant (the program as written, without autotuning, the emulation)")
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
