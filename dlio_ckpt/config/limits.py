"""Limits a config must respect before anything is allocated or written: memory and plan size.

A value the types allow can still be impossible on this machine: a content pool larger than the
memory, a dataset plan of ten billion files, a staging buffer of 100 GiB. These surface as a
MemoryError deep inside a run (after the run folder and part of the dataset were written), so the
loader compares them with `psutil.virtual_memory().total` first and explains the limit.
"""

from __future__ import annotations

import os

import psutil

from dlio_ckpt.checkpoint.registry import strategy_declares
from dlio_ckpt.schema import RunConfig
from dlio_ckpt.errors import ConfigError

GIB = float(1 << 30)
# Memory one dataset file takes on every rank: its sample size in the file list's int64 array
# where sizes vary (record_length_bytes_stdev > 0; none where they do not). The read plan computes
# its order a block at a time (plan/permutation.py), and the manifest and the event recorder hold
# nothing per file (issue 26; was 1 KiB, ~0.4 KiB measured, then 64 with whole-epoch index arrays).
PLAN_BYTES_PER_FILE = 8
# A ByteSource holds its pool twice (any window is one slice) and briefly three times while built.
POOL_COPIES_AT_PEAK = 3
# The share of this machine's memory the run's own buffers may take; the rest is for the page
# cache, the readers' buffers and everything else on the node.
MEMORY_SHARE = 0.5


def local_ranks(world_size: int) -> int:
    """Ranks on this node, where the launcher says so (MPICH/Hydra, Open MPI, Slurm); else 1.

    Without a hint the ranks may be spread over many nodes, so only one is charged to this one.
    """
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return min(int(value), max(world_size, 1))
    return 1


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def check_memory(config: RunConfig, world_size: int, total_memory: int | None = None) -> None:
    """Refuse buffers and plans that cannot fit in this machine's memory (one line naming the key)."""
    total = psutil.virtual_memory().total if total_memory is None else total_memory
    budget = int(total * MEMORY_SHARE)
    ranks = local_ranks(world_size)
    on_node = f"{ranks} rank{'s' if ranks != 1 else ''} on this node"
    limit = f"half of this machine's {_gib(total)} of memory ({_gib(budget)})"

    ds = config.dataset
    files = ds.num_files_train + ds.num_files_eval
    plan_bytes = files * PLAN_BYTES_PER_FILE
    if plan_bytes > budget:
        raise ConfigError(
            f"dataset.num_files_train: {files:,} files need about {_gib(plan_bytes)} of memory for the dataset plan on every rank "
            f"(about {PLAN_BYTES_PER_FILE} bytes per file), more than {limit}; use fewer, larger files "
            f"(at most {budget // PLAN_BYTES_PER_FILE:,} here)"
        )

    pool = config.generate.pool_bytes * POOL_COPIES_AT_PEAK * ranks
    if pool > budget:
        raise ConfigError(
            f"generate.pool_bytes: {_gib(config.generate.pool_bytes)} per rank needs {_gib(pool)} with {on_node} "
            f"(each rank builds its content pool {POOL_COPIES_AT_PEAK} times over), more than {limit}; "
            "lower generate.pool_bytes (default 64MiB)"
        )

    ck = config.checkpoint
    async_checkpoints = (ck.enabled or config.mode == "checkpoint") and strategy_declares(ck.strategy, "persists_in_background")
    staging = ck.staging_buffer_bytes * ck.max_in_flight * ranks
    if async_checkpoints and staging > budget:
        raise ConfigError(
            f"checkpoint.staging_buffer_bytes: {_gib(ck.staging_buffer_bytes)} x checkpoint.max_in_flight {ck.max_in_flight} "
            f"x {on_node} = {_gib(staging)} of staging buffers, more than {limit}; lower it, "
            "or set it to 0 (the rank's shard, capped at a quarter of free memory)"
        )
