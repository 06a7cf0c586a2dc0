"""Helpers shared by the side-by-side benchmarks in this folder.

The benchmarks compare dlio_ckpt with a reference tool (fio, the DLIO benchmark) on the same bytes,
block size and parallelism. They run on a small shared machine where other work competes for the
two cores and the disk, so nothing here asserts a time: each script alternates the two tools
A, B, A, B, ... in one process, takes medians, and reports the ratio of medians (plus the
per-pair ratios, to show the spread). Every figure is parsed from the tools' own machine-readable
output (summary.json, fio --output-format=json), never scraped from a human table.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"
MIB = 1 << 20
GIB = 1 << 30


def tool(name: str) -> str:
    """A command from the project's venv when it is there, else from PATH."""
    candidate = VENV_BIN / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if not found:
        sys.exit(f"{name} not found: install the project (pip install -e .) or put {name} on PATH")
    return found


def parse_size(text: str) -> int:
    """'1MiB', '64M', '4096', '1GiB' -> bytes (binary units, as dlio_ckpt and fio use them)."""
    t = str(text).strip()
    units = {"kib": 1 << 10, "k": 1 << 10, "mib": MIB, "m": MIB, "gib": GIB, "g": GIB, "b": 1}
    for suffix in sorted(units, key=len, reverse=True):
        if t.lower().endswith(suffix):
            return int(float(t[: -len(suffix)]) * units[suffix])
    return int(t)


def human(nbytes: int) -> str:
    """Bytes as dlio_ckpt/fio accept them on a command line (exact, binary units)."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return str(nbytes)


def fio_size(nbytes: int) -> str:
    """fio reads 'M' as 2^20 by default (kb_base=1024)."""
    for unit, size in (("g", GIB), ("m", MIB), ("k", 1 << 10)):
        if nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return str(nbytes)


def median(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def run(cmd: Sequence[str], *, cwd: str | None = None, env: dict | None = None, log: Path | None = None,
        timeout: float | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run a command, capture its output, return it with the wall seconds it took.

    A failing command stops the benchmark with its output shown: a ratio computed from a half
    failed run would be worse than none.
    """
    start = time.perf_counter()
    proc = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if log is not None:
        with open(log, "a") as out:
            out.write(f"$ {' '.join(cmd)}\n# rc={proc.returncode} wall={wall:.3f}s\n{proc.stdout}\n{proc.stderr}\n")
    if proc.returncode != 0:
        sys.stderr.write(f"command failed (rc={proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n")
        raise SystemExit(1)
    return proc, wall


# Seconds to wait, after deleting one tool's files and a sync, before the other tool writes.
# This VM's balloon driver reports freed pages to the host (virtio-balloon free page reporting),
# which discards them, so a page freed seconds ago costs a host-side fault when it is next written.
# Measured here (benchmarks/README.md, issue 14): 768 MiB of 4 MiB pwrites with fsync ran at
# ~1,350 MiB/s right after 1.5 GiB of files were deleted, ~830 after 1 s, 370-600 after 2-8 s.
# fio starts within ~50 ms of the previous run's clean-up, dlio_ckpt after ~1-2 s of interpreter
# and mpirun start-up, so without an equal pause fio wrote into warm pages and dlio_ckpt into cold
# ones, and the ratio measured the balloon, not the emulator.
SETTLE_S = 10.0


def settle(pause_s: float = SETTLE_S) -> None:
    """Flush what the previous run left (deletions, discards), then wait until freed pages have
    been reported to the host, so each tool starts writing in the same state (SETTLE_S)."""
    os.sync()
    time.sleep(pause_s)


def load_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def fio_version() -> str:
    try:
        return subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:
        return "missing"


def git_commit() -> str:
    """Read-only: the commit the benchmark ran from, and whether the tree had local changes."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
        return head + ("+local-changes" if dirty else "")
    except FileNotFoundError:
        return "unknown"


def environment(path_for_fs: str) -> dict:
    """What the figures depend on: the machine, the file system under the data, the tools."""
    info: dict[str, Any] = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "fio": fio_version(),
        "dlio_ckpt_commit": git_commit(),
    }
    try:
        with open("/proc/meminfo") as f:
            mem = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        info["mem_total_bytes"] = mem.get("MemTotal")
        info["mem_available_bytes"] = mem.get("MemAvailable")
    except OSError:
        pass
    try:
        out = subprocess.run(["df", "--output=source,fstype,target", path_for_fs], capture_output=True, text=True).stdout.split("\n")[1].split()
        info["filesystem"] = {"device": out[0], "type": out[1], "mount": out[2]}
    except (IndexError, FileNotFoundError):
        pass
    try:
        info["loadavg_at_start"] = os.getloadavg()
    except OSError:
        pass
    return info


def resident_bytes(paths: Sequence[str]) -> int | None:
    """Bytes of these files in the page cache (util-linux fincore), or None when unavailable."""
    if not shutil.which("fincore") or not paths:
        return None
    total = 0
    for start in range(0, len(paths), 200):
        proc = subprocess.run(["fincore", "--bytes", "--noheadings", "--output=RES", *paths[start:start + 200]],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            return None
        total += sum(int(x) for x in proc.stdout.split())
    return total


class Workdir:
    """A temporary folder for one benchmark's data, removed at the end unless --keep."""

    def __init__(self, parent: str | None, keep: bool, prefix: str) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        self.keep = keep

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc) -> None:
        if self.keep:
            print(f"kept {self.path}")
        else:
            shutil.rmtree(self.path, ignore_errors=True)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])
