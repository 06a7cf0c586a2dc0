"""Peak memory of one step that takes every file of a dataset, in a process of its own (issue 26,
item 3): run it at two file counts and compare; nothing is asserted.

- sizes  : the dataset plan of unet3d (varied sample sizes) for N files, every size summed
           (`payload_bytes`) and the last file's asked for, as generation and the disk-space
           check ask (plan/file_sizes.py)
- darshan: `write_darshan_log` (the streamed writer, trace/darshan_stream.py) of one rank whose
           N files each had an open, two 4 KiB reads and a close, from that rank's event file
           on disk, as a run leaves it (mpi=False): the trace.darshan output. The event file is
           made by a forked child, so the peak is the writer's alone.
  With --ranks R, R ranks each read every file (an MPI job: every file reduced to rank -1).
- darshan-in-memory: the same log made as the writer made it before it streamed: the event file
           loaded whole (RankEvents.load), every record built, the log encoded whole
           (build_log_contents, encode_log), for old against new in one session
- chrome : `write_chrome_trace` of a run folder's event file (one rank; each of N files an open,
           two 4 KiB reads and a close, saved by the EventRecorder in a child process first):
           the trace.chrome output, from the event files as a run's end passes them (a checkout
           before the streaming reader, EventFile, loads them whole first, as run.py then did)
- analysis: `analyse_run` of that run folder (with a summary.json): dlio_ckpt-analyze's figures

Prints one JSON line: the case, N, the process's peak RSS before the step and after it (MiB,
getrusage), the step's seconds, and a digest of what it made (the sum, or the log's bytes), so
two checkouts, or the two darshan cases, can be compared on the same output.

    .venv/bin/python benchmarks/memory_per_file.py --case sizes --files 10000000
    .venv/bin/python benchmarks/memory_per_file.py --case darshan --files 250000
    .venv/bin/python benchmarks/memory_per_file.py --case analysis --files 250000
    .venv/bin/python benchmarks/memory_per_file.py --case darshan-in-memory --files 50000
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
from dlio_ckpt.storage import events as events_module
from dlio_ckpt.storage.events import EVENT_DTYPE, OP_CODE, EventRecorder, JobClock, RankEvents, load_run_events
from dlio_ckpt.trace.chrome import write_chrome_trace
from dlio_ckpt.trace.darshan_writer import JobInfo, build_log_contents, encode_log, write_darshan_log


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sizes(n: int) -> str:
    config = load_config(["workload=unet3d", "dataset.format=raw", f"dataset.num_files_train={n}",
                          "storage.root=/nonexistent"])
    plan = plan_dataset(config, "bin")
    return f"{plan.payload_bytes}:{plan.train[n - 1].sample_bytes}"


def darshan_event_file(folder: Path, n: int, rank: int = 0) -> Path:
    """The event file (`EventRecorder.save`'s layout) of a rank whose N files each had an open,
    two 4 KiB reads and a close (every rank the same files)."""
    events = np.zeros(4 * n, EVENT_DTYPE)
    events["file"] = np.repeat(np.arange(n), 4)
    events["op"] = np.tile([OP_CODE["open"], OP_CODE["read"], OP_CODE["read"], OP_CODE["close"]], n)
    events["offset"] = np.tile([-1, 0, 4096, -1], n)
    events["length"] = np.tile([0, 4096, 4096, 0], n)
    events["start"] = np.arange(4 * n) * 1e-5
    events["end"] = events["start"] + 5e-6
    paths = [f"/data/train/{i % 100:02d}/img_{i:07d}_of_{n}.bin".encode() for i in range(n)]
    target = folder / f"rank-{rank:05d}.npz"
    np.savez(target, events=events, path_bytes=np.frombuffer(b"".join(paths), np.uint8),
             path_ends=np.cumsum([len(p) for p in paths]).astype(np.int64),
             meta=np.array(json.dumps({"rank": rank, "hostname": "h", "job_start_wall": 1.7e9})))
    return target


def darshan_job(ranks: int) -> JobInfo:
    """One rank: mpi=False (its records kept as rank 0's); more: an MPI job, every file shared by
    every rank and so reduced to one rank -1 record."""
    return JobInfo(nprocs=ranks, jobid=1, uid=0, start_wall=1.7e9, end_wall=1.7e9 + 100, exe="x", mpi=ranks > 1)


def made_in_child(folder: Path, n: int, ranks: int) -> list[Path]:
    """The ranks' event files, made by a forked child so that their arrays never count in this peak."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for rank in range(ranks):
                darshan_event_file(folder, n, rank)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status:
        raise SystemExit("could not make the event files")
    return [folder / f"rank-{rank:05d}.npz" for rank in range(ranks)]


def darshan(event_files: list[Path]) -> str:
    log = write_darshan_log(event_files[0].parent / "run.darshan", event_files, darshan_job(len(event_files)))
    return _digest(log)


def darshan_in_memory(event_files: list[Path]) -> str:
    log, job = event_files[0].parent / "run.darshan", darshan_job(len(event_files))
    log.write_bytes(encode_log(build_log_contents([RankEvents.load(f) for f in event_files], job), job))
    return _digest(log)


def _digest(log: Path) -> str:
    digest = hashlib.sha256()
    with open(log, "rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


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
    sources = (events_module.event_files(folder) if hasattr(events_module, "EventFile") else load_run_events(folder))
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
    parser.add_argument("--case", choices=("sizes", "darshan", "darshan-in-memory", "chrome", "analysis"), required=True)
    parser.add_argument("--files", type=int, required=True)
    parser.add_argument("--ranks", type=int, default=1, help="darshan cases: ranks that each read every file")
    parser.add_argument("--make-run", type=Path, help=argparse.SUPPRESS)  # the child that makes the run folder
    args = parser.parse_args()
    if args.make_run:
        make_run(args.make_run, args.files)
        return
    with tempfile.TemporaryDirectory() as folder:
        if args.case in ("chrome", "analysis"):  # the run folder is the input, made by a child process
            subprocess.run([sys.executable, *sys.argv, "--make-run", folder], check=True)
            step, argument = (chrome if args.case == "chrome" else analysis), Path(folder)
        elif args.case == "sizes":
            step, argument = sizes, args.files
        else:  # the event file is the input, made before the step
            step = darshan if args.case == "darshan" else darshan_in_memory
            argument = made_in_child(Path(folder), args.files, args.ranks)
        before = peak_mib()
        started = time.perf_counter()
        made = step(argument)
        seconds = time.perf_counter() - started
    print(json.dumps({"case": args.case, "files": args.files, "ranks": args.ranks, "peak_before_mib": round(before, 1),
                      "peak_mib": round(peak_mib(), 1), "seconds": round(seconds, 2), "made": made}))


if __name__ == "__main__":
    main()
