"""accelerator=NAME: the figures a workload gives for one accelerator (DLIO's *_a100/_h100/_v100 files).

DLIO encodes the accelerator in separate workload files that differ only in compute time per
step, batch size and a few reader settings. Here a workload keeps its default figures and an
`accelerators:` table, one entry per accelerator with the keys that differ, each citing its
DLIO file; `accelerator=a100` applies that entry after composition. Keys the user sets on the
command line still win, and the scale caps apply after it, as to any workload figure.
"""

from __future__ import annotations

from typing import Any, Mapping

from dlio_ckpt.config.yaml_files import dotted_leaves
from dlio_ckpt.errors import ConfigError


def apply_accelerator(data: dict[str, Any], explicit: set[str]) -> None:
    """Remove the workload's `accelerators` table from `data` and apply the chosen entry in place."""
    table = data.pop("accelerators", None) or {}
    name = data.get("accelerator") or ""
    if not name:
        return
    workload = data.get("workload", "?")
    if not isinstance(table, Mapping) or name not in table:
        choices = ", ".join(sorted(table)) if isinstance(table, Mapping) else ""
        raise ConfigError(
            f"accelerator: workload {workload} has no figures for '{name}'; "
            + (f"choose one of: {choices}" if choices else "it has no per-accelerator figures: leave accelerator unset")
        )
    entry = table[name]
    if not isinstance(entry, Mapping):
        raise ConfigError(f"accelerators.{name}: expected a mapping of config keys in workload {workload}")
    for key, value in dotted_leaves(entry):
        if key in explicit:
            continue
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"accelerators.{name}.{key}: not a config key (workload {workload})")
            node = node[part]
        if leaf not in node:
            raise ConfigError(f"accelerators.{name}.{key}: not a config key (workload {workload})")
        node[leaf] = value
