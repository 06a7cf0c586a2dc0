"""`dlio_ckpt --list-workloads`: one line per shipped workload with what it is and where its numbers come from.

The lines come from each workload file's own `description` and `source` keys (the same values a
run records in summary.json), so the list cannot drift from the files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from dlio_ckpt.errors import ConfigError


@dataclass(frozen=True)
class WorkloadEntry:
    name: str
    description: str
    source: str


def read_entry(path: Path) -> WorkloadEntry:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"workload file {path} cannot be read as YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"workload file {path}: is not a mapping of config keys")
    return WorkloadEntry(name=path.stem, description=str(data.get("description") or "(no description)"),
                         source=str(data.get("source") or "(no source given)"))


def workload_catalogue(folder: Path) -> list[WorkloadEntry]:
    return [read_entry(path) for path in sorted(folder.glob("*.yaml"))]


def format_catalogue(entries: list[WorkloadEntry]) -> str:
    width = max((len(e.name) for e in entries), default=0)
    return "\n".join(f"{e.name:<{width}}  {e.description}  [source: {e.source}]" for e in entries)
