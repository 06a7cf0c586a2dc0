"""reader.workers=processes: torch.utils.data's multiprocessing DataLoader, without torch.

What `iter(DataLoader(..., num_workers=N, prefetch_factor=P))` does (torch/utils/data/dataloader.py,
_MultiProcessingDataLoaderIter), each step here the same:

- each epoch forks N worker processes (kept across epochs with `reader.persistent_workers`), each
  with its own index queue, all answering on one result queue;
- batch indices go to the workers round robin, N x P batches outstanding: P x N are sent at the
  start, and one more each time the training loop takes a batch;
- a worker fetches its whole batch (BatchFetcher: read, decode, collate into shared memory, as
  default_collate stacks into shared memory in a worker) and puts it on the result queue, the
  shared memory's descriptor passed as torch passes it (its file_descriptor strategy: a /dev/shm
  file unlinked at once, its descriptor sent through multiprocessing's resource sharer, DupFd,
  which the main process connects to for each batch, then maps it);
- the main process returns batches strictly in order, keeping those that arrive early;
- at the epoch's end (or when the loop stops early) the workers are told to stop, skip any
  batch still queued, and exit; the main process joins them.

Forking, and each worker's start until it takes its first batch, happens while the training
loop waits for its first batch, so it is counted in data wait as in PyTorch.

Tracing stays exact: a worker records its own I/O (a fresh EventRecorder on the same job clock:
perf_counter is CLOCK_MONOTONIC, shared by forked processes) and sends its events with each
batch, and with its exit message the closes of the files it still held; the main process adds
them to the rank's recorder (EventRecorder.absorb). Batches fetched but never taken (an epoch cut
short) are still absorbed: their reads happened.
"""

from __future__ import annotations

import itertools
import mmap
import multiprocessing
import os
from multiprocessing import reduction
import queue
import signal
from collections import OrderedDict
from contextlib import suppress
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Iterator

import numpy as np

from dlio_ckpt.engine.batch_fetch import BatchFetcher, FetchTimes, OpenFiles
from dlio_ckpt.errors import RunFailure
from dlio_ckpt.formats.base import DatasetFormat, FileSpec, FormatOptions
from dlio_ckpt.plan.read import Batch, EpochReadPlan
from dlio_ckpt.storage.events import EVENT_DTYPE, PATH_CACHE, EventRecorder

OPEN_FILES_PER_WORKER = 4
# Path names a worker keeps (_WorkerTrace): its recorder's cache can hold PATH_CACHE plus a batch's
# new paths, and indices its cache or open files still use were added or used among the last
# 2 x PATH_CACHE; the margin covers a batch's files. ~8 MB of strings.
NAMES_KEPT = 2 * PATH_CACHE + 4096
SHM_FOLDER = "/dev/shm"  # where torch's shared-memory batches live too (shm_open)
POLL_S = 1.0  # how often the main process checks that its workers are alive while it waits


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def workers_fork(capabilities: Any) -> bool:
    """Whether worker processes can read this backend (capabilities.fork_safe): on S3 the reader keeps to threads."""
    return capabilities.fork_safe


@dataclass
class LoaderStats:
    """What the loader's processes spent, beyond the storage calls the events hold (docs/metrics.md)."""

    workers: str = "processes"
    worker_starts: int = 0
    worker_start_s: float = 0.0  # forking (main process) + each worker's start until ready (summed)
    times: FetchTimes = field(default_factory=FetchTimes)

    def as_dict(self) -> dict[str, Any]:
        return {"workers": self.workers, "worker_starts": self.worker_starts, "worker_start_s": self.worker_start_s,
                **self.times.as_dict()}


@dataclass
class _Job:
    """What every worker of a reader needs, inherited through fork."""

    storage: Any
    fmt: DatasetFormat
    options: FormatOptions
    files: tuple[FileSpec, ...]
    decode: str
    shm_prefix: str


@dataclass
class _Message:
    kind: str  # batch | exit | error
    worker: int
    index: int = -1
    shm: Any = None  # the batch's shared memory: a multiprocessing.reduction.DupFd of its descriptor
    nbytes: int = 0
    samples: int = 0
    payload: int = 0
    events: bytes = b""
    paths: tuple[str, ...] = ()
    times: FetchTimes | None = None
    start_s: float = 0.0  # first message only: the worker's start, fork to ready
    error: BaseException | None = None


