"""Each reference program beside its emulation: the I/O both issue (strace) and the times both take.

    .venv/bin/python benchmarks/realapps/fidelity.py [--programs pytorch_cnn,ddp_dcp,keras_tfdata]
        [--size tiny|small] [--repeats 3] [--json benchmarks/results/realapps_fidelity.json]

For each program (programs.py): dlio_ckpt generates the dataset both read (untraced); then
1. counts: the real program and its emulation run once each under strace (strace_io.py), and
   per file class (dataset, checkpoint, other) the calls, bytes, size histograms, fsyncs,
   renames and unlinks are compared, emulated / real;
2. times: untraced, real and emulated alternate `--repeats` times (a tracer would distort them);
   each emulated run takes train.computation_time from the real run just before it (its
   compute seconds per step: what docs/fidelity.md says computation_time must hold), and the
   medians of checkpoint seconds per save, data-wait seconds and loop wall seconds are compared.
Real figures come from the program's own --metrics JSON (its loop timed as the framework's
examples time it), emulated ones from summary.json. No time is asserted anywhere: the tests
(tests/test_realapps_fidelity.py) assert the counts only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from programs import PROGRAMS, Program, Size  # noqa: E402
from strace_io import CLASSES, Classifier, strace_available, strace_command, tally  # noqa: E402

COUNT_KEYS = ("opens", "reads", "writes", "seeks", "fsyncs", "renames", "unlinks", "bytes_read", "bytes_written")


class CommandFailed(RuntimeError):
    pass


def run(cmd: list[str], log: Path, timeout: float) -> float:
    """Run a command, its output appended to `log`; the wall seconds, or CommandFailed with the tail."""
    start = time.perf_counter()
    # its own process group: on a timeout every process it started (torchrun's workers, MPI
    # ranks, DataLoader workers) is killed with it, not only the first
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise CommandFailed(f"timed out after {timeout:.0f} s: {' '.join(cmd)}\n{stderr[-3000:]}") from None
    wall = time.perf_counter() - start
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n# rc={proc.returncode} wall={wall:.3f}s\n{stdout}\n{stderr}\n")
    if proc.returncode != 0:
        raise CommandFailed(f"rc={proc.returncode}: {' '.join(cmd)}\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return wall


def ratio(emulated: float, real: float) -> float | None:
    """emulated / real; 1.0 when both are 0; None when only the emulation has any."""
    if emulated == real:
        return 1.0
    return emulated / real if real else None


class Bench:
    """One program's working folders: storage root (dataset, both sides' checkpoints), runs, traces."""

    def __init__(self, program: Program, size: Size, workdir: Path, timeout: float) -> None:
        self.program, self.size, self.timeout = program, size, timeout
        self.storage = workdir / "storage"
        self.runs = workdir / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        self.log = self.runs / "commands.log"
        self.data = self.storage / "data" / program.name
        self.real_checkpoints = self.storage / "real_checkpoints"
        self.classifier = Classifier(str(self.storage), str(self.data), program.dataset_ext,
                                     (str(self.real_checkpoints), str(self.storage / "checkpoints")))
        self.count = 0

    def _fresh(self, name: str) -> Path:
        self.count += 1
        return self.runs / f"{self.count:02d}-{name}"

    def _clear_checkpoints(self) -> None:
        shutil.rmtree(self.real_checkpoints, ignore_errors=True)
        shutil.rmtree(self.storage / "checkpoints", ignore_errors=True)

    def generate(self) -> None:
        run(self.program.generate_command(self.storage, self._fresh("generate"), self.size), self.log, self.timeout)

    def real(self, traced: bool) -> dict:
        folder = self._fresh("real")
        folder.mkdir()
        cmd = self.program.real_command(self.data, self.real_checkpoints, self.size, folder / "metrics.json")
        if traced:
            cmd = strace_command(folder / "trace", cmd)
        self._clear_checkpoints()
        run(cmd, self.log, self.timeout)
        result = {"metrics": json.loads((folder / "metrics.json").read_text())}
        if traced:
            result["io"] = self._io(folder)
        self._clear_checkpoints()
        return result

    def emulated(self, traced: bool, compute_s: float) -> dict:
        folder = self._fresh("emulated")
        folder.mkdir()
        cmd = self.program.emulation_command(self.storage, folder / "run", self.size, compute_s)
        if traced:
            cmd = strace_command(folder / "trace", cmd)
        self._clear_checkpoints()
        run(cmd, self.log, self.timeout)
        summary = json.loads((folder / "run" / "summary.json").read_text())
        result = {"metrics": emulated_metrics(summary)}
        if traced:
            result["io"] = self._io(folder)
        self._clear_checkpoints()
        return result

    def _io(self, folder: Path) -> dict:
        tallies = tally(sorted(folder.glob("trace.*")), self.classifier)
        return {cls: tallies[cls].as_dict() for cls in CLASSES}


def emulated_metrics(summary: dict) -> dict:
    """The emulation's figures named as the real programs' --metrics names them.

    checkpoint_s is the save call as the program makes it: blocking_s_max less prepare_s_max,
    the emulator assembling whole tensors in memory before a torch/TF save, which a program
    already holds (docs/checkpointing.md, Durability); blocking_s keeps it, and is kept too
    (checkpoint_blocking_s: what the emulated loop lost, prepare included). checkpoint_s includes
    the framework's work before the bytes (checkpoint_framework_s: checkpoint.framework_cpu_s,
    DCP's storage setup and plan exchange; docs/fidelity.md)."""
    train, ckpt = summary["train"], summary.get("checkpoint", {})
    saves = ckpt.get("per_checkpoint", [])
    return {"steps": train["steps"], "wall_s": train["wall_s"], "data_wait_s": train["data_wait_s"],
            "compute_s": train["compute_s"], "sync_wait_s": train.get("sync_wait_s", 0.0),
            "checkpoint_s": [c["blocking_s_max"] - c.get("prepare_s_max", 0.0) for c in saves],
            "checkpoint_blocking_s": [c["blocking_s_max"] for c in saves],
            "checkpoint_framework_s": [c.get("framework_s_max", 0.0) for c in saves],
            "checkpoint_cpu_s": [c.get("cpu_s_max", 0.0) for c in saves]}


