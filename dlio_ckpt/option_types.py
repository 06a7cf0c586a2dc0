"""What a config field can be typed with beyond the builtins, and how a table rejects a value.

Below every layer, so the tables that are not config/'s own can use them without importing
config/ (an upward edge): a storage backend declares its options (`storage.<backend>.*`) in its
own table (storage/s3_options.py), which typed.py builds and checks like every other
section. typed.py re-exports both names.
"""

from __future__ import annotations

from dlio_ckpt.errors import ConfigError


class Bytes(int):
    """An int field that also accepts sizes with units ('4MiB')."""


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless condition holds: for impossible values in validate()."""
    if not condition:
        raise ConfigError(message)
