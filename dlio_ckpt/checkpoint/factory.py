"""`make_checkpoint_engine(ctx)`: what the training loop and the modes call for a rank's checkpoints.

Apart from the package's __init__ so that importing a checkpoint module for names (the config
check reads registry.py, encoded.py) does not pull in the engine and its strategies.
"""

from __future__ import annotations

from typing import Any

from dlio_ckpt.checkpoint.engine import CheckpointEngineImpl
from dlio_ckpt.checkpoint.levels import MultiLevelEngine
from dlio_ckpt.strategy_registry import STRATEGIES


def make_checkpoint_engine(ctx: Any):
    """The CheckpointEngine of `ctx.config.checkpoint` for this rank (see base.CheckpointEngine)."""
    strategy = STRATEGIES.load(ctx.config.checkpoint.strategy)
    if ctx.config.checkpoint.levels:
        return MultiLevelEngine(ctx, strategy)
    return CheckpointEngineImpl(ctx, strategy)
