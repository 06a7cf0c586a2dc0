"""Put intervals of bytes (events, DXT segments, heatmap bins of differently sized logs) on one
time grid.

Bytes of an interval are spread over the bins it overlaps in proportion to the time it spends in
each, as darshan-runtime fills its HEATMAP bins, so a plot made from run-folder events looks like
one made from a Darshan log. The spreading is vectorised (difference array for the whole bins an
interval covers) because a run folder can hold millions of events.
"""

from __future__ import annotations

import math

import numpy as np

DEFAULT_BINS = 200


def grid(span_s: float, nbins: int = DEFAULT_BINS) -> tuple[float, int]:
    """Bin width and count covering [0, span_s]; a zero span still gets one bin."""
    if not span_s or span_s <= 0 or not math.isfinite(span_s):
        return 1.0, 1
    width = span_s / nbins
    return width, nbins


def spread(rows: np.ndarray, start: np.ndarray, end: np.ndarray, nbytes: np.ndarray,
           nrows: int, width: float, nbins: int) -> np.ndarray:
    """Bytes per (row, bin); the total is preserved (up to float rounding) for every row."""
    out = np.zeros((nrows, nbins), dtype=np.float64)
    if len(start) == 0:
        return out
    rows = np.asarray(rows, dtype=np.int64)
    start = np.clip(np.asarray(start, dtype=np.float64), 0.0, None)
    end = np.maximum(np.asarray(end, dtype=np.float64), start)
    nbytes = np.asarray(nbytes, dtype=np.float64)
    b0 = np.clip(np.floor(start / width).astype(np.int64), 0, nbins - 1)
    b1 = np.clip(np.floor(end / width).astype(np.int64), 0, nbins - 1)
    dur = end - start
    single = (b0 == b1) | (dur <= 0)
    np.add.at(out, (rows[single], b0[single]), nbytes[single])
    multi = ~single
    if not multi.any():
        return out
    r, s, e, n, f, l = rows[multi], start[multi], end[multi], nbytes[multi], b0[multi], b1[multi]
    rate = n / (e - s)
    head = np.minimum((f + 1) * width, e) - s
    tail = np.clip(e - l * width, 0.0, None)
    np.add.at(out, (r, f), head * rate)
    np.add.at(out, (r, l), tail * rate)
    inner = l - f > 1
    if inner.any():
        diff = np.zeros((nrows, nbins + 1), dtype=np.float64)
        np.add.at(diff, (r[inner], f[inner] + 1), rate[inner] * width)
        np.add.at(diff, (r[inner], l[inner]), -rate[inner] * width)
        out += np.cumsum(diff, axis=1)[:, :nbins]
    # Clipping at the last bin (an interval that ends past the grid) would lose bytes: put the
    # remainder there so totals stay exact.
    missing = np.bincount(rows, weights=nbytes, minlength=nrows) - out.sum(axis=1)
    out[:, -1] += np.where(np.abs(missing) > 1e-6 * np.maximum(1.0, np.abs(out.sum(axis=1))), missing, 0.0)
    return out
