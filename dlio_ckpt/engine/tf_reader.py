"""reader.name=tensorflow: a tf.data pipeline over an epoch's TFRecord files, as DLIO builds it.

The pipeline is TFRecordDataset's own (an interleave of one record reader per file,
`num_parallel_reads` = read_threads wide), then parse_single_example, shuffle, batch, prefetch.
It is written as that interleave spelled out, so that each record carries the index of the file
it came from; that is the only difference, and it costs one small integer per record.

Byte accounting. tf.data opens and reads the files with its own file system code, so none of it
passes through our storage layer and nothing would be traced. To keep summary.json honest, the
first time a file's records reach the training loop the file is recorded as opened, read whole
(its size on disk: tf.data reads every file it opens to the end, framing included) and closed,
through the storage's EventRecorder. These events have zero duration at the moment they are
recorded: tf.data's read time is hidden in its threads, so read throughput for this reader comes
from the epoch's wall time, not from per-event times. An epoch cut short (total_steps) leaves out
files tf.data had opened and buffered but whose records were never consumed.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

import numpy as np

from dlio_ckpt.engine.readers import Batch
from dlio_ckpt.optional import require


def _tensorflow() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ start-up chatter out of the run's output
    return require("tensorflow")


def build_dataset(tf: Any, paths: Sequence[str], batch_size: int, read_threads: int, prefetch_size: int,
                  shuffle_buffer_size: int, seed: int, drop_last: bool) -> Any:
    """The tf.data pipeline; elements are (file index per record, image bytes per record)."""
    parallel = read_threads if read_threads > 0 else None
    files = tf.data.Dataset.from_tensor_slices((tf.range(len(paths), dtype=tf.int32), tf.constant(list(paths))))
    records = files.interleave(
        lambda index, path: tf.data.TFRecordDataset(path).map(lambda record: (index, record)),
        cycle_length=max(read_threads, 1),
        block_length=1,
        num_parallel_calls=parallel,
    )
    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(index: Any, record: Any) -> tuple[Any, Any]:
        example = tf.io.parse_single_example(record, features)
        return index, tf.cast(tf.strings.length(example["image"]), tf.int64)

    samples = records.map(parse, num_parallel_calls=parallel)
    if shuffle_buffer_size > 1:
        samples = samples.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=False)
    batches = samples.batch(batch_size, drop_remainder=drop_last)
    return batches.prefetch(prefetch_size) if prefetch_size > 0 else batches


class _ConsumedFiles:
    """Records each file as read whole the first time its records are consumed (see module doc)."""

    def __init__(self, storage: Any, paths: Sequence[str]) -> None:
        self._recorder = getattr(storage, "recorder", None)
        self._phase = getattr(storage, "phase", "other")
        self._sizer = getattr(storage, "inner", storage)  # sizing is bookkeeping, not tf.data's I/O
        self._paths = paths
        self._seen = np.zeros(len(paths), dtype=bool)
        self.bytes = 0

    def consume(self, file_indices: np.ndarray) -> None:
        for index in np.unique(file_indices):
            if not self._seen[index]:
                self._seen[index] = True
                self._record(self._paths[index])

    def _record(self, path: str) -> None:
        size = self._sizer.file_size(path) if self._sizer is not None else os.path.getsize(path)
        self.bytes += size
        if self._recorder is not None:
            now = self._recorder.clock.now()
            for op, offset, length in (("open", -1, 0), ("read", 0, size), ("close", -1, 0)):
                self._recorder.record(op, self._phase, path, offset, length, now, now)


def tfdata_batches(paths: Sequence[str], batch_size: int, read_threads: int, prefetch_size: int,
                   shuffle_buffer_size: int, seed: int, drop_last: bool = False, storage: Any = None) -> Iterator[Batch]:
    """Batches of one epoch over `paths` (in read order): samples and image bytes per batch.

    `storage` is the (traced) storage the dataset lives on; its recorder receives the per-file
    read events described in the module docstring. shuffle_buffer_size <= 1 means no shuffle.
    """
    tf = _tensorflow()
    if not paths:
        return
    dataset = build_dataset(tf, paths, batch_size, read_threads, prefetch_size, shuffle_buffer_size, seed, drop_last)
    consumed = _ConsumedFiles(storage, paths)
    for indices, lengths in dataset.as_numpy_iterator():
        consumed.consume(indices)
        yield Batch(samples=len(lengths), payload_bytes=int(lengths.sum()))
