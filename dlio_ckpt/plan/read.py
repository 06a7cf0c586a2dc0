"""ReadPlan: for one rank and one epoch, which samples it reads, in which order, in which batches.

Pure and seeded: the epoch's global order is the file order (a keyed permutation of the files
per epoch, keyed by `shuffle_seed` and the epoch) with each file's samples in place; ranks take
contiguous shares that differ by at most one sample, so every sample is read exactly once per
epoch. Sample shuffling then permutes a rank's share (keyed by seed, epoch and rank) for formats
read by index; formats read in file order (TFRecord) keep the on-disk order, as tf.data does, and
shuffle in memory.

Nothing here grows with the dataset: the orders are KeyedPermutations (plan/permutation.py) and a
plan computes a batch's rows when asked (plan/read_order.py), a block of BLOCK_ROWS at a time, so
a rank holds ~1 MB for its epoch whether it reads a thousand samples or a billion.

Two framework behaviours are planned here too. DLIO's step counting (`train.step_counting=dlio`)
gives every rank floor(samples / batch / ranks) steps per epoch, dropping what is left. A reader
with `reader.access=transfer` (tf.data's TFRecordDataset) takes whole files and reads each
from its start in transfer_size requests, as far as the samples consumed so far reach.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlio_ckpt.schema import ReaderConfig
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.formats.base import FileSpec
from dlio_ckpt.plan.file_list import sample_counts, samples_per_file, total_samples
from dlio_ckpt.plan.permutation import KeyedPermutation
from dlio_ckpt.plan.read_order import ListedOrder, RunFiles, ShareOrder, index_dtype
from dlio_ckpt.world import rank_slices

BLOCK_ROWS = 1 << 16  # rows computed at once: 512 KiB of int32 pairs, a numpy call per ~65k samples, not per batch


@dataclass(frozen=True)
class Batch:
    """What reading one planned batch delivered: samples and their payload bytes."""

    samples: int
    payload_bytes: int


@dataclass(frozen=True)
class EpochReadPlan:
    epoch: int
    rank: int
    order: ShareOrder | ListedOrder  # the rank's whole share of the epoch, computed a block at a time when asked
    batch_size: int
    drop_last: bool
    max_batches: int | None = None  # None: every batch of the share; else at most this many (DLIO step counting)
    start: int = 0  # positions of the share already consumed (a resumed epoch starts after them)
    # The block of rows last computed, (block number, rows), replaced whole so that reader threads
    # asking for batches at once each see one block entire; a cache of a pure function, not state.
    _block: list = field(init=False, default_factory=lambda: [None], compare=False, repr=False)

    @property
    def num_samples(self) -> int:
        return self.order.length - self.start

    @property
    def num_batches(self) -> int:
        full, rest = divmod(self.num_samples, self.batch_size)
        count = full + (1 if rest and not self.drop_last else 0)
        return count if self.max_batches is None else min(count, self.max_batches)

    @property
    def samples_read(self) -> int:
        """Samples the batches cover (the whole share unless batches are dropped)."""
        return min(self.num_samples, self.num_batches * self.batch_size)

    def rows(self, first: int, stop: int) -> np.ndarray:
        """(file position, sample index) of the plan's samples first..stop-1, in read order."""
        first, stop = self.start + max(first, 0), self.start + min(stop, self.num_samples)
        if stop <= first:
            return np.empty((0, 2), self.order.dtype)
        block = first // BLOCK_ROWS
        if (stop - 1) // BLOCK_ROWS != block:  # across two blocks (a batch rarely is)
            return self.order.rows(first, stop)
        cached = self._block[0]
        if cached is None or cached[0] != block:
            cached = (block, self.order.rows(block * BLOCK_ROWS, min((block + 1) * BLOCK_ROWS, self.order.length)))
            self._block[0] = cached
        return cached[1][first - block * BLOCK_ROWS : stop - block * BLOCK_ROWS]

    def batch(self, index: int) -> np.ndarray:
        cached = self._block[0]  # the common case first, with nothing computed: a slice of the block
        if cached is not None:
            first = self.start + index * self.batch_size - cached[0] * BLOCK_ROWS
            if first >= 0 and first + self.batch_size <= len(cached[1]):
                return cached[1][first:first + self.batch_size]
        return self.rows(index * self.batch_size, (index + 1) * self.batch_size)

    @property
    def samples(self) -> np.ndarray:
        """Every row of the plan at once: 8 bytes a sample, for tests and whole-file readers'
        set-up (a reader that streams asks for `batch`)."""
        return self.order.rows(self.start, self.order.length)

    def files(self) -> list[int]:
        """Positions of the files this rank touches, in first-touch order."""
        column = self.samples[:, 0]
        _, first = np.unique(column, return_index=True)
        return [int(column[i]) for i in sorted(first)]

    def files_in_order(self) -> RunFiles | list[int]:
        """`files()` without a list where the plan reads each file's samples in one run, all
        files alike (a whole-file plan in file order: tf.data's): the share's files by arithmetic
        (RunFiles); any other plan, `files()`."""
        order = self.order
        if not (isinstance(order, ShareOrder) and order.per_file and order.sample_order is None):
            return self.files()
        if self.num_samples <= 0:
            return RunFiles(first=order.first_slot, files=0, file_order=order.file_order)
        first = (order.begin + self.start) // order.per_file
        last = (order.begin + order.length - 1) // order.per_file
        return RunFiles(first=order.first_slot + first, files=last - first + 1, file_order=order.file_order)


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
    per_file = samples_per_file(files)
    if per_file:  # alike files: no array of counts (the file order does not matter either way)
        return _alike_shares(len(files), per_file, size, whole_files)
    counts = sample_counts(files, np.arange(len(files)))
    return [int(counts[start:stop].sum()) for start, stop in rank_slices(len(files), size)]


