"""Measure a reference program's framework work outside its checkpoint bytes: checkpoint.framework_cpu_s.

    .venv/bin/python benchmarks/realapps/framework_cpu.py [--programs pytorch_cnn,ddp_dcp,keras_tfdata]
        [--size tiny] [--runs 3]

A save call does work that does not depend on the checkpoint's bytes: it walks the program's
objects, plans, reads each variable out of its runtime; the emulator has no objects to walk
(dlio_ckpt/checkpoint/framework_work.py). This runs each real program as fidelity.py does (same
dataset, same arguments) and measures, on the saving thread (time.thread_time: CPU, which a busy
machine stretches far less than wall time), the CPU of each save as the program's loop times it
(LoopClock.save: the whole save statement) less the CPU inside the framework's byte work, the part
the emulator does for real:

- pytorch_cnn: torch.save (pickling, the zip records and their CRC-32s, the writes); what is left
  is the statement's `model.state_dict()` and `optimizer.state_dict()`;
- ddp_dcp: FileSystemWriter.write_data (each item torch.save'd into its `.distcp`, the fsyncs) and
  FileSystemWriter.finish (the pickled `.metadata`, its fsync and rename); what is left is
  `_storage_setup`, the program's Stateful.state_dict() (`get_state_dict`), the planner and the
  collectives' own CPU (the slowest rank's figure, as the save waits for it);
- keras_tfdata: SaveV2, MergeV2Checkpoints and the `checkpoint` state file's write; what is left
  is CheckpointManager's walk of the object graph, its proto, the reads of each variable, the
  save counter and the bookkeeping.

It prints, per program, the CPU seconds of each save and their mean over the saves after each
run's first: the value for the workload's `checkpoint.framework_cpu_s`. A first save costs more
(DCP imports its fsspec writer, TensorFlow runs its ops for the first time: 37-47 ms against 13-22
ms later), but the emulation's own first save pays the same kind of warm-up for real (DCP's
`_storage_setup`, TensorFlow's first SaveV2 and MergeV2Checkpoints), so the steady figure is the
one it lacks. The emulation counts what it does for real outside the bytes (DCP's storage setup
and plan exchange) against it and spends the rest as CPU work.

Run inside a real program (fidelity's command with this file as the script), it installs the
probe and runs the program's main.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

OUT_ENV = "DLIO_CKPT_FRAMEWORK_CPU_OUT"
PROGRAM_ENV = "DLIO_CKPT_FRAMEWORK_CPU_PROGRAM"


class ThreadCpu:
    """This thread's CPU seconds per save: in the loop's save block, and inside the byte work."""

    def __init__(self) -> None:
        self.depth = 0
        self.began = 0.0
        self.inside = 0.0
        self.saves: list[float] = []  # per save: the block's CPU less the byte work's

    def byte_work(self, function):
        def wrapped(*args, **kwargs):
            if self.depth == 0:
                self.began = time.thread_time()
            self.depth += 1
            try:
                return function(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.inside += time.thread_time() - self.began

        return wrapped

    def install_block(self) -> None:
        """Time LoopClock.save's block (what fidelity.py compares as checkpoint time) in CPU."""
        import contextlib

        import loop_clock

        original = loop_clock.LoopClock.save

        @contextlib.contextmanager
        def save(clock):
            began, self.inside = time.thread_time(), 0.0
            with original(clock):
                yield
            self.saves.append(time.thread_time() - began - self.inside)

        loop_clock.LoopClock.save = save


def _probe_pytorch(probe: ThreadCpu) -> None:
    import torch

    torch.save = probe.byte_work(torch.save)


def _probe_dcp(probe: ThreadCpu) -> None:
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    FileSystemWriter.write_data = probe.byte_work(FileSystemWriter.write_data)
    FileSystemWriter.finish = probe.byte_work(FileSystemWriter.finish)


def _probe_keras(probe: ThreadCpu) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tensorflow.python.lib.io import file_io
    from tensorflow.python.ops import gen_io_ops, io_ops

    io_ops.save_v2 = probe.byte_work(io_ops.save_v2)
    gen_io_ops.merge_v2_checkpoints = probe.byte_work(gen_io_ops.merge_v2_checkpoints)
    file_io.atomic_write_string_to_file = probe.byte_work(file_io.atomic_write_string_to_file)


PROBES = {"pytorch_cnn": (_probe_pytorch, "pytorch_cnn"), "ddp_dcp": (_probe_dcp, "ddp_dcp"),
          "keras_tfdata": (_probe_keras, "keras_tfdata")}


def _inside() -> None:
    """In the real program's process: probe, run its main, append this process's figures."""
    name = os.environ[PROGRAM_ENV]
    install, module = PROBES[name]
    probe = ThreadCpu()
    probe.install_block()
    install(probe)
    program = __import__(module)
    program.main(sys.argv[1:])
    with open(os.environ[OUT_ENV], "a") as out:
        out.write(json.dumps({"rank": int(os.environ.get("RANK", "0")), "saves": probe.saves}) + "\n")


def measure(name: str, size_name: str, runs: int, workdir: Path) -> dict:
    from fidelity import Bench, run
    from programs import PROGRAMS

    program = PROGRAMS[name]
    bench = Bench(program, program.sizes[size_name], workdir, timeout=600)
    bench.generate()
    out = workdir / "framework_cpu.jsonl"
    per_save: list[float] = []
    later: list[float] = []  # the saves after each run's first
    for number in range(runs):
        out.unlink(missing_ok=True)
        cmd = program.real_command(bench.data, bench.real_checkpoints, bench.size, workdir / f"metrics-{number}.json")
        cmd = [str(Path(__file__)) if part == str(HERE / program.script) else part for part in cmd]
        os.environ.update({OUT_ENV: str(out), PROGRAM_ENV: name})
        run(cmd, bench.log, bench.timeout)
        shutil.rmtree(bench.real_checkpoints, ignore_errors=True)
        ranks = [json.loads(line)["saves"] for line in out.read_text().splitlines()]
        saves = [max(rank[i] for rank in ranks) for i in range(len(ranks[0]))]  # the slowest rank per save
        per_save += saves
        later += saves[1:]
    return {"program": name, "size": size_name, "runs": runs, "cpu_s_per_save": per_save,
            "first_s": [per_save[i] for i in range(0, len(per_save), len(per_save) // runs)],
            "steady_s": statistics.mean(later)}


def main(argv=None) -> None:
    if PROGRAM_ENV in os.environ and OUT_ENV in os.environ:
        _inside()
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--programs", default=",".join(PROBES))
    p.add_argument("--size", default="tiny", choices=("tiny", "small"))
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    for name in args.programs.split(","):
        if name not in PROBES:
            p.error(f"--programs: no program {name!r}; choose from {', '.join(PROBES)}")
        workdir = Path(tempfile.mkdtemp(prefix=f"framework-cpu-{name}-"))
        try:
            result = measure(name, args.size, args.runs, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print(f"{name}: framework CPU per save {', '.join(f'{s:.4f}' for s in result['cpu_s_per_save'])} s; "
              f"mean after each run's first {result['steady_s']:.4f} s "
              f"-> checkpoint.framework_cpu_s: {result['steady_s']:.3f}", flush=True)


if __name__ == "__main__":
    main()
