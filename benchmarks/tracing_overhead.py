"""Tracing overhead: the same read workload through PosixStorage and through TracedStorage.

Every storage call of a run goes through the tracing wrapper, so its cost per call is what
matters. The workload reads page-cached files with explicit offsets (no device time to hide
behind, the worst case for a wrapper), in small and large transfers, alternating untraced and
traced passes so drift on a shared machine hits both; the ratio reported is traced / untraced
wall time (median over passes).

    python benchmarks/tracing_overhead.py [--files 32] [--file-mib 1] [--transfer 4096,1048576] [--passes 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from dlio_ckpt.storage.events import EventRecorder, JobClock
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.traced import TracedStorage


def make_files(folder: Path, count: int, size: int) -> list[str]:
    paths = []
    block = os.urandom(size)
    for index in range(count):
        path = folder / f"f{index:04d}.bin"
        path.write_bytes(block)
        paths.append(str(path))
    return paths


def read_all(storage, paths: list[str], size: int, transfer: int) -> int:
    """Open, read every transfer-sized piece at its offset into one buffer, close: per file."""
    buffer = memoryview(bytearray(transfer))
    moved = 0
    for path in paths:
        handle = storage.open_read(path)
        try:
            for offset in range(0, size, transfer):
                moved += handle.read_at_into(buffer[: min(transfer, size - offset)], offset)
        finally:
            handle.close()
    return moved


def measure(paths: list[str], size: int, transfer: int, passes: int) -> dict:
    plain = PosixStorage()
    untraced, traced, calls = [], [], 0
    read_all(plain, paths, size, transfer)  # warm the page cache
    for _ in range(passes):
        start = time.perf_counter()
        read_all(plain, paths, size, transfer)
        untraced.append(time.perf_counter() - start)
        recorder = EventRecorder(rank=0, clock=JobClock.start())
        storage = TracedStorage(plain, recorder)
        start = time.perf_counter()
        read_all(storage, paths, size, transfer)
        traced.append(time.perf_counter() - start)
        calls = len(recorder.array())
    base, wrapped = statistics.median(untraced), statistics.median(traced)
    return {"transfer_bytes": transfer, "events_per_pass": calls, "untraced_s": round(base, 6),
            "traced_s": round(wrapped, 6), "ratio": round(wrapped / base, 4),
            "overhead_us_per_event": round((wrapped - base) / max(calls, 1) * 1e6, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=32)
    parser.add_argument("--file-mib", type=float, default=1.0)
    parser.add_argument("--transfer", default="4096,1048576", help="comma-separated transfer sizes in bytes")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--out", default=None, help="also write the JSON here, with the machine and the commit")
    args = parser.parse_args()
    size = int(args.file_mib * (1 << 20))
    with tempfile.TemporaryDirectory(prefix="dlio_ckpt_overhead_") as folder:
        paths = make_files(Path(folder), args.files, size)
        results = [measure(paths, size, int(t), args.passes) for t in args.transfer.split(",")]
    report = {"files": args.files, "file_bytes": size, "passes": args.passes, "results": results}
    print(json.dumps(report, indent=2))
    if args.out:
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _common import environment, write_json

        write_json(Path(args.out), {"environment": environment(tempfile.gettempdir()), **report})


if __name__ == "__main__":
    main()
