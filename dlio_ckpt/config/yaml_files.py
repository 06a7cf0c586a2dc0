"""A user's YAML file read within bounds, and walked as dotted keys: the workload files and the DLIO
benchmark YAMLs (workload_files.py, dlio_import.py) and the accelerator tables (accelerators.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from dlio_ckpt.errors import ConfigError


# A workload file is a few levels deep (model.parallelism.tensor), a few hundred values and a few
# KiB. These bounds refuse a file nested past any workload (5,000 levels was a RecursionError in the
# YAML parser) or one whose YAML aliases multiply a few lines into billions of values (each alias
# is the same object until something copies or walks it), before anything walks it recursively.
MAX_YAML_DEPTH = 32
MAX_YAML_VALUES = 100_000
MAX_YAML_BYTES = 16 << 20


def read_yaml_text(path: Path) -> str:
    """The text of a user's YAML file, refused (one line) past MAX_YAML_BYTES or when not text."""
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise ConfigError(f"{path}: {size:,} bytes; a workload file is a few KiB (at most {MAX_YAML_BYTES >> 20} MiB here)")
        return path.read_text()
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file; give a workload YAML") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror}); give a readable workload YAML") from None


def parse_yaml(text: str, path: Path | str) -> Any:
    """yaml.safe_load of a user's file, then check_yaml_shape; one line on any YAML error."""
    import yaml

    try:
        node = yaml.safe_load(text)
    except RecursionError:
        raise ConfigError(f"{path}: nested more than Python can parse; a workload file is a few levels deep "
                          f"(at most {MAX_YAML_DEPTH} here)") from None
    except yaml.YAMLError as exc:
        first = " ".join(str(exc).split())[:200]
        raise ConfigError(f"{path}: not valid YAML ({first}); give a workload YAML") from None
    check_yaml_shape(node, path)
    return node


def check_yaml_shape(node: Any, path: Path | str) -> None:
    """ConfigError when a parsed YAML document is nested deeper than MAX_YAML_DEPTH or holds more
    than MAX_YAML_VALUES values, aliases counted each time they are used (so a "billion laughs"
    file stops here after MAX_YAML_VALUES steps). Walked with a stack, not recursion."""
    stack = [(node, 0)]
    values = 0
    while stack:
        value, depth = stack.pop()
        values += 1
        if values > MAX_YAML_VALUES:
            raise ConfigError(f"{path}: more than {MAX_YAML_VALUES:,} values (YAML aliases counted where used); "
                              "a workload file holds a few hundred")
        if isinstance(value, dict):
            children: Iterable[Any] = (*value.keys(), *value.values())
        elif isinstance(value, (list, tuple)):
            children = value
        else:
            continue
        if depth >= MAX_YAML_DEPTH:
            raise ConfigError(f"{path}: nested more than {MAX_YAML_DEPTH} levels deep; a workload file is a few "
                              "levels deep (model.parallelism.tensor)")
        stack.extend((child, depth + 1) for child in children)


def dotted_leaves(node: Mapping[str, Any], prefix: str = "", opaque: Iterable[str] = ()) -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf; a mapping named in `opaque` (or an empty one) is a leaf."""
    opaque = set(opaque)
    leaves = []
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and name not in opaque:
            leaves.extend(dotted_leaves(value, name + ".", opaque))
        else:
            leaves.append((name, value))
    return leaves


def file_name(path: str | Path) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", Path(path).stem) or "workload"
