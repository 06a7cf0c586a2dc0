"""ReadPlan: for one rank and one epoch, which samples it reads, in which order, in which batches.

Pure and seeded: the epoch's global order is the file order (shuffled per epoch with
`shuffle_seed + epoch`) with each file's samples in place; ranks take contiguous shares that
differ by at most one sample, so every sample is read exactly once per epoch. Sample shuffling
then permutes a rank's share (seeded by epoch and rank) for formats read by index; formats read
in file order (TFRecord) keep the on-disk order, as tf.data does, and shuffle in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlio_ckpt.config.schema import ReaderConfig
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.formats.base import FileSpec
from dlio_ckpt.world import rank_slices


@dataclass(frozen=True)
class EpochReadPlan:
    epoch: int
    rank: int
    # One row per sample in read order: (position in the file list, sample index in the file).
    samples: np.ndarray
    batch_size: int
    drop_last: bool

    @property
    def num_samples(self) -> int:
        return len(self.samples)

    @property
    def num_batches(self) -> int:
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def batch(self, index: int) -> np.ndarray:
        return self.samples[index * self.batch_size : (index + 1) * self.batch_size]

    def files(self) -> list[int]:
        """Positions of the files this rank touches, in first-touch order."""
        _, first = np.unique(self.samples[:, 0], return_index=True)
        return [int(self.samples[i, 0]) for i in sorted(first)]


def file_order(num_files: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    order = np.arange(num_files)
    if shuffle:
        np.random.default_rng([seed, epoch, 0]).shuffle(order)
    return order


def check_world(files: tuple[FileSpec, ...], size: int, whole_files: bool) -> None:
    """A world larger than the dataset leaves ranks idle; for whole-file readers, larger than the file count."""
    total = sum(f.num_samples for f in files)
    if total < size:
        raise ConfigError(f"world size {size} is larger than the dataset's {total} samples; raise dataset.num_files_train or run fewer ranks")
    if whole_files and len(files) < size:
        raise ConfigError(
            f"reader.name=tensorflow reads whole files, and {size} ranks need at least {size} files "
            f"(dataset.num_files_train={len(files)}); raise it or run fewer ranks"
        )


def plan_epoch(
    files: tuple[FileSpec, ...],
    reader: ReaderConfig,
    rank: int,
    size: int,
    epoch: int,
    sequential: bool,
    batch_size: int | None = None,
    shuffle: bool = True,
    whole_files: bool = False,
) -> EpochReadPlan:
    """The read order of `rank` in `epoch` (epochs count from 1).

    `whole_files` shards by file instead of by sample, for readers that consume whole files
    (tf.data): each rank gets a contiguous share of the epoch's file order.
    """
    order = file_order(len(files), shuffle and reader.file_shuffle, reader.shuffle_seed, epoch)
    if whole_files:
        first, last = rank_slices(len(order), size)[rank]
        order = order[first:last]
        rank, size = 0, 1
    counts = np.array([files[i].num_samples for i in order], dtype=np.int64)
    file_column = np.repeat(order, counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sample_column = np.arange(int(counts.sum())) - np.repeat(starts, counts)
    begin, end = rank_slices(len(file_column), size)[rank]
    share = np.stack([file_column[begin:end], sample_column[begin:end]], axis=1)
    if shuffle and reader.sample_shuffle and not sequential and len(share) > 1:
        share = share[np.random.default_rng([reader.shuffle_seed, epoch, rank + 1]).permutation(len(share))]
    return EpochReadPlan(
        epoch=epoch,
        rank=rank,
        samples=share,
        batch_size=batch_size or reader.batch_size,
        drop_last=reader.drop_last,
    )
