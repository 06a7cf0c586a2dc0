"""ReadPlan: for one rank and one epoch, which samples it reads, in which order, in which batches.

Pure and seeded: the epoch's global order is the file order (shuffled per epoch with
`shuffle_seed + epoch`) with each file's samples in place; ranks take contiguous shares that
differ by at most one sample, so every sample is read exactly once per epoch. Sample shuffling
then permutes a rank's share (seeded by epoch and rank) for formats read by index; formats read
in file order (TFRecord) keep the on-disk order, as tf.data does, and shuffle in memory.

Two framework behaviours are planned here too. DLIO's step counting (`train.step_counting=dlio`)
gives every rank floor(samples / batch / ranks) steps per epoch, dropping what is left. A reader
with `reader.access=transfer` (tf.data's TFRecordDataset) takes whole files and reads each
from its start in transfer_size requests, as far as the samples consumed so far reach.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlio_ckpt.schema import ReaderConfig
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.formats.base import FileSpec
from dlio_ckpt.plan.file_list import sample_counts, total_samples
from dlio_ckpt.world import rank_slices


@dataclass(frozen=True)
class Batch:
    """What reading one planned batch delivered: samples and their payload bytes."""

    samples: int
    payload_bytes: int


@dataclass(frozen=True)
class EpochReadPlan:
    epoch: int
    rank: int
    # One row per sample in read order: (position in the file list, sample index in the file); int32
    # below 2^31 files and samples (index_dtype): 8 bytes a sample of the rank's share
    samples: np.ndarray
    batch_size: int
    drop_last: bool
    max_batches: int | None = None  # None: every batch of the share; else at most this many (DLIO step counting)

    @property
    def num_samples(self) -> int:
        return len(self.samples)

    @property
    def num_batches(self) -> int:
        full, rest = divmod(self.num_samples, self.batch_size)
        count = full + (1 if rest and not self.drop_last else 0)
        return count if self.max_batches is None else min(count, self.max_batches)

    @property
    def samples_read(self) -> int:
        """Samples the batches cover (the whole share unless batches are dropped)."""
        return min(self.num_samples, self.num_batches * self.batch_size)

    def batch(self, index: int) -> np.ndarray:
        return self.samples[index * self.batch_size : (index + 1) * self.batch_size]

    def files(self) -> list[int]:
        """Positions of the files this rank touches, in first-touch order."""
        _, first = np.unique(self.samples[:, 0], return_index=True)
        return [int(self.samples[i, 0]) for i in sorted(first)]


def index_dtype(count: int) -> np.dtype:
    """int32 for positions below 2^31, else int64: a plan's index arrays take 4 bytes an entry, not
    8, up to 2 billion files or samples. A shuffle of either gives the same order (numpy's Fisher-Yates
    draws do not depend on the item size), so the plan is the same numbers."""
    return np.dtype(np.int32 if count < 2**31 else np.int64)


def file_order(num_files: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    order = np.arange(num_files, dtype=index_dtype(num_files))
    if shuffle:
        np.random.default_rng([seed, epoch, 0]).shuffle(order)
    return order


def check_world(files: tuple[FileSpec, ...], size: int, whole_files: bool) -> None:
    """A world larger than the dataset leaves ranks idle; for whole-file readers, larger than the file count."""
    total = total_samples(files)
    if total < size:
        raise ConfigError(f"world size {size} is larger than the dataset's {total} samples; raise dataset.num_files_train or run fewer ranks")
    if whole_files and len(files) < size:
        raise ConfigError(
            f"reader.name=tensorflow reads whole files, and {size} ranks need at least {size} files "
            f"(dataset.num_files_train={len(files)}); raise it or run fewer ranks"
        )


def share_sizes(files: tuple[FileSpec, ...], size: int, whole_files: bool) -> list[int]:
    """Samples each rank reads per epoch: contiguous sample shares, or whole-file shares."""
    if not whole_files:
        total = total_samples(files)
        return [stop - start for start, stop in rank_slices(total, size)]
    counts = sample_counts(files, np.arange(len(files)))  # equal sample counts: the file order does not matter
    return [int(counts[start:stop].sum()) for start, stop in rank_slices(len(files), size)]


def dlio_steps_per_epoch(files: tuple[FileSpec, ...], batch_size: int, size: int, whole_files: bool,
                         total_steps: int = 0) -> int:
    """DLIO 2.0.0's steps per epoch: floor(samples / batch / ranks), capped by total_steps.

    Every rank runs the same count (a rank whose whole-file share is short of it runs the
    shortest share's count, so that no rank waits in a checkpoint the others never reach).
    """
    total = total_samples(files)
    steps = total // batch_size // size
    steps = min([steps] + [share // batch_size for share in share_sizes(files, size, whole_files)])
    return min(steps, total_steps) if total_steps else steps


def last_training_step(num_files: int, samples_per_file: int, batch_size: int, drop_last: bool, size: int,
                       whole_files: bool, dlio: bool, epochs: int, total_steps: int = 0) -> int:
    """The last step any rank of a training run reaches (steps count from 1, over all epochs), as
    engine/train.py counts them: DLIO's count per epoch times the epochs, or a rank's batches per
    epoch (its share; the first ranks' shares are the larger) times the epochs, up to total_steps.
    A failure planned after it (failures.at_steps) never strikes. Files hold equal sample counts."""
    if dlio:
        specs = tuple(FileSpec(index=i, path="", num_samples=samples_per_file, sample_bytes=0) for i in range(num_files))
        return dlio_steps_per_epoch(specs, batch_size, size, whole_files, total_steps) * epochs
    if whole_files:
        share = -(-num_files // size) * samples_per_file
    else:
        share = -(-num_files * samples_per_file // size)
    per_epoch = share // batch_size if drop_last else -(-share // batch_size)
    return min(per_epoch * epochs, total_steps) if total_steps else per_epoch * epochs


def transfer_end(file_bytes: int, num_samples: int, sample: int, transfer_size: int) -> int:
    """Bytes from the start of a file a sequential reader has read once `sample` is consumed.

    Samples lie in file order and take equal shares of the file (TFRecord records of one file
    have one length); tf.data reads whole transfer_size requests, so it has read through the
    request that holds the sample's last byte, or to the end of the file.
    """
    last_byte = -(-(sample + 1) * file_bytes // num_samples)
    if transfer_size <= 0:
        return last_byte
    return min(file_bytes, -(-last_byte // transfer_size) * transfer_size)


def transfer_requests(start: int, end: int, file_bytes: int, transfer_size: int) -> list[tuple[int, int]]:
    """The (offset, length) requests that read bytes [start, end) of a file, transfer_size at a time."""
    step = transfer_size if transfer_size > 0 else max(1, end - start)
    return [(offset, min(step, file_bytes - offset)) for offset in range(start, end, step) if offset < file_bytes]


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
    max_batches: int | None = None,
) -> EpochReadPlan:
    """The read order of `rank` in `epoch` (epochs count from 1).

    `whole_files` shards by file instead of by sample, for readers that consume whole files
    (tf.data): each rank gets a contiguous share of the epoch's file order. `max_batches` caps
    the batches (DLIO's step count, possibly 0; the rest of the share is not read).
    """
    order = file_order(len(files), shuffle and reader.file_shuffle, reader.shuffle_seed, epoch)
    if whole_files:
        first, last = rank_slices(len(order), size)[rank]
        order = order[first:last]
        rank, size = 0, 1
    counts = sample_counts(files, order)
    total = int(counts.sum())
    dtype = index_dtype(max(total, len(files)))
    begin, end = rank_slices(total, size)[rank]
    share = np.empty((end - begin, 2), dtype)
    if len(counts) and counts.min() == counts.max():  # every file alike: the columns without their prefix sums
        per_file = int(counts[0])
        del counts
        rows = np.arange(begin, end, dtype=dtype)
        share[:, 0] = order[rows // per_file]
        share[:, 1] = rows % per_file
        del rows
    else:
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        share[:, 0] = np.repeat(order, counts)[begin:end]
        share[:, 1] = (np.arange(total) - np.repeat(starts, counts))[begin:end]
    del order
    if shuffle and reader.sample_shuffle and not sequential and len(share) > 1:
        # rng.permutation(n) is arange(n) shuffled: the same order, in the plan's dtype
        permutation = np.arange(len(share), dtype=dtype)
        np.random.default_rng([reader.shuffle_seed, epoch, rank + 1]).shuffle(permutation)
        share = share[permutation]
    return EpochReadPlan(
        epoch=epoch,
        rank=rank,
        samples=share,
        batch_size=batch_size or reader.batch_size,
        drop_last=reader.drop_last or max_batches is not None,
        max_batches=max_batches,
    )
