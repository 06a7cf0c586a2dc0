"""The Hydra groups dlio_ckpt composes, and the command line's overrides as Hydra parses them.

Where conf/ and the workload library are (in the wheel or the source tree), each group's options
(the shipped library and the user's own files, registered in Hydra's ConfigStore), registering the
library, and every value an override gives (a sweep's each, a glob's matches). Below the loader
(load.py) and the user's workload files (workload_files.py), which both read them.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Iterable, Sequence

from omegaconf import OmegaConf

from dlio_ckpt.errors import ConfigError

GROUPS = ("workload", "scale")


def _data_dir(name: str) -> Path:
    """A data folder shipped as `dlio_ckpt.<name>`: from the wheel, else from the source tree.

    In a source checkout (editable install, or running from the repository root) the folders
    stay at the top level (conf/, workloads/, analysis/) beside the package.
    """
    source = Path(__file__).resolve().parents[2] / name
    if source.is_dir():
        return source
    # A data-only folder installs as a namespace package: its __path__ holds the real folder.
    package = importlib.import_module(f"dlio_ckpt.{name}")
    return Path(list(package.__path__)[0])


def conf_dir() -> Path:
    return _data_dir("conf")


def workloads_dir() -> Path:
    return _data_dir("workloads")


def workload_names() -> list[str]:
    """The shipped workload library's names (workloads/*.yaml)."""
    return sorted(p.stem for p in workloads_dir().glob("*.yaml"))


def group_options(group: str) -> list[str]:
    if group == "workload":
        return sorted(set(workload_names()) | set(registered_names()))  # with the user's files (workload_files.py)
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def register_workloads(names: Iterable[str] | None = None) -> None:
    """Make workloads/*.yaml the Hydra group `workload` (package _global_): all of them, or only
    `names` (a run composes one workload, and parsing a file costs ~6 ms: the whole library was
    ~0.1 s of every process's start, on every rank).

    The library lives in its own top-level folder rather than under conf/, so it is registered
    through Hydra's ConfigStore instead of the folder search; repeated calls are harmless and
    cheap: a file already registered in this process is not parsed again. A name that is not a
    shipped file is left alone (a user's file registers itself; an unknown name is refused by
    check_override_keys with the list of choices).
    """
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    registered = store.repo.get("workload", {})
    folder = workloads_dir()
    paths = sorted(folder.glob("*.yaml")) if names is None else [folder / f"{name}.yaml" for name in sorted(set(names))]
    for path in paths:
        if f"{path.stem}.yaml" in registered or not path.is_file():
            continue
        try:
            node = OmegaConf.load(path)
        except Exception as exc:
            raise ConfigError(f"workload file {path} is not valid YAML: {' '.join(str(exc).split())}") from None
        store.store(group="workload", name=path.stem, node=node, package="_global_")


def default_workload() -> str:
    """The workload conf/config.yaml's defaults list picks when the command line names none."""
    found = re.search(r"^\s*-\s*workload:\s*([A-Za-z0-9_]+)\s*$", (conf_dir() / "config.yaml").read_text(), re.MULTILINE)
    if found is None:
        raise ConfigError(f"{conf_dir() / 'config.yaml'}: its defaults list names no workload")
    return found.group(1)


def workloads_named(overrides: Sequence[str]) -> list[str] | None:
    """The workloads a command line composes: those its `workload=` overrides name (every value of
    a sweep, a glob's matches) and the default (Hydra composes the defaults once before a sweep's
    jobs); None (all of them) when a value is not a plain name."""
    names = {default_workload()}
    for override in parse_overrides(overrides):
        if override.key_or_group != "workload":
            continue
        values = override_values(override)
        if not all(isinstance(value, str) for value in values):
            return None
        names.update(values)
    return sorted(names)


def parse_overrides(overrides: Sequence[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except Exception as exc:  # Hydra's grammar errors are several lines; keep the first
        raise ConfigError(f"cannot parse command-line override: {str(exc).splitlines()[0]}") from None


def override_values(override) -> list:
    """Every value an override gives, a sweep's each: `a,b`, `range(...)`, and `glob(...)`
    over a group's options (which Hydra's parser can only list with a config loader at hand)."""
    from hydra.core.override_parser.types import ValueType

    if override.value_type == ValueType.GLOB_CHOICE_SWEEP:
        return override.value().filter(group_options(override.key_or_group))
    return list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]


def registered_names() -> list[str]:
    """Names of the workload group in Hydra's ConfigStore (shipped and user files)."""
    from hydra.core.config_store import ConfigStore

    group = ConfigStore.instance().repo.get("workload", {})
    return sorted(name.removesuffix(".yaml") for name in group)
