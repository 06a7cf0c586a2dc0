"""Tracing: cache lines per file, counted rather than timed, for 1 MiB files read once each.

Why: at one 1 MiB read per file the tracer's cost is ~1 us against ~60 us of copying, below what
timing resolves on a shared machine (tracing_overhead.py's A/A control moves by more). The cost
is in cache lines: each read's copy evicts the core's 1 MiB L2, so every line of code and data the
tracer touches afterwards, and every line it touches once per file, comes from further away.
Cachegrind counts them exactly and the same every run.

How: cachegrind simulates the caches of user space only, so the kernel's copy in pread would leave
them warm. A small preloaded shim (compiled here with gcc) writes one byte per line of 2 MiB after
every pread-family call, which evicts the simulated 1 MiB last-level cache (this machine's L2)
as the copy does. Each contender runs under cachegrind with 2 and with 6 passes over 64 files
(PYTHONHASHSEED=0, address randomisation off); the difference, over 4 * 64 files, is the cost
per file with start-up and set-up cancelled. Reported: misses of that last level per file beyond
the shim's own 32,768 (traced and untraced, so the tracer's own is their difference), and the
functions whose misses differ most between traced and untraced.

    python benchmarks/tracing_cache_lines.py [--tree OTHER_CHECKOUT] [--out results/x.json]

--tree also counts the traced and untraced passes of another checkout of dlio_ckpt (an older
commit in a git worktree, its C extension built in place), for a before/after in one run. Needs
valgrind and gcc (apt-get install -y valgrind gcc).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES, FEW, MANY = 64, 2, 6
FOOTPRINT_LINES = (2 << 20) // 64  # the shim's writes, each a miss

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/uio.h>
#include <unistd.h>
static volatile char area[2 << 20];
static void footprint(void) { for (size_t i = 0; i < sizeof area; i += 64) area[i] = 1; }
ssize_t pread64(int fd, void *buf, size_t n, off_t off) {
    static ssize_t (*real)(int, void *, size_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "pread64");
    ssize_t r = real(fd, buf, n, off); footprint(); return r; }
ssize_t pread(int fd, void *buf, size_t n, off_t off) { return pread64(fd, buf, n, off); }
ssize_t preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    static ssize_t (*real)(int, const struct iovec *, int, off_t, int);
    if (!real) real = dlsym(RTLD_NEXT, "preadv2");
    ssize_t r = real(fd, iov, cnt, off, flags); footprint(); return r; }
ssize_t preadv64v2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) { return preadv2(fd, iov, cnt, off, flags); }
ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off) { return preadv2(fd, iov, cnt, off, 0); }
ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off_t off) { return preadv2(fd, iov, cnt, off, 0); }
"""

# The workload: tracing_overhead.py's read_all over FILES 1 MiB files, one 1 MiB read each.
WORKLOAD = r"""
import sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from tracing_overhead import MIB, make_files, read_all
import dlio_ckpt
print(dlio_ckpt.__file__)
from dlio_ckpt.storage.events import EventRecorder, JobClock
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.traced import TracedStorage
traced, passes = sys.argv[1] == "traced", int(sys.argv[2])
with tempfile.TemporaryDirectory(prefix="dlio_ckpt_lines_") as folder:
    paths = make_files(Path(folder), "s", int(sys.argv[4]), MIB)
    plain = PosixStorage()
    read_all(plain, paths, MIB, MIB)
    for _ in range(passes):
        recorder = EventRecorder(rank=0, clock=JobClock.start())
        read_all(TracedStorage(plain, recorder) if traced else plain, paths, MIB, MIB)
        recorder.array()
"""


def per_function(path: Path) -> dict[tuple[str, str], int]:
    """Last-level misses (instruction and data) per (file, function) of a cachegrind output."""
    totals: dict[tuple[str, str], int] = collections.defaultdict(int)
    misses: list[int] = []  # the columns of last-level misses, from the `events:` header
    file = function = ""
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
            misses = [names.index(name) for name in ("ILmr", "DLmr", "DLmw")]
        elif line.startswith("fl="):
            file = line[3:].rsplit("/", 1)[-1]
        elif line.startswith("fn="):
            function = line[3:]
        elif line[:1].isdigit() and misses:
            counts = line.split()[1:]  # trailing zero columns may be left out
            totals[(file, function)] += sum(int(counts[i]) for i in misses if i < len(counts))
    return totals


