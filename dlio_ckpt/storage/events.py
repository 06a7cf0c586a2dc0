"""One event per storage operation: what the metrics, the Darshan writer and the Chrome trace read.

While a rank runs, an event (op, phase, path index, offset, length, start, end) is packed as the
38 bytes of an EVENT_DTYPE row (`pack_event`) and appended to one bytearray in a single `extend`
(cheap, and atomic between threads). Every COMPACT_EVENTS events they are moved into one numpy
array, grown in place, and every SPILL_ROWS events that array is written to the recorder's spill
file (event_spill.py) with the paths added meanwhile, so what a rank holds does not grow with the
files it touches: `blocks()` reads them back a block at a time for the end-of-run figures
(metrics/) and the event file, whose path table takes a byte a character (`save`). Times are seconds since
the job started, on a clock that all ranks share (`JobClock`), so events of different ranks can be put on one timeline
(traced handles append raw perf_counter readings, flagged RAW_TIMES in the phase, and the
recorder moves them onto that clock as it converts them).

The traced POSIX handle's hot paths and the recorder's path registration are in C where the
optional extension `_trace_c` is built (`_trace_c` below: the one place that decides); the same
events come from pure Python without it.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import struct
import threading
import zipfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from dlio_ckpt.storage.event_spill import EventSpill

OPS = ("open", "close", "read", "write", "fsync", "stat", "rename", "unlink", "seek")
PHASES = ("generate", "train", "eval", "checkpoint", "restore", "other")
OP_CODE = {name: code for code, name in enumerate(OPS)}
PHASE_CODE = {name: code for code, name in enumerate(PHASES)}

EVENT_DTYPE = np.dtype(
    [
        ("op", "u1"),
        ("phase", "u1"),
        ("file", "u4"),  # index into the rank's path table
        ("offset", "i8"),  # -1 where an operation has no offset
        ("length", "i8"),  # bytes actually moved (reads/writes), 0 otherwise
        ("start", "f8"),  # seconds since job start
        ("end", "f8"),
    ]
)

# pack_event(op, phase, file, offset, length, start, end): one event as the bytes of one
# EVENT_DTYPE row (38 bytes, native order, no padding), so the recorder's events become a numpy
# array without parsing, every offset and length below 2^63 and every time exact. A list of five
# Python numbers per event, which the recorder kept before, took ~150 bytes an event and cost
# ~150 ns more an event to convert and free than packing costs (benchmarks/README.md, "Emulator
# overhead").
pack_event = struct.Struct("=BBIqqdd").pack
EVENT_BYTES = EVENT_DTYPE.itemsize
assert struct.calcsize("=BBIqqdd") == EVENT_BYTES

# Past this many events the recorder moves its bytearray into a numpy chunk: the bytearray's
# events cannot be read while threads append to it (a view would stop it growing), a chunk can.
COMPACT_EVENTS = 1 << 14

# A phase with this bit carries times as time.perf_counter() read them: the traced handles append
# them so, saving two subtractions per event on the hot path, and the recorder puts them on the
# job clock (minus JobClock.shift, the same float64 subtraction) when it converts them.
RAW_TIMES = 0x80
OP_OPEN, OP_CLOSE, OP_READ, OP_WRITE, OP_FSYNC = (OP_CODE[op] for op in ("open", "close", "read", "write", "fsync"))


def _load_trace_c():
    """The C hot paths (storage/_trace_c.c), or None where they are not to be used: not built (an
    install without a compiler) or a perf_counter on another clock than the module reads (its
    times must mix with the ones Python records). The tracer reads `_trace_c` when it builds a
    view's openers and picks the POSIX handle class, and the recorder when it adds a path, so
    setting it to None (tests) gives the pure-Python paths for what is built after."""
    try:
        from dlio_ckpt.storage import _trace_c
    except ImportError:
        return None
    if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        return None
    return _trace_c


_trace_c = _load_trace_c()


def events_of(packed: bytearray, shift: float = 0.0) -> np.ndarray:
    """Packed events (`pack_event`, back to back) as EVENT_DTYPE rows, in place: `packed` must be
    a copy the recorder no longer appends to. Events whose phase carries RAW_TIMES get `shift`
    (the clock's) taken off their times: the float64 subtraction JobClock.now() makes."""
    rows = np.frombuffer(packed, EVENT_DTYPE)
    phase = rows["phase"]
    raw = phase >= RAW_TIMES
    for name in ("start", "end"):
        times = rows[name]
        if raw.all():
            times -= shift
        elif raw.any():
            np.subtract(times, shift, out=times, where=raw)
    phase &= RAW_TIMES - 1
    return rows


@dataclass(frozen=True)
class JobClock:
    """Seconds since the job started, comparable across ranks.

    Rank 0's wall-clock start time is broadcast; each rank maps its own monotonic
    perf_counter onto it, so intervals stay monotonic and ranks share one origin.
    """

    job_start_wall: float
    perf_origin: float
    wall_origin: float

    @classmethod
    def start(cls, job_start_wall: float | None = None) -> "JobClock":
        wall = time.time()
        return cls(
            job_start_wall=wall if job_start_wall is None else job_start_wall,
            perf_origin=time.perf_counter(),
            wall_origin=wall,
        )

    def now(self) -> float:
        return (time.perf_counter() - self.perf_origin) + (self.wall_origin - self.job_start_wall)

    @property
    def shift(self) -> float:
        """now() is time.perf_counter() - shift: the recorder subtracts this one number from the
        perf_counter readings that traced handles append (RAW_TIMES)."""
        return self.perf_origin - (self.wall_origin - self.job_start_wall)

    def from_wall(self, wall: float) -> float:
        """A wall-clock time (`time.time()`, as other libraries stamp events) on this clock."""
        return wall - self.job_start_wall


@dataclass
class EventRecorder:
    """Collects one rank's events; every total is derived from them (`totals_by_phase`).

    `record` is called at once from reader threads, the async persist thread and the training
    thread. It keeps no running totals, because an unlocked read-modify-write of a shared
    counter loses updates between threads; it only appends one event's packed bytes (a single
    `bytearray.extend`, atomic in CPython, so events never interleave) and looks up the
    file's index, taking a lock only the first time a path is seen (none where the C extension
    adds it, in one step under the GIL), so the common call stays cheap and nothing is ever lost.

    What it holds does not grow with the run (event_spill.py): past SPILL_ROWS converted events it
    writes them to its spill file, and with them the paths added since the last time; the path ->
    index table is a cache of the PATH_CACHE paths added last, so a path seen again after it left
    gets a second index (a second entry in the path table, merged when the file is read:
    `RankEvents.load`). `blocks()` gives the events back a block at a time.
    """

    rank: int
    clock: JobClock
    spill_dir: Path | None = None  # where the unlinked spill files go (None: the temporary folder)
    _path_index: dict[str, int] = field(default_factory=dict)  # the cache: path -> index
    # The paths added since they were last spilled, after the index of the first of them: index
    # window[0] + k - 1 names window[k]. The base lives in the list so that spilling (one slice
    # assignment) and an addition in C (`_trace_c.path_index`) each see the window whole.
    _window: list = field(default_factory=lambda: [0])
    _path_lock: threading.Lock = field(default_factory=threading.Lock)
    _events: bytearray = field(default_factory=bytearray)  # EVENT_BYTES per event (pack_event)
    # The converted events not yet spilled, in one array grown in place (`_store_rows`), then spare
    # room: `_stored` rows are events.
    _store: np.ndarray = field(default_factory=lambda: np.empty(0, EVENT_DTYPE))
    _stored: int = 0
    _chunk_lock: threading.Lock = field(default_factory=threading.Lock)
    _spill: EventSpill | None = None

    def __post_init__(self) -> None:
        self._spill = EventSpill(EVENT_DTYPE, self.spill_dir)

    @property
    def paths(self) -> list[str]:
        """Every path by index, spilled ones read back: for tests and small runs (a long run's
        table is read from its event file)."""
        return self._spill.read_paths() + self._window[1:]

    def paths_since(self, first: int) -> list[str]:
        """The paths from index `first` on (what a worker process has not yet sent its parent)."""
        window = list(self._window)
        base = window[0]
        return self._spill.read_paths(first) + window[1 + max(first - base, 0):]

    def path_id(self, path: str) -> int:
        index = self._path_index.get(path)
        if index is None:
            if _trace_c is not None:  # the same, in one step under the GIL, without the lock
                return _trace_c.path_index(self._path_index, self._window, path)
            with self._path_lock:  # two threads adding paths must not take the same index
                index = self._path_index.get(path)
                if index is None:
                    window = self._window
                    index = window[0] + len(window) - 1
                    window.append(path)
                    self._path_index[path] = index
        return index

    def record(self, op: str, phase: str, path: str, offset: int, length: int, start: float, end: float) -> None:
        self._events.extend(pack_event(OP_CODE[op], PHASE_CODE[phase], self.path_id(path), offset, length, start, end))
        if len(self._events) >= COMPACT_EVENTS * EVENT_BYTES:
            self.compact()

    def compact(self) -> None:
        """Move the appended events into the numpy store once there are COMPACT_EVENTS of them
        (callers: `record`, and traced handles as they close), and the store to the spill file
        once it holds SPILL_ROWS. Appends by other threads meanwhile land after the slice taken,
        so deleting that slice loses none; `array` takes the lock."""
        if len(self._events) < COMPACT_EVENTS * EVENT_BYTES:
            return
        with self._chunk_lock:
            count = len(self._events)  # whole events: each is one atomic extend of EVENT_BYTES
            if count >= COMPACT_EVENTS * EVENT_BYTES:
                # a slice is a copy, taken in one step; a view would stop the appending threads
                self._store_rows(events_of(self._events[:count], self.clock.shift))
                del self._events[:count]
                if self._stored >= SPILL_ROWS:
                    self._spill.write_rows(self._store[:self._stored])
                    self._stored = 0
                    self._spill_paths()

    def _spill_paths(self) -> None:
        """The window's paths to the spill file, and the cache cut to its newer half once past
        PATH_CACHE (the caller holds `_chunk_lock`). The window becomes [next index] in one slice
        assignment, so a path added in C meanwhile (after the copy taken) stays, at its index."""
        self._spill.write_paths(self._take_window())
        self._trim_cache()

    def forget_paths(self) -> None:
        """Drop the paths added so far, unspilled, and cut the cache as a spill does: for a reader
        worker process's recorder, whose paths went to its parent with its events
        (`paths_since`, engine/workers.py), so that it holds no path per file it opened. A path
        seen again after it left the cache gets another index, as in the parent."""
        self._take_window()
        self._trim_cache()

    def _take_window(self) -> list[str]:
        with self._path_lock:
            window = self._window
            count = len(window) - 1
            taken = window[1:count + 1]
            window[0:count + 1] = [window[0] + count]
        return taken

    def _trim_cache(self) -> None:
        table = self._path_index
        if len(table) > PATH_CACHE:
            for path in list(itertools.islice(table, len(table) - PATH_CACHE // 2)):
                table.pop(path, None)  # a path looked up meanwhile keeps its index; a new one gets another

    def _store_rows(self, rows: np.ndarray) -> None:
        """Add converted rows after the stored ones (the caller holds `_chunk_lock`)."""
        end = self._stored + len(rows)
        if end > len(self._store):
            self._grow(end)
        self._store[self._stored:end] = rows
        self._stored = end

    def _grow(self, needed: int) -> None:
        """Room for `needed` rows and more. `resize` reallocates in place: for an array past the C
        library's mmap threshold (at most 32 MiB) it moves the pages (mremap) rather than copying
        them, so the store grows by an eighth without a second copy at any moment; below it a
        reallocation may copy, so the store doubles there (amortised: a copy per row at most, and
        the spare room, zero-filled, stays under 32 MiB). An array() result still looking at the
        store (resize refuses then) keeps the old memory; the rows are copied into a new array."""
        size = len(self._store)
        more = size if size * EVENT_BYTES < _COPYING_REALLOC_BYTES else size // 8
        capacity = max(needed, size + more + COMPACT_EVENTS)
        try:
            self._store.resize(capacity, refcheck=True)
        except ValueError:
            grown = np.empty(capacity, EVENT_DTYPE)
            grown[:self._stored] = self._store[:self._stored]
            self._store = grown

    def extender(self):
        """Append one event as `extend(pack_event(op, phase | RAW_TIMES, path id, offset, length,
        start, end))` with start and end as time.perf_counter() read them: what `record` does, for
        a caller that looked up the phase and path once (a traced file handle, whose every read and
        write lands here). Thread-safe as `record`. Such a caller calls `compact` once the
        bytearray (the extender's `__self__`) holds COMPACT_EVENTS * EVENT_BYTES bytes."""
        return self._events.extend

    def absorb(self, packed: bytes, mapping: np.ndarray) -> None:
        """Events another process recorded (a reader worker process, engine/workers.py) added
        as this recorder's: `packed` is that recorder's bytes (pack_event rows, times as its
        handles read perf_counter, the same CLOCK_MONOTONIC in a forked child); `mapping` maps its
        path indices onto this recorder's (`path_id` of each of its paths, in order)."""
        if not packed:
            return
        rows = np.frombuffer(bytearray(packed), EVENT_DTYPE)
        rows["file"] = mapping[rows["file"]]
        self._events.extend(rows.tobytes())
        if len(self._events) >= COMPACT_EVENTS * EVENT_BYTES:
            self.compact()

    def take_packed(self) -> bytes:
        """The events appended so far, removed from this recorder: what a worker process sends
        its parent (`absorb`) with each batch. Only for a recorder nothing else appends to meanwhile.
        The stored and spilled events come first (their times already on the job clock, as
        `events_of` leaves rows without RAW_TIMES), then the raw tail. The store starts afresh (an
        array() result may still look at the old one)."""
        with self._chunk_lock:
            stored = [rows.tobytes() for rows in self._spill.read_blocks()]
            stored.append(self._store[:self._stored].tobytes())
            self._spill.drop_rows()
            self._store, self._stored = np.empty(0, EVENT_DTYPE), 0
            packed = bytes(self._events)
            del self._events[:]
        return b"".join(stored) + packed

    def path_table(self) -> dict[str, int]:
        """The path -> index cache, for a caller that looks a path up before calling `path_id`
        (an entry found names its path for good; one missing may only have left the cache)."""
        return self._path_index

    def path_window(self) -> list:
        """The window of paths not yet spilled, after its first index: what `_trace_c.path_index`
        adds to (index window[0] + len(window) - 1)."""
        return self._window

    @property
    def bytes_read(self) -> dict[str, int]:
        """Bytes moved by read calls, per phase that read (derived from the events)."""
        return {phase: t["bytes_read"] for phase, t in totals_by_phase(self.array()).items() if t["reads"]}

    @property
    def bytes_written(self) -> dict[str, int]:
        """Bytes moved by write calls, per phase that wrote (derived from the events)."""
        return {phase: t["bytes_written"] for phase, t in totals_by_phase(self.array()).items() if t["writes"]}

    @property
    def op_counts(self) -> dict[tuple[str, str], int]:
        """Operations per (phase, op) (derived from the events)."""
        return op_counts(self.array())

    def _store_tail(self) -> None:
        """The tail of appended bytes stored, as `compact` does (the caller holds `_chunk_lock`;
        appends meanwhile land after it)."""
        count = len(self._events)
        if count:
            self._store_rows(events_of(self._events[:count], self.clock.shift))
            del self._events[:count]

    def array(self) -> np.ndarray:
        """All events so far as one EVENT_DTYPE array, read-only. Until a block was spilled it is a
        view of the recorder's store (the events held once); after, a new array of all of them
        read back: for tests and short runs (a run's end reads `blocks()`)."""
        with self._chunk_lock:
            self._store_tail()
            events = self._store[:self._stored]
            if self._spill.rows:
                events = np.concatenate([*self._spill.read_blocks(), events])
        events.flags.writeable = False  # the recorder's own rows
        return events

    def event_count(self) -> int:
        with self._chunk_lock:
            self._store_tail()
            return self._spill.rows + self._stored

    def blocks(self) -> Iterator[tuple[np.ndarray, float]]:
        """All events so far, a block at a time, each with the earliest start of any event in a
        later block (inf for the last): what metrics/timing.UnionLength needs to count each busy
        period once while holding a block. For a recorder nothing appends to meanwhile."""
        with self._chunk_lock:
            self._store_tail()
            held = self._store[:self._stored]
            held.flags.writeable = False
        starts = [*self._spill.block_starts, float(held["start"].min()) if len(held) else np.inf]
        later = np.minimum.accumulate(starts[::-1])[::-1].tolist()[1:] + [np.inf]
        for number, rows in enumerate(self._spill.read_blocks()):
            yield rows, later[number]
        if len(held):
            yield held, np.inf

    def save(self, folder: Path, hostname: str, events: np.ndarray | None = None) -> Path:
        """Write this rank's events as `events/rank-NNNNN.npz`: arrays `events` (EVENT_DTYPE),
        `path_bytes` (uint8: the paths' UTF-8, back to back) and `path_ends` (int64: where each
        path's bytes end), and `meta` (JSON). The path table is a byte per ASCII character, where a
        numpy unicode array took four for the longest path's every character; each array is written
        into the archive block by block from the spill files and what is held, so saving holds no
        second copy of the events or the paths.

        `events` is this recorder's array() when the caller already built it."""
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"rank-{self.rank:05d}.npz"
        meta = {
            "rank": self.rank,
            "hostname": hostname,
            "pid": os.getpid(),
            "job_start_wall": self.clock.job_start_wall,
            "ops": list(OPS),
            "phases": list(PHASES),
        }
        blocks = [events] if events is not None else None
        count = len(events) if events is not None else self.event_count()
        tmp = target.with_suffix(".tmp.npz")
        with open(tmp, "wb") as out:
            with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
                _write_events(archive, blocks if blocks is not None else (rows for rows, _ in self.blocks()), count)
                _write_path_table(archive, self._spill, self._window[1:])
                with archive.open("meta.npy", "w", force_zip64=True) as entry:
                    np.lib.format.write_array(entry, np.array(json.dumps(meta)), allow_pickle=False)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
        return target


# Converted events a recorder holds before it writes them to its spill file (600 KiB; every
# compaction spills). COMPACT_EVENTS (2^14) also bounds the path cache between its trims: at most
# PATH_CACHE + COMPACT_EVENTS paths (a stat of each dataset file adds a path an event); with
# 2^16 there, a 100k-file generation peaked at 222.7 MiB in the manifest's stats, with 2^14 195.2.
SPILL_ROWS = 1 << 14

# Paths the recorder's path -> index cache keeps (~3 MiB of str, int and dict entry): a file opened
# again within the last PATH_CACHE paths added keeps its index. A recorder alone for 1M files (5
# events each, then its figures and event file) peaks at 49 MiB with 2^14, 72 MiB with 2^16 (and
# 2^17 spill rows), 527 MiB holding everything; 10k files: 38 MiB.
PATH_CACHE = 1 << 14

# glibc's largest mmap threshold: a reallocation below it may copy the array, one above moves pages.
_COPYING_REALLOC_BYTES = 32 << 20

# Paths encoded per block while the path table is written: the table's Python bytes objects are
# never more than this many at once.
PATH_BLOCK = 1 << 14


def _encoded(paths: list[str], start: int) -> list[bytes]:
    """One block of paths as bytes. "surrogatepass" keeps a path that os.fsdecode gave lone
    surrogates (undecodable bytes) exact through the round trip (`decoded_paths`)."""
    return [path.encode("utf-8", "surrogatepass") for path in paths[start:start + PATH_BLOCK]]


def _npy_entry(archive: zipfile.ZipFile, name: str, dtype: np.dtype, count: int):
    """A zip entry holding a one-dimensional .npy array of `count` items, its header written: the
    caller writes the items' bytes."""
    entry = archive.open(f"{name}.npy", "w", force_zip64=True)
    np.lib.format.write_array_header_2_0(entry, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                 "fortran_order": False, "shape": (count,)})
    return entry


def _write_events(archive: zipfile.ZipFile, blocks: Iterable[np.ndarray], count: int) -> None:
    """`count` events given in blocks, written from views of each a part at a time (numpy's own
    writer copies up to 16 MiB at once into bytes)."""
    part = COMPACT_EVENTS * EVENT_BYTES
    with _npy_entry(archive, "events", EVENT_DTYPE, count) as entry:
        for rows in blocks:
            flat = np.ascontiguousarray(rows, EVENT_DTYPE).view(np.uint8)
            for start in range(0, len(flat), part):
                entry.write(flat[start:start + part])


def _write_path_table(archive: zipfile.ZipFile, spill: EventSpill, window: list[str]) -> None:
    """`path_ends` then `path_bytes`: the spilled ones copied a megabyte at a time, then the
    window's, a block of paths at a time (each block encoded twice rather than all of it kept)."""
    count = spill.paths + len(window)
    end = spill.path_bytes
    with _npy_entry(archive, "path_ends", np.int64, count) as entry:
        for chunk in spill.byte_blocks(2, 1 << 20):
            entry.write(chunk)
        for start in range(0, len(window), PATH_BLOCK):
            ends = end + np.cumsum([len(path) for path in _encoded(window, start)], dtype=np.int64)
            entry.write(ends.tobytes())
            end = int(ends[-1])
    with _npy_entry(archive, "path_bytes", np.uint8, end) as entry:
        for chunk in spill.byte_blocks(1, 1 << 20):
            entry.write(chunk)
        for start in range(0, len(window), PATH_BLOCK):
            entry.write(b"".join(_encoded(window, start)))


def decoded_paths(path_bytes: np.ndarray, path_ends: np.ndarray) -> list[str]:
    """The path table of an event file (`path_bytes`, `path_ends`) as strings; ValueError where it
    does not hold together (ends that go back or past the bytes, bytes that are not UTF-8)."""
    blob = path_bytes.tobytes()
    ends = path_ends.astype(np.int64, copy=False)
    if path_bytes.dtype != np.uint8 or path_ends.ndim != 1 or (len(ends) and (
            ends[0] < 0 or (np.diff(ends) < 0).any() or int(ends[-1]) != len(blob))) or (not len(ends) and blob):
        raise ValueError("its path table does not hold together")
    starts = [0, *ends[:-1].tolist()]
    return [blob[start:end].decode("utf-8", "surrogatepass") for start, end in zip(starts, ends.tolist())]


def merged_paths(paths: list[str], events: np.ndarray) -> list[str]:
    """The path table with each path once: a path that left the recorder's cache and came back
    has a second index (EventRecorder), so its events (`events`, changed in place) are moved to
    its first one. Unchanged where every path is there once."""
    first: dict[str, int] = {}
    index = np.fromiter((first.setdefault(path, len(first)) for path in paths), np.uint32, len(paths))
    if len(first) == len(paths) or (len(events) and int(events["file"].max()) >= len(paths)):
        return paths  # each path once; or a damaged file, left as it is for its reader's checks to name
    if len(events):
        events["file"] = index[events["file"]]
    return list(first)


def op_counts(events: np.ndarray) -> dict[tuple[str, str], int]:
    """Number of events per (phase, op), only those that occurred."""
    codes = events["phase"].astype(np.uint16) * len(OPS) + events["op"]  # 2 bytes an event, not 8
    counts = np.bincount(codes, minlength=len(PHASES) * len(OPS))
    return {(PHASES[code // len(OPS)], OPS[code % len(OPS)]): int(n) for code, n in enumerate(counts) if n}


def totals_by_phase(events: np.ndarray) -> dict[str, dict[str, int]]:
    """Per phase that has events: bytes moved by reads and by writes, and the number of reads,
    writes and operations of any kind. Exact: summed from the events, never kept running. The
    sums take masks (a byte an event) over the length column rather than copies of the events."""
    totals: dict[str, dict[str, int]] = {}
    counts = op_counts(events)
    phases, ops_of, lengths = events["phase"], events["op"], events["length"]
    for phase in PHASES:
        ops = sum(n for (p, _), n in counts.items() if p == phase)
        if not ops:
            continue
        in_phase = phases == PHASE_CODE[phase]
        totals[phase] = {
            "bytes_read": int(lengths.sum(where=in_phase & (ops_of == OP_CODE["read"]))),
            "bytes_written": int(lengths.sum(where=in_phase & (ops_of == OP_CODE["write"]))),
            "reads": counts.get((phase, "read"), 0),
            "writes": counts.get((phase, "write"), 0),
            "ops": ops,
        }
    return totals


@dataclass(frozen=True)
class RankEvents:
    """One rank's events read back from its event file."""

    rank: int
    hostname: str
    job_start_wall: float
    paths: list[str]
    events: np.ndarray

    @classmethod
    def load(cls, path: Path) -> "RankEvents":
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            paths = (decoded_paths(data["path_bytes"], data["path_ends"]) if "path_ends" in data.files
                     else [str(p) for p in data["paths"]])  # event files written before the byte table
            events = data["events"].copy()
            paths = merged_paths(paths, events)
            return cls(
                rank=int(meta["rank"]),
                hostname=str(meta["hostname"]),
                job_start_wall=float(meta["job_start_wall"]),
                paths=paths,
                events=events,
            )


def load_run_events(run_dir: Path) -> list[RankEvents]:
    """All ranks' events of a run folder, ordered by rank."""
    return sorted((RankEvents.load(f) for f in event_files(run_dir)), key=lambda r: r.rank)


# ---------------------------------------------------------------------------------------------
# Reading an event file a block at a time (the Chrome trace, the offline analysis).
#
# A run over 10 million files leaves ~40 million events (1.5 GB) and 10 million paths in one
# rank's event file: `RankEvents.load` holds all of it, and a Python str per path besides. The
# archive is written uncompressed (ZIP_STORED, `save`), so each .npy member is a plain run of
# bytes in the file: `EventFile` finds where each starts and reads the events a block of rows at a
# time, and the paths by index, each only when a block names it. What it holds is one block and
# its paths, whatever the file's size.

# Rows a block (608 KiB of events), and paths a block of the path table (`path_blocks`): a block
# of 2^16 paths held ~14 MiB while it was decoded (its bytes, twice, and a dict of str).
EVENT_BLOCK_ROWS = 1 << 14
_PATH_GAP = 256  # paths named less than this far apart are read in one run of the table


class _StoredArray:
    """Where a one-dimensional .npy member of an uncompressed zip lies, to read a slice at a time."""

    def __init__(self, handle, archive: zipfile.ZipFile, name: str) -> None:
        info = archive.getinfo(name)
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"{name} is compressed (dlio_ckpt writes its event files uncompressed)")
        handle.seek(info.header_offset)
        local = handle.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            raise ValueError(f"{name}: no zip entry where the directory says")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        handle.seek(info.header_offset + 30 + name_len + extra_len)
        version = np.lib.format.read_magic(handle)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(handle)
        if len(shape) != 1 or fortran or dtype.hasobject:
            raise ValueError(f"{name} is not a one-dimensional array of plain values")
        self.dtype, self.count, self.offset = dtype, int(shape[0]), handle.tell()
        if info.file_size < self.offset - (info.header_offset + 30 + name_len + extra_len) + self.count * dtype.itemsize:
            raise ValueError(f"{name} is cut short")

    def read(self, handle, start: int, stop: int) -> np.ndarray:
        """Items [start, stop) (stop clipped to the array's end) as a new array."""
        out = np.empty(max(min(stop, self.count) - start, 0), self.dtype)
        if len(out):
            handle.seek(self.offset + start * self.dtype.itemsize)
            if handle.readinto(out.view(np.uint8)) != out.nbytes:
                raise ValueError("the file is cut short")
        return out


class EventFile:
    """One rank's event file (`EventRecorder.save`) opened for reading a block at a time:
    `blocks()` gives the events EVENT_BLOCK_ROWS rows at a time with the paths each block names,
    `names()` any paths by index. Paths are as the file stores them: a path the recorder gave a
    second index (`merged_paths`) comes back under each of its indices, with the same text.

    The file is opened when it is read and stays open until `close()`, which a reader of many
    ranks' files calls after each (a run of a thousand ranks would otherwise hold a thousand)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._handle = None
        try:
            with zipfile.ZipFile(self._open()) as archive:
                meta = json.loads(str(np.load(io.BytesIO(archive.read("meta.npy")), allow_pickle=False)))
                self.events = _StoredArray(self._handle, archive, "events.npy")
                if "path_ends.npy" in archive.namelist():
                    self._ends = _StoredArray(self._handle, archive, "path_ends.npy")
                    self._bytes = _StoredArray(self._handle, archive, "path_bytes.npy")
                    self._legacy = None
                else:  # written before the byte table: fixed-width unicode, read by index as well
                    self._ends = self._bytes = None
                    self._legacy = _StoredArray(self._handle, archive, "paths.npy")
            self.rank = int(meta["rank"])
            self.hostname = str(meta["hostname"])
            self.job_start_wall = float(meta["job_start_wall"])
        finally:
            self.close()

    def __enter__(self) -> "EventFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self):
        if self._handle is None:
            self._handle = open(self.path, "rb")
        return self._handle

    def _read(self, array: _StoredArray, start: int, stop: int) -> np.ndarray:
        return array.read(self._open(), start, stop)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    @property
    def path_count(self) -> int:
        return self._legacy.count if self._legacy is not None else self._ends.count

    def check_path_table(self) -> None:
        """ValueError where the path table does not hold together (ends that go back or past its
        bytes), read a block of ends at a time; what `decoded_paths` checks for a whole table."""
        if self._legacy is not None:
            return
        last = 0
        for start in range(0, self._ends.count, EVENT_BLOCK_ROWS):
            ends = self._read(self._ends, start, start + EVENT_BLOCK_ROWS).astype(np.int64, copy=False)
            if (np.diff(ends, prepend=last) < 0).any():
                raise ValueError("its path table does not hold together")
            last = int(ends[-1])
        if self._ends.dtype.kind not in "iu" or self._bytes.dtype != np.uint8 or last != self._bytes.count:
            raise ValueError("its path table does not hold together")

    def names(self, indices: np.ndarray) -> dict[int, str]:
        """The paths at `indices` (ValueError for one past the table), each run of nearby indices
        read in one piece."""
        wanted = np.unique(np.asarray(indices, dtype=np.int64))
        if not len(wanted):
            return {}
        if wanted[0] < 0 or wanted[-1] >= self.path_count:
            raise ValueError(f"its events name file numbers past its {self.path_count} paths")
        cuts = np.flatnonzero(np.diff(wanted) > _PATH_GAP) + 1
        found: dict[int, str] = {}
        for run in np.split(wanted, cuts):
            first, last = int(run[0]), int(run[-1])
            if self._legacy is not None:
                table = self._read(self._legacy, first, last + 1)
                found.update((index, str(table[index - first])) for index in run.tolist())
                continue
            ends = self._read(self._ends, max(first - 1, 0), last + 1).astype(np.int64, copy=False)
            if first == 0:
                ends = np.concatenate([[0], ends])
            base = int(ends[0])
            if base < 0 or (np.diff(ends) < 0).any() or int(ends[-1]) > self._bytes.count:
                raise ValueError("its path table does not hold together")
            blob = memoryview(self._read(self._bytes, base, int(ends[-1])))
            for index in run.tolist():
                start, end = int(ends[index - first]) - base, int(ends[index - first + 1]) - base
                found[index] = str(blob[start:end], "utf-8", "surrogatepass")
        return found

    def blocks(self, rows: int | None = None, paths: bool = True) -> Iterator[tuple[np.ndarray, dict[int, str]]]:
        """The events `rows` at a time (the file's EVENT_DTYPE rows as they are, checked by the
        caller), each with {index: path} for the files it names ({} when `paths` is False)."""
        rows = rows or EVENT_BLOCK_ROWS
        for start in range(0, self.events.count, rows):
            block = self._read(self.events, start, start + rows)
            yield block, (self.names(block["file"]) if paths and block.dtype == EVENT_DTYPE else {})

    def path_blocks(self, rows: int | None = None) -> Iterator[tuple[int, list[str]]]:
        """The whole path table `rows` paths at a time (EVENT_BLOCK_ROWS by default), each block
        with the index of its first path."""
        rows = rows or EVENT_BLOCK_ROWS
        for first in range(0, self.path_count, rows):
            yield first, list(self.names(np.arange(first, min(first + rows, self.path_count))).values())


def iter_event_blocks(path: Path | str, rows: int | None = None) -> Iterator[tuple[np.ndarray, dict[int, str]]]:
    """An event file's events a block of `rows` at a time, each with the paths it names
    ({index: path}): what a reader that needs no more than the events and their paths calls."""
    with EventFile(path) as events:
        yield from events.blocks(rows)


def event_files(run_dir: Path) -> list[Path]:
    """A run folder's event files, in the order of their names (rank-NNNNN.npz: the ranks')."""
    return sorted((Path(run_dir) / "events").glob("rank-*.npz"))
