"""Every run ends by saying what it left on disk and how to remove it (issue 27, item 11)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from conftest import load_summary, run_cli
from dlio_ckpt.metrics.report import left_on_disk_rows

MIB = float(1 << 20)


def du(folder: str) -> int:
    """Bytes of the files below `folder`, by os.walk and os.stat (not the code under test)."""
    return sum(os.stat(os.path.join(top, name)).st_size for top, _, names in os.walk(folder) for name in names)


def row(stdout: str) -> str:
    (line,) = [line for line in stdout.splitlines() if line.startswith("left on disk")]
    return line.split("left on disk", 1)[1].strip()


def test_a_run_says_what_it_left_and_clean_removes_exactly_that(workdir):
    store, run = workdir / "store", workdir / "run"
    done = run_cli(["workload=unet3d", "scale=tiny", "progress=false", "checkpoint.enabled=true",
                    f"storage.root={store}", f"hydra.run.dir={run}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    left = load_summary(run)["left_on_disk"]
    (ckpt,) = left["checkpoints"]
    data = left["dataset"]
    assert data["created_by_this_run"] is True and Path(data["folder"]).is_dir()
    assert ckpt["bytes"] == du(ckpt["folder"]) > 0
    assert data["bytes"] == du(data["folder"]) > 0  # bytes_on_disk: the dataset files and their manifest
    assert left["bytes"] == ckpt["bytes"] + data["bytes"]
    assert left["clean_command"] == f"dlio_ckpt clean {shlex.quote(str(run))}"
    text = row(done.stdout)
    assert text == (f"{left['bytes'] / MIB:,.1f} MiB: dataset {data['bytes'] / MIB:,.1f} MiB in {data['folder']}, "
                    f"checkpoints {ckpt['bytes'] / MIB:,.1f} MiB in {ckpt['folder']}; remove with: {left['clean_command']}")
    # the command printed does what it says
    cleaned = run_cli(shlex.split(left["clean_command"])[1:], workdir / "cwd")
    assert cleaned.returncode == 0, cleaned.stderr
    assert not Path(ckpt["folder"]).exists() and not Path(data["folder"]).exists()

    # a second run reuses a dataset: it is named as an earlier run's, and not counted as this run's
    again = workdir / "again"
    first = run_cli(["workload=unet3d", "scale=tiny", "progress=false", "checkpoint.enabled=false", "train.epochs=1",
                     f"storage.root={store}", f"hydra.run.dir={workdir / 'maker'}"], workdir / "cwd")
    assert first.returncode == 0, first.stderr
    second = run_cli(["workload=unet3d", "scale=tiny", "progress=false", "checkpoint.enabled=false", "train.epochs=1",
                      f"storage.root={store}", f"hydra.run.dir={again}"], workdir / "cwd")
    assert second.returncode == 0, second.stderr
    left = load_summary(again)["left_on_disk"]
    assert left["bytes"] == 0 and left["checkpoints"] == [] and left["clean_command"] is None
    assert left["dataset"]["created_by_this_run"] is False
    assert row(second.stdout).startswith("nothing of this run's (the dataset it reused, ")
    assert row(second.stdout).endswith("is an earlier run's; clean keeps it)")


def test_a_run_that_left_nothing_says_so():
    assert left_on_disk_rows({"dataset": None, "checkpoints": [], "bytes": 0, "clean_command": None}) == [
        ("left on disk", "nothing of this run's")]
    assert left_on_disk_rows(None) == []
