"""reader.name=tensorflow: a tf.data pipeline over an epoch's TFRecord files, as DLIO builds it.

The pipeline is TFRecordDataset's own (an interleave of one record reader per file,
`num_parallel_reads` = read_threads wide), then parse_single_example, shuffle, batch, prefetch.
It is written as that interleave spelled out, so that each record carries the index of the file
it came from; that is the only difference, and it costs one small integer per record.

Byte and call accounting. tf.data opens and reads the files with its own file system code, so
none of it passes through our storage layer and nothing would be traced. To keep summary.json
honest, each file whose records reached the training loop is recorded, when the epoch ends, with
the calls TFRecordDataset makes on it (strace of TensorFlow 2.21, docs/metrics.md): an open,
pread of READ_BUFFER bytes at offsets 0, B, 2B, ... until one returns short, one more pread
asking for the rest of that buffer, which returns 0 (end of file; the only extra call when the
size is a multiple of B), and a close: `tfrecord_reads`. An epoch cut short (total_steps)
leaves out files tf.data had opened and buffered but whose records were never consumed.

Read time. tf.data's reads happen in its own threads, so the pipeline itself stamps the time:
`tf.timestamp()` when the interleave opens a file, and again as each record is parsed, with the
record's size. Records leave a file in file order, so the record whose bytes
reach into buffer k is the one that made the reader issue pread k: that pread is recorded from
the previous record's stamp (the open's, for the first) to that record's, the end-of-file pread
at the last record's. A span also holds any time the reader stalled because the prefetch buffer
was full, so the read rate derived from it is a lower bound on the storage's rate (exact when the
storage, not compute, is the bottleneck).

The pipeline is built once per reader and iterated once per epoch, as a Keras program builds its
dataset once and `fit` iterates it each epoch: building it traces its functions (~0.1 s), which
a real program pays once, not each epoch. So the files keep the first epoch's order (the file
list such a program passes TFRecordDataset), and the records are reshuffled each epoch
(reshuffle_each_iteration); a resumed epoch over fewer files builds its own.
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


READ_BUFFER = 256 * 1024  # TFRecordDataset's buffer_size for local files (its default, passed explicitly)


def tfrecord_reads(size: int, buffer: int = READ_BUFFER) -> list[tuple[int, int]]:
    """(offset, bytes moved) of each pread TFRecordDataset makes reading a file of `size` bytes
    to its end (module doc): whole buffers, the short one, then the read that returns 0."""
    reads = [(offset, min(buffer, size - offset)) for offset in range(0, size, buffer)]
    reads.append((size, 0))
    return reads


def build_dataset(tf: Any, paths: Sequence[str], batch_size: int, read_threads: int, prefetch_size: int,
                  shuffle_buffer_size: int, seed: int, drop_last: bool) -> Any:
    """The tf.data pipeline; elements are, per record: the index of its file in `paths`, its
    image bytes, its record's size, when its file was opened and when it was parsed (wall-clock
    seconds, `tf.timestamp`).

    Each file's records are zipped with a repeated (index, opened) element rather than mapped
    per record in the interleave: a map per file's records is a function per record on the
    reading thread, which cost several times the reading itself here (tiny files)."""
    parallel = read_threads if read_threads > 0 else None
    files = tf.data.Dataset.from_tensor_slices((tf.range(len(paths), dtype=tf.int32), tf.constant(list(paths))))

    def records_of(index: Any, path: Any) -> Any:
        tag = tf.data.Dataset.from_tensors((index, tf.timestamp())).repeat()
        return tf.data.Dataset.zip((tag, tf.data.TFRecordDataset(path, buffer_size=READ_BUFFER)))

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

    def parse(tag: Any, record: Any) -> tuple[Any, Any, Any, Any, Any]:
        example = tf.io.parse_single_example(record, features)
        return (tag[0], tf.cast(tf.strings.length(example["image"]), tf.int64),
                tf.cast(tf.strings.length(record), tf.int64), tag[1], tf.timestamp())

    samples = records.map(parse, num_parallel_calls=parallel)
    if shuffle_buffer_size > 1:
        # one seed for the pipeline, a new order each epoch (each iteration), as Keras' fit sees it
        samples = samples.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
    batches = samples.batch(batch_size, drop_remainder=drop_last)
    return batches.prefetch(prefetch_size) if prefetch_size > 0 else batches


RECORD_FRAMING = 16  # a TFRecord's length (8), its CRC (4) and the data's CRC (4) around the data


class _ConsumedFiles:
    """Each file whose records were consumed, recorded with TFRecordDataset's calls (module doc)."""

    def __init__(self, storage: Any, paths: Sequence[str]) -> None:
        self._recorder = getattr(storage, "recorder", None)
        self._phase = getattr(storage, "phase", "other")
        self._sizer = getattr(storage, "inner", storage)  # sizing is bookkeeping, not tf.data's I/O
        self._paths = paths
        self._opened = np.full(len(paths), np.inf)
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per batch: file, record size, stamp

    def consume(self, file_indices: np.ndarray, record_sizes: np.ndarray, opened: np.ndarray, read: np.ndarray) -> None:
        np.minimum.at(self._opened, file_indices, opened)
        self._parts.append((file_indices, record_sizes, read))

    def record(self) -> None:
        """Record every consumed file once; called when the epoch ends or is cut short."""
        if not self._parts:
            return
        files = np.concatenate([p[0] for p in self._parts])
        sizes = np.concatenate([p[1] for p in self._parts])
        stamps = np.concatenate([p[2] for p in self._parts])
        self._parts = []
        for index in np.unique(files):
            path = self._paths[index]
            size = self._sizer.file_size(path) if self._sizer is not None else os.path.getsize(path)
            if self._recorder is None:
                continue
            mine = files == index
            order = np.argsort(stamps[mine], kind="stable")
            self._record_file(path, size, float(self._opened[index]), stamps[mine][order], sizes[mine][order])

    def _record_file(self, path: str, size: int, opened: float, stamps: np.ndarray, record_sizes: np.ndarray) -> None:
        clock = self._recorder.clock
        ends = np.cumsum(record_sizes + RECORD_FRAMING)  # where each consumed record ends in the file
        before = np.concatenate([[opened], stamps])  # the stamp before each record: the open's, then the previous record's
        last = float(stamps[-1])
        events = [("open", -1, 0, opened, opened)]
        for offset, length in tfrecord_reads(size):
            # the first consumed record reaching past `offset` made the reader fetch this buffer
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
        self._paths: list[str] = []
        self._dataset: Any = None

    def batches(self, paths: Sequence[str], storage: Any = None) -> Iterator[Batch]:
        """Batches of one epoch over `paths` (in read order): samples and image bytes per batch.

        `storage` is the (traced) storage the dataset lives on; its recorder receives the
        per-file events described in the module docstring."""
        tf = load_tensorflow()
        if not paths:
            return
        if self._dataset is None or sorted(paths) != sorted(self._paths):
            self._paths = list(paths)
            self._dataset = build_dataset(tf, self._paths, *self._settings)
        consumed = _ConsumedFiles(storage, self._paths)
        try:
            for indices, lengths, record_sizes, opened, read in self._dataset.as_numpy_iterator():
                consumed.consume(indices, record_sizes, opened, read)
                yield Batch(samples=len(lengths), payload_bytes=int(lengths.sum()))
        finally:
            consumed.record()


def tfdata_batches(paths: Sequence[str], batch_size: int, read_threads: int, prefetch_size: int,
                   shuffle_buffer_size: int, seed: int, drop_last: bool = False, storage: Any = None) -> Iterator[Batch]:
    """One epoch of a fresh pipeline over `paths`; shuffle_buffer_size <= 1 means no shuffle."""
    pipeline = TFRecordPipeline(batch_size, read_threads, prefetch_size, shuffle_buffer_size, seed, drop_last)
    yield from pipeline.batches(paths, storage)
