"""train.gradient_sync: the ranks meet once per step, where data-parallel training's gradient all-reduce meets them.

DistributedDataParallel all-reduces the gradients inside `loss.backward()`, and `optimizer.step()` waits
for it, so every rank's step ends when the slowest rank's backward does: a rank that waited longer
for its batch holds the others back there, and their wait is part of their step (the program's own
profile counts it in the step's compute). Emulated ranks that never meet drift apart within an
epoch, and the drift lands in the next collective, the checkpoint's first exchange, where it reads
as checkpoint time. DLIO's ranks do not meet (`none`, the default).

- `barrier`: the ranks meet, no bytes move. For a `train.computation_time` measured on the program
  (docs/fidelity.md), which holds the all-reduce's own transfer already.
- `allreduce`: an MPI all-reduce of a buffer the size of the rank's gradients (its model-parallel
  shard's model tensors), for a `computation_time` that holds the compute alone.

The meeting comes after the step's compute, where backward's all-reduce ends; its wait is accounted
as compute and reported apart (`sync_wait_s`). Only the steps every rank takes meet: with
`train.step_counting=global` the ranks with the larger share may take one batch more per epoch (a
DistributedSampler pads the shares equal instead), and such a step has no one to meet.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import numpy as np

from dlio_ckpt.plan.read import share_sizes
from dlio_ckpt.world import World


def steps_every_rank_takes(files: Any, batch_size: int, drop_last: bool, size: int, whole_files: bool,
                           max_batches: int | None) -> int:
    """Batches per epoch that every rank takes: the smallest share's count (DLIO's count: all equal)."""
    if max_batches is not None:
        return max_batches
    shares = share_sizes(files, size, whole_files)
    return min(share // batch_size if drop_last else -(-share // batch_size) for share in shares)


def gradient_bytes(model_plan: Any, rank: int) -> int:
    """The bytes a data-parallel rank all-reduces per step: its model-parallel shard's model tensors."""
    if model_plan is None:
        return 0
    return sum(t.nbytes for t in model_plan.mp_shards[model_plan.mp_rank(rank)][0])


class StepSync:
    """One rank's per-step meeting (module doc): `meet(epoch_step)` after each step's compute."""

    def __init__(self, world: World, mode: str, steps_per_epoch: int, nbytes: int = 0) -> None:
        self.world, self.mode, self.steps_per_epoch = world, mode, steps_per_epoch
        self.active = mode != "none" and world.parallel
        self.meetings = 0
        self._send = self._receive = None
        if self.active and mode == "allreduce":
            self._send = np.zeros(max(1, nbytes // 4), dtype=np.float32)  # float32 gradients
            self._receive = np.empty_like(self._send)

    def meet(self, epoch_step: int) -> float:
        """Wait for every rank to end step `epoch_step` (1-based, within the epoch); the seconds waited."""
        if not self.active or epoch_step > self.steps_per_epoch:
            return 0.0
        start = perf_counter()
        if self._send is None:
            self.world.barrier()
        else:
            self.world.allreduce_buffer(self._send, self._receive)
        self.meetings += 1
        return perf_counter() - start
