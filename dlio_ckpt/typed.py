"""Turn a composed mapping into frozen dataclasses, with errors that name the key.

The YAML files under conf/ hold every default value; the dataclasses hold only types. So there
is one place for each: a key missing from the YAML is a bug in conf/, a key the user adds that the
dataclasses do not know is a ConfigError with a close match.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Mapping

from dlio_ckpt.errors import ConfigError, close_match
from dlio_ckpt.option_types import Bytes, require  # noqa: F401 (defined below config/, so backends' tables use them too)

# Sizes are numpy int64 values (offsets, array lengths) further on.
MAX_BYTES = 2**63 - 1
_SIZE_SUFFIXES = {
    "k": 1 << 10, "kib": 1 << 10, "kb": 1000,
    "m": 1 << 20, "mib": 1 << 20, "mb": 1000**2,
    "g": 1 << 30, "gib": 1 << 30, "gb": 1000**3,
    "t": 1 << 40, "tib": 1 << 40, "tb": 1000**4,
}


def parse_size(text: str, key: str) -> int:
    """'4MiB' -> 4194304, '1.5GB' -> 1500000000; binary and decimal units stay distinct."""
    raw = text.strip().lower().replace("_", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number):].strip()
    try:
        value = float(number)
    except ValueError:
        raise ConfigError(f"{key}: '{text}' is not a size; use bytes or a unit such as 4MiB, 1GiB, 500MB") from None
    if not math.isfinite(value):
        raise ConfigError(f"{key}: '{text}' is not a finite size; use bytes or a unit such as 4MiB, 1GiB, 500MB")
    if unit in ("", "b"):
        factor = 1
    elif unit in _SIZE_SUFFIXES:
        factor = _SIZE_SUFFIXES[unit]
    else:
        raise ConfigError(f"{key}: unknown size unit '{unit}' in '{text}'; use B, KiB, MiB, GiB, TiB or KB, MB, GB, TB")
    return int(value * factor)


def all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of a dataclass tree, for close-match suggestions."""
    keys = []
    for field in dataclasses.fields(cls):
        name = f"{prefix}{field.name}"
        keys.append(name)
        hint = _field_types(cls)[field.name]
        if dataclasses.is_dataclass(hint):
            keys.extend(all_keys(hint, name + "."))
    return keys


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """The resolved annotations of a config dataclass. Cached: resolving the string annotations
    costs about 0.25 ms a class, and every command resolves the whole schema several times (key
    checks, build, close-match hints); a class's annotations never change while it runs."""
    return typing.get_type_hints(cls)


def build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """Build dataclass `cls` from `data`, checking unknown keys, missing keys and types."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of keys, got {data!r}")
    hints = _field_types(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in hints:
            raise ConfigError(
                f"unknown config key '{prefix}{key}'{close_match(str(key), names)}; "
                f"allowed under {prefix.rstrip('.') or 'the top level'}: {', '.join(names)}"
            )
    values = {}
    for name in names:
        key = f"{prefix}{name}"
        if name not in data:
            field = next(f for f in dataclasses.fields(cls) if f.name == name)
            if field.default is not dataclasses.MISSING:
                values[name] = field.default
                continue
            if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                values[name] = field.default_factory()  # type: ignore[misc]
                continue
            raise ConfigError(f"missing config key '{key}'")
        values[name] = convert(hints[name], data[name], key)
    instance = cls(**values)
    check = getattr(instance, "validate", None)
    if check is not None:
        check(prefix)
    return instance


def convert(hint: Any, value: Any, key: str) -> Any:
    """Convert one value to the annotated type, or raise ConfigError naming the key."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return convert(option, value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key}: invalid value {value!r}")
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ConfigError(
                f"{key}: '{value}' is not allowed{close_match(str(value), [str(a) for a in allowed])}; "
                f"choose one of: {', '.join(str(a) for a in allowed)}"
            )
        return value
    if origin in (list, tuple):
        (item,) = typing.get_args(hint)[:1] or (Any,)
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        items = [convert(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if dataclasses.is_dataclass(hint):
        return build(hint, value, key + ".")
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if hint is Bytes:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a size in bytes, got {value!r}")
        if isinstance(value, str):
            value = parse_size(value, key)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise ConfigError(f"{key}: expected a size in bytes, got {value!r}")
        if value < 0:
            raise ConfigError(f"{key}: a size cannot be negative (got {value})")
        if value > MAX_BYTES:
            raise ConfigError(f"{key}: {value} bytes is too large; a size is at most 2**63-1 bytes (8 EiB)")
        return int(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(value):  # nan passes every `>= 0` check; inf makes times and counts infinite
            raise ConfigError(f"{key}: must be a finite number (got {value})")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    return value
