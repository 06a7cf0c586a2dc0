"""The reference programs and how to run each beside its emulation, at a named size (pure values).

Each entry names the real program, its workload YAML (beside it), the dataset format the two
share, the ranks, and the sizes fidelity.py varies on both sides at once: files, samples per
file, batch size, epochs. `tiny` is what the tests run (seconds); `small` what the benchmark runs.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
VENV_BIN = REPO / ".venv" / "bin"


@dataclass(frozen=True)
class Size:
    files: int
    samples_per_file: int
    batch_size: int
    epochs: int


@dataclass(frozen=True)
class Program:
    name: str              # also the workload name (dataset folder data/<name>)
    script: str            # beside this file
    dataset_format: str    # dlio_ckpt's dataset.format
    dataset_ext: str
    ranks: int
    needs: str             # the Python module the real program imports (skip when missing)
    sizes: dict

    @property
    def workload(self) -> Path:
        return HERE / f"{self.name}.yaml"

    def real_command(self, data: Path, checkpoints: Path, size: Size, metrics: Path) -> list[str]:
        args = [str(HERE / self.script), "--data", str(data), "--checkpoints", str(checkpoints),
                "--epochs", str(size.epochs), "--batch-size", str(size.batch_size), "--metrics", str(metrics)]
        if self.ranks > 1:  # torchrun, as the DDP tutorials launch it (rendezvous on 127.0.0.1)
            return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={self.ranks}", *args]
        return [sys.executable, *args]

    def emulation_command(self, storage: Path, run_dir: Path, size: Size, compute_s: float) -> list[str]:
        cmd = [str(VENV_BIN / "dlio_ckpt"), f"workload={self.workload}", f"storage.root={storage}",
               f"hydra.run.dir={run_dir}", "progress=false",
               f"dataset.num_files_train={size.files}", f"dataset.num_samples_per_file={size.samples_per_file}",
               f"reader.batch_size={size.batch_size}", f"train.epochs={size.epochs}",
               f"train.computation_time={compute_s:.6f}"]
        if self.ranks > 1:
            return [str(VENV_BIN / "mpirun"), "-np", str(self.ranks), *cmd]
        return cmd

    def generate_command(self, storage: Path, run_dir: Path, size: Size) -> list[str]:
        """The dataset both sides read: dlio_ckpt generates it once, untraced (the emulation then
        reuses it: same folder, same fingerprint)."""
        return self.emulation_command(storage, run_dir, size, 0.0) + ["mode=generate"]


def exclude_environment() -> str:
    """DARSHAN_EXCLUDE_DIRS for a Python program: the interpreter's and the packages' folders. Without
    it the ~1,000 files torch or TensorFlow import fill darshan-runtime's POSIX records (the log is
    then partial) and the files the program opens later, its checkpoints, are not recorded."""
    dirs = {os.path.realpath(p) for p in sys.path if p and ("-packages" in p or p.startswith(sys.base_prefix))}
    return ",".join(sorted(dirs | {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}))


def traced_environment(runtime: Path, logs: Path) -> dict[str, str]:
    """This process's environment, plus what runs a program under the real darshan-runtime
    (`runtime`, its non-MPI libdarshan.so) with DXT, one log per process in `logs`."""
    return dict(os.environ, DARSHAN_ENABLE_NONMPI="1", DXT_ENABLE_IO_TRACE="1", DARSHAN_LOG_DIR_PATH=str(logs),
                LD_PRELOAD=str(runtime), TF_CPP_MIN_LOG_LEVEL="2", DARSHAN_EXCLUDE_DIRS=exclude_environment())


PROGRAMS = {
    "pytorch_cnn": Program("pytorch_cnn", "pytorch_cnn.py", "npz", ".npz", 1, "torch",
                           {"tiny": Size(16, 1, 4, 2), "small": Size(512, 1, 16, 2)}),
    "ddp_dcp": Program("ddp_dcp", "ddp_dcp.py", "npz", ".npz", 2, "torch",
                       {"tiny": Size(16, 1, 4, 2), "small": Size(512, 1, 16, 2)}),
    "keras_tfdata": Program("keras_tfdata", "keras_tfdata.py", "tfrecord", ".tfrecord", 1, "tensorflow",
                            {"tiny": Size(4, 8, 4, 2), "small": Size(16, 64, 16, 2)}),
}