def compare_counts(real_io: dict, emulated_io: dict, saves: int) -> dict:
    out = {}
    for cls in CLASSES:
        r, e = real_io[cls], emulated_io[cls]
        out[cls] = {k: ratio(e[k], r[k]) for k in COUNT_KEYS}
    out["checkpoint_bytes_per_save"] = {"real": real_io["checkpoint"]["bytes_written"] / saves,
                                        "emulated": emulated_io["checkpoint"]["bytes_written"] / saves}
    return out


def compare_times(reals: list[dict], emus: list[dict]) -> dict:
    """Medians over the alternating repeats, emulated / real. Both sides run the same epochs, so
    the wall ratio is the wall-per-epoch ratio."""
    def med(runs, key):
        values = [statistics.median(r[key]) if isinstance(r[key], list) else r[key] for r in runs if r[key] != []]
        return statistics.median(values) if values else float("nan")

    rows = (("checkpoint_s", "checkpoint_s", "checkpoint_s_per_save"),
            ("checkpoint_s", "checkpoint_blocking_s", "checkpoint_blocking_s_per_save"),
            ("checkpoint_cpu_s", "checkpoint_cpu_s", "checkpoint_cpu_s_per_save"),
            ("data_wait_s", "data_wait_s", "data_wait_s"), ("wall_s", "wall_s", "wall_s"))
    out = {}
    for real_key, emu_key, label in rows:
        if not all(emu_key in e for e in emus) or not all(real_key in r for r in reals):
            continue
        r, e = med(reals, real_key), med(emus, emu_key)
        out[label] = {"real": r, "emulated": e, "ratio": e / r if r else None}
    return out


