"""Dataset formats, chosen by name (`dataset.format=`)."""

from __future__ import annotations

import importlib

from dlio_ckpt.errors import ConfigError, close_match
from dlio_ckpt.formats.base import DatasetFormat, FileSpec, FormatOptions, SampleReader

# name -> "module:Class"; imported on use so an optional dependency only matters when chosen.
_REGISTRY = {
    "npz": "dlio_ckpt.formats.npz:NpzFormat",
    "npy": "dlio_ckpt.formats.npy:NpyFormat",
    "hdf5": "dlio_ckpt.formats.hdf5:Hdf5Format",
    "tfrecord": "dlio_ckpt.formats.tfrecord:TFRecordFormat",
    "raw": "dlio_ckpt.formats.raw:RawFormat",
    "indexed_binary": "dlio_ckpt.formats.indexed:IndexedBinaryFormat",
}


def names() -> list[str]:
    return sorted(_REGISTRY)


def get_format(name: str) -> DatasetFormat:
    if name not in _REGISTRY:
        raise ConfigError(f"dataset.format: unknown format '{name}'{close_match(name, _REGISTRY)}; choose one of: {', '.join(names())}")
    module, _, cls = _REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["DatasetFormat", "FileSpec", "FormatOptions", "SampleReader", "get_format", "names"]
