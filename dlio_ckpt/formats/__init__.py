"""Dataset formats, chosen by name (`dataset.format=`)."""

from __future__ import annotations

from dlio_ckpt.formats.base import DatasetFormat, FileSpec, FormatOptions, SampleReader
from dlio_ckpt.registry import Registry

DATASET_FORMATS = Registry(
    key="dataset.format",
    noun="format",
    entries={
        "npz": "dlio_ckpt.formats.npz:NpzFormat",
        "npy": "dlio_ckpt.formats.npy:NpyFormat",
        "hdf5": "dlio_ckpt.formats.hdf5:Hdf5Format",
        "tfrecord": "dlio_ckpt.formats.tfrecord:TFRecordFormat",
        "raw": "dlio_ckpt.formats.raw:RawFormat",
        "indexed_binary": "dlio_ckpt.formats.indexed:IndexedBinaryFormat",
        "jpeg": "dlio_ckpt.formats.jpeg:JpegFormat",
        "parquet": "dlio_ckpt.formats.parquet:ParquetFormat",
    },
    group="dlio_ckpt.dataset_formats",
)


def names() -> list[str]:
    return sorted(DATASET_FORMATS.names())


def get_format(name: str) -> DatasetFormat:
    return DATASET_FORMATS.load(name)()


__all__ = ["DATASET_FORMATS", "DatasetFormat", "FileSpec", "FormatOptions", "SampleReader", "get_format", "names"]
