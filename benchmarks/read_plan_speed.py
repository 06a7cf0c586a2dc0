"""What one epoch's read order costs a rank: time to plan it and to take every batch's rows, and
the memory it holds meanwhile (plan/read.py), against the order as it was made before it streamed.

The order is asked for as the readers ask (`plan.batch(i)` for every batch, in order), so the
plan, which computes rows when asked (a block at a time, keyed permutations), and the previous
plan, computed whole up front (numpy's shuffle of the files, each file's samples in place, a
shuffled permutation of the share: `whole_order` below, the code of plan/read.py before), are
timed for the same work, alternated in one process. Memory is tracemalloc's peak (numpy reports its arrays to it) over the
planning and the pass over the batches, above what was allocated before, in an untimed pass. One process, cases
alternated round by round; medians reported. Nothing is asserted: the table and the JSON are the
output.

    .venv/bin/python benchmarks/read_plan_speed.py
    .venv/bin/python benchmarks/read_plan_speed.py --samples 1000000,10000000 --rounds 1
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, environment, git_commit, median, table, write_json  # noqa: E402

from dlio_ckpt.config.load import load_config  # noqa: E402
from dlio_ckpt.plan.dataset import plan_dataset  # noqa: E402
from dlio_ckpt.plan.file_list import samples_per_file  # noqa: E402
from dlio_ckpt.plan.read import plan_epoch  # noqa: E402

CASES = {  # name: (samples per file, file_shuffle, sample_shuffle)
    "files+samples shuffled": (1, True, True),
    "files shuffled, 10 samples a file": (10, True, False),
    "no shuffle": (1, False, False),
}


def whole_order(files, reader, epoch: int = 1) -> np.ndarray:
    """Rank 0 of 1's order as plan/read.py made it before (alike files): int32 rows, all at once."""
    order = np.arange(len(files), dtype=np.int32)
    if reader.file_shuffle:
        np.random.default_rng([reader.shuffle_seed, epoch, 0]).shuffle(order)
    per_file = samples_per_file(files)
    total = len(files) * per_file
    share = np.empty((total, 2), np.int32)
    rows = np.arange(total, dtype=np.int32)
    share[:, 0] = order[rows // per_file]
    share[:, 1] = rows % per_file
    del rows
    if reader.sample_shuffle and total > 1:
        permutation = np.arange(total, dtype=np.int32)
        np.random.default_rng([reader.shuffle_seed, epoch, 1]).shuffle(permutation)
        share = share[permutation]
    return share


def one_epoch(files, reader, batch_size: int, before: bool) -> tuple[float, float, int]:
    """(plan s, rows s, rows taken) of epoch 1 on rank 0 of 1."""
    start = time.perf_counter()
    if before:
        rows = whole_order(files, reader)
        batch = lambda index: rows[index * batch_size:(index + 1) * batch_size]  # noqa: E731
        count = -(-len(rows) // batch_size)
    else:
        plan = plan_epoch(files, reader, 0, 1, 1, False, batch_size=batch_size)
        batch, count = plan.batch, plan.num_batches
    planned = time.perf_counter()
    taken = 0
    for index in range(count):
        taken += len(batch(index))
    return planned - start, time.perf_counter() - planned, taken


def peak_bytes(files, reader, batch_size: int, before: bool) -> int:
    """tracemalloc's peak over the same work, above what was held before (a pass of its own:
    tracing slows every allocation, so the timed passes run without it)."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    one_epoch(files, reader, batch_size, before)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", default="1000000", help="samples an epoch (comma-separated)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "read_plan_speed.json"))
    args = parser.parse_args()
    env = environment(".")
    rows, results, ratios = [], [], []
    for samples in [int(x) for x in args.samples.split(",") if x]:
        setups = {}
        for name, (per_file, file_shuffle, sample_shuffle) in CASES.items():
            config = load_config(["workload=unet3d", "dataset.format=raw", f"dataset.num_files_train={samples // per_file}",
                                  f"dataset.num_samples_per_file={per_file}", "dataset.record_length_bytes_stdev=0",
                                  "storage.root=/nonexistent"])
            reader = dataclasses.replace(config.reader, file_shuffle=file_shuffle, sample_shuffle=sample_shuffle)
            setups[name] = (plan_dataset(config, "raw").train, reader)
        measured = {(name, before): [] for name in CASES for before in (True, False)}
        for _ in range(args.rounds):
            for name, before in measured:
                measured[name, before].append(one_epoch(*setups[name], args.batch_size, before))
        for (name, before), runs in measured.items():
            plan_s, rows_s = median([r[0] for r in runs]), median([r[1] for r in runs])
            peak = peak_bytes(*setups[name], args.batch_size, before)
            code = "before (whole, numpy shuffle)" if before else "after (streamed, keyed)"
            result = {"case": name, "code": code, "samples": samples, "rows": runs[0][2],
                      "plan_s": [r[0] for r in runs], "rows_s": [r[1] for r in runs], "median_plan_s": plan_s,
                      "median_rows_s": rows_s, "median_total_s": median([r[0] + r[1] for r in runs]),
                      "peak_traced_bytes": peak}
            results.append(result)
            rows.append([name, code, f"{samples:,}", f"{plan_s:.3f}", f"{rows_s:.3f}",
                         f"{result['median_total_s']:.3f}", f"{peak / samples:.2f}"])
        for name in CASES:
            was, now = (next(r for r in results if r["case"] == name and r["samples"] == samples
                             and r["code"].startswith(code)) for code in ("before", "after"))
            ratios.append([name, f"{samples:,}", f"{now['median_total_s'] / was['median_total_s']:.2f}",
                           f"{now['peak_traced_bytes'] / max(was['peak_traced_bytes'], 1):.4f}"])
    print(table(rows, ["case", "code", "samples", "plan s", "rows s", "total s", "peak bytes a sample"]))
    print(table(ratios, ["case", "samples", "time after / before", "peak memory after / before"]))
    write_json(Path(args.out), {"commit": git_commit(), "environment": env,
                                "loadavg_at_end": os.getloadavg(), "batch_size": args.batch_size,
                                "rounds": args.rounds, "results": results})


if __name__ == "__main__":
    main()
