"""Checkpoint strategies by name (`checkpoint.strategy=`), and the check of every checkpoint name.

Strategies live in strategies.py, layouts and format specs in plan/ (pure naming rules); each table
is a `Registry`, so a typo fails in the config stage with the key named and a close match, not
deep inside a run.
"""

from __future__ import annotations

from typing import Any

from dlio_ckpt.plan.checkpoint_formats import CHECKPOINT_FORMATS
from dlio_ckpt.plan.layouts import LAYOUTS
from dlio_ckpt.registry import Registry

STRATEGIES = Registry(
    key="checkpoint.strategy",
    noun="strategy",
    entries={
        "sharded": "dlio_ckpt.checkpoint.strategies:ShardedStrategy",
        "single_writer": "dlio_ckpt.checkpoint.strategies:SingleWriterStrategy",
        "async": "dlio_ckpt.checkpoint.strategies:AsyncStrategy",
    },
    aliases={"sync": "sharded"},
)


def canonical_strategy(name: str) -> str:
    return STRATEGIES.canonical(name)


def check_names(config: Any) -> None:
    """`config` (a CheckpointConfig) names a known strategy, layout and format."""
    STRATEGIES.canonical(config.strategy)
    LAYOUTS.canonical(config.layout)
    CHECKPOINT_FORMATS.canonical(config.format)
