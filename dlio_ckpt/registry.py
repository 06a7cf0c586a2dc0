"""Name -> implementation tables, imported on use: the one way a config name becomes a class.

Dataset formats, checkpoint formats, layouts, strategies, codecs and storage backends each keep one
`Registry` beside their code. An entry is a "module:attr" string, so choosing a name imports only
that module, and an optional dependency (TensorFlow, an S3 client) matters only when its entry is
chosen; a missing one is reported with the pip command that installs it. Adding an implementation
is one new module plus one line in its table: no other list of names exists.

A registry with a `group` is open to plugins: an installed package that declares an entry point
in that group (`[project.entry-points."dlio_ckpt.codecs"] name = "module:attr"`) adds a name, with
the same lazy import, close match and install hint as a built-in one (docs/plugins.md). Plugins
are read from the installed packages' metadata only when a name is not built in, so choosing a
built-in name costs what it always did, and a built-in name is never replaced by a plugin.
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points
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
    group: str = ""  # entry-point group installed packages add names under (e.g. "dlio_ckpt.codecs"); "": closed

    def plugins(self) -> dict[str, EntryPoint]:
        """Names installed packages add through `group`, read from their metadata now (nothing is
        imported); a name that is built in (or an alias) stays the built-in one."""
        if not self.group:
            return {}
        return {ep.name: ep for ep in entry_points(group=self.group) if ep.name not in self.entries and ep.name not in self.aliases}

    def names(self) -> list[str]:
        """The names to offer: built-in ones in table order, then plugins' sorted (aliases are
        accepted but not offered)."""
        return list(self.entries) + sorted(self.plugins())

    def canonical(self, name: str) -> str:
        """`name` resolved through the aliases; ConfigError naming the key and a close match when unknown."""
        name = self.aliases.get(name, name)
        if name in self.entries:
            return name
        plugins = self.plugins()
        if name not in plugins:
            hint = close_match(name, list(self.entries) + list(self.aliases) + list(plugins))
            raise ConfigError(f"{self.key}: unknown {self.noun} '{name}'{hint}; choose one of: {', '.join(self.names())}")
        return name

    def load(self, name: str) -> Any:
        """The attribute `name` points at, imported now; MissingDependency with the install hint
        when its module (or something it imports) is not installed (for a plugin: reinstalling
        the package that declared it, which brings its dependencies)."""
        name = self.canonical(name)
        plugin = None if name in self.entries else self.plugins()[name]
        try:
            return import_target(self.entries[name]) if plugin is None else plugin.load()
        except ImportError as exc:
            hint = self.install_hints.get(name) or (plugin is not None and plugin.dist is not None and f"pip install {plugin.dist.name}")
            if not hint:
                raise
            raise MissingDependency(f"{self.key}={name} needs a library that is not installed ({exc}); install it with: {hint}") from exc


def import_target(target: str) -> Any:
    """The attribute a "module:attr" string names, its module imported now."""
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)
