"""Readers: turn an epoch's read plan into batches, with read threads and prefetch.

The native reader works like a PyTorch DataLoader: `read_threads` workers each assemble whole
batches, up to `read_threads x prefetch_size` batches ahead of the training loop, and the loop
only waits when the storage cannot keep up. Each worker keeps its own small cache of open files,
because a format's reader object (an h5py file, a loaded npz) is not shared across threads.
Every byte goes through the traced storage, so it is counted as the storage moved it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from dlio_ckpt.engine import tf_reader
from dlio_ckpt.formats.base import DatasetFormat, FileSpec, FormatOptions, SampleReader, Scratch
from dlio_ckpt.plan.file_list import samples_per_file
from dlio_ckpt.plan.read import Batch, EpochReadPlan, transfer_end, transfer_requests

OPEN_FILES_PER_WORKER = 4


class _OpenFiles:
    """A per-thread LRU of open SampleReaders."""

    def __init__(self, storage: Any, fmt: DatasetFormat, options: FormatOptions, capacity: int) -> None:
        self._storage = storage
        self._fmt = fmt
        self._options = options
        self._capacity = capacity
        self._local = threading.local()
        self._all: list[SampleReader] = []
        self._lock = threading.Lock()

    def _cache(self) -> OrderedDict:
        cache = getattr(self._local, "cache", None)
        if cache is None:
            cache = self._local.cache = OrderedDict()
        return cache

    def get(self, spec: FileSpec) -> SampleReader:
        cache = self._cache()
        reader = cache.get(spec.index)
        if reader is not None:
            cache.move_to_end(spec.index)
            return reader
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = Scratch()
        reader = self._fmt.open(lambda suffix: self._storage.open_read(spec.path + suffix), spec, self._options, scratch)
        cache[spec.index] = reader
        with self._lock:
            self._all.append(reader)
        while len(cache) > self._capacity:
            _, old = cache.popitem(last=False)
            old.close()
            with self._lock:
                self._all.remove(old)
        return reader

    def close_all(self) -> None:
        with self._lock:
            readers, self._all = self._all, []
        for reader in readers:
            reader.close()


class NativeReader:
    """Reads samples through a dataset format over the traced storage."""

    def __init__(self, storage: Any, fmt: DatasetFormat, options: FormatOptions, files: tuple[FileSpec, ...],
                 read_threads: int, prefetch_size: int) -> None:
        self._files = files
        self._threads = read_threads
        self._window = max(1, read_threads * max(prefetch_size, 1))
        self._open = _OpenFiles(storage, fmt, options, OPEN_FILES_PER_WORKER)

    def _read_batch(self, rows: np.ndarray) -> Batch:
        payload = 0
        for file_position, sample in rows:
            spec = self._files[int(file_position)]
            payload += self._open.get(spec).read(int(sample))
        return Batch(samples=len(rows), payload_bytes=payload)

    def batches(self, plan: EpochReadPlan) -> Iterator[Batch]:
        try:
            yield from read_ahead(lambda index: self._read_batch(plan.batch(index)), plan.num_batches,
                                  self._threads, self._window)
        finally:
            self._open.close_all()


def read_ahead(read_batch: Callable[[int], Batch], count: int, threads: int, window: int) -> Iterator[Batch]:
    """Batches 0..count-1 in order, read by `threads` workers up to `window` batches ahead
    (threads 0: in the caller's thread), as a DataLoader's workers and prefetch do."""
    if threads == 0:
        for index in range(count):
            yield read_batch(index)
        return
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="reader") as pool:
        pending: list[Future] = []
        submitted = 0
        try:
            for _ in range(count):
                while submitted < count and len(pending) < window:
                    pending.append(pool.submit(read_batch, submitted))
                    submitted += 1
                yield pending.pop(0).result()
        finally:
            for future in pending:
                future.cancel()


class _SequentialFile:
    """One file read from its start in transfer_size requests, as far as the samples consumed reach."""

    def __init__(self, handle: Any, spec: FileSpec, position: int) -> None:
        self.handle = handle
        self.spec = spec
        self.position = position  # the file's position in the reader's file list
        self.size = handle.size()
        self.done = 0  # bytes read from the start
        self.uses = 0  # samples of this file handed to batches and not yet consumed
        self.sealed = False  # no later batch reads this file: it closes once `uses` is 0
        self.lock = threading.Lock()

    def release(self) -> bool:
        """Close the file once it is sealed and every sample handed out was consumed (call with
        `lock` held); True when this call closed it."""
        if self.sealed and self.uses == 0 and self.handle is not None:
            self.handle.close()
            self.handle = None
            return True
        return False


class _OpenRuns:
    """The files of an epoch's batches, opened as the batches are handed out, in plan order.

    Batch b's rows are split into runs of one file; a run that continues the file the batch
    before ended with joins that file's stream, any other opens the file (and seals the file
    before it, which closes once its last sample is consumed). So a file is open from the batch
    that first reads it to the one that last does, and only the files of the batches in flight
    are held: never one handle (or object) per file of the rank's share. The plan must list
    each file's samples in one run, as a whole-file plan in file order does (a file that came
    back after another would be opened again)."""

    def __init__(self, storage: Any, files: Sequence[FileSpec], plan: EpochReadPlan) -> None:
        self._storage = storage
        self._files = files
        self._plan = plan
        self._count = plan.num_batches
        self._lock = threading.Lock()
        self._next = 0  # the next batch to hand out
        self._tail: _SequentialFile | None = None  # the stream the last batch handed out ended with
        self._handed: dict[int, tuple[np.ndarray, list[_SequentialFile]]] = {}  # batch -> its rows, a stream a row
        self._open: dict[int, _SequentialFile] = {}  # by id: what `close` must still close

    def take(self, index: int) -> tuple[np.ndarray, list[_SequentialFile]]:
        """Batch `index`'s rows and each row's stream (batches before it are handed out first)."""
        with self._lock:
            while self._next <= index:
                self._handed[self._next] = self._hand_out(self._plan.batch(self._next))
                self._next += 1
                if self._next == self._count:
                    self._seal(self._tail)
            return self._handed.pop(index)

    def _hand_out(self, rows: np.ndarray) -> tuple[np.ndarray, list[_SequentialFile]]:
        positions = rows[:, 0]
        starts = [0, *(np.flatnonzero(positions[1:] != positions[:-1]) + 1).tolist(), len(rows)]
        streams: list[_SequentialFile] = []
        for start, stop in zip(starts[:-1], starts[1:]):
            position = int(positions[start])
            stream = self._tail
            if stream is None or stream.position != position:
                self._seal(stream)
                spec = self._files[position]
                stream = self._tail = _SequentialFile(self._storage.open_read(spec.path), spec, position)
                self._open[id(stream)] = stream
            with stream.lock:
                stream.uses += stop - start
            streams += [stream] * (stop - start)
        return rows, streams

    def _seal(self, stream: _SequentialFile | None) -> None:
        if stream is not None:
            with stream.lock:
                stream.sealed = True
                self.closed(stream, stream.release())

    def closed(self, stream: _SequentialFile, done: bool) -> None:
        if done:
            self._open.pop(id(stream), None)

    def close(self) -> None:
        """Close what an epoch ended or cut short left open, in the order the files were opened."""
        with self._lock:
            streams, self._open = list(self._open.values()), {}
        for stream in streams:
            with stream.lock:
                if stream.handle is not None:
                    stream.handle.close()
                    stream.handle = None


class TransferReader:
    """reader.access=transfer: tf.data's TFRecordDataset pattern without TensorFlow.

    Each file of the rank's whole-file share is read sequentially from offset 0 in
    transfer_size requests (tf.data's read buffer); a sample is available once the request
    holding its last byte has been read. Read threads assemble batches as the native reader's
    do; a file shared by two batches in flight is read once, in order, under its lock. Files are
    opened as the batches that read them are handed out and closed after their last sample
    (_OpenRuns), as tf.data opens each file when its interleave reaches it: what the reader holds
    is the batches in flight, not the share.
    """

    def __init__(self, storage: Any, files: Sequence[FileSpec], transfer_size: int, read_threads: int,
                 prefetch_size: int) -> None:
        self._storage = storage
        self._files = files
        self._transfer = transfer_size
        self._threads = read_threads
        self._window = max(1, read_threads * max(prefetch_size, 1))

    def _read_batch(self, index: int, runs: _OpenRuns, scratch: threading.local) -> Batch:
        rows, streams = runs.take(index)
        payload = 0
        for (_, sample), stream in zip(rows, streams):
            with stream.lock:
                end = transfer_end(stream.size, stream.spec.num_samples, int(sample), self._transfer)
                if end > stream.done:
                    buffer = getattr(scratch, "buffer", None)
                    if buffer is None:
                        buffer = scratch.buffer = Scratch()
                    for offset, length in transfer_requests(stream.done, end, stream.size, self._transfer):
                        got = stream.handle.read_at_into(buffer.view(length), offset)
                        if got < length:
                            raise EOFError(f"{stream.spec.path}: the file ended at {offset + max(got, 0)} bytes, "
                                           f"before the {stream.size} it had when opened")
                    stream.done = end
                stream.uses -= 1
                runs.closed(stream, stream.release())
            payload += stream.spec.sample_bytes
        return Batch(samples=len(rows), payload_bytes=payload)

    def batches(self, plan: EpochReadPlan) -> Iterator[Batch]:
        runs = _OpenRuns(self._storage, self._files, plan)
        scratch = threading.local()
        try:
            yield from read_ahead(lambda index: self._read_batch(index, runs, scratch), plan.num_batches,
                                  self._threads, self._window)
        finally:
            runs.close()


class SharePaths(Sequence):
    """The paths of a share's files in read order, each made when asked (a block at a time when
    iterated): what tf.data is handed as its list of files, with nothing kept per file."""

    def __init__(self, files: Sequence[FileSpec], positions: Sequence[int]) -> None:
        self._files = files
        self.positions = positions

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, k: int) -> str:
        return self._files[self.positions[k]].path

    def __iter__(self) -> Iterator[str]:
        return (self._files[p].path for p in self.positions)

    def identity(self) -> tuple:
        """Equal for shares of the same files in any order (plan/read_order.RunFiles.identity)."""
        identity = getattr(self.positions, "identity", None)
        return identity() if identity is not None else ("set", tuple(sorted(self.positions)))


class TensorFlowReader:
    """reader.name=tensorflow: tf.data reads the rank's TFRecord files (see engine/tf_reader.py)."""

    def __init__(self, storage: Any, files: tuple[FileSpec, ...], reader_config: Any, seed: int) -> None:
        """Imports TensorFlow here, before training starts its clock, as a TensorFlow job has it
        loaded before its first step: its import (~4.6 s here) is not time spent waiting for data."""
        tf_reader.load_tensorflow()
        self._module = tf_reader
        self._storage = storage
        self._files = files
        self._config = reader_config
        self._seed = seed
        self._pipeline: Any = None

    def prepare(self, plan: EpochReadPlan) -> None:
        """Build the pipeline before training starts its clock, as a program builds its dataset
        before its loop: building traces its functions (~0.5 s here in the first epoch's wait)."""
        if self._pipeline is None:  # built once, iterated each epoch (engine/tf_reader.py)
            config = self._config
            self._pipeline = self._module.TFRecordPipeline(
                batch_size=plan.batch_size, read_threads=config.read_threads, prefetch_size=config.prefetch_size,
                shuffle_buffer_size=config.shuffle_buffer_size if config.sample_shuffle else 0, seed=self._seed,
                drop_last=plan.drop_last)
        self._pipeline.prepare(*self._paths(plan))

    def _paths(self, plan: EpochReadPlan) -> tuple[SharePaths, int | list[int]]:
        """The epoch's files, a path when asked, and their record count (one number where every
        file has the same: a dataset's files do)."""
        paths = SharePaths(self._files, plan.files_in_order())
        per_file = samples_per_file(self._files)
        return paths, per_file if per_file else [self._files[p].num_samples for p in paths.positions]

    def batches(self, plan: EpochReadPlan) -> Iterator[Batch]:
        if self._pipeline is None:
            self.prepare(plan)
        yield from self._pipeline.batches(*self._paths(plan), self._storage)
