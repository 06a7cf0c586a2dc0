"""Registries open to plugins, proved with a real package: tests/plugin_pkg declares a toy
storage backend, dataset format, checkpoint format, codec and strategy through entry points (one
module and one entry-point line each). It is installed with pip (offline, no build isolation)
into a temporary folder, and jobs run with PYTHONPATH pointing there, as an installed plugin is
found; the bytes each plugin wrote are read back from disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN, cli_env, load_summary
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME

PLUGIN_PKG = Path(__file__).parent / "plugin_pkg"
TINY = ["workload=bert", "scale=tiny", "progress=false", "train.computation_time=0", "checkpoint.enabled=true",
        "checkpoint.restore=true", "checkpoint.keep_last=0", "checkpoint.durability=commit"]


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """The toy plugin installed by pip into a folder of its own (copied first: pip builds in the
    source tree)."""
    source = tmp_path_factory.mktemp("plugin_source") / "plugin_pkg"
    shutil.copytree(PLUGIN_PKG, source)
    site = tmp_path_factory.mktemp("plugin_site")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(site), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return site


def run_with_plugin(site: Path, args: list[str], workdir: Path) -> subprocess.CompletedProcess:
    env = dict(cli_env(), PYTHONPATH=str(site))
    (workdir / "cwd").mkdir(exist_ok=True)
    return subprocess.run([str(BIN / "dlio_ckpt"), *args], cwd=workdir / "cwd", env=env, capture_output=True, text=True,
                          timeout=300)


def run_job(site: Path, workdir: Path, overrides: list[str]) -> tuple[subprocess.CompletedProcess, Path, dict]:
    """A tiny training job with checkpoints and a restore, with the plugin on the path: (the
    process, its storage root, its summary)."""
    store, run = workdir / "store", workdir / "run"
    done = run_with_plugin(site, TINY + overrides + [f"storage.root={store}", f"hydra.run.dir={run}"], workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = load_summary(run)
    assert summary["checkpoint"]["restore_verified"] is True
    return done, store, summary


def test_a_job_with_the_plugin_backend_dataset_format_checkpoint_format_and_strategy(plugin_site, tmp_path):
    _, store, summary = run_job(plugin_site, tmp_path, ["storage.backend=toy_posix", "dataset.format=toyset",
                                                        "checkpoint.format=toyckpt", "checkpoint.strategy=toy_receipts"])
    ckpt = summary["checkpoint"]
    assert ckpt["strategy"] == "toy_receipts"

    datasets = sorted(store.glob("data/**/*.toy"))  # the dataset format's files, each after its magic
    assert len(datasets) == summary["dataset"]["files_train"] > 0
    assert all(path.read_bytes()[:8] == b"TOYSET01" for path in datasets)
    assert summary["train"]["samples"] > 0

    checkpoints = sorted(store.glob("checkpoints/**/*.toyckpt"))  # the checkpoint format's
    assert checkpoints and all(path.read_bytes()[:8] == b"TOYCKPT1" for path in checkpoints)
    receipts = sorted(store.glob("checkpoints/**/receipt-0.txt"))  # the strategy's, one per checkpoint
    assert len(receipts) == ckpt["writes"]
    for receipt in receipts:
        written = [p for p in receipt.parent.rglob("*.toyckpt")]
        assert receipt.read_text() == f"rank 0 wrote {len(written)} files, {sum(p.stat().st_size for p in written)} bytes\n"

    journal = set((store / "toy_posix.journal").read_text().splitlines())  # the backend's
    assert {str(p.relative_to(store)) for p in datasets + checkpoints} <= journal


def test_a_job_with_the_plugin_codec_in_a_pipeline(plugin_site, tmp_path):
    done, store, summary = run_job(plugin_site, tmp_path, ["checkpoint.format=raw", "checkpoint.update=sparse",
                                                           "checkpoint.update_fraction=0.01", "checkpoint.codecs=[incremental,toyxor]"])
    ckpt = summary["checkpoint"]
    assert ckpt["restore_chain_length"] == ckpt["writes"] >= 2
    assert "incremental+toyxor: " in done.stdout
    for manifest_path in sorted(store.glob(f"checkpoints/**/{MANIFEST_NAME}")) or pytest.fail("no manifest"):
        manifest = json.loads(manifest_path.read_text())
        assert manifest["encoding"] == "incremental+toyxor"
        for entry in manifest["files"]:
            data = (manifest_path.parent / entry["path"]).read_bytes()
            unmasked = bytes(b ^ 0x5A for b in data[:2])  # the toy codec's XOR over incremental's container,
            assert unmasked == b"MK" and data[:2] != b"MK"  # which starts with its magic "MK"


def test_plugin_names_are_offered_and_close_matched_like_built_in_ones(plugin_site, tmp_path):
    done = run_with_plugin(plugin_site, TINY + ["checkpoint.codecs=[toyxr]", f"storage.root={tmp_path / 'store'}"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == ("dlio_ckpt: error: checkpoint.codecs: unknown codec 'toyxr' (did you mean 'toyxor'?); "
                                   "choose one of: incremental, lossy, zstd, toyxor")
    assert not (tmp_path / "store").exists()
