"""The LC-Checkpoint codec's per-element work (codec/lossy.py), in C where the optional extension
is built (codec/_lossy_c.c) and in numpy otherwise: the same containers either way, bit for bit.

Why a module of its own: lossy.py decides what is computed (buckets, priority promotion, the
container); this module decides only how fast. Each function takes a segment's raw bytes in the
tensor's own float format, so the C loops read them once with no float64 copies; the numpy
versions are the reference (tests/test_lossy_speed.py runs both and compares bytes).

Float formats (`FloatFormat`): IEEE float16, float32, float64, and bfloat16, the top 16 bits of a
float32 (what mixed-precision training saves: 8 exponent bits, 7 mantissa bits). A value is
widened to float64 exactly; a float64 is narrowed as numpy's astype does for the IEEE formats
(one rounding to nearest even) and, for bfloat16, as torch does (to float32, then to the top
16 bits, each rounding to nearest even).

Per-element error (`ErrorHistogram`): |x - xr| / |x| of every float element, counted into bins of
1/16 binade from 2^-40 up (bin 0: exact, xr = x; below 2^-40 into the first bin, above 2^24 into
the last), so p50 / p99 come out as a bin's upper edge: at most 1/16 (6.25 %) above the true
percentile; the max is exact. Elements with x = 0 have no relative error: counted as exact when
xr = 0, else in `zero_changed` (and their absolute error is in the file-normalised
`max_rel_error`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

HIST_LOW_EXP = -40  # the first bin's binade: 2^-40 (below: counted there too)
HIST_SUB = 16  # bins per binade
HIST_BINS = 1 + 64 * HIST_SUB  # bin 0 (exact), then 64 binades: 2^-40 .. 2^24
_HIST_OFFSET = (1023 + HIST_LOW_EXP) * HIST_SUB  # float64 bits >> 48 of 2^-40


def _load_c():
    """The C loops, or None where the extension was not built (an install without a compiler)."""
    try:
        from dlio_ckpt.codec import _lossy_c
    except ImportError:
        return None
    return _lossy_c


_C = _load_c()  # read at every call, so a test can set it to None for the numpy path


@dataclass(frozen=True)
class FloatFormat:
    """How a tensor's elements are stored: code (the container's and the C module's number),
    name, bytes per element, and the numpy dtype of the raw elements."""

    code: int
    name: str
    itemsize: int
    raw: np.dtype

    def to_f64(self, data) -> np.ndarray:
        """The elements of raw bytes as float64 (exact)."""
        values = np.frombuffer(data, dtype=self.raw)
        if self.name == "bfloat16":
            return (values.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return values.astype(np.float64)

    def from_f64(self, values: np.ndarray) -> np.ndarray:
        """float64 values narrowed into raw elements (the rounding in the module docstring)."""
        if self.name != "bfloat16":
            return values.astype(self.raw)
        bits = values.astype(np.float32).view(np.uint32)
        return ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16).astype(self.raw)

    def spacing(self, largest: float) -> float:
        """The format's ulp at `largest` (clipped to its largest finite value)."""
        if self.name == "bfloat16":
            largest = min(largest, float(np.finfo(np.float32).max))
            return float(np.spacing(np.float32(largest))) * 65536.0
        dtype = self.raw.type
        return float(np.spacing(dtype(min(largest, float(np.finfo(dtype).max)))))


FORMATS = (
    FloatFormat(0, "float16", 2, np.dtype("<f2")),
    FloatFormat(1, "bfloat16", 2, np.dtype("<u2")),
    FloatFormat(2, "float32", 4, np.dtype("<f4")),
    FloatFormat(3, "float64", 8, np.dtype("<f8")),
)
HALF_FORMATS = ("bfloat16", "float16")  # what a 2-byte float tensor may hold (checkpoint.lossy.half)


def float_format(dtype_bytes: int, half: str) -> FloatFormat | None:
    """The format of a tensor of `dtype_bytes` (None: not a float tensor, uint8)."""
    if dtype_bytes == 2:
        return FORMATS[HALF_FORMATS.index(half) ^ 1]  # bfloat16 -> code 1, float16 -> code 0
    return {4: FORMATS[2], 8: FORMATS[3]}.get(dtype_bytes)


def _c_for(fmt: FloatFormat):
    c = _C
    if c is None or (fmt.code == 0 and not c.HAVE_FLOAT16):
        return None
    return c


def bucket_ids(delta: np.ndarray, mantissa_bits: int, nb: int) -> np.ndarray:
    """lossy.bucket_ids: the top 12 + m bits of each float64 delta."""
    ids = delta.view(np.int64) >> (52 - mantissa_bits)
    ids &= nb - 1
    return ids


