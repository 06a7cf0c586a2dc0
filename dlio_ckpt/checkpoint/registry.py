"""Names the checkpoint config may use, checked when the config is built (before any run starts).

The classes live beside their code (strategies.py, layouts.py, formats.py); this module only
answers "is that name known, and if not what was meant", so a typo fails in the config stage
with the key named, not deep inside a run.
"""

from __future__ import annotations

from typing import Any

from dlio_ckpt.errors import ConfigError, close_match

STRATEGY_NAMES = ("sharded", "single_writer", "async")
STRATEGY_ALIASES = {"sync": "sharded"}


def canonical_strategy(name: str) -> str:
    return STRATEGY_ALIASES.get(name, name)


def check_names(config: Any, key: str) -> None:
    from dlio_ckpt.checkpoint.formats import FORMATS
    from dlio_ckpt.checkpoint.layouts import LAYOUTS

    strategy = canonical_strategy(config.strategy)
    if strategy not in STRATEGY_NAMES:
        allowed = list(STRATEGY_NAMES) + list(STRATEGY_ALIASES)
        raise ConfigError(
            f"{key}strategy: unknown strategy '{config.strategy}'{close_match(config.strategy, allowed)}; "
            f"choose one of: {', '.join(STRATEGY_NAMES)}"
        )
    if config.layout not in LAYOUTS:
        raise ConfigError(
            f"{key}layout: unknown layout '{config.layout}'{close_match(config.layout, LAYOUTS)}; "
            f"choose one of: {', '.join(LAYOUTS)}"
        )
    if config.format not in FORMATS:
        raise ConfigError(
            f"{key}format: unknown format '{config.format}'{close_match(config.format, FORMATS)}; "
            f"choose one of: {', '.join(FORMATS)}"
        )
