"""Shared fixtures: a scratch storage root per test, and helpers to run the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DLIO_CKPT_MPI", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cli(args: list[str], cwd: Path, mpi_ranks: int = 0, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `dlio_ckpt ARGS` (under `mpirun -n N` when mpi_ranks > 0) and capture its output."""
    command = [str(BIN / "dlio_ckpt"), *args]
    if mpi_ranks:
        command = [str(BIN / "mpirun"), "-n", str(mpi_ranks), *command]
    return subprocess.run(command, cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout)


def load_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "cwd").mkdir()
    return tmp_path
