"""One rank's Darshan records made from its events a block at a time, in memory that does not grow
with its files or events (issue 26, item 3).

The log holds a POSIX record per file, in the order the rank first touched the files, and a DXT
trace per file read or written, in the order of the first read or write; but events come in the
order calls completed, files interleaved. Holding a record per file until the end cost 3.7 KiB a
file (benchmarks/README.md). So here:

1. the path table is read a block at a time into a `NameTable` (temporary files): each index's
   record id (darshan_hash of the cleaned name) and the cleaned name's bytes;
2. the events are read a block at a time (the heat map and the last I/O taken on the way), given
   their position in the rank's order, and sorted by path index through a `BucketSpill`
   (darshan_spill.py); each index range then takes its record ids from the table, and the events
   are sorted again by record id and position. A path the recorder gave two indices (it left its
   cache, `RankEvents.load`) has one record id, so its events meet as `merged_paths` merges them;
3. each file's events, now together and in order, make its POSIX record (darshan_posix.file_record)
   and DXT trace, which are sorted by the position of the file's first (counted) event and first
   read or write, and come out in the log's order: the POSIX records into a temporary file of
   RECORD_ROW rows, the DXT traces as the bytes of the rank's DXT_POSIX stream.

Everything held is a bucket of rows (darshan_spill.BUCKET_BYTES) and a few buffers; the files
are unlinked temporary files in the log's folder, gone when closed or when the process ends.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator

import numpy as np

from dlio_ckpt.storage.events import EVENT_DTYPE, OP_CODE, EventFile, RankEvents
from dlio_ckpt.trace.darshan_dxt import HeatmapBuilder, dxt_bytes, segments
from dlio_ckpt.trace.darshan_hash import darshan_hash
from dlio_ckpt.trace.darshan_posix import POSIX_RECORD, clean_path, file_alignment, file_record
from dlio_ckpt.trace.darshan_spill import BucketSpill, key_groups

EVENT_BLOCK = 1 << 14  # events read from an event file at a time
PATH_BLOCK = 1 << 12  # paths read from an event file at a time
RECORD_BLOCK = 1 << 10  # POSIX records read back at a time (724 bytes each)
ALIGNMENT_CACHE = 4096  # folders whose block size is remembered (a statvfs each otherwise)

# An event with its position in the rank's order and its file's record id.
EVENT_ROW = np.dtype([("pos", "<u8"), ("rid", "<u8"), ("file", "<u4"), ("op", "u1"), ("offset", "<i8"),
                      ("length", "<i8"), ("start", "<f8"), ("end", "<f8")])
# A POSIX record in the log's order: its id, the path index naming it, and its bytes; placed
# (PLACED_RECORD) it also has the position that orders it.
RECORD_ROW = np.dtype([("rid", "<u8"), ("file", "<u4"), ("body", f"V{POSIX_RECORD.size}")])
PLACED_RECORD = np.dtype([("pos", "<u8"), ("rid", "<u8"), ("file", "<u4"), ("body", f"V{POSIX_RECORD.size}")])
_PLACED_TRACE = np.dtype([("pos", "<u8"), ("at", "<i8"), ("size", "<i8")])  # bytes in the trace file

_SKIPPED_FIRST = (OP_CODE["unlink"], OP_CODE["rename"])  # never open a record (darshan_posix)
_READ, _WRITE = OP_CODE["read"], OP_CODE["write"]


@dataclass(frozen=True)
class EventSource:
    """One rank's events and path table, each readable a block at a time, any number of times."""

    rank: int
    hostname: str
    events: int
    paths: int
    event_blocks: Callable[[], Iterator[np.ndarray]]
    path_blocks: Callable[[], Iterator[list[str]]]

    @classmethod
    def of_file(cls, path: Path) -> "EventSource":
        """A rank's event file (`EventRecorder.save`), never read whole."""
        file = EventFile(path)

        def event_blocks() -> Iterator[np.ndarray]:
            with EventFile(path) as events:
                if events.events.dtype != EVENT_DTYPE:
                    raise ValueError("its events are not in this version's layout")
                yield from (block for block, _ in events.blocks(EVENT_BLOCK, paths=False))

        def path_blocks() -> Iterator[list[str]]:
            with EventFile(path) as events:
                yield from (names for _, names in events.path_blocks(PATH_BLOCK))

        return cls(file.rank, file.hostname, file.events.count, file.path_count, event_blocks, path_blocks)

    @classmethod
    def of_events(cls, rank: RankEvents) -> "EventSource":
        """Events already in memory (tests, small runs), handed on in the same blocks."""
        events, paths = rank.events, rank.paths
        return cls(rank.rank, rank.hostname, len(events), len(paths),
                   lambda: (events[start:start + EVENT_BLOCK] for start in range(0, len(events), EVENT_BLOCK)),
                   lambda: (paths[start:start + PATH_BLOCK] for start in range(0, len(paths), PATH_BLOCK)))