class _WorkerTrace:
    """A worker's own recorder over the parent's backend; what it sends with each message.

    Each message names its events' files itself: the events' path indices are rewritten to
    positions in the message's own list of paths, so the parent maps them with that list alone
    and keeps no table per worker (4 bytes a file the worker opened, 40 MB for a 10M-file
    epoch), and the worker keeps the names of the NAMES_KEPT indices it added or used last, not
    every path it opened. Those cover every index its events can hold: its recorder's cache (at
    most PATH_CACHE paths plus one batch's, all recently added) and its open files (an LRU of
    OPEN_FILES_PER_WORKER, each used within its last few files).
    """

    def __init__(self, storage: Any) -> None:
        parent = getattr(storage, "recorder", None)
        self.recorder = None if parent is None else EventRecorder(parent.rank, parent.clock)
        self.storage = storage if parent is None else type(storage)(storage.inner, self.recorder, storage.phase)
        self._next = 0  # the recorder's next path index
        self._names: OrderedDict[int, str] = OrderedDict()  # path index -> path, least recently added or used first

    def drain(self) -> tuple[bytes, tuple[str, ...]]:
        """The events since the last message, their path indices made positions in the paths returned."""
        if self.recorder is None:
            return b"", ()
        packed = self.recorder.take_packed()
        names = self._names
        for path in self.recorder.paths_since(self._next):
            names[self._next] = path
            self._next += 1
        self.recorder.forget_paths()  # named above: a worker of a 10M-file epoch held 2.5M paths
        paths: tuple[str, ...] = ()
        if packed:
            rows = np.frombuffer(bytearray(packed), EVENT_DTYPE)
            used, rows["file"] = np.unique(rows["file"], return_inverse=True)
            paths = tuple(self._name(int(index)) for index in used)
            packed = rows.tobytes()
        while len(names) > NAMES_KEPT:
            names.popitem(last=False)
        return packed, paths

    def _name(self, index: int) -> str:
        try:
            self._names.move_to_end(index)
        except KeyError:
            raise RuntimeError(f"reader worker: an event names path index {index}, older than the "
                               f"{NAMES_KEPT} kept (engine/workers.py, NAMES_KEPT)") from None
        return self._names[index]


def _shm_create(name: str, nbytes: int) -> tuple[int, mmap.mmap]:
    """A shared-memory file as torch makes one for a batch: created, unlinked at once (only the
    descriptor keeps it), sized and mapped."""
    fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.unlink(name)
        os.ftruncate(fd, max(nbytes, 1))
        return fd, mmap.mmap(fd, max(nbytes, 1))
    except BaseException:
        os.close(fd)
        raise


def own_darshan_log(environ: Any, pid: int) -> None:
    """Under darshan-runtime (trace/runtime.py) each process writes its log at exit to
    DARSHAN_LOGFILE; a forked worker inherits its parent's path, where its log could not be
    created (the parent's takes it), and its I/O would be lost. It gets its own beside it."""
    logfile = environ.get("DARSHAN_LOGFILE")
    if logfile:
        stem = logfile[: -len(".darshan")] if logfile.endswith(".darshan") else logfile
        environ["DARSHAN_LOGFILE"] = f"{stem}-worker-pid{pid}.darshan"


