"""DXT_POSIX traces and HEATMAP histograms computed from dlio_ckpt events.

DXT keeps every read and write call, which is what replay and timeline analysis need; HEATMAP is
what `darshan summary` draws by default. Both follow the runtime: DXT holds one trace per (rank,
file) with all writes before all reads, each in the order the calls completed; the heat map is
filled call by call with 0.1 s bins that double in width whenever a call ends beyond 200 bins,
and at the end every rank's map is cut to the same width and bin count, set by the job's end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dlio_ckpt.storage.events import OP_CODE, RankEvents
from dlio_ckpt.trace.darshan_posix import clean_path

MAX_HEATMAP_BINS = 200
INITIAL_BIN_WIDTH = 0.1
HEATMAP_POSIX_NAME = "heatmap:POSIX"
SEGMENT_DTYPE = np.dtype([("offset", "<i8"), ("length", "<i8"), ("start", "<f8"), ("end", "<f8")])

_READ, _WRITE = OP_CODE["read"], OP_CODE["write"]


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

        def segments(op: int) -> np.ndarray:
            chosen = mine[mine["op"] == op]
            out = np.zeros(len(chosen), SEGMENT_DTYPE)
            for name in SEGMENT_DTYPE.names:
                out[name] = chosen[name]
            return out

        records.append(DxtRecord(clean_path(rank.paths[file_index], cwd), rank.rank, hostname,
                                 segments(_WRITE), segments(_READ)))
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


def heatmap_record(rank: RankEvents, end_time: float) -> HeatmapRecord | None:
    """The rank's heat map as the runtime leaves it at shutdown; None if it moved no bytes.

    `end_time` is the job's end relative to its start; every rank gets the same one, so every
    record ends with the same width and bin count (PyDarshan requires that).
    """
    events = rank.events
    data = events[((events["op"] == _READ) | (events["op"] == _WRITE)) & (events["length"] > 0)]
    width = INITIAL_BIN_WIDTH
    write_bins = np.zeros(MAX_HEATMAP_BINS, np.int64)
    read_bins = np.zeros(MAX_HEATMAP_BINS, np.int64)
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
    if not write_bins.any() and not read_bins.any():
        return None
    while end_time > width * MAX_HEATMAP_BINS:
        _collapse(write_bins, read_bins)
        width *= 2.0
    nbins = min(MAX_HEATMAP_BINS, max(1, math.ceil(end_time / width)))
    return HeatmapRecord(rank=rank.rank, bin_width=width, write_bins=write_bins[:nbins].copy(),
                         read_bins=read_bins[:nbins].copy())