def _alike_shares(num_files: int, per_file: int, size: int, whole_files: bool) -> list[int]:
    """share_sizes of `num_files` files of `per_file` samples each, from the two numbers."""
    if whole_files:
        return [(stop - start) * per_file for start, stop in rank_slices(num_files, size)]
    return [stop - start for start, stop in rank_slices(num_files * per_file, size)]


def dlio_steps_per_epoch(files: tuple[FileSpec, ...], batch_size: int, size: int, whole_files: bool,
                         total_steps: int = 0) -> int:
    """DLIO 2.0.0's steps per epoch: floor(samples / batch / ranks), capped by total_steps.

    Every rank runs the same count (a rank whose whole-file share is short of it runs the
    shortest share's count, so that no rank waits in a checkpoint the others never reach).
    """
    return _dlio_steps(total_samples(files), share_sizes(files, size, whole_files), batch_size, size, total_steps)


def _dlio_steps(total: int, shares: list[int], batch_size: int, size: int, total_steps: int) -> int:
    steps = min([total // batch_size // size] + [share // batch_size for share in shares])
    return min(steps, total_steps) if total_steps else steps


def last_training_step(num_files: int, samples_per_file: int, batch_size: int, drop_last: bool, size: int,
                       whole_files: bool, dlio: bool, epochs: int, total_steps: int = 0) -> int:
    """The last step any rank of a training run reaches (steps count from 1, over all epochs), as
    engine/train.py counts them: DLIO's count per epoch times the epochs, or a rank's batches per
    epoch (its share; the first ranks' shares are the larger) times the epochs, up to total_steps.
    A failure planned after it (failures.at_steps) never strikes. Files hold equal sample counts."""
    if dlio:  # dlio_steps_per_epoch's count, from the two numbers (no list of ten million files)
        shares = _alike_shares(num_files, samples_per_file, size, whole_files)
        return _dlio_steps(num_files * samples_per_file, shares, batch_size, size, total_steps) * epochs
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
    num_files = len(files)
    file_order = KeyedPermutation(num_files, [reader.shuffle_seed, epoch, 0]) \
        if shuffle and reader.file_shuffle and num_files > 1 else None
    first_slot, last_slot = rank_slices(num_files, size)[rank] if whole_files else (0, num_files)
    if whole_files:
        rank, size = 0, 1
    per_file = samples_per_file(files)
    if per_file:  # every file alike: a row's file and sample by arithmetic
        total = (last_slot - first_slot) * per_file
        layout = {"per_file": per_file, "first_slot": first_slot, "file_order": file_order}
    else:  # differing counts: the share's file order and each file's first row (two integers a file)
        slots = np.arange(first_slot, last_slot, dtype=np.int64)
        slot_files = slots if file_order is None else file_order(slots)
        counts = sample_counts(files, slot_files)
        total = int(counts.sum())
        layout = {"per_file": 0, "slot_files": slot_files, "slot_starts": np.cumsum(counts) - counts}
    begin, end = rank_slices(total, size)[rank]
    sample_order = KeyedPermutation(end - begin, [reader.shuffle_seed, epoch, rank + 1]) \
        if shuffle and reader.sample_shuffle and not sequential and end - begin > 1 else None
    order = ShareOrder(length=end - begin, begin=begin, dtype=index_dtype(max(total, num_files)),
                       sample_order=sample_order, **layout)
    return EpochReadPlan(
        epoch=epoch,
        rank=rank,
        order=order,
        batch_size=batch_size or reader.batch_size,
        drop_last=reader.drop_last or max_batches is not None,
        max_batches=max_batches,
    )
