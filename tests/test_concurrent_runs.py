"""Runs that share a storage.root at the same time: none crashes, none reads another's dataset.

Staged writes take unique temporary names (pid + random), and a dataset's folder is named by its
fingerprint, so runs of the same shape share one dataset and runs of another shape get their own.
Two runs given the same hydra.run.dir: the second is refused, never mixed into the first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli_fork import ForkedRun, start_forked
from conftest import BIN, cli_env, load_summary, run_cli

SMALL = ["workload=unet3d", "scale=tiny", "dataset.format=raw", "checkpoint.enabled=false", "progress=false",
         "dataset.record_length_bytes=64KiB", "dataset.record_length_bytes_stdev=0", "dataset.record_length_bytes_min=1",
         "train.epochs=1"]


def start(args: list[str], cwd: Path) -> ForkedRun:
    """`dlio_ckpt ARGS` started, not waited for: a fork of the tests' server (cli_fork.py), a
    process of its own as a fresh interpreter is, without its ~0.5 s of CPU importing the package."""
    return start_forked([str(BIN / "dlio_ckpt"), *args], cwd, cli_env())


def finish(procs: list[ForkedRun]) -> list[tuple[int, str]]:
    return [(done.returncode, done.stderr) for done in (p.wait(timeout=240) for p in procs)]


def dataset_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in (folder / "train").rglob("*.bin"))


@pytest.mark.slow
def test_identical_and_differently_shaped_runs_at_once_all_succeed(workdir):
    for attempt in range(3):
        root = workdir / f"store{attempt}"
        runs = {name: workdir / f"run{attempt}-{name}" for name in ("a", "b", "other")}
        shapes = {"a": [], "b": [], "other": ["dataset.record_length_bytes=96KiB"]}
        procs = [start([*SMALL, *shapes[name], f"storage.root={root}", f"hydra.run.dir={run}"], workdir / "cwd")
                 for name, run in runs.items()]
        results = finish(procs)
        assert [code for code, _ in results] == [0, 0, 0], [err[-1500:] for _, err in results]
        folders = sorted((root / "data" / "unet3d").iterdir())
        assert len(folders) == 2  # one dataset per shape, shared by the identical runs
        assert not [p for p in root.rglob("*") if ".tmp" in p.name]  # no staged file left behind
        for name, run in runs.items():
            summary = load_summary(run)
            folder = Path(summary["dataset"]["folder"])
            assert folder in folders
            manifest = json.loads((folder / ".dlio_ckpt_dataset.json").read_text())
            assert manifest["fingerprint"] == folder.name
            # one epoch reads exactly the bytes of its own dataset, whose samples have its size
            assert summary["train"]["bytes_read"] == dataset_bytes(folder)
            sample = 96 * 1024 if name == "other" else 64 * 1024
            assert {p.stat().st_size for p in (folder / "train").rglob("*.bin")} == {sample}


def test_two_runs_given_one_run_folder_do_not_mix(workdir):
    run, root = workdir / "run", workdir / "store"
    results = finish([start([*SMALL, f"storage.root={root}", f"hydra.run.dir={run}"], workdir / "cwd") for _ in range(2)])
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2).strip().splitlines()
    assert len(refused) == 1 and f"hydra.run.dir: {run} already holds another run" in refused[0]
    assert load_summary(run)["train"]["bytes_read"] > 0  # the winner's summary, whole
    # and later, too: the finished run's folder is not reused
    again = run_cli([*SMALL, f"storage.root={root}", f"hydra.run.dir={run}"], workdir / "cwd")
    assert again.returncode == 2 and "already holds another run (" in again.stderr


def test_a_run_folder_used_again_never_writes_into_the_earlier_runs_checkpoints(workdir):
    root, run = workdir / "store", workdir / "run"
    args = ["workload=unet3d", "scale=tiny", "dataset.format=raw", "progress=false", "checkpoint.keep_last=1",
            f"storage.root={root}", f"hydra.run.dir={run}"]
    assert run_cli(args, workdir / "cwd").returncode == 0
    (first,) = (root / "checkpoints").iterdir()
    before = sorted((p.relative_to(first), p.stat().st_size, p.stat().st_mtime_ns) for p in first.rglob("*") if p.is_file())
    shutil.rmtree(run)  # the same path, a new run
    assert run_cli(args, workdir / "cwd").returncode == 0
    folders = sorted((root / "checkpoints").iterdir())
    assert len(folders) == 2 and first in folders
    after = sorted((p.relative_to(first), p.stat().st_size, p.stat().st_mtime_ns) for p in first.rglob("*") if p.is_file())
    assert after == before
