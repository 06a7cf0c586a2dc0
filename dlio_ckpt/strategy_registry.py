"""Checkpoint strategies by name (`checkpoint.strategy=`) and what each declares of itself.

A table of names only (entries are "module:Class" strings, imported when one is chosen), so the
report and the config check can ask what a strategy declares without importing the strategies,
and a plugin strategy is asked the same questions as a built-in one.
"""

from __future__ import annotations

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
