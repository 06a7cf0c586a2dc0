"""Workloads from the user's own files: `workload=PATH`, `--config-dir DIR`, `dlio_config=PATH`.

The shipped library is registered as the Hydra group `workload` (config/groups.py). A user's file
joins the same group under its file name, so it composes, scales and takes overrides exactly as
a shipped workload does; the command line is rewritten to name it (`workload=NAME`). A DLIO
benchmark YAML is converted first (config/dlio_import.py). Every file is checked here, before
Hydra sees it, so that a bad file gives one line naming the file and the key, exit 2.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence

from dlio_ckpt.config.dlio_import import import_file
from dlio_ckpt.config.groups import override_values, parse_overrides, workload_names
from dlio_ckpt.schema import RunConfig
from dlio_ckpt.typed import all_keys, convert
from dlio_ckpt.config.yaml_files import dotted_leaves, file_name, parse_yaml, read_yaml_text
from dlio_ckpt.errors import ConfigError, close_match

GROUP = "workload"
DLIO_KEY = "dlio_config"
# Keys a workload file may hold besides RunConfig's: the per-accelerator table (config/accelerators.py).
EXTRA_TOP_KEYS = ("accelerators",)


def _field_type(key: str) -> Any:
    """The annotated type of a dotted RunConfig key, or None for a section."""
    cls: Any = RunConfig
    hint: Any = None
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            return None
        hint = typing.get_type_hints(cls)[part]
        cls = hint
    return None if dataclasses.is_dataclass(hint) else hint


def check_workload_node(node: Any, path: str) -> None:
    """Every key of a workload file is a config key and every value has its type (one line naming both)."""
    if not isinstance(node, Mapping):
        raise ConfigError(f"{path}: a workload file holds a mapping of config keys (dataset:, reader:, ...), "
                          f"not {type(node).__name__}")
    known = set(all_keys(RunConfig)) - {"run_dir"}
    for key, value in dotted_leaves(node, opaque=EXTRA_TOP_KEYS):
        if key in EXTRA_TOP_KEYS or key == "defaults":
            continue
        if key not in known:
            if key.split(".")[0] in ("framework", "workflow") or key == "model":
                raise ConfigError(f"{path}: unknown config key '{key}': this looks like a DLIO benchmark workload; "
                                  f"run it with dlio_config={path}")
            raise ConfigError(f"{path}: unknown config key '{key}'{close_match(key, known)}; "
                              "every key and its default: conf/config.yaml")
        hint = _field_type(key)
        if hint is not None and not (isinstance(value, str) and "${" in value):
            convert(hint, value, f"{path}: {key}")


def _load_yaml(path: Path) -> Any:
    from omegaconf import OmegaConf

    parse_yaml(read_yaml_text(path), path)  # its size and depth, before OmegaConf copies it (recursively)
    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())[:200]}") from None


def register_node(name: str, node: Mapping[str, Any]) -> None:
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(group=GROUP, name=name, node=OmegaConf.create(dict(node)), package="_global_")


def register_file(path: str | Path) -> str:
    """Check a dlio_ckpt workload file and add it to the workload group; returns its name there."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"workload: {path} is not a file; give a workload name (see workloads/) or the path of a workload YAML")
    node = _load_yaml(file)
    check_workload_node(node, str(path))
    name = file_name(file)
    if name in workload_names():  # the shipped library is registered again at each compose
        name = f"{name}_user"
    node = dict(node)
    node.setdefault("workload", name)
    node.setdefault("source", str(file.resolve()))
    register_node(name, node)
    return name


def register_config_dirs(folders: Sequence[str]) -> None:
    """Workload files in --config-dir folders (DIR/*.yaml and DIR/workload/*.yaml) join the group."""
    for folder in folders:
        base = Path(folder).expanduser()
        if not base.is_dir():
            raise ConfigError(f"--config-dir: {folder} is not a folder")
        for path in sorted(base.glob("*.yaml")) + sorted((base / GROUP).glob("*.yaml")):
            if path.name != "config.yaml":
                register_file(path)


def register_dlio(path: str) -> tuple[str, str]:
    """Convert a DLIO workload YAML and add it to the workload group: (name, warning line or "")."""
    result = import_file(path)
    node = result.workload()
    name = result.name if result.name not in workload_names() else f"{result.name}_dlio"
    node["workload"] = name
    register_node(name, node)
    return name, result.warning()


def _is_path(value: str) -> bool:
    return "/" in value or value.endswith((".yaml", ".yml"))


def resolve(overrides: Sequence[str], config_dirs: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """Register the files the command line names and return (overrides naming them, warning lines)."""
    register_config_dirs(config_dirs)
    parsed = parse_overrides(overrides)
    out: list[str] = []
    warnings: list[str] = []
    dlio_names: list[str] = []
    chooses_workload = False
    for text, override in zip(overrides, parsed):
        key = override.key_or_group
        if key not in (GROUP, DLIO_KEY):
            out.append(text)
            continue
        values = [str(v) for v in override_values(override)]
        if key == DLIO_KEY:
            for value in values:
                name, warning = register_dlio(value)
                dlio_names.append(name)
                if warning:
                    warnings.append(warning)
            continue
        chooses_workload = True
        names = [register_file(v) if _is_path(v) else v for v in values]
        out.append(f"{GROUP}={','.join(names)}")
    if dlio_names:
        if chooses_workload:
            raise ConfigError(f"{DLIO_KEY}: a DLIO file is the workload; leave out workload= (or leave out {DLIO_KEY}=)")
        out.insert(0, f"{GROUP}={','.join(dlio_names)}")
    return out, warnings


def config_dirs_in(flags: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the --config-dir folders, the flags without them): the folders' workloads are registered
    here rather than added to Hydra's search path."""
    dirs, rest = [], []
    index = 0
    while index < len(flags):
        flag = flags[index]
        if flag in ("--config-dir", "-cd") and index + 1 < len(flags):
            dirs.append(flags[index + 1])
            index += 2
            continue
        if flag.startswith("--config-dir="):
            dirs.append(flag.split("=", 1)[1])
        else:
            rest.append(flag)
        index += 1
    return dirs, rest