def _worker_loop(worker: int, job: _Job, tasks: Any, results: Any, done: Any, forked_at: float, parent: int) -> None:
    """One worker process: fetch the batches its index queue names until told to stop."""
    # The rank's handlers are not the worker's: SIGTERM (scancel, a time limit) ends it quietly as
    # the default action does, and Ctrl-C is the training process's to report, as torch's workers
    # ignore SIGINT; the fork inherited the rank's handler, which raised a traceback per worker.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    own_darshan_log(os.environ, os.getpid())
    if job.decode == "torch":
        import torch

        torch.set_num_threads(1)  # what torch's _worker_loop does in each worker
    trace = _WorkerTrace(job.storage)
    fetcher = BatchFetcher(job.files, OpenFiles(trace.storage, job.fmt, job.options, OPEN_FILES_PER_WORKER), job.decode)
    start_s = perf_counter() - forked_at
    made = 0
    try:
        while True:
            try:
                task = tasks.get(timeout=POLL_S)
            except queue.Empty:
                if os.getppid() != parent:
                    # torch's worker watchdog: the rank died (killed, say); nobody will read what is
                    # left, and a live orphan would hold its launcher's output open
                    os._exit(1)
                continue
            if task is None:
                break
            if done.is_set():  # shutting down: queued batches are skipped, as torch's workers do
                continue
            index, rows = task
            name = f"{job.shm_prefix}-{worker}-{made}"
            made += 1
            before = FetchTimes(**fetcher.times.as_dict())
            made_here: list[tuple[int, mmap.mmap]] = []
            try:
                def out(nbytes: int) -> memoryview:
                    made_here.append(_shm_create(name, nbytes))
                    return memoryview(made_here[-1][1])[:nbytes]

                samples, payload = fetcher.fill(rows, out)
                fd, buffer = made_here[0]
                nbytes = len(buffer)
                shared = reduction.DupFd(fd)  # what torch's reduce_storage sends for a tensor's storage
            except BaseException as error:  # the main process raises it where the training loop waits
                events, paths = trace.drain()
                results.put(_Message("error", worker, index, events=events, paths=paths, error=_picklable(error)))
                continue
            finally:
                for fd, buffer in made_here:
                    with suppress(BufferError):  # a failed fill's array may still view it: unmapped when collected
                        buffer.close()
                    os.close(fd)
            times = FetchTimes(**fetcher.times.as_dict())
            times.fetch_s -= before.fetch_s
            times.decode_s -= before.decode_s
            times.collate_s -= before.collate_s
            times.batches -= before.batches
            events, paths = trace.drain()
            results.put(_Message("batch", worker, index, shared, nbytes, samples, payload, events, paths, times, start_s))
            start_s = 0.0
    finally:
        fetcher.close()  # the closes of the files still open: recorded, and sent with the exit message
        events, paths = trace.drain()
        results.put(_Message("exit", worker, events=events, paths=paths, start_s=start_s))
        results.close()
        results.join_thread()


def _picklable(error: BaseException) -> BaseException:
    import pickle

    error = error.with_traceback(None)  # its frames would keep the batch's buffers alive
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


class _Received:
    """A batch in the main process: its shared memory's descriptor fetched from the worker and
    mapped (torch's rebuild_storage_fd); unmapped when the next batch is taken."""

    def __init__(self, message: _Message) -> None:
        fd = message.shm.detach()
        try:
            self.buffer = mmap.mmap(fd, max(message.nbytes, 1))
        finally:
            os.close(fd)

    def release(self) -> None:
        self.buffer.close()


