"""Checkpoint engine: `make_checkpoint_engine(ctx)` is what the training loop and the modes call.

Imports stay inside the function so that importing this package (for the layout and format
names the config checks) pulls in neither numpy-heavy strategies nor optional dependencies.
"""

from __future__ import annotations

from typing import Any


def make_checkpoint_engine(ctx: Any):
    """The CheckpointEngine of `ctx.config.checkpoint` for this rank (see base.CheckpointEngine)."""
    from dlio_ckpt.checkpoint.engine import CheckpointEngineImpl
    from dlio_ckpt.checkpoint.registry import STRATEGIES

    strategy = STRATEGIES.load(ctx.config.checkpoint.strategy)
    if ctx.config.checkpoint.levels:
        from dlio_ckpt.checkpoint.levels import MultiLevelEngine

        return MultiLevelEngine(ctx, strategy)
    return CheckpointEngineImpl(ctx, strategy)


__all__ = ["make_checkpoint_engine"]
