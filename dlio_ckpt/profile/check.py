"""`--check`: run the profiled workload at the log's rank count and put its figures beside the log's.

The emulation runs in a temporary storage root (its dataset generated first, untraced), traced by
dlio_ckpt's own Darshan writer (trace.darshan=true), and its log is summed by the same function as
the real program's (figures.py), with the emulation's own folders as the roots: so both columns
are counted alike. Rows: per file class the bytes and calls, then the checkpoint count and bytes
per save (the saves summary.json counts; the bytes of the emulated log's checkpoint class over
them, coordinator files and tags included, as the log's saves count them) and compute per step (the log's inferred value beside the emulated run's measured one).
A failed emulation is a run-time failure: one line, exit 1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dlio_ckpt.errors import UserError
from dlio_ckpt.profile.classify import classify
from dlio_ckpt.profile.figures import class_figures
from dlio_ckpt.profile.profile import Profile
from dlio_ckpt.profile.records import load_job

ROWS = (("dataset", "bytes_read"), ("dataset", "reads"), ("dataset", "opens"), ("dataset", "seeks"),
        ("checkpoint", "bytes_written"), ("checkpoint", "writes"), ("checkpoint", "opens"),
        ("checkpoint", "reads"), ("checkpoint", "bytes_read"),
        ("checkpoint", "fsyncs"), ("checkpoint", "renames"), ("other", "bytes_read"), ("other", "bytes_written"))


class CheckFailed(RuntimeError):
    """The emulated run failed; the message is one line."""


@dataclass
class Row:
    name: str
    log: float
    emulated: float

    @property
    def ratio(self) -> float | None:
        if self.log == self.emulated:
            return 1.0
        return self.emulated / self.log if self.log else None


def _commands(workload: Path, root: Path, run: Path, ranks: int) -> tuple[list[str], list[str]]:
    base = [sys.executable, "-m", "dlio_ckpt", f"workload={workload}", f"storage.root={root}", "progress=false"]
    generate = base + [f"hydra.run.dir={run}-generate", "mode=generate", "trace.events=false"]
    train = base + [f"hydra.run.dir={run}", "trace.darshan=true"]
    if ranks > 1:
        mpirun = shutil.which("mpirun", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        if not mpirun:
            raise UserError(f"--check: the log has {ranks} ranks and mpirun is not on PATH; install an MPI or drop --check")
        train = [mpirun, "-np", str(ranks), *train]
    return generate, train


def _run(cmd: list[str], timeout: float) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # never the real runtime's: our own log
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-1:])
        raise CheckFailed(f"the emulated run failed (rc={proc.returncode}): {tail}")


def run_check(profile: Profile, workload: Path, timeout: float = 600.0, keep: Path | None = None) -> list[Row]:
    """Run the workload and return the table's rows."""
    ranks = profile.dataset.ranks
    work = Path(tempfile.mkdtemp(prefix="dlio_ckpt-profile-check-", dir=keep))
    try:
        root, run = work / "storage", work / "run"
        generate, train = _commands(workload, root, run, ranks)
        _run(generate, timeout)
        _run(train, timeout)
        logs = sorted(run.glob("*.darshan"))
        if not logs:
            raise CheckFailed(f"the emulated run wrote no Darshan log in {run}")
        job = load_job(logs)
        roles = classify(job, str(root / "data"), str(root / "checkpoints"))
        figures = class_figures(job, roles)
        summary = json.loads((run / "summary.json").read_text())
        train_summary = summary.get("train", {})
        steps = max(int(train_summary.get("steps", 0)), 1)
        emulated_compute = float(train_summary.get("compute_s", 0.0)) / steps
        ckpt = summary.get("checkpoint") or {}
        saves = int(ckpt.get("writes", 0) or 0)
        # counted as the log's per-save figure is: every checkpoint-class byte of the save, its
        # coordinator files and tag too (summary.json's total_bytes_written has the data files only)
        per_save = int(figures["checkpoint"].bytes_written) // saves if saves else 0
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    rows = [Row(f"{cls} {key}", getattr(profile.figures[cls], key), getattr(figures[cls], key)) for cls, key in ROWS]
    rows.append(Row("checkpoints (saves)", len(profile.checkpoint.saves), saves))
    # the log's likewise: its checkpoint bytes over its saves (saves can differ: CheckpointManager's
    # state file lists one checkpoint more each save, so the largest save is not the typical one)
    logged = len(profile.checkpoint.saves)
    rows.append(Row("checkpoint bytes per save", int(profile.figures["checkpoint"].bytes_written) // logged if logged else 0,
                    per_save))
    rows.append(Row("compute per step (s)", profile.compute_s or 0.0, emulated_compute))
    return rows


def table(rows: list[Row]) -> str:
    width = max(len(r.name) for r in rows)
    lines = [f"{'figure':<{width}}  {'log':>14}  {'emulated':>14}  {'emulated/log':>12}"]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f}"
        fmt = (lambda v: f"{v:,.4f}") if isinstance(r.log, float) and not float(r.log).is_integer() or "(s)" in r.name \
            else (lambda v: f"{int(v):,}")
        lines.append(f"{r.name:<{width}}  {fmt(r.log):>14}  {fmt(r.emulated):>14}  {ratio:>12}")
    return "\n".join(lines)
