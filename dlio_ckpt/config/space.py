"""Free space a run needs, checked before anything is written.

A run whose dataset and checkpoints cannot fit on storage.root's file system would otherwise find
out at ENOSPC, hours and many gigabytes in (bare `dlio_ckpt` plans a 147 GB dataset). The need is
the planned dataset when it is not generated yet (its payload: formats add a little) plus the
checkpoints it keeps on disk: `checkpoint.keep_last` of them, or every one it writes when that is
0 (mode=checkpoint: num_checkpoints_write; training: the step and epoch triggers over the planned
steps; checkpoints triggered by seconds cannot be foreseen and are not counted). So the check is
a lower bound: passing it does not promise the run fits, failing it proves the run cannot.
With checkpoint.levels, each level holds the checkpoints SCR's rule sends to it (up to its
keep_last), and a level with a folder of its own (a RAM disk, a local SSD) is checked there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from dlio_ckpt.checkpoint.triggers import Triggers
from dlio_ckpt.schema import RunConfig
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.formats import get_format
from dlio_ckpt.plan import dataset_manifest
from dlio_ckpt.plan.checkpoint import build_checkpoint_plan
from dlio_ckpt.plan.dataset import plan_dataset
from dlio_ckpt.plan.levels import placement
from dlio_ckpt.storage import make_backend
from dlio_ckpt.storage.base import StorageBackend

# Tests stand for a small disk with this (bytes); unset, the file system is asked.
FREE_BYTES_VARIABLE = "DLIO_CKPT_FREE_BYTES"


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def dataset_bytes_to_write(config: RunConfig, storage: StorageBackend) -> int:
    """Payload bytes of the dataset this run would generate; 0 when a matching one is there (its
    manifest read through `storage`, where generation would have written it) or none is needed."""
    if config.mode not in ("train", "generate") or config.workload == "replay" or not config.generate.enabled:
        return 0

    plan = plan_dataset(config, get_format(config.dataset.format).extension)
    try:
        if _manifest_fingerprint(storage, plan.manifest_path) == plan.fingerprint:
            return 0
    except (OSError, ValueError, AttributeError):
        pass
    return plan.payload_bytes


def _manifest_fingerprint(storage: StorageBackend, path: str) -> object:
    """The fingerprint a dataset manifest records: from its header alone (its first read, not its
    file table) where it has generation's layout, else from the whole JSON."""
    try:
        handle = storage.open_read(path)
        try:
            header, _ = dataset_manifest.decode(dataset_manifest.text_lines(handle.read_at, handle.size()))
        finally:
            handle.close()
        return header.get("fingerprint")
    except (ValueError, AttributeError):
        return json.loads(storage.read_whole(path)).get("fingerprint")


def checkpoints_kept(config: RunConfig, world_size: int) -> int:
    """How many checkpoints this run has on disk at once, at most (see the module's note)."""
    written = checkpoints_written(config, world_size)
    keep = config.checkpoint.keep_last
    return min(written, keep) if keep else written


def checkpoints_written(config: RunConfig, world_size: int) -> int:
    """How many checkpoints this run writes (see the module's note)."""
    ck = config.checkpoint
    if config.workload == "replay" or config.mode not in ("train", "checkpoint"):
        return 0
    if config.mode == "checkpoint":
        written = ck.num_checkpoints_write
    elif not ck.enabled:
        return 0
    else:
        ds, reader = config.dataset, config.reader
        share = ds.num_files_train * ds.num_samples_per_file // max(world_size, 1)
        per_epoch = share // reader.batch_size if reader.drop_last else math.ceil(share / reader.batch_size)
        steps = per_epoch * config.train.epochs
        if config.train.total_steps:
            steps = min(steps, config.train.total_steps)
        triggers = Triggers.from_config(ck)
        by_step = steps // triggers.steps_between if triggers.steps_between > 0 else 0
        epochs = min(config.train.epochs, math.ceil(steps / per_epoch)) if per_epoch else 0
        written = by_step + sum(1 for epoch in range(1, epochs + 1) if triggers.at_epoch_end(epoch))
    return written


