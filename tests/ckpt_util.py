"""Helpers for the checkpoint tests: a RunContext over a temporary folder, without the CLI."""

from __future__ import annotations

import os
from pathlib import Path

from dlio_ckpt.config.load import load_config
from dlio_ckpt.engine.context import RunContext
from dlio_ckpt.storage.events import EventRecorder, JobClock
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.traced import TracedStorage
from dlio_ckpt.world import World

SMALL_MODEL = [
    "model.kind=explicit",
    "model.model_size_bytes=3MiB",
    "model.optimization_groups=[262144]",
    "checkpoint.enabled=true",
    # these helpers serve the tests of the project's own commit protocol (manifests, checksums,
    # restore); the framework-faithful default is tested in test_framework_io.py
    "checkpoint.durability=commit",
    "checkpoint.write_chunk_bytes=256KiB",
    "generate.pool_bytes=4MiB",
]


def make_ctx(tmp_path: Path, overrides=(), world: World | None = None, run_id: str = "run-test") -> RunContext:
    config = load_config([f"storage.root={tmp_path}", *SMALL_MODEL, *overrides])
    world = world or World.serial()
    clock = JobClock.start()
    recorder = EventRecorder(rank=world.rank, clock=clock)
    storage = TracedStorage(PosixStorage(direct_io=config.storage.direct_io), recorder)
    run_dir = tmp_path / "runs" / run_id
    os.makedirs(run_dir, exist_ok=True)
    return RunContext(config=config, world=world, run_dir=run_dir, run_id=run_id, clock=clock,
                      recorder=recorder, storage=storage)


def data_files(folder: Path) -> list[Path]:
    """Data files of one checkpoint folder (not the manifest or the coordinator metadata)."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "dlio_ckpt_manifest.json"
                  and not p.name.endswith(".index") and p.name != ".metadata" and ".tmp" not in p.name)