class _WorkerPool:
    """N forked workers, their index queues and the shared result queue."""

    def __init__(self, job: _Job, count: int, prefetch: int, stats: LoaderStats, recorder: Any) -> None:
        context = multiprocessing.get_context("fork")
        self._job, self._count, self._window = job, count, count * prefetch
        self._stats, self._recorder = stats, recorder
        self._results = context.Queue()
        self._done = context.Event()
        self._tasks = [context.Queue() for _ in range(count)]
        self._exited: set[int] = set()
        self._ready_s = 0.0  # the latest worker's start so far (fork to its first batch taken up)
        self._processes = []
        forked_at = perf_counter()
        for worker in range(count):
            process = context.Process(target=_worker_loop, name=f"reader-{worker}", daemon=True,
                                      args=(worker, job, self._tasks[worker], self._results, self._done, forked_at,
                                            os.getpid()))
            process.start()
            self._processes.append(process)
        stats.worker_starts += count
        self._ready(perf_counter() - forked_at)

    def _ready(self, seconds: float) -> None:
        """worker_start_s counts, per pool, the time until its last worker was ready: forking in
        this process, then each worker's own start (any part of it the loop did not wait for is
        counted all the same: it is what starting the workers took)."""
        if seconds > self._ready_s:
            self._stats.worker_start_s += seconds - self._ready_s
            self._ready_s = seconds

    # messages ---------------------------------------------------------------------------------
    def _take(self, message: _Message) -> None:
        """Absorb what every message carries: the worker's events and times."""
        if self._recorder is not None:
            mapping = np.array([self._recorder.path_id(path) for path in message.paths], dtype=np.uint32)
            self._recorder.absorb(message.events, mapping)  # the message's events name its own paths by position
        if message.times is not None:
            self._stats.times.add(message.times)
        self._ready(message.start_s)
        if message.kind == "exit":
            self._exited.add(message.worker)

    def _next_message(self) -> _Message:
        while True:
            try:
                message = self._results.get(timeout=POLL_S)
            except queue.Empty:
                for worker, process in enumerate(self._processes):
                    if worker not in self._exited and not process.is_alive():
                        raise RunFailure(f"reader worker process {worker} (pid {process.pid}) exited unexpectedly "
                                         f"with code {process.exitcode}; see its output above")
                continue
            self._take(message)
            return message

    # one epoch ---------------------------------------------------------------------------------
    def epoch(self, plan: EpochReadPlan) -> Iterator[Batch]:
        count = plan.num_batches
        cycle = itertools.cycle(range(self._count))
        sent = 0
        arrived: dict[int, _Message] = {}
        outstanding = 0

        def put() -> None:
            nonlocal sent, outstanding
            if sent < count:
                self._tasks[next(cycle)].put((sent, plan.batch(sent)))
                sent += 1
                outstanding += 1

        for _ in range(self._window):
            put()
        held: _Received | None = None
        try:
            for wanted in range(count):
                while wanted not in arrived:
                    message = self._next_message()
                    if message.kind == "exit":
                        raise RunFailure(f"reader worker process {message.worker} stopped before its batches were read")
                    arrived[message.index] = message
                message = arrived.pop(wanted)
                outstanding -= 1
                put()
                if message.kind == "error":
                    raise message.error
                if held is not None:
                    held.release()
                held = _Received(message)
                yield Batch(samples=message.samples, payload_bytes=message.payload)
        finally:
            if held is not None:
                held.release()
            self.clean = not arrived and outstanding == 0

    def shutdown(self) -> None:
        """torch's _shutdown_workers: the done event, a None on every index queue, then every
        worker's exit message (with the events of batches it still fetched), then join."""
        self._done.set()
        for tasks in self._tasks:
            tasks.put(None)
        while len(self._exited) < self._count:
            try:
                message = self._next_message()
            except RunFailure:
                break
        for process in self._processes:
            process.join()
        for tasks in self._tasks:
            tasks.close()
        self._results.close()


class ProcessReader:
    """The PyTorch DataLoader with worker processes (module doc); read_threads=0 fetches in the
    training process itself, as num_workers=0 does."""

    def __init__(self, storage: Any, fmt: DatasetFormat, options: FormatOptions, files: tuple[FileSpec, ...],
                 workers: int, prefetch: int, persistent: bool, decode: str) -> None:
        self._job = _Job(storage, fmt, options, files, decode, os.path.join(SHM_FOLDER, f"dlio_ckpt-{os.getpid()}-{id(self):x}"))
        self._workers, self._prefetch, self._persistent = workers, max(prefetch, 1), persistent
        self._recorder = getattr(storage, "recorder", None)
        self._pool: _WorkerPool | None = None
        self.stats = LoaderStats(workers="processes")
        if decode == "torch":
            import torch  # noqa: F401  imported before training starts its clock, as a PyTorch program has it



    def batches(self, plan: EpochReadPlan) -> Iterator[Batch]:
        if self._workers == 0:
            yield from self._in_process(plan)
            return
        pool = self._pool or _WorkerPool(self._job, self._workers, self._prefetch, self.stats, self._recorder)
        self._pool = None
        finished = False
        try:
            yield from pool.epoch(plan)
            finished = pool.clean
        finally:
            if finished and self._persistent:
                self._pool = pool
            else:
                pool.shutdown()

    def _in_process(self, plan: EpochReadPlan) -> Iterator[Batch]:
        fetcher = BatchFetcher(self._job.files, OpenFiles(self._job.storage, self._job.fmt, self._job.options,
                                                          OPEN_FILES_PER_WORKER), self._job.decode)
        try:
            for index in range(plan.num_batches):
                def out(nbytes: int) -> memoryview:
                    return memoryview(np.empty(nbytes, dtype=np.uint8))  # as collate's torch.empty

                samples, payload = fetcher.fill(plan.batch(index), out)
                yield Batch(samples=samples, payload_bytes=payload)
        finally:
            fetcher.close()
            self.stats.times.add(fetcher.times)

    def close(self) -> None:
        """The persistent workers, at the end of the run (their file closes are absorbed)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.shutdown()
