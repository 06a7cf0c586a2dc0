"""DXT_POSIX traces and HEATMAP histograms computed from dlio_ckpt events.

DXT keeps every read and write call, which is what replay and timeline analysis need; HEATMAP is
what `darshan summary` draws by default. Both follow the runtime: DXT holds one trace per (rank,
file) with all writes before all reads, each in the order the calls completed; the heat map is
filled call by call with 0.1 s bins that double in width whenever a call ends beyond 200 bins,
and at the end every rank's map is cut to the same width and bin count, set by the job's end.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from dlio_ckpt.storage.events import OP_CODE, RankEvents
from dlio_ckpt.trace.darshan_posix import clean_path

MAX_HEATMAP_BINS = 200
INITIAL_BIN_WIDTH = 0.1
HEATMAP_POSIX_NAME = "heatmap:POSIX"
SEGMENT_DTYPE = np.dtype([("offset", "<i8"), ("length", "<i8"), ("start", "<f8"), ("end", "<f8")])

_READ, _WRITE = OP_CODE["read"], OP_CODE["write"]
# A trace's header in the log: record id, rank, flags, hostname, write and read segment counts.
DXT_HEADER = struct.Struct("<Qqq64sqq")


def dxt_bytes(record_id: int, rank: int, hostname: str, writes: np.ndarray, reads: np.ndarray) -> bytes:
    """One trace as the log stores it: header, write segments, read segments (SEGMENT_DTYPE)."""
    host = hostname.encode("utf-8")[:63]
    return DXT_HEADER.pack(record_id, rank, 0, host, len(writes), len(reads)) + writes.tobytes() + reads.tobytes()


def segments(rows: np.ndarray) -> np.ndarray:
    """Events (any dtype with offset, length, start and end) as DXT segments."""
    out = np.zeros(len(rows), SEGMENT_DTYPE)
    for name in SEGMENT_DTYPE.names:
        out[name] = rows[name]
    return out


@dataclass(frozen=True)
class DxtRecord:
    """One rank's trace of one file: write segments, then read segments (SEGMENT_DTYPE arrays)."""

    name: str
    rank: int
    hostname: str
    writes: np.ndarray
    reads: np.ndarray


@dataclass(frozen=True)
class HeatmapRecord:
    """One rank's POSIX heat map: bytes written and read per time bin."""

    rank: int
    bin_width: float
    write_bins: np.ndarray
    read_bins: np.ndarray


def dxt_records(rank: RankEvents, hostname: str, cwd: str | None = None) -> list[DxtRecord]:
    """The rank's DXT_POSIX records, in the order files were first read or written."""
    events = rank.events
    data = events[(events["op"] == _READ) | (events["op"] == _WRITE)]
    records = []
    order = dict.fromkeys(data["file"].tolist())  # first-touch order, each file once
    # Group by file once (a stable sort keeps each file's calls in time order) rather than
    # masking the whole array per file, which is quadratic for datasets of many files.
    grouped = data[np.argsort(data["file"], kind="stable")]
    firsts = np.searchsorted(grouped["file"], np.fromiter(order, dtype=grouped["file"].dtype), side="left")
    lasts = np.searchsorted(grouped["file"], np.fromiter(order, dtype=grouped["file"].dtype), side="right")
    for file_index, first, last in zip(order, firsts.tolist(), lasts.tolist()):
        mine = grouped[first:last]

        records.append(DxtRecord(clean_path(rank.paths[file_index], cwd), rank.rank, hostname,
                                 segments(mine[mine["op"] == _WRITE]), segments(mine[mine["op"] == _READ])))
    return records


def _collapse(write_bins: np.ndarray, read_bins: np.ndarray) -> None:
    """Halve the resolution: adjacent pairs are summed into the lower half, the upper half cleared."""
    for bins in (write_bins, read_bins):
        half = bins.reshape(-1, 2).sum(axis=1)
        bins[: len(half)] = half
        bins[len(half) :] = 0


def _round(value: float) -> int:
    """C round(): halves go away from zero (Python's round() would go to even)."""
    return int(math.floor(value + 0.5)) if value >= 0 else -int(math.floor(-value + 0.5))


class HeatmapBuilder:
    """One rank's heat map filled as the runtime fills it, a block of events at a time (its
    events in the order they completed), so a writer need not hold the rank's events."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.width = INITIAL_BIN_WIDTH
        self.write_bins = np.zeros(MAX_HEATMAP_BINS, np.int64)
        self.read_bins = np.zeros(MAX_HEATMAP_BINS, np.int64)

    def add(self, events: np.ndarray) -> None:
        data = events[((events["op"] == _READ) | (events["op"] == _WRITE)) & (events["length"] > 0)]
        width, write_bins, read_bins = self.width, self.write_bins, self.read_bins
        for op, size, start, end in zip(data["op"].tolist(), data["length"].tolist(),
                                        data["start"].tolist(), data["end"].tolist()):
            while end > width * MAX_HEATMAP_BINS:
                _collapse(write_bins, read_bins)
                width *= 2.0
            bins = write_bins if op == _WRITE else read_bins
            for index in range(int(start / width), int(end / width + 1)):
                bottom = index * width
                top = bottom + width
                seconds = width
                if start > bottom:
                    seconds -= start - bottom
                if end < top:
                    seconds -= top - end
                if seconds < 0:
                    break
                share = _round(size * (seconds / (end - start))) if end > start else size
                if index < MAX_HEATMAP_BINS:
                    bins[index] += share
        self.width = width

    def finish(self, end_time: float) -> HeatmapRecord | None:
        """The map as the runtime leaves it at shutdown; None if it moved no bytes.

        `end_time` is the job's end relative to its start; every rank gets the same one, so every
        record ends with the same width and bin count (PyDarshan requires that).
        """
        if not self.write_bins.any() and not self.read_bins.any():
            return None
        width = self.width
        while end_time > width * MAX_HEATMAP_BINS:
            _collapse(self.write_bins, self.read_bins)
            width *= 2.0
        self.width = width
        nbins = min(MAX_HEATMAP_BINS, max(1, math.ceil(end_time / width)))
        return HeatmapRecord(rank=self.rank, bin_width=width, write_bins=self.write_bins[:nbins].copy(),
                             read_bins=self.read_bins[:nbins].copy())


def heatmap_record(rank: RankEvents, end_time: float) -> HeatmapRecord | None:
    """The rank's heat map as the runtime leaves it at shutdown; None if it moved no bytes."""
    builder = HeatmapBuilder(rank.rank)
    builder.add(rank.events)
    return builder.finish(end_time)
