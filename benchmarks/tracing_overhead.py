"""Tracing overhead: the same read workload through PosixStorage and through TracedStorage.

Every storage call of a run is traced (TracedStorage; a POSIX handle records its own events), so
the tracer's cost per call is what matters. The workload reads page-cached files with explicit
offsets (no device time to hide behind, the worst case for a tracer), alternating untraced and traced passes so drift on a
shared machine hits both. Each pass opens every file, reads it in transfer-sized calls at their
offsets into one buffer, and closes it, so a traced pass records an open, the reads and a close
per file (a 1 MiB file read in one call is three events); the traced pass ends with the
recorder's `array()`, the conversion every run makes before saving its events.

Cases (transfer in file size): 4 KiB reads of 1 MiB files, 1 MiB reads of 1 MiB files (one read
per file: open and close weigh as much as the read), and 1 MiB reads of 32 MiB files (the read
benchmark's dataset shape). Reported per case: traced / untraced wall time and CPU time
(user + sys of this process, which other work on the machine distorts less), as the ratio of the
medians and the range of the per-pass ratios, and the tracer's CPU cost per event; plus a bare
`os.preadv` loop (no Python file object at all) as the floor of a read call, and an A/A control:
the untraced pass run a second time as a contender of its own (`aa_*`), the ratio an unchanged
pass shows on this machine, to read the traced ratio against.

    python benchmarks/tracing_overhead.py [--files 256] [--passes 15] [--out results/tracing_overhead.json]
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

MIB = 1 << 20


def make_files(folder: Path, prefix: str, count: int, size: int) -> list[str]:
    paths = []
    block = os.urandom(size)
    for index in range(count):
        path = folder / f"{prefix}{index:04d}.bin"
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


def read_bare(paths: list[str], size: int, transfer: int) -> int:
    """The floor: os.open, os.preadv per piece, os.close; no Python file object."""
    buffer = memoryview(bytearray(transfer))
    moved = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            for offset in range(0, size, transfer):
                moved += os.preadv(fd, [buffer[: min(transfer, size - offset)]], offset)
        finally:
            os.close(fd)
    return moved


def timed(call) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    moved = call()
    return time.perf_counter() - wall, time.process_time() - cpu, moved


def measure(paths: list[str], size: int, transfer: int, passes: int) -> dict:
    plain = PosixStorage()
    expected = len(paths) * size
    runs: dict[str, list[tuple[float, float]]] = {"untraced": [], "traced": [], "bare": [], "again": []}
    read_all(plain, paths, size, transfer)  # warm the page cache
    events = 0
    for index in range(passes):
        recorder = EventRecorder(rank=0, clock=JobClock.start())
        traced = TracedStorage(plain, recorder)
        saved = []

        def traced_pass() -> int:
            moved = read_all(traced, paths, size, transfer)
            saved.append(recorder.array())  # what a run saves at its end: that conversion counts too
            return moved

        contenders = [("untraced", lambda: read_all(plain, paths, size, transfer)), ("traced", traced_pass),
                      ("bare", lambda: read_bare(paths, size, transfer)),
                      ("again", lambda: read_all(plain, paths, size, transfer))]
        for name, call in (contenders if index % 2 == 0 else contenders[::-1]):
            wall, cpu, moved = timed(call)
            assert moved == expected, (name, moved, expected)
            runs[name].append((wall, cpu))
        events = len(saved[0])
        assert int(saved[0]["length"].sum()) == expected and events == len(paths) * (2 + -(-size // transfer))
    med = {name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for name, r in runs.items()}
    per_pass_wall = [t[0] / u[0] for t, u in zip(runs["traced"], runs["untraced"])]
    per_pass_cpu = [t[1] / u[1] for t, u in zip(runs["traced"], runs["untraced"])]
    per_pass_aa = [a[1] / u[1] for a, u in zip(runs["again"], runs["untraced"])]
    return {
        "transfer_bytes": transfer, "file_bytes": size, "files": len(paths), "events_per_pass": events,
        "untraced_s": round(med["untraced"][0], 6), "traced_s": round(med["traced"][0], 6), "bare_s": round(med["bare"][0], 6),
        "untraced_cpu_s": round(med["untraced"][1], 6), "traced_cpu_s": round(med["traced"][1], 6),
        "bare_cpu_s": round(med["bare"][1], 6),
        "ratio": round(med["traced"][0] / med["untraced"][0], 4),
        "ratio_cpu": round(med["traced"][1] / med["untraced"][1], 4),
        "ratio_range": [round(min(per_pass_wall), 4), round(max(per_pass_wall), 4)],
        "ratio_cpu_range": [round(min(per_pass_cpu), 4), round(max(per_pass_cpu), 4)],
        "ratio_traced_to_bare_cpu": round(med["traced"][1] / med["bare"][1], 4),
        "aa_ratio": round(med["again"][0] / med["untraced"][0], 4),
        "aa_ratio_cpu": round(med["again"][1] / med["untraced"][1], 4),
        "aa_ratio_cpu_range": [round(min(per_pass_aa), 4), round(max(per_pass_aa), 4)],
        "overhead_cpu_us_per_event": round((med["traced"][1] - med["untraced"][1]) / max(events, 1) * 1e6, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=256, help="1 MiB files of the first two cases")
    parser.add_argument("--large-file-mib", type=int, default=32, help="file size of the third case (same bytes)")
    parser.add_argument("--passes", type=int, default=15)
    parser.add_argument("--out", default=None, help="also write the JSON here, with the machine and the commit")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dlio_ckpt_overhead_") as folder:
        small = make_files(Path(folder), "s", args.files, MIB)
        large = make_files(Path(folder), "l", max(args.files // args.large_file_mib, 1), args.large_file_mib * MIB)
        results = [measure(small, MIB, 4096, args.passes), measure(small, MIB, MIB, args.passes),
                   measure(large, args.large_file_mib * MIB, MIB, args.passes)]
    report = {"passes": args.passes, "results": results}
    print(json.dumps(report, indent=2))
    for r in results:
        print(f"{r['transfer_bytes'] // 1024} KiB reads of {r['file_bytes'] // MIB} MiB files: traced/untraced wall "
              f"{r['ratio']:.3f} ({r['ratio_range'][0]:.2f}..{r['ratio_range'][1]:.2f}), CPU {r['ratio_cpu']:.3f} "
              f"({r['ratio_cpu_range'][0]:.2f}..{r['ratio_cpu_range'][1]:.2f}); {r['overhead_cpu_us_per_event']:.3f} us CPU "
              f"an event; traced / bare preadv CPU {r['ratio_traced_to_bare_cpu']:.2f}; A/A control CPU {r['aa_ratio_cpu']:.3f} "
              f"({r['aa_ratio_cpu_range'][0]:.2f}..{r['aa_ratio_cpu_range'][1]:.2f})")
    if args.out:
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _common import environment, write_json

        write_json(Path(args.out), {"environment": environment(tempfile.gettempdir()), **report})


if __name__ == "__main__":
    main()
