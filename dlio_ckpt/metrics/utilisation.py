"""Where training time went (the AU target's verdict is the run's one verdict, metrics/verdict.py).

DLIO's AU leaves the first step of every block out (a block starts at each epoch and after each
checkpoint). With one or two steps per block that removes the very steps that waited for data,
and a run that spent nearly all its time reading can report AU 0.95. So the verdict is taken
from `au_overall` (compute / training wall time, checkpoints and waits included), which covers
the whole run, and a run too short to show a steady state is said to be so rather than judged.
"""

from __future__ import annotations

from typing import Any

# DLIO blocks of this many steps or fewer keep at most one measured step each.
FEW_STEPS_PER_BLOCK = 2.0


def time_shares(ranks: list[dict[str, Any]]) -> dict[str, float]:
    """Shares of the training wall time (all ranks together, evaluation excluded): waiting for
    data, emulated compute, blocked in checkpoints, and the rest (loop bookkeeping, oversleep)."""
    wall = sum(r["train_wall_s"] for r in ranks)
    if wall <= 0:
        return {"reading": 0.0, "computing": 0.0, "checkpointing": 0.0, "other": 0.0}
    shares = {
        "reading": sum(r["data_wait_s"] for r in ranks) / wall,
        "computing": sum(r["compute_s"] for r in ranks) / wall,
        "checkpointing": sum(r["checkpoint_s"] for r in ranks) / wall,
    }
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def steps_per_block(ranks: list[dict[str, Any]]) -> float:
    """Mean steps per DLIO block over all ranks (0 when no step ran)."""
    blocks = sum(r["au_blocks"] for r in ranks)
    return sum(r["au_block_steps"] for r in ranks) / blocks if blocks else 0.0
