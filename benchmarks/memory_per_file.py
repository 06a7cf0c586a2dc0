"""Peak memory of one step that takes every file of a dataset, in a process of its own (issue 26,
item 3): run it at two file counts and compare; nothing is asserted.

- sizes  : the dataset plan of unet3d (varied sample sizes) for N files, every size summed
           (`payload_bytes`) and the last file's asked for, as generation and the disk-space
           check ask (plan/file_sizes.py)
- darshan: `write_darshan_log` of one rank whose N files each had an open, two 4 KiB reads and
           a close (the RankEvents made in memory, mpi=False): the trace.darshan output
- chrome : `write_chrome_trace` of a run folder's event file (one rank; each of N files an open,
           two 4 KiB reads and a close, saved by the EventRecorder in a child process first):
           the trace.chrome output, from the event files as a run's end passes them (a checkout
           before the streaming reader, EventFile, loads them whole first, as run.py then did)
- analysis: `analyse_run` of that run folder (with a summary.json): dlio_ckpt-analyze's figures

Prints one JSON line: the case, N, the process's peak RSS before the step and after it (MiB,
getrusage), the step's seconds, and a digest of what it made (the sum, or the log's bytes), so
two checkouts can be compared on the same output.

    .venv/bin/python benchmarks/memory_per_file.py --case sizes --files 10000000
    .venv/bin/python benchmarks/memory_per_file.py --case darshan --files 250000
    .venv/bin/python benchmarks/memory_per_file.py --case analysis --files 250000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dlio_ckpt.analysis.run_folders import analyse_run
from dlio_ckpt.config.load import load_config
from dlio_ckpt.plan.dataset import plan_dataset
from dlio_ckpt.storage import events as event_files
from dlio_ckpt.storage.events import EVENT_DTYPE, OP_CODE, EventRecorder, JobClock, RankEvents, load_run_events
from dlio_ckpt.trace.chrome import write_chrome_trace
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


def make_run(folder: Path, n: int) -> None:
    """A one-rank run folder: events/rank-00000.npz (each of n files an open, two 4 KiB reads and a
    close, recorded and saved by the EventRecorder) and a summary.json. Run in a child process, so
    that making it does not count in the measured process's peak."""
    rec = EventRecorder(0, JobClock.start(job_start_wall=1.7e9))
    for i in range(n):
        path, t = f"/data/train/{i % 100:02d}/img_{i:07d}_of_{n}.bin", i * 1e-4
        rec.record("open", "train", path, -1, 0, t, t + 1e-5)
        rec.record("read", "train", path, 0, 4096, t + 1e-5, t + 3e-5 + (i % 13) * 1e-6)
        rec.record("read", "train", path, 4096, 4096, t + 3e-5, t + 5e-5 + (i % 7) * 1e-6)
        rec.record("close", "train", path, -1, 0, t + 6e-5, t + 7e-5)
    rec.save(folder / "events", "h")
    (folder / "summary.json").write_text(json.dumps({"workload": "unet3d", "mode": "train", "world_size": 1}))


def chrome(folder: Path) -> str:
    # the event files as a run's end hands them over (before EventFile: loaded whole, as run.py did)
    sources = (event_files.event_files(folder) if hasattr(event_files, "EventFile") else load_run_events(folder))
    trace = write_chrome_trace(folder / "trace.chrome.json", sources)
    digest = hashlib.sha256()
    with open(trace, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def analysis(folder: Path) -> str:
    found = analyse_run(folder)
    figures = [found.bytes_read, found.files["count"], found.files["read_only"],
               found.extra["latency"]["train"]["read"]["p99_9_s"], found.extra["latency"]["train"]["read"]["p50_s"],
               round(float(found.timeline.read.sum()))]
    return hashlib.sha256(json.dumps(figures).encode()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=("sizes", "darshan", "chrome", "analysis"), required=True)
    parser.add_argument("--files", type=int, required=True)
    parser.add_argument("--make-run", type=Path, help=argparse.SUPPRESS)  # the child that makes the run folder
    args = parser.parse_args()
    if args.make_run:
        make_run(args.make_run, args.files)
        return
    with tempfile.TemporaryDirectory() as folder:
        if args.case in ("chrome", "analysis"):  # the run folder is the input, made by a child process
            subprocess.run([sys.executable, *sys.argv, "--make-run", folder], check=True)
            step, argument = (chrome if args.case == "chrome" else analysis), Path(folder)
        elif args.case == "darshan":  # the events and paths are the input, made before the step
            step, argument = darshan, darshan_input(args.files)
        else:
            step, argument = sizes, args.files
        before = peak_mib()
        started = time.perf_counter()
        made = step(argument)
        seconds = time.perf_counter() - started
    print(json.dumps({"case": args.case, "files": args.files, "peak_before_mib": round(before, 1),
                      "peak_mib": round(peak_mib(), 1), "seconds": round(seconds, 2), "made": made}))


if __name__ == "__main__":
    main()
