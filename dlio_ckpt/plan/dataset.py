"""DatasetPlan: which files the dataset has, where, how many samples and how large (pure).

Sample sizes follow a seeded normal distribution (mean, stdev, clipped at the minimum), drawn a
block of files at a time keyed by the seed, the split and the block (plan/file_sizes.py), so every
rank and every later run computes the same plan without communicating, and no rank holds a size
per file.
The fingerprint covers everything that decides the bytes on disk, and it names the dataset's
folder (`<dataset.folder or data/<workload>>/<fingerprint>/`): runs that share a storage.root,
even at the same time, never write a dataset of one shape where another run reads one of another
shape; runs of the same shape share one dataset (reused when its manifest matches).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from dlio_ckpt.schema import RunConfig
from dlio_ckpt.plan.file_list import FileList, SplitFiles
from dlio_ckpt.plan.file_sizes import KeyedSizes

MANIFEST_NAME = ".dlio_ckpt_dataset.json"


@dataclass(frozen=True)
class DatasetPlan:
    """`train` and `eval` are FileLists (plan/file_list.py): sequences of FileSpec built on demand,
    in memory that does not grow with the file count."""

    folder: str
    format: str
    train: FileList
    eval: FileList
    fingerprint: str

    @property
    def files(self) -> FileList:
        return self.train + self.eval

    @property
    def manifest_path(self) -> str:
        return os.path.join(self.folder, MANIFEST_NAME)

    @property
    def train_samples(self) -> int:
        return self.train.total_samples()

    @property
    def payload_bytes(self) -> int:
        return self.files.total_payload_bytes()


def dataset_base_folder(config: RunConfig) -> str:
    """The folder the user chose (or data/<workload>) under storage.root; each shape gets a subfolder."""
    relative = config.dataset.folder or os.path.join("data", config.workload)
    return os.path.abspath(os.path.join(config.storage.root, relative))


def dataset_fingerprint(config: RunConfig) -> str:
    """A digest of everything that decides the dataset's bytes (not where it lives)."""
    ds = config.dataset
    identity = {
        "format": ds.format,
        "files": [ds.num_files_train, ds.num_files_eval],
        "samples_per_file": ds.num_samples_per_file,
        "sizes": [ds.record_length_bytes, ds.record_length_bytes_stdev, ds.record_length_bytes_min],
        "subfolders": [ds.num_subfolders_train, ds.num_subfolders_eval],
        "prefix": ds.file_prefix,
        "compression": [ds.compression, ds.compression_level],
        "chunking": [ds.chunking, ds.chunk_size_bytes],
        "content": ds.content,
        "seed": ds.seed,
        "pool_bytes": config.generate.pool_bytes,
        "version": 2,  # 2: sample contents spread by content.spread (version 1 repeated every other file)
    }
    if ds.record_length_bytes_stdev:  # varied sizes are drawn per block of files since then: other sizes
        identity["sizes_drawn"] = "keyed blocks"  # only there, so that no dataset of one size changes folder
    if ds.format == "parquet":  # only there, so that no other dataset's fingerprint (and folder) changes
        identity["parquet"] = [list(ds.parquet_columns), ds.parquet_row_group_size]
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def dataset_folder(config: RunConfig) -> str:
    return os.path.join(dataset_base_folder(config), dataset_fingerprint(config))


def _sizes(count: int, config: RunConfig, stream: int) -> KeyedSizes | None:
    """Per-file sample sizes (computed a block of files at a time when asked), or None where every
    file has record_length_bytes."""
    ds = config.dataset
    if ds.record_length_bytes_stdev == 0 or count == 0:
        return None
    return KeyedSizes(count=count, mean=ds.record_length_bytes, stdev=ds.record_length_bytes_stdev,
                      minimum=ds.record_length_bytes_min, key=(ds.seed, stream))


def plan_dataset(config: RunConfig, extension: str) -> DatasetPlan:
    """The dataset a config describes; `extension` comes from the format (e.g. 'npz')."""
    ds = config.dataset
    fingerprint = dataset_fingerprint(config)
    folder = os.path.join(dataset_base_folder(config), fingerprint)
    splits: dict[str, FileList] = {}
    offset = 0
    for split, count, subfolders, stream in (
        ("train", ds.num_files_train, ds.num_subfolders_train, 0),
        ("eval", ds.num_files_eval, ds.num_subfolders_eval, 1),
    ):
        rule = SplitFiles(folder=folder, split=split, count=count, subfolders=subfolders, prefix=ds.file_prefix,
                          extension=extension, num_samples=ds.num_samples_per_file, first_index=offset,
                          sample_bytes=ds.record_length_bytes, sizes=_sizes(count, config, stream))
        splits[split] = FileList((rule,))
        offset += count
    return DatasetPlan(folder=folder, format=ds.format, train=splits["train"], eval=splits["eval"], fingerprint=fingerprint)


def generation_share(plan: DatasetPlan, rank: int, size: int) -> FileList:
    """The files rank `rank` writes: round robin, so large and small files spread evenly."""
    return plan.files[rank::size]
