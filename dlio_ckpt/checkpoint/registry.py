"""The check of every checkpoint name: strategy, layout and format.

Strategies are named in strategy_registry.py (re-exported here) and live in strategies.py, layouts and format specs in plan/ (pure naming rules); each table
is a `Registry`, so a typo fails in the config stage with the key named and a close match, not
deep inside a run.
"""

from __future__ import annotations

from typing import Any

from dlio_ckpt.strategy_registry import STRATEGIES, canonical_strategy, strategy_declares
from dlio_ckpt.plan.checkpoint_formats import CHECKPOINT_FORMATS
from dlio_ckpt.plan.layouts import LAYOUTS

__all__ = ["STRATEGIES", "canonical_strategy", "strategy_declares", "check_names"]


def check_names(config: Any) -> None:
    """`config` (a CheckpointConfig) names a known strategy, layout and format."""
    STRATEGIES.canonical(config.strategy)
    LAYOUTS.canonical(config.layout)
    CHECKPOINT_FORMATS.canonical(config.format)
