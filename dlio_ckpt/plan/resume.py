"""The data loader's resume point (pure): what a checkpoint stores so that training after a
restart reads exactly the samples an uninterrupted run would (CheckFreq's resumable iterator).

A rank's order within an epoch is a pure function of (shuffle seed, epoch, rank), see
plan/read.py; so the position is {epoch, step_in_epoch, shuffle_seed, sample_offset} (plus the
global step), the same idea as CheckFreq's {epoch, iteration, start index}. Resuming rebuilds the
epoch's order from the stored seed and skips the `sample_offset` samples already consumed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import xxhash

from dlio_ckpt.plan.read import EpochReadPlan


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    step: int  # the global step the checkpoint holds (0: the start of training)
    epoch: int  # the epoch of the next batch, counted from 1
    step_in_epoch: int  # batches of that epoch already consumed
    shuffle_seed: int
    sample_offset: int  # samples of this rank's share of the epoch already consumed

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ResumePoint":
        try:
            return cls(**{f.name: int(data[f.name]) for f in dataclasses.fields(cls)})
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"the checkpoint's resume point is incomplete or malformed ({exc!r}): {data!r}") from None

    @classmethod
    def start(cls, shuffle_seed: int) -> "ResumePoint":
        return cls(0, 1, 0, shuffle_seed, 0)


def resume_plan(plan: EpochReadPlan, point: ResumePoint) -> EpochReadPlan:
    """The rest of `plan` after `point` (for point.epoch): its batches from step_in_epoch on."""
    if point.sample_offset != point.step_in_epoch * plan.batch_size:
        raise ValueError(f"resume point: {point.sample_offset} samples consumed do not make {point.step_in_epoch} "
                         f"batches of {plan.batch_size}")
    skipped = min(point.step_in_epoch, plan.num_batches)
    batches = None if plan.max_batches is None else max(0, plan.max_batches - skipped)
    return dataclasses.replace(plan, start=plan.start + skipped * plan.batch_size, max_batches=batches)


def batch_digest(rows: np.ndarray) -> str:
    """xxh3_64 of a batch's (file, sample) rows: a compact witness of which samples a step read."""
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(rows, dtype=np.int64).tobytes())


def order_digest(digests: dict[int, str]) -> str:
    """One digest of the sample order over the run's surviving steps (step order)."""
    hasher = xxhash.xxh3_128()
    for step in sorted(digests):
        hasher.update(order_entry(step, digests[step]))
    return hasher.hexdigest()


def order_entry(step: int, digest: str) -> bytes:
    """What one step adds to order_digest's input (a caller taking steps as they come adds it itself)."""
    return f"{step}:{digest};".encode()