def count(shim: Path, folder: Path, tree: str | None, mode: str, passes: int) -> tuple[dict[tuple[str, str], int], str]:
    """Per-function misses of one run, and the dlio_ckpt package it imported."""
    out = folder / f"{Path(tree or 'this').name}-{mode}-{passes}.cg"
    env = {**os.environ, "PYTHONHASHSEED": "0", "LD_PRELOAD": str(shim)}
    if tree:
        env["PYTHONPATH"] = tree
    command = ["setarch", "-R", "valgrind", "--tool=cachegrind", "--cache-sim=yes", "--LL=1048576,16,64",
               f"--cachegrind-out-file={out}", sys.executable, "-c", WORKLOAD, mode, str(passes),
               str(Path(tree) / "benchmarks" if tree else HERE), str(FILES)]
    # run from the scratch folder: `python -c` puts the working directory first on sys.path, where
    # a checkout would shadow the one asked for
    done = subprocess.run(command, env=env, check=True, capture_output=True, cwd=folder, text=True)
    return per_function(out), str(Path(done.stdout.split()[0]).parent)


def measure(shim: Path, folder: Path, tree: str | None) -> dict:
    """Per-file misses of the untraced and traced passes of one checkout, and the functions
    whose per-file misses differ most between them."""
    jobs = [(mode, passes) for mode in ("untraced", "traced") for passes in (FEW, MANY)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(zip(jobs, pool.map(lambda job: count(shim, folder, tree, *job), jobs)))
    packages = {package for _, package in runs.values()}
    assert len(packages) == 1, packages
    results = {job: totals for job, (totals, _) in runs.items()}
    files = FILES * (MANY - FEW)
    per_file = {mode: {key: (results[(mode, MANY)].get(key, 0) - results[(mode, FEW)].get(key, 0)) / files
                       for key in set(results[(mode, MANY)]) | set(results[(mode, FEW)])}
                for mode in ("untraced", "traced")}
    total = {mode: sum(values.values()) - FOOTPRINT_LINES for mode, values in per_file.items()}
    keys = set(per_file["untraced"]) | set(per_file["traced"])
    differences = sorted(((per_file["traced"].get(key, 0) - per_file["untraced"].get(key, 0), key) for key in keys),
                         key=lambda item: -abs(item[0]))
    # the shim's writes show as its pread64 (the C tracer's call) against its preadv2 (os.preadv's)
    top = [{"function": key[1], "file": key[0], "lines_per_file": round(diff, 2)} for diff, key in differences
           if abs(diff) >= 1.5 and abs(diff) < FOOTPRINT_LINES / 2][:20]
    return {"package": packages.pop(), "untraced_lines_per_file": round(total["untraced"], 1),
            "traced_lines_per_file": round(total["traced"], 1),
            "tracer_lines_per_file": round(total["traced"] - total["untraced"], 1), "by_function": top}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", help="another checkout of dlio_ckpt to count as well (before/after)")
    parser.add_argument("--out", help="also write the JSON here, with the machine and the commit")
    args = parser.parse_args()
    for needed in ("valgrind", "gcc", "setarch"):
        if shutil.which(needed) is None:
            sys.exit(f"{needed} not found: apt-get install -y valgrind gcc (setarch is in util-linux)")
    with tempfile.TemporaryDirectory(prefix="dlio_ckpt_cachegrind_") as folder:
        folder = Path(folder)
        (folder / "shim.c").write_text(SHIM)
        subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-o", folder / "shim.so", folder / "shim.c", "-ldl"], check=True)
        results = [measure(folder / "shim.so", folder, None)]
        if args.tree:
            results.append(measure(folder / "shim.so", folder, str(Path(args.tree).resolve())))
    report = {"files": FILES, "passes": [FEW, MANY], "simulated_last_level": "1 MiB, 16-way, 64 B lines",
              "results": results}
    print(json.dumps(report, indent=2))
    for result in results:
        print(f"{result['package']}: untraced {result['untraced_lines_per_file']:.0f} lines a file, traced "
              f"{result['traced_lines_per_file']:.0f}: the tracer's {result['tracer_lines_per_file']:+.0f}")
    if args.out:
        sys.path.insert(0, str(HERE))
        from _common import environment, write_json

        write_json(Path(args.out), {"environment": environment(tempfile.gettempdir()), **report})


if __name__ == "__main__":
    main()