def temporary_file(folder: Path | None) -> IO[bytes]:
    """An unlinked temporary file in `folder` (the log's): gone when closed or the process ends.
    Unbuffered, so what was written is there for os.pread at once (writes are whole blocks)."""
    return tempfile.TemporaryFile(dir=folder, prefix=".dlio_ckpt-darshan-", buffering=0)


class NameTable:
    """A rank's path table as the log names its files: for each index, the record id and the
    cleaned name (UTF-8), in two temporary files read back by index."""

    _ROW = np.dtype([("rid", "<u8"), ("end", "<i8")])

    def __init__(self, folder: Path | None) -> None:
        self._rows, self._names = temporary_file(folder), temporary_file(folder)
        self._end = 0
        self.count = 0

    def close(self) -> None:
        self._rows.close()
        self._names.close()

    def add(self, paths: list[str], cwd: str | None) -> None:
        encoded = [clean_path(path, cwd).encode("utf-8") for path in paths]
        rows = np.empty(len(encoded), self._ROW)
        rows["rid"] = [darshan_hash(name) for name in encoded]
        rows["end"] = self._end + np.cumsum([len(name) for name in encoded], dtype=np.int64)
        self._names.write(b"".join(encoded))
        self._rows.write(rows.tobytes())
        self._end = int(rows["end"][-1]) if len(rows) else self._end
        self.count += len(rows)

    def _read_rows(self, first: int, end: int) -> np.ndarray:
        data = os.pread(self._rows.fileno(), (end - first) * self._ROW.itemsize, first * self._ROW.itemsize)
        return np.frombuffer(data, self._ROW)

    def rids(self, first: int, end: int) -> np.ndarray:
        """The record ids of indices first..end-1."""
        return self._read_rows(first, end)["rid"]

    def name(self, index: int) -> bytes:
        """The cleaned name of index `index`, UTF-8."""
        rows = self._read_rows(max(index - 1, 0), index + 1)
        start = int(rows["end"][0]) if index else 0
        end = int(rows["end"][-1])
        return os.pread(self._names.fileno(), end - start, start)


@dataclass
class RankPass:
    """What one rank's pass leaves: its POSIX records in the log's order (RECORD_ROW rows in a
    temporary file), its name table, its heat map so far, and its last I/O's end."""

    rank: int
    names: NameTable
    records: IO[bytes]
    record_count: int
    heatmap: HeatmapBuilder
    last_io: float
    event_count: int

    def close(self) -> None:
        self.names.close()
        self.records.close()

    def record_blocks(self) -> Iterator[np.ndarray]:
        """The POSIX records in order, RECORD_BLOCK at a time."""
        self.records.seek(0)
        left = self.record_count
        while left:
            take = min(RECORD_BLOCK, left)
            yield np.frombuffer(self.records.read(take * RECORD_ROW.itemsize), RECORD_ROW)
            left -= take


def rank_pass(source: EventSource, hostname: str, folder: Path | None, cwd: str | None,
              write_trace: Callable[[bytes], None]) -> RankPass:
    """Read `source` block by block, hand its DXT traces in the log's order to `write_trace`, and
    return its POSIX records in order (closing what it made if it fails)."""
    names = NameTable(folder)
    records = temporary_file(folder)
    try:
        for paths in source.path_blocks():
            names.add(paths, cwd)
        heatmap = HeatmapBuilder(source.rank)
        with BucketSpill(EVENT_ROW, "file", max(names.count, 1), source.events, folder) as by_index:
            last_io = _spill_events(source, names.count, heatmap, by_index)
            with BucketSpill(EVENT_ROW, "rid", 1 << 64, source.events, folder, then="pos") as by_file:
                for rows in by_index.chunks():
                    first, end = int(rows["file"][0]), int(rows["file"][-1]) + 1
                    rows["rid"] = names.rids(first, end)[rows["file"] - first]
                    by_file.add(rows)
                count = _make_records(by_file, source.rank, hostname, names, folder, records, write_trace)
        return RankPass(source.rank, names, records, count, heatmap, last_io, source.events)
    except BaseException:
        names.close()
        records.close()
        raise


