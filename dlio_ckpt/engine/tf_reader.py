"""reader.name=tensorflow: a tf.data pipeline over an epoch's TFRecord files, as DLIO builds it.

The pipeline is the one programs write: TFRecordDataset over the files (its interleave of one
record reader per file, `num_parallel_reads` = read_threads wide), parse_single_example, shuffle,
batch, prefetch, with one addition: `enumerate`, so each record carries its position in the
interleaved stream, from which its file follows (`interleave_files`, TensorFlow's deterministic
interleave order, checked against TensorFlow in tests/test_formats.py; `InterleaveOrder`, the same
by arithmetic where the files hold equal record counts). Tagging each record with its file inside
the interleave instead made each epoch 3-4x slower than the program's pipeline.

Byte and call accounting. tf.data opens and reads the files with its own file system code, so
none of it passes through our storage layer and nothing would be traced. To keep summary.json
honest, each file whose records reached the training loop is recorded, once its last record was
consumed (or when the epoch ends), with the calls TFRecordDataset makes on it (strace of
TensorFlow 2.21, docs/metrics.md): an open, pread of READ_BUFFER bytes at offsets 0, B, 2B, ...
until one returns short, one more pread asking for the rest of that buffer, which returns 0 (end
of file; the only extra call when the size is a multiple of B), and a close: `tfrecord_reads`. An epoch cut short (total_steps)
leaves out files tf.data had opened and buffered but whose records were never consumed.

Read time. tf.data's reads happen in its own threads, so the pipeline itself stamps the time:
`tf.timestamp()` as each record is parsed, with the record's size. Records leave a file in file
order, so the record whose bytes reach into buffer k is the one that made the reader issue pread
k: that pread is recorded from the stamp of the record before it in the stream (the iterator's
making, for the first) to that record's; the open at the first pread's start; the end-of-file
pread and the close at the last record's stamp. A span also holds any time the reader stalled because the prefetch buffer
was full, so the read rate derived from it is a lower bound on the storage's rate (exact when the
storage, not compute, is the bottleneck).

The pipeline is built once per reader and iterated once per epoch, as a Keras program builds its
dataset once and `fit` iterates it each epoch: building it traces its functions (~0.1 s, and
~0.5 s for the first in a process), which a real program pays once, before its loop (the reader's
`prepare`, called before training starts its clock), not each epoch. So the files keep the first epoch's order (the file
list such a program passes TFRecordDataset), and the records are reshuffled each epoch
(reshuffle_each_iteration); a resumed epoch over fewer files builds its own.

Memory. Nothing is kept per record of the share: a record's file is arithmetic
(`InterleaveOrder`), and a file's calls are recorded once its records are all consumed
(`_ConsumedFiles`, TAKE_EVERY records at a time), so what is held is the shuffle buffer's window of
records and the files in progress, not the epoch's records (the table per record and the epoch's
positions, sizes and stamps: 8 + 24 bytes a record, and ~36 more while the table was made). The
share's files are a lazy sequence on this side (engine/readers.SharePaths over
plan/read_order.RunFiles: file k of the share by arithmetic); TFRecordDataset still gets them as a
list, one string tensor of every name (~100 bytes a file), see `build_dataset`.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Iterator, Sequence

import numpy as np

from dlio_ckpt.optional import require
from dlio_ckpt.plan.read import Batch


def load_tensorflow() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ start-up chatter out of the run's output
    return require("tensorflow")


READ_BUFFER = 256 * 1024  # TFRecordDataset's buffer_size for local files (its default, passed explicitly)


def tfrecord_reads(size: int, buffer: int = READ_BUFFER) -> list[tuple[int, int]]:
    """(offset, bytes moved) of each pread TFRecordDataset makes reading a file of `size` bytes
    to its end (module doc): whole buffers, the short one, then the read that returns 0."""
    reads = [(offset, min(buffer, size - offset)) for offset in range(0, size, buffer)]
    reads.append((size, 0))
    return reads


def build_dataset(tf: Any, paths: Sequence[str], batch_size: int, read_threads: int, prefetch_size: int,
                  shuffle_buffer_size: int, seed: int, drop_last: bool) -> Any:
    """The tf.data pipeline, as programs write it: TFRecordDataset over the files with
    `num_parallel_reads` = read_threads, parse_single_example, shuffle, batch, prefetch; plus
    `enumerate`, so each element carries, per record: its position in the interleaved record
    stream (its file follows: `interleave_files`), its image bytes, its record's size and when
    it was parsed (wall-clock seconds, `tf.timestamp`).

    Tagging records with their file inside the interleave (a zip or a map per file) made an epoch
    3-4x slower than this pipeline on tiny files; enumerate costs nothing measurable."""
    parallel = read_threads if read_threads > 0 else None
    # the names as a list, made from `paths` (a lazy sequence in a run) here and held by TensorFlow
    # as one string tensor: a generator dataset of the names (Dataset.from_generator, in blocks,
    # unbatched) issued the same calls but made an epoch of 10k one-record files 1.3-1.9x slower
    # (benchmarks/README.md, "whole-file readers")
    records = tf.data.TFRecordDataset(list(paths), buffer_size=READ_BUFFER, num_parallel_reads=parallel).enumerate()
    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(position: Any, record: Any) -> tuple[Any, Any, Any, Any]:
        example = tf.io.parse_single_example(record, features)
        return (position, tf.cast(tf.strings.length(example["image"]), tf.int64),
                tf.cast(tf.strings.length(record), tf.int64), tf.timestamp())

    samples = records.map(parse, num_parallel_calls=parallel)
    if shuffle_buffer_size > 1:
        # one seed for the pipeline, a new order each epoch (each iteration), as Keras' fit sees it
        samples = samples.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
    batches = samples.batch(batch_size, drop_remainder=drop_last)
    return batches.prefetch(prefetch_size) if prefetch_size > 0 else batches


def interleave_files(counts: Sequence[int], cycle_length: int) -> np.ndarray:
    """The file of each record of the stream TFRecordDataset(num_parallel_reads=cycle_length)
    yields (deterministic, block_length 1: TensorFlow's InterleaveDataset order): slots visited in
    turn; an empty slot opens the next file; a file that runs out empties its slot. `counts`:
    records per file; 0 or 1 parallel reads read the files one after another."""
    cycle_length = max(cycle_length, 1)
    left = [int(c) for c in counts]
    slots: list[int | None] = [None] * cycle_length
    order: list[int] = []
    following, open_files, slot = 0, 0, 0
    while following < len(left) or open_files > 0:
        current = slots[slot]
        if current is not None:
            if left[current] > 0:
                left[current] -= 1
                order.append(current)
            else:
                slots[slot] = None
                open_files -= 1
            slot = (slot + 1) % cycle_length
            continue
        if following < len(left):
            slots[slot] = following
            following += 1
            open_files += 1
        else:
            slot = (slot + 1) % cycle_length
    return np.array(order, dtype=np.int64)


class InterleaveOrder:
    """The file of each position of the record stream TFRecordDataset interleaves (the order
    `interleave_files` simulates), without a table per record where every file holds the same
    number of records (a dataset's files do): the cycle opens `cycle_length` files, takes one
    record of each in turn until all run out in the same round, then opens the next ones, so
    position p lies in group g = p // (c * n) of c files (the last group may have fewer, c'), file
    g * c + (p mod c * n) mod c'. Files of differing counts (lists made by hand) use the table."""

    def __init__(self, records: int | Sequence[int], files: int, cycle_length: int) -> None:
        self._cycle = max(cycle_length, 1)
        self._files = files
        self._uniform = records if isinstance(records, int) else None
        if self._uniform is None and len(set(records)) == 1:
            self._uniform = int(records[0])
        self._counts = None if self._uniform is not None else [int(c) for c in records]
        self._table = None if self._uniform is not None else interleave_files(self._counts, cycle_length)

    def records_of(self, file: int) -> int:
        return self._uniform if self._uniform is not None else self._counts[file]

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        if self._table is not None:
            return self._table[positions]
        group_records = self._cycle * self._uniform
        group, within = np.divmod(np.asarray(positions, dtype=np.int64), group_records)
        first = group * self._cycle
        return first + within % np.minimum(self._cycle, self._files - first)


TAKE_EVERY = 4096  # consumed records looked at together: numpy's calls per batch of 8 cost ~20 us a file
RECORD_FRAMING = 16  # a TFRecord's length (8), its CRC (4) and the data's CRC (4) around the data


class _ConsumedFiles:
    """Each file whose records were consumed, recorded with TFRecordDataset's calls (module doc),
    as soon as its last record is consumed: the records consumed are taken in stream order as far
    as the stream has no gap (the shuffle buffer and parallel parsing hand them out a window out
    of order), so what is held is that window and the files in progress, not the epoch."""

    def __init__(self, storage: Any, paths: Sequence[str], file_of: InterleaveOrder, started: float) -> None:
        self._recorder = getattr(storage, "recorder", None)
        self._phase = getattr(storage, "phase", "other")
        self._sizer = getattr(storage, "inner", storage)  # sizing is bookkeeping, not tf.data's I/O
        self._paths = paths
        self._file_of = file_of
        self._previous = started  # the stamp of the last record taken (the iterator's making, at first)
        self._next = 0  # every stream position before it was taken
        empty = np.empty(0, np.int64)
        self._waiting = (empty, empty, np.empty(0, np.float64))  # consumed past a gap: position, record size, stamp
        self._in_progress: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}  # file -> stamps, before, sizes
        self._taken: dict[int, int] = {}  # file -> its records taken so far
        self._batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # consumed, not yet looked at
        self._held = 0  # records in _batches

    def consume(self, positions: np.ndarray, record_sizes: np.ndarray, read: np.ndarray) -> None:
        self._batches.append((positions, record_sizes, read))
        self._held += len(positions)
        if self._held >= TAKE_EVERY:
            self._take_ready()

    def _take_ready(self) -> None:
        """Take the records consumed so far as far as the stream has no gap; keep the rest."""
        parts = [self._waiting, *self._batches]
        self._batches, self._held = [], 0
        positions, sizes, stamps = (np.concatenate(column) for column in zip(*parts))
        order = np.argsort(positions, kind="stable")  # stream order: each file's records in file order
        positions, sizes, stamps = positions[order], sizes[order], stamps[order]
        ready = int(np.count_nonzero(positions == self._next + np.arange(len(positions))))  # no gap before them
        self._take(positions[:ready], sizes[:ready], stamps[:ready])
        self._waiting = (positions[ready:], sizes[ready:], stamps[ready:])

    def _take(self, positions: np.ndarray, sizes: np.ndarray, stamps: np.ndarray, finish: bool = False) -> None:
        """Take records in stream order; record each file whose records are all taken (every file
        left, when `finish`)."""
        if len(positions):
            # the stamp before each record in the stream: when the reader went for the bytes that
            # record needed (records are parsed in parallel, so a stamp can precede the one
            # before it: no later than its own)
            before = np.minimum(np.concatenate([[self._previous], stamps[:-1]]), stamps)
            self._previous, self._next = float(stamps[-1]), int(positions[-1]) + 1
            files = self._file_of(positions)
            for index in np.unique(files).tolist():
                mine = files == index
                self._in_progress.setdefault(index, []).append((stamps[mine], before[mine], sizes[mine]))
                self._taken[index] = self._taken.get(index, 0) + int(np.count_nonzero(mine))
        done = sorted(self._in_progress) if finish else \
            [i for i, n in self._taken.items() if n == self._file_of.records_of(i)]
        for index in done:
            parts = self._in_progress.pop(index)
            del self._taken[index]
            self._record(index, *(np.concatenate(column) for column in zip(*parts)))

    def record(self) -> None:
        """Record every consumed file not yet recorded; called when the epoch ends or is cut short."""
        self._take_ready()
        self._take(*self._waiting, finish=True)
        self._waiting = tuple(column[:0] for column in self._waiting)

    def _record(self, index: int, stamps: np.ndarray, before: np.ndarray, record_sizes: np.ndarray) -> None:
        path = self._paths[index]
        size = self._sizer.file_size(path) if self._sizer is not None else os.path.getsize(path)
        if self._recorder is not None:
            self._record_file(path, size, stamps, before, record_sizes)

    def _record_file(self, path: str, size: int, stamps: np.ndarray, before: np.ndarray,
                     record_sizes: np.ndarray) -> None:
        clock = self._recorder.clock
        ends = np.cumsum(record_sizes + RECORD_FRAMING)  # where each consumed record ends in the file
        opened, last = float(before[0]), float(stamps.max())
        events = [("open", -1, 0, opened, opened)]
        for offset, length in tfrecord_reads(size):
            # the first record reaching past `offset` made the reader fetch this buffer
            j = int(np.searchsorted(ends, offset, side="right"))
            if length == 0 or j >= len(stamps):
                events.append(("read", offset, length, last, last))
            else:
                events.append(("read", offset, length, float(before[j]), float(stamps[j])))
        events.append(("close", -1, 0, last, last))
        for op, offset, length, at, until in events:
            self._recorder.record(op, self._phase, path, offset, length, clock.from_wall(at), clock.from_wall(until))


class TFRecordPipeline:
    """One reader's tf.data pipeline, built at the first epoch and iterated each epoch (module doc)."""

    def __init__(self, batch_size: int, read_threads: int, prefetch_size: int, shuffle_buffer_size: int, seed: int,
                 drop_last: bool) -> None:
        self._settings = (batch_size, read_threads, prefetch_size, shuffle_buffer_size, seed, drop_last)
        self._read_threads = read_threads
        self._paths: Sequence[str] = []
        self._identity: tuple | None = None
        self._dataset: Any = None
        self._file_of: InterleaveOrder | None = None

    def prepare(self, paths: Sequence[str], records: int | Sequence[int]) -> None:
        """The dataset over `paths` (`records`: each file's record count, as the dataset plan
        has it, or one count for all), built unless the one built already reads the same files.
        `paths` is kept, not copied: a lazy sequence (engine/readers.SharePaths) makes each path
        when asked, and one with `identity()` says which set of files it holds without a list."""
        if not len(paths):
            return
        identity = paths.identity() if hasattr(paths, "identity") else ("set", tuple(sorted(paths)))
        if self._dataset is None or identity != self._identity:
            self._paths, self._identity = paths, identity
            self._dataset = build_dataset(load_tensorflow(), paths, *self._settings)
            self._file_of = InterleaveOrder(records, len(paths), self._read_threads)

    def batches(self, paths: Sequence[str], records: int | Sequence[int], storage: Any = None) -> Iterator[Batch]:
        """Batches of one epoch over `paths` (in read order): samples and image bytes per batch.

        `storage` is the (traced) storage the dataset lives on; its recorder receives the
        per-file events described in the module docstring."""
        if not len(paths):
            return
        self.prepare(paths, records)
        started = time.time()
        held = [self._dataset.as_numpy_iterator()]
        consumed = None
        try:
            for positions, lengths, record_sizes, read in held[0]:
                if consumed is None:
                    consumed = _ConsumedFiles(storage, self._paths, self._file_of, started)
                consumed.consume(positions, record_sizes, read)
                yield Batch(samples=len(lengths), payload_bytes=int(lengths.sum()))
        finally:
            if consumed is not None:
                consumed.record()
            release_in_background(held)


def release_in_background(held: list) -> None:
    """Drop an epoch's finished iterator (the only reference, in `held`) on a thread of its own.

    Deleting it, tf.data tearing down its pipeline, took 0.7-1.2 s at the end of every epoch of the
    emulated keras_tfdata (2026-12-02, traced line by line: the return from the epoch's batches),
    time the training loop counted as neither compute nor data wait ("other": 26-42 % of a
    2-epoch run's wall, the emulation's wall 1.3-1.7x the program's). The program's own iterator
    over the same files took 2-4 ms to delete, and this pipeline's 2-140 ms outside a run, so the
    stall is the emulator's, not the program's I/O: it goes off the loop. Not a daemon thread, so
    the interpreter finishes the deletion before it exits. An epoch closed mid-way (total_steps,
    an injected failure) still holds the iterator in its `for` loop when this runs, and drops it
    on the loop's thread as before."""
    threading.Thread(target=held.clear, name="tf.data iterator release").start()


def tfdata_batches(paths: Sequence[str], records: Sequence[int], batch_size: int, read_threads: int,
                   prefetch_size: int, shuffle_buffer_size: int, seed: int, drop_last: bool = False,
                   storage: Any = None) -> Iterator[Batch]:
    """One epoch of a fresh pipeline over `paths` (`records`: each file's record count);
    shuffle_buffer_size <= 1 means no shuffle."""
    pipeline = TFRecordPipeline(batch_size, read_threads, prefetch_size, shuffle_buffer_size, seed, drop_last)
    yield from pipeline.batches(paths, records, storage)
