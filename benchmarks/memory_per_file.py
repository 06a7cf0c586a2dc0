"""Peak memory of one step that takes every file of a dataset, in a process of its own (issue 26,
item 3): run it at two file counts and compare; nothing is asserted.

- sizes  : the dataset plan of unet3d (varied sample sizes) for N files, every size summed
           (`payload_bytes`) and the last file's asked for, as generation and the disk-space
           check ask (plan/file_sizes.py)
- darshan: `write_darshan_log` of one rank whose N files each had an open, two 4 KiB reads and
           a close (the RankEvents made in memory, mpi=False): the trace.darshan output

Prints one JSON line: the case, N, the process's peak RSS before the step and after it (MiB,
getrusage), the step's seconds, and a digest of what it made (the sum, or the log's bytes), so
two checkouts can be compared on the same output.

    .venv/bin/python benchmarks/memory_per_file.py --case sizes --files 10000000
    .venv/bin/python benchmarks/memory_per_file.py --case darshan --files 250000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import tempfile
import time

import numpy as np

from dlio_ckpt.config.load import load_config
from dlio_ckpt.plan.dataset import plan_dataset
from dlio_ckpt.storage.events import EVENT_DTYPE, OP_CODE, RankEvents
from dlio_ckpt.trace.darshan_writer import JobInfo, write_darshan_log


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sizes(n: int) -> str:
    config = load_config(["workload=unet3d", "dataset.format=raw", f"dataset.num_files_train={n}",
                          "storage.root=/nonexistent"])
    plan = plan_dataset(config, "bin")
    return f"{plan.payload_bytes}:{plan.train[n - 1].sample_bytes}"


def darshan_input(n: int):
    """One rank's RankEvents and a JobInfo: the writer's input, made before its step is measured."""
    events = np.zeros(4 * n, EVENT_DTYPE)
    events["file"] = np.repeat(np.arange(n), 4)
    events["op"] = np.tile([OP_CODE["open"], OP_CODE["read"], OP_CODE["read"], OP_CODE["close"]], n)
    events["offset"] = np.tile([-1, 0, 4096, -1], n)
    events["length"] = np.tile([0, 4096, 4096, 0], n)
    events["start"] = np.arange(4 * n) * 1e-5
    events["end"] = events["start"] + 5e-6
    paths = [f"/data/train/{i % 100:02d}/img_{i:07d}_of_{n}.bin" for i in range(n)]
    rank = RankEvents(rank=0, hostname="h", job_start_wall=1.7e9, paths=paths, events=events)
    return rank, JobInfo(nprocs=1, jobid=1, uid=0, start_wall=1.7e9, end_wall=1.7e9 + 100, exe="x", mpi=False)


def darshan(inputs) -> str:
    rank, job = inputs
    with tempfile.TemporaryDirectory() as folder:
        log = write_darshan_log(os.path.join(folder, "run.darshan"), [rank], job)
        return hashlib.sha256(log.read_bytes()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=("sizes", "darshan"), required=True)
    parser.add_argument("--files", type=int, required=True)
    args = parser.parse_args()
    if args.case == "darshan":  # the events and paths are the input, made before the step
        step, argument = darshan, darshan_input(args.files)
    else:
        step, argument = sizes, args.files
    before = peak_mib()
    started = time.perf_counter()
    made = step(argument)
    print(json.dumps({"case": args.case, "files": args.files, "peak_before_mib": round(before, 1),
                      "peak_mib": round(peak_mib(), 1), "seconds": round(time.perf_counter() - started, 2),
                      "made": made}))


if __name__ == "__main__":
    main()
