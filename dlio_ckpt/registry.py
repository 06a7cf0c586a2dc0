"""Name -> implementation tables, imported on use: the one way a config name becomes a class.

Dataset formats, checkpoint formats, layouts, strategies and storage backends each keep one
`Registry` beside their code. An entry is a "module:attr" string, so choosing a name imports only
that module, and an optional dependency (TensorFlow, an S3 client) matters only when its entry is
chosen; a missing one is reported with the pip command that installs it. Adding an implementation
is one new module plus one line in its table: no other list of names exists.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Mapping

from dlio_ckpt.errors import ConfigError, MissingDependency, close_match


@dataclass(frozen=True)
class Registry:
    """Names a config key (`key`, e.g. "dataset.format") may take, and where each one lives."""

    key: str
    noun: str  # what a name names, for messages: "format", "backend", ...
    entries: Mapping[str, str]  # name -> "module:attr"
    install_hints: Mapping[str, str] = field(default_factory=dict)  # name -> pip command for its optional dependency
    aliases: Mapping[str, str] = field(default_factory=dict)  # accepted old name -> name

    def names(self) -> list[str]:
        """The names to offer, in table order (aliases are accepted but not offered)."""
        return list(self.entries)

    def canonical(self, name: str) -> str:
        """`name` resolved through the aliases; ConfigError naming the key and a close match when unknown."""
        name = self.aliases.get(name, name)
        if name not in self.entries:
            hint = close_match(name, list(self.entries) + list(self.aliases))
            raise ConfigError(f"{self.key}: unknown {self.noun} '{name}'{hint}; choose one of: {', '.join(self.names())}")
        return name

    def load(self, name: str) -> Any:
        """The attribute `name` points at, imported now; MissingDependency with the install hint
        when its module (or something it imports) is not installed."""
        name = self.canonical(name)
        try:
            return import_target(self.entries[name])
        except ImportError as exc:
            if name not in self.install_hints:
                raise
            raise MissingDependency(
                f"{self.key}={name} needs a library that is not installed ({exc}); install it with: {self.install_hints[name]}"
            ) from exc


def import_target(target: str) -> Any:
    """The attribute a "module:attr" string names, its module imported now."""
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)