def scan(x, previous, fmt: FloatFormat, mantissa_bits: int, counts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bool:
    """Pass 1 of a segment: adds each delta x - previous into its bucket's count, minimum and
    maximum (dense tables, in place); False (tables then not to be used) when a delta is not finite."""
    c = _c_for(fmt)
    if c is not None:
        return c.scan(x, previous, fmt.code, mantissa_bits, counts, lo, hi)
    delta = fmt.to_f64(x) - fmt.to_f64(previous)
    if not np.isfinite(delta).all():
        return False
    ids = bucket_ids(delta, mantissa_bits, len(counts))
    counts += np.bincount(ids, minlength=len(counts))
    np.minimum.at(lo, ids, delta)
    np.maximum.at(hi, ids, delta)
    return True


@dataclass
class ErrorHistogram:
    """Per-element relative errors of a file (module docstring): bin counts, exact max, and the
    elements with x = 0 that did not come back 0."""

    counts: np.ndarray = field(default_factory=lambda: np.zeros(HIST_BINS, dtype=np.int64))
    max_rel: float = 0.0
    zero_changed: int = 0

    @staticmethod
    def upper_edge(index: int) -> float:
        if index == 0:
            return 0.0
        q = index - 1
        return float(2.0 ** (q // HIST_SUB + HIST_LOW_EXP) * (1 + (q % HIST_SUB + 1) / HIST_SUB))

    def percentile(self, p: float) -> float:
        """The p-th percentile (0-100) of the relative errors: its bin's upper edge, at most the max."""
        total = int(self.counts.sum())
        if not total:
            return 0.0
        index = int(np.searchsorted(np.cumsum(self.counts), max(1, int(np.ceil(p / 100 * total)))))
        return min(self.upper_edge(index), self.max_rel)

    def add_exact(self, n: int) -> None:
        """Elements stored raw: relative error 0."""
        self.counts[0] += n


@dataclass
class SegmentErrors:
    """Pass 2's sums over one segment."""

    kept: int
    max_err: float
    sq_err: float
    sq_x: float
    max_abs_x: float
    largest: float  # max |x|, |previous|, |new|: M of the error bound


def quantise(x, previous, fmt: FloatFormat, mantissa_bits: int, symbol_of_bucket: np.ndarray,
             representatives: np.ndarray, hist: ErrorHistogram) -> tuple[np.ndarray, np.ndarray, SegmentErrors]:
    """Pass 2 of a segment: (symbols uint8, the new state's raw elements, the segment's errors);
    the per-element relative errors are counted into `hist`."""
    n = memoryview(x).nbytes // fmt.itemsize
    c = _c_for(fmt)
    if c is not None:
        symbols = np.empty(n, dtype=np.uint8)
        new = np.empty(n, dtype=fmt.raw)
        kept, max_err, sq_err, sq_x, max_x, largest, zero_changed, max_rel = c.quantise(
            x, previous, fmt.code, mantissa_bits, symbol_of_bucket, representatives, symbols, new, hist.counts)
        hist.zero_changed += zero_changed
        hist.max_rel = max(hist.max_rel, max_rel)
        return symbols, new, SegmentErrors(kept, max_err, sq_err, sq_x, max_x, largest)
    x64, prev64 = fmt.to_f64(x), fmt.to_f64(previous)
    symbols = symbol_of_bucket[bucket_ids(x64 - prev64, mantissa_bits, len(symbol_of_bucket))]
    new = fmt.from_f64(prev64 + representatives[symbols])
    new64 = fmt.to_f64(new)
    err = x64 - new64
    abs_x, abs_err = np.abs(x64), np.abs(err)
    nonzero = abs_x != 0
    hist.zero_changed += int(np.count_nonzero(~nonzero & (new64 != 0)))
    exact = int(np.count_nonzero(~nonzero & (new64 == 0))) + int(np.count_nonzero(nonzero & (abs_err == 0)))
    rel = abs_err[nonzero & (abs_err != 0)] / abs_x[nonzero & (abs_err != 0)]
    q = ((rel.view(np.uint64) >> np.uint64(48)) & np.uint64(0x7FFF)).astype(np.int64) - _HIST_OFFSET
    hist.counts += np.bincount(1 + np.clip(q, 0, HIST_BINS - 2), minlength=HIST_BINS)
    hist.counts[0] += exact
    if len(rel):
        hist.max_rel = max(hist.max_rel, float(rel.max()))
    top = lambda v: float(v.max()) if len(v) else 0.0  # noqa: E731
    max_x = top(abs_x)
    errors = SegmentErrors(int(np.count_nonzero(symbols)), top(abs_err), float(np.dot(err, err)), float(np.dot(x64, x64)),
                           max_x, max(max_x, top(np.abs(prev64)), top(np.abs(new64))))
    return symbols, new, errors


def apply(previous, fmt: FloatFormat, symbols: np.ndarray, representatives: np.ndarray) -> np.ndarray:
    """The decoder's replay of a segment: the raw elements of cast(previous + representatives[symbols])."""
    c = _c_for(fmt)
    if c is not None:
        state = np.frombuffer(previous, dtype=fmt.raw).copy()
        c.apply(state, fmt.code, symbols, representatives)
        return state
    return fmt.from_f64(fmt.to_f64(previous) + representatives[symbols])
