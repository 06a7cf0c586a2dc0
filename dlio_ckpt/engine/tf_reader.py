"""reader.name=tensorflow: a tf.data pipeline over an epoch's TFRecord files, as DLIO builds it.

The pipeline is TFRecordDataset's own (an interleave of one record reader per file,
`num_parallel_reads` = read_threads wide), then parse_single_example, shuffle, batch, prefetch.
It is written as that interleave spelled out, so that each record carries the index of the file
it came from; that is the only difference, and it costs one small integer per record.

Byte accounting. tf.data opens and reads the files with its own file system code, so none of it
passes through our storage layer and nothing would be traced. To keep summary.json honest, each
file whose records reached the training loop is recorded, when the epoch ends, as opened, read
whole (its size on disk: tf.data reads every file it opens to the end, framing included) and
closed, through the storage's EventRecorder. An epoch cut short (total_steps) leaves out files
tf.data had opened and buffered but whose records were never consumed.

Read time. tf.data's reads happen in its own threads, so the pipeline itself stamps the time:
`tf.timestamp()` when the interleave opens a file, and again as each record leaves the file's
reader. A file's read event spans from its opening to its last record, so the train phase's
read time (the union of those spans) is when tf.data was reading. A span also holds any time
the reader stalled because the prefetch buffer was full, so the read rate derived from it is
a lower bound on the storage's rate (exact when the storage, not compute, is the bottleneck).
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

import numpy as np

from dlio_ckpt.optional import require
from dlio_ckpt.plan.read import Batch


def load_tensorflow() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ start-up chatter out of the run's output
    return require("tensorflow")


def build_dataset(tf: Any, paths: Sequence[str], batch_size: int, read_threads: int, prefetch_size: int,
                  shuffle_buffer_size: int, seed: int, drop_last: bool) -> Any:
    """The tf.data pipeline; elements are, per record: the index of its file, its image bytes,
    when its file was opened and when it was read (wall-clock seconds, `tf.timestamp`)."""
    parallel = read_threads if read_threads > 0 else None
    files = tf.data.Dataset.from_tensor_slices((tf.range(len(paths), dtype=tf.int32), tf.constant(list(paths))))

    def records_of(index: Any, path: Any) -> Any:
        opened = tf.timestamp()
        return tf.data.TFRecordDataset(path).map(lambda record: (index, record, opened, tf.timestamp()))

    records = files.interleave(
        records_of,
        cycle_length=max(read_threads, 1),
        block_length=1,
        num_parallel_calls=parallel,
    )
    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(index: Any, record: Any, opened: Any, read: Any) -> tuple[Any, Any, Any, Any]:
        example = tf.io.parse_single_example(record, features)
        return index, tf.cast(tf.strings.length(example["image"]), tf.int64), opened, read

    samples = records.map(parse, num_parallel_calls=parallel)
    if shuffle_buffer_size > 1:
        samples = samples.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=False)
    batches = samples.batch(batch_size, drop_remainder=drop_last)
    return batches.prefetch(prefetch_size) if prefetch_size > 0 else batches


class _ConsumedFiles:
    """Each file whose records were consumed, recorded as read whole over the span from its
    opening to its last record (see module doc)."""

    def __init__(self, storage: Any, paths: Sequence[str]) -> None:
        self._recorder = getattr(storage, "recorder", None)
        self._phase = getattr(storage, "phase", "other")
        self._sizer = getattr(storage, "inner", storage)  # sizing is bookkeeping, not tf.data's I/O
        self._paths = paths
        self._opened = np.full(len(paths), np.inf)
        self._last_read = np.full(len(paths), -np.inf)

    def consume(self, file_indices: np.ndarray, opened: np.ndarray, read: np.ndarray) -> None:
        np.minimum.at(self._opened, file_indices, opened)
        np.maximum.at(self._last_read, file_indices, read)

    def record(self) -> None:
        """Record every consumed file once; called when the epoch ends or is cut short."""
        for index in np.flatnonzero(np.isfinite(self._last_read)):
            path = self._paths[index]
            size = self._sizer.file_size(path) if self._sizer is not None else os.path.getsize(path)
            if self._recorder is None:
                continue
            clock = self._recorder.clock
            start, end = clock.from_wall(float(self._opened[index])), clock.from_wall(float(self._last_read[index]))
            for op, offset, length, at, until in (("open", -1, 0, start, start), ("read", 0, size, start, end),
                                                  ("close", -1, 0, end, end)):
                self._recorder.record(op, self._phase, path, offset, length, at, until)
        self._last_read[:] = -np.inf


def tfdata_batches(paths: Sequence[str], batch_size: int, read_threads: int, prefetch_size: int,
                   shuffle_buffer_size: int, seed: int, drop_last: bool = False, storage: Any = None) -> Iterator[Batch]:
    """Batches of one epoch over `paths` (in read order): samples and image bytes per batch.

    `storage` is the (traced) storage the dataset lives on; its recorder receives the per-file
    read events described in the module docstring. shuffle_buffer_size <= 1 means no shuffle.
    """
    tf = load_tensorflow()
    if not paths:
        return
    dataset = build_dataset(tf, paths, batch_size, read_threads, prefetch_size, shuffle_buffer_size, seed, drop_last)
    consumed = _ConsumedFiles(storage, paths)
    try:
        for indices, lengths, opened, read in dataset.as_numpy_iterator():
            consumed.consume(indices, opened, read)
            yield Batch(samples=len(lengths), payload_bytes=int(lengths.sum()))
    finally:
        consumed.record()
