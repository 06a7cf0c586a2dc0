"""Nothing outside storage.root: configured paths are resolved and refused when they leave it.

The loader-level cases (file prefix, checkpoint folder, absolute and `..` dataset folders, links
out of the root) are in test_bad_input.py; here the real command, the one documented way out for
a dataset, and the names a replayed Darshan log may hold.
"""

from __future__ import annotations

from pathlib import Path

from conftest import load_summary, run_cli
from dlio_ckpt.plan.replay import _relative_paths

TINY = ["workload=unet3d", "scale=tiny", "dataset.format=raw", "progress=false"]


def everything_under(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*")) if folder.exists() else []


def test_escaping_paths_are_refused_by_the_command(workdir):
    for args, key in ((["dataset.file_prefix=../../x"], "dataset.file_prefix"),
                      (["checkpoint.folder=../../y"], "checkpoint.folder"),
                      ([f"dataset.folder={workdir / 'outside'}"], "dataset.folder")):
        done = run_cli([*TINY, *args, f"storage.root={workdir / 'store' / 'root'}"], workdir / "cwd")
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"dlio_ckpt: error: {key}:"), done.stderr
    assert everything_under(workdir / "store") == [] and not (workdir / "outside").exists() and not (workdir / "y").exists()
    assert list((workdir / "cwd").iterdir()) == []


def test_the_documented_key_lets_a_dataset_live_outside_the_root(workdir):
    outside, root, run = workdir / "shared-data", workdir / "store", workdir / "run"
    done = run_cli([*TINY, "checkpoint.enabled=false", f"dataset.folder={outside}", "storage.allow_outside_root_dataset=true",
                    f"storage.root={root}", f"hydra.run.dir={run}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr[-2000:]
    (dataset,) = outside.iterdir()
    on_disk = sum(p.stat().st_size for p in (dataset / "train").rglob("*.bin"))
    assert load_summary(run)["train"]["bytes_read"] == 2 * on_disk > 0  # two epochs of the outside dataset
    assert not (root / "data").exists()


def test_replayed_file_names_never_climb_out():
    names = ["../../etc/passwd", "/abs/a/../../../b", "relative/../../c", "/x/y/z"]
    for relative in _relative_paths(names):
        assert not relative.startswith("/") and ".." not in Path(relative).parts and relative
