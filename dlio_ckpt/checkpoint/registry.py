"""Checkpoint strategies by name (`checkpoint.strategy=`), and the check of every checkpoint name.

Strategies live in strategies.py, layouts and format specs in plan/ (pure naming rules); each table
is a `Registry`, so a typo fails in the config stage with the key named and a close match, not
deep inside a run.
"""

from __future__ import annotations

from typing import Any

from dlio_ckpt.errors import ConfigError, MissingDependency
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
    group="dlio_ckpt.strategies",
)


def canonical_strategy(name: str) -> str:
    return STRATEGIES.canonical(name)


def strategy_declares(name: str, prop: str) -> bool:
    """What strategy `name` says of itself (a class attribute such as `persists_in_background`;
    False where it says nothing), so config, engine and report follow a plugin strategy as they
    follow a built-in one. False for a name not known here (a summary written with a plugin that
    is not installed where it is read)."""
    try:
        return bool(getattr(STRATEGIES.load(name), prop, False))
    except (ConfigError, MissingDependency):
        return False


def check_names(config: Any) -> None:
    """`config` (a CheckpointConfig) names a known strategy, layout and format."""
    from dlio_ckpt.plan.checkpoint_formats import CHECKPOINT_FORMATS
    from dlio_ckpt.plan.layouts import LAYOUTS

    STRATEGIES.canonical(config.strategy)
    LAYOUTS.canonical(config.layout)
    CHECKPOINT_FORMATS.canonical(config.format)
