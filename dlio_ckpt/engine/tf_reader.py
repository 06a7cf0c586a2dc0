"""reader.name=tensorflow: a tf.data pipeline over an epoch's TFRecord files, as DLIO builds it.

The pipeline is the one programs write: TFRecordDataset over the files (its interleave of one
record reader per file, `num_parallel_reads` = read_threads wide), parse_single_example, shuffle,
batch, prefetch, with one addition: `enumerate`, so each record carries its position in the
interleaved stream, from which its file follows (`interleave_files`, TensorFlow's deterministic
interleave order, checked against TensorFlow in tests/test_formats.py). Tagging each record with
its file inside the interleave instead made each epoch 3-4x slower than the program's pipeline.

Byte and call accounting. tf.data opens and reads the files with its own file system code, so
none of it passes through our storage layer and nothing would be traced. To keep summary.json
honest, each file whose records reached the training loop is recorded, when the epoch ends, with
the calls TFRecordDataset makes on it (strace of TensorFlow 2.21, docs/metrics.md): an open,
pread of READ_BUFFER bytes at offsets 0, B, 2B, ... until one returns short, one more pread
asking for the rest of that buffer, which returns 0 (end of file; the only extra call when the
size is a multiple of B), and a close: `tfrecord_reads`. An epoch cut short (total_steps)
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


RECORD_FRAMING = 16  # a TFRecord's length (8), its CRC (4) and the data's CRC (4) around the data


class _ConsumedFiles:
    """Each file whose records were consumed, recorded with TFRecordDataset's calls (module doc)."""

    def __init__(self, storage: Any, paths: Sequence[str], file_of: np.ndarray, started: float) -> None:
        self._recorder = getattr(storage, "recorder", None)
        self._phase = getattr(storage, "phase", "other")
        self._sizer = getattr(storage, "inner", storage)  # sizing is bookkeeping, not tf.data's I/O
        self._paths = paths
        self._file_of = file_of
        self._started = started  # wall clock when the epoch's iterator was made
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per batch: position, record size, stamp

    def consume(self, positions: np.ndarray, record_sizes: np.ndarray, read: np.ndarray) -> None:
        self._parts.append((positions, record_sizes, read))

    def record(self) -> None:
        """Record every consumed file once; called when the epoch ends or is cut short."""
        if not self._parts:
            return
        positions = np.concatenate([p[0] for p in self._parts])
        sizes = np.concatenate([p[1] for p in self._parts])
        stamps = np.concatenate([p[2] for p in self._parts])
        self._parts = []
        order = np.argsort(positions, kind="stable")  # stream order: each file's records in file order
        positions, sizes, stamps = positions[order], sizes[order], stamps[order]
        # the stamp before each record in the stream (the iterator's making, for the first):
        # when the reader went for the bytes that record needed
        # (records are parsed in parallel, so a stamp can precede the one before it: no later than its own)
        before = np.minimum(np.concatenate([[self._started], stamps[:-1]]), stamps)
        files = self._file_of[positions]
        for index in np.unique(files):
            path = self._paths[index]
            size = self._sizer.file_size(path) if self._sizer is not None else os.path.getsize(path)
            if self._recorder is None:
                continue
            mine = files == index
            self._record_file(path, size, stamps[mine], before[mine], sizes[mine])

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
        self._paths: list[str] = []
        self._dataset: Any = None
        self._file_of: np.ndarray | None = None

    def prepare(self, paths: Sequence[str], records: Sequence[int]) -> None:
        """The dataset over `paths` (`records`: each file's record count, as the dataset plan
        has it), built unless the one built already reads the same files."""
        if paths and (self._dataset is None or sorted(paths) != sorted(self._paths)):
            self._paths = list(paths)
            self._dataset = build_dataset(load_tensorflow(), self._paths, *self._settings)
            self._file_of = interleave_files(records, self._read_threads)

    def batches(self, paths: Sequence[str], records: Sequence[int], storage: Any = None) -> Iterator[Batch]:
        """Batches of one epoch over `paths` (in read order): samples and image bytes per batch.

        `storage` is the (traced) storage the dataset lives on; its recorder receives the
        per-file events described in the module docstring."""
        if not paths:
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