def measure(program: Program, size_name: str, workdir: Path, repeats: int, trace: bool = True,
            timeout: float = 600.0) -> dict:
    """Counts (traced, once each) and times (untraced, alternating) of one program and its emulation."""
    size = program.sizes[size_name]
    bench = Bench(program, size, workdir, timeout)
    bench.generate()
    result: dict = {"program": program.name, "size": size_name, "ranks": program.ranks, "sizes": vars(size)}
    if trace:
        real = bench.real(traced=True)
        emu = bench.emulated(traced=True, compute_s=0.0)
        result["io"] = {"real": real["io"], "emulated": emu["io"]}
        result["io_ratio"] = compare_counts(real["io"], emu["io"], size.epochs)
    reals, emus = [], []
    for _ in range(repeats):
        real = bench.real(traced=False)["metrics"]
        emus.append(bench.emulated(traced=False, compute_s=real["compute_s_per_step"])["metrics"])
        reals.append(real)
    if repeats:
        result["times"] = {"real": reals, "emulated": emus, "median": compare_times(reals, emus)}
    return result


def _fmt(value) -> str:
    if value is None:
        return "only emulated"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:,.3f}"
    return f"{value:,}"


def report(result: dict) -> str:
    lines = [f"{result['program']} ({result['size']}: {result['sizes']}, {result['ranks']} rank(s))",
             f"  {'':34s} {'real':>14s} {'emulated':>14s} {'emu/real':>14s}"]
    if "io" in result:
        real, emu = result["io"]["real"], result["io"]["emulated"]
        for cls in CLASSES:
            for key in COUNT_KEYS:
                if real[cls][key] or emu[cls][key]:
                    lines.append(f"  {cls + ' ' + key:34s} {_fmt(real[cls][key]):>14s} {_fmt(emu[cls][key]):>14s} "
                                 f"{_fmt(result['io_ratio'][cls][key]):>14s}")
            for key in ("read_sizes", "write_sizes"):
                if real[cls][key] or emu[cls][key]:
                    lines.append(f"  {cls + ' ' + key:34s} real {real[cls][key]}")
                    lines.append(f"  {'':34s} emu  {emu[cls][key]}")
        per_save = result["io_ratio"]["checkpoint_bytes_per_save"]
        lines.append(f"  {'checkpoint bytes per save':34s} {_fmt(per_save['real']):>14s} {_fmt(per_save['emulated']):>14s} "
                     f"{_fmt(ratio(per_save['emulated'], per_save['real'])):>14s}")
    if "times" in result:
        for key, row in result["times"]["median"].items():
            lines.append(f"  {key + ' (median)':34s} {_fmt(row['real']):>14s} {_fmt(row['emulated']):>14s} {_fmt(row['ratio']):>14s}")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--programs", default=",".join(PROGRAMS), help="comma-separated: " + ", ".join(PROGRAMS))
    p.add_argument("--size", default="small", choices=("tiny", "small"))
    p.add_argument("--repeats", type=int, default=3, help="alternating untraced runs of each side for the times")
    p.add_argument("--no-trace", action="store_true", help="times only")
    p.add_argument("--workdir", default=None, help="parent of the temporary folder (default: the system's)")
    p.add_argument("--keep", action="store_true", help="keep the data, checkpoints and traces")
    p.add_argument("--json", default=str(HERE.parent / "results" / "realapps_fidelity.json"))
    args = p.parse_args(argv)
    from _common import environment, write_json

    names = args.programs.split(",")
    for name in names:
        if name not in PROGRAMS:
            p.error(f"--programs: no program {name!r}; choose from {', '.join(PROGRAMS)}")
        try:
            __import__(PROGRAMS[name].needs)
        except ImportError:
            p.error(f"{name} needs {PROGRAMS[name].needs}: install it, or leave {name} out of --programs")
    if not args.no_trace and strace_available():
        p.error(f"{strace_available()}; or pass --no-trace for the times only")
    results = []
    for name in names:
        workdir = Path(tempfile.mkdtemp(prefix=f"realapps-{name}-", dir=args.workdir))
        try:
            result = measure(PROGRAMS[name], args.size, workdir, args.repeats, trace=not args.no_trace)
        finally:
            if args.keep:
                print(f"kept {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
        print(report(result), flush=True)
        results.append(result)
    write_json(Path(args.json), {"environment": environment(tempfile.gettempdir()), "size": args.size,
                                 "repeats": args.repeats, "programs": results})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