# Levels: checkpoints counted over at most this many (a lower bound, as the rest, for longer runs).
LEVEL_COUNT_LIMIT = 100_000


def kept_per_level(config: RunConfig, world_size: int) -> list[int]:
    """checkpoint.levels: how many checkpoints each level holds at once, at most: those SCR's rule
    sends to it (a flushed level's also on the first level), up to the level's keep_last."""
    levels = config.checkpoint.levels
    counts = [0] * len(levels)
    intervals, flushed = [lv.every for lv in levels], [lv.write == "flush" for lv in levels]
    for number in range(1, min(checkpoints_written(config, world_size), LEVEL_COUNT_LIMIT) + 1):
        where = placement(number, intervals, flushed)
        counts[where.write] += 1
        for target in where.flush:
            counts[target] += 1
    keeps = [config.checkpoint.keep_last if lv.keep_last < 0 else lv.keep_last for lv in levels]
    return [min(count, keep) if keep else count for count, keep in zip(counts, keeps)]


def _check_level_space(config: RunConfig, kept: list[int], each: int) -> None:
    """Each level with a folder of its own (a RAM disk, a local SSD) holds its checkpoints there."""
    for number, (level, count) in enumerate(zip(config.checkpoint.levels, kept)):
        if not level.path or not count:
            continue
        folder = os.path.abspath(level.path)
        options = dataclasses.replace(config.storage, backend=level.backend or config.storage.backend, root=folder)
        given = os.environ.get(FREE_BYTES_VARIABLE, "")
        free = int(given) if given.isdigit() else make_backend(options, folder).free_bytes(folder)
        if free is not None and count * each > free:
            raise ConfigError(
                f"checkpoint.levels[{number}].path: level {level.name} keeps up to {count} checkpoint"
                f"{'s' if count > 1 else ''} x {_size(each)} = {_size(count * each)} but {folder} has {_size(free)} free; "
                "lower the level's keep_last, choose another folder, or shrink the run"
            )


def checkpoint_bytes(config: RunConfig, world_size: int) -> int:
    plan = build_checkpoint_plan(config, world_size)
    return plan.encoded_bytes() or plan.total_bytes


def check_free_space(config: RunConfig, world_size: int, free_bytes: int | None = None,
                     storage: StorageBackend | None = None) -> None:
    """Refuse (exit 2) a run whose planned dataset and kept checkpoints exceed the free space of
    storage.root's file system; `free_bytes` stands for that figure in tests (else the backend's).
    Every look at the storage (its free space, an existing dataset's manifest) goes through the
    run's backend (`storage`, default: the one storage.backend names); a backend that reports no
    bound (an object store) is not checked."""
    if config.mode == "plan":
        return
    root = os.path.abspath(config.storage.root)
    if storage is None:
        storage = make_backend(config.storage, root)
    kept = checkpoints_kept(config, world_size)
    if config.checkpoint.levels and kept:  # levels with folders of their own are checked there
        per_level = kept_per_level(config, world_size)
        _check_level_space(config, per_level, checkpoint_bytes(config, world_size))
        kept = sum(count for level, count in zip(config.checkpoint.levels, per_level) if not level.path)
    if free_bytes is None:
        given = os.environ.get(FREE_BYTES_VARIABLE, "")
        free_bytes = int(given) if given.isdigit() else storage.free_bytes(root)
    if free_bytes is None:  # unknown or unbounded (object stores)
        return
    dataset = dataset_bytes_to_write(config, storage)
    each = checkpoint_bytes(config, world_size) if kept else 0
    needed = dataset + kept * each
    if needed <= free_bytes:
        return
    parts = []
    if dataset:
        parts.append(f"dataset {_size(dataset)} not generated yet")
    if kept:
        parts.append(f"{kept} checkpoint{'s' if kept > 1 else ''} x {_size(each)}")
    raise ConfigError(
        f"storage.root: the run needs at least {_size(needed)} ({' + '.join(parts)}) but {root} has "
        f"{_size(free_bytes)} free; free some space, choose another storage.root, or shrink the run "
        "(scale=small or tiny, fewer files, checkpoint.keep_last)"
    )