def _spill_events(source: EventSource, paths: int, heatmap: HeatmapBuilder, spill: BucketSpill) -> float:
    """Every event into `spill` with its position; the heat map filled; the last end returned."""
    position, last_io = 0, 0.0
    for block in source.event_blocks():
        if not len(block):
            continue
        if int(block["file"].max()) >= paths:
            raise ValueError(f"rank {source.rank}'s events name a path its path table does not have")
        heatmap.add(block)
        last_io = max(last_io, float(block["end"].max()))
        rows = np.empty(len(block), EVENT_ROW)
        rows["pos"] = np.arange(position, position + len(block), dtype=np.uint64)
        rows["rid"] = 0
        for name in ("file", "op", "offset", "length", "start", "end"):
            rows[name] = block[name]
        spill.add(rows)
        position += len(block)
    return last_io


def _make_records(by_file: BucketSpill, rank: int, hostname: str, names: NameTable, folder: Path | None,
                  records: IO[bytes], write_trace: Callable[[bytes], None]) -> int:
    """Each file's POSIX record and DXT trace from its events; both put in the log's order."""
    alignments: dict[str, int] = {}
    with BucketSpill(PLACED_RECORD, "pos", max(by_file.rows, 1), by_file.rows, folder) as placed, \
            BucketSpill(_PLACED_TRACE, "pos", max(by_file.rows, 1), by_file.rows, folder) as traced, \
            temporary_file(folder) as traces:
        trace_end = 0
        made: list[tuple] = []  # records and traces made, until a block of them is spilled
        placed_traces: list[tuple] = []
        trace_bytes: list[bytes] = []
        for rows in by_file.chunks():
            ops, offsets, lengths = rows["op"].tolist(), rows["offset"].tolist(), rows["length"].tolist()
            starts, ends, positions = rows["start"].tolist(), rows["end"].tolist(), rows["pos"].tolist()
            for first, end in key_groups(rows, "rid"):
                rid, index = int(rows["rid"][first]), int(rows["file"][first])
                name = names.name(index).decode("utf-8")
                folder_name = os.path.dirname(name)
                if folder_name not in alignments:
                    if len(alignments) >= ALIGNMENT_CACHE:
                        alignments.clear()
                    alignments[folder_name] = file_alignment(name)
                record = file_record(name, rank, alignments[folder_name], ops[first:end], offsets[first:end],
                                     lengths[first:end], starts[first:end], ends[first:end])
                if record is not None:
                    touched = next(p for op, p in zip(ops[first:end], positions[first:end]) if op not in _SKIPPED_FIRST)
                    made.append((touched, rid, index, record.pack(rid)))
                    if len(made) >= RECORD_BLOCK:
                        placed.add(np.array(made, PLACED_RECORD))
                        made = []
                mine = rows[first:end]
                moved = mine[(mine["op"] == _READ) | (mine["op"] == _WRITE)]
                if len(moved):
                    data = dxt_bytes(rid, rank, hostname, segments(moved[moved["op"] == _WRITE]),
                                     segments(moved[moved["op"] == _READ]))
                    placed_traces.append((int(moved["pos"][0]), trace_end, len(data)))
                    trace_bytes.append(data)
                    trace_end += len(data)
                    if len(placed_traces) >= RECORD_BLOCK:
                        traced.add(np.array(placed_traces, _PLACED_TRACE))
                        traces.write(b"".join(trace_bytes))
                        placed_traces, trace_bytes = [], []
        placed.add(np.array(made, PLACED_RECORD))
        traced.add(np.array(placed_traces, _PLACED_TRACE))
        traces.write(b"".join(trace_bytes))
        count = 0
        for rows in placed.chunks():
            ordered = np.empty(len(rows), RECORD_ROW)
            for name in RECORD_ROW.names:
                ordered[name] = rows[name]
            records.write(ordered.tobytes())
            count += len(rows)
        traces.flush()
        for rows in traced.chunks():
            for at, size in zip(rows["at"].tolist(), rows["size"].tolist()):
                write_trace(os.pread(traces.fileno(), size, at))
    return count
