"""LC-Checkpoint (Chen et al., 2020): lossy delta checkpoints of float state.

The first checkpoint of a chain stores the state x0 in full. Checkpoint t stores only
delta_t = x_t - xr_{t-1}, where xr is the state a restore rebuilds (so quantisation errors are
corrected by the next delta instead of accumulating), quantised to n bits per element:

1. bucket every delta element by its (sign, binary exponent): the sign and exponent field of the
   float64 delta (its top 12 bits, 4096 buckets), which is frexp's (sign, exponent) for normal
   numbers; with `mantissa_bits` m > 0 (an opt-in refinement, not in the paper; 0 is the
   default) also the top m bits of its mantissa, so that a bucket is 1/2^m of a binade (the top
   12 + m bits, 4096 << m buckets); the buckets of exponent field 0 (exact zeros, and
   float64-subnormal deltas below 2.3e-308, which float16/32 tensors cannot produce: both signs,
   all 2^m sub-buckets) are never kept: index 0;
2. a bucket's representative is the midpoint of its smallest and largest delta;
3. priority promotion: the 2^bits - 1 buckets with the largest |representative| keep an index
   1..2^bits-1, every other element gets index 0 (it is not changed);
4. the indices are entropy coded per segment, with canonical Huffman (huffman.py) or zstd.

Restore replays the chain: xr_t = xr_{t-1} + representative[index], computed by `apply_delta` (the
same numpy operations in the encoder and the decoder), so a restore is bit-identical to the
encoder's xr_t; every container records xxh3_128(xr_t), which the decoder checks. Index 0 adds
-0.0, the exact identity, so elements whose delta is exactly zero (state that changes sparsely)
come back bit for bit.

Error bound (per tensor, stats `error_bound` after dividing by the file's max|x|): every element
of a float tensor satisfies

    |x_t - xr_t| <= max( max over kept buckets b of (max_b - min_b) / 2,
                         max over dropped buckets b of max(|min_b|, |max_b|) )
                    +  ulp_dtype(M) + 3 ulp_float64(M)

where min_b / max_b are the smallest / largest delta of bucket b at checkpoint t, M is the largest
|value| among x_t, xr_{t-1} and xr_t in the tensor, and ulp_T(M) = numpy.spacing(T(M)). The last
two terms cover rounding: the delta, the midpoint and the sum in float64, and the cast of the sum
back into the tensor's dtype (for float16 tensors that cast dominates: about 1e-3 of M). The first
term is reached: the extreme elements of the bucket it names are off by exactly that much.
A kept bucket spans one binade [2^(e-1), 2^e) (1/2^m of it with mantissa_bits m), so its elements
are off by less than half (2^-(m+1)) of their own delta; more bits keep more buckets and only
lower the dropped-bucket term, more mantissa bits lower the kept-bucket term but split each binade
into 2^m buckets, so the 2^bits - 1 kept ones cover fewer binades and the dropped term grows (on
`sparse` at 8 bits the max error is least near m = 4; benchmarks/README.md).

Float tensors are those of 2 (IEEE float16, or bfloat16 with `half="bfloat16"`: the top 16 bits
of a float32, recorded in the tensor header), 4 (float32) and 8 (float64) bytes per element (the
per-element loops are in lossy_kernels: C where built, else numpy, the same bytes); uint8 tensors, and a float tensor whose delta is not finite at some element, are
stored raw in that checkpoint (then xr_t = x_t exactly).

Streaming: per tensor, pass 1 reads x and xr_{t-1} segment by segment (`segment_elems` elements)
and gathers the bucket counts, minima and maxima; pass 2 reads them again, quantises, writes xr_t
back into the xr store in place, hashes it, and appends the coded segment to a spool (a scratch
store: zstd's size is not known up front, and the EncodedFile needs xr_t's digest before its first
byte is written). A full container is not spooled: it streams from xr. Peak memory is a few
segments (about a dozen float64 arrays of `segment_elems`: 70 MiB at the default), never a tensor;
pass 1's per-bucket tables (count, minimum, maximum) are dense while they fit DENSE_TABLE_BYTES
(24 bytes x 4096 << m: 96 KiB at m = 0, 24 MiB at m = 8, plus each segment's bincount of 8 bytes
x 4096 << m), and hold only the non-empty buckets
beyond (m = 9, 10: np.unique per segment, merged); pass 2 looks indices up in a uint8 table of
4096 << m entries.

Container (little-endian; docs/checkpointing.md "Lossy checkpoints"):

    file header   FILE_HEADER (72 bytes): magic, version, kind (0 full, 1 delta), coder, bits,
                  mantissa_bits (a former padding byte: containers without it read as 0; the
                  decoder needs neither, it applies representatives[index]), index, chain base
                  index, previous index (-1 for a full one), logical size, tensor count,
                  segment_elems, xxh3_128 of the reconstructed logical bytes
    per tensor    TENSOR_HEADER (32 bytes): mode (0 raw, 1 quantised), dtype bytes, symbols
                  (kept buckets + 1), fill symbol, float format (0 IEEE, 1 bfloat16; 0 in
                  containers written before it), lane, element count, body bytes; then the body:
      raw         the tensor's bytes
      quantised   representatives (float64 x symbols, index 0 holds -0.0), code lengths
                  (uint8 x symbols, Huffman only), then per segment: payload bytes (uint32),
                  lane bit lengths (huffman.lane_dtype x lanes; Huffman with two or more
                  symbols only), payload
                  (Huffman bit stream, or a zstd frame of the indices packed
                  `index_width(symbols)` bits each, lowest bits first, into bytes)
"""

from __future__ import annotations

import functools
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import xxhash
import zstandard

from dlio_ckpt.codec import huffman, lossy_kernels
from dlio_ckpt.codec.base import ChainLink, EncodedFile
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.base import FileView, MutableFileView
from dlio_ckpt.state.store import ScratchStore

MAGIC = b"DLCKLOSY"
VERSION = 1
FILE_HEADER = struct.Struct("<8sHBBBB2xqqqQII16s")
TENSOR_HEADER = struct.Struct("<BBHHHIQQ4x")
SEGMENT_HEADER = struct.Struct("<I")
KIND_FULL, KIND_DELTA = 0, 1
MODE_RAW, MODE_QUANTISED = 0, 1
CODERS = ("huffman", "zstd")
FLOAT_BYTES = (2, 4, 8)
FORMAT_IEEE, FORMAT_BFLOAT16 = 0, 1  # TENSOR_HEADER's format field: how a 2-byte tensor's elements are read
N_BUCKETS = 4096  # mantissa_bits 0: a bucket is the top 12 bits (sign, exponent field) of a float64 delta
MAX_MANTISSA_BITS = 10  # mantissa bits a bucket may add below the exponent (4096 << 10 buckets)
DENSE_TABLE_BYTES = 32 << 20  # pass 1 keeps dense per-bucket tables up to this; beyond, only the non-empty buckets
DEFAULT_SEGMENT_ELEMS = 1 << 20
MAX_SEGMENT_ELEMS = 1 << 26  # what a container may ask a decoder to hold (float64 arrays of it)
MAX_LANE = 1 << 16
ZSTD_LEVEL = 3


def apply_delta(previous, symbols: np.ndarray, representatives: np.ndarray, fmt: lossy_kernels.FloatFormat) -> np.ndarray:
    """xr_t's raw elements for one segment from xr_{t-1}'s raw bytes: the sum in float64 (exact
    widening for every float format), narrowed back into the format; the one formula the encoder
    (lossy_kernels.quantise) and the decoder share, so a restore is bit-identical to what the
    encoder kept."""
    return lossy_kernels.apply(previous, fmt, symbols, representatives)


def index_width(symbols: int) -> int:
    """Bits per index in a zstd payload: 1, 2, 4 or 8, the least that holds `symbols` values.
    Packing several indices into a byte lets zstd's byte-wise entropy coder go below one bit per
    index (the trace at 3 bits: 1.05 bits against 1.26 with a byte per index)."""
    return next(w for w in (1, 2, 4, 8) if symbols <= 1 << w)


def pack_indices(symbols: np.ndarray, width: int) -> bytes:
    """Indices of `width` bits, 8 // width to a byte, the first in the lowest bits."""
    per = 8 // width
    pad = -len(symbols) % per
    if pad:
        symbols = np.concatenate((symbols, np.zeros(pad, dtype=np.uint8)))
    groups = symbols.reshape(-1, per)
    packed = groups[:, 0].copy()
    for k in range(1, per):
        packed |= groups[:, k] << np.uint8(width * k)
    return packed.tobytes()


def unpack_indices(data: bytes, n: int, width: int) -> np.ndarray:
    """The `n` indices `pack_indices` packed (ValueError when `data` is not their size)."""
    per = 8 // width
    packed = np.frombuffer(data, dtype=np.uint8)
    if len(packed) != -(-n // per):
        raise ValueError(f"{len(packed)} bytes of packed indices for {n} indices")
    out = np.empty((len(packed), per), dtype=np.uint8)
    mask = np.uint8((1 << width) - 1)
    for k in range(per):
        np.bitwise_and(packed >> np.uint8(width * k), mask, out=out[:, k])
    return out.reshape(-1)[:n]


def rounding_slack(fmt: lossy_kernels.FloatFormat, largest: float) -> float:
    """ulp_format(M) + 3 ulp_float64(M): what rounding can add to an element's error (the delta,
    the midpoint and the sum in float64, each within one float64 ulp at M; the cast back into
    the tensor's format within one of its ulps: bfloat16's two roundings, via float32, stay within
    half a bfloat16 ulp plus half a float32 one)."""
    return fmt.spacing(largest) + 3 * float(np.spacing(np.float64(min(largest, float(np.finfo(np.float64).max)))))


def n_buckets(mantissa_bits: int) -> int:
    """How many buckets `bucket_ids` can name: 2^(12 + mantissa_bits)."""
    return N_BUCKETS << mantissa_bits


def bucket_ids(delta: np.ndarray, mantissa_bits: int = 0) -> np.ndarray:
    """The bucket of each float64 delta element: its top 12 + mantissa_bits bits, i.e. (sign,
    exponent field) and, with mantissa_bits m > 0, the top m bits of the mantissa (1/2^m of a
    binade)."""
    ids = delta.view(np.int64) >> (52 - mantissa_bits)
    ids &= n_buckets(mantissa_bits) - 1
    return ids


def zero_exponent(ids: np.ndarray, mantissa_bits: int = 0) -> np.ndarray:
    """Which bucket ids have exponent field 0 (+-0 and float64 subnormals, either sign, any of
    the 2^m mantissa sub-buckets): never kept, always index 0."""
    return (ids >> mantissa_bits) & 0x7FF == 0


@dataclass
class _Chain:
    """What the encoder keeps per file between checkpoints: the reconstructed state and the chain."""

    xr: MutableFileView
    indices: list[int] = field(default_factory=list)


@dataclass
class _Quantiser:
    """One tensor's pass-1 result: which bucket becomes which index, and what the index adds."""

    symbol_of_bucket: np.ndarray  # uint8 per bucket
    representatives: np.ndarray  # float64 per symbol, [0] = -0.0
    lengths: np.ndarray  # Huffman code length per symbol
    fill: int  # the symbol when only one occurs
    bound_abs: float  # the error bound before rounding (see the module docstring)


class _Spool:
    """Appends to a scratch store and streams it back: the container before it is written."""

    def __init__(self, store: MutableFileView) -> None:
        self.store = store
        self.size = 0

    def append(self, data) -> None:
        data = memoryview(data).cast("B")
        if len(data):
            self.store.write_at(self.size, data)
            self.size += len(data)

    def chunks(self, chunk_bytes: int) -> Iterator[memoryview]:
        try:
            offset = 0
            while offset < self.size:
                piece = self.store.read_at(offset, min(chunk_bytes, self.size - offset))
                yield piece
                offset += len(piece)
        finally:
            _close(self.store)


def _close(store) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        close()


def _segments(numel: int, segment_elems: int) -> Iterator[tuple[int, int]]:
    for start in range(0, numel, segment_elems):
        yield start, min(segment_elems, numel - start)


def _read(view: FileView, offset: int, nbytes: int, what: str) -> memoryview:
    data = view.read_at(offset, nbytes)
    if len(data) != nbytes:
        raise ValueError(f"{what}: {len(data)} bytes at offset {offset}, expected {nbytes}")
    return data


def _offsets(tensors: tuple[TensorSpec, ...]) -> list[int]:
    """Where each tensor starts in the file's logical bytes."""
    return [int(at) for at in np.cumsum([0] + [t.nbytes for t in tensors[:-1]])]


def _format_field(t: TensorSpec, half: str) -> int:
    """TENSOR_HEADER's format field: FORMAT_BFLOAT16 for a 2-byte tensor read as bfloat16, else
    FORMAT_IEEE (what containers without the field hold: IEEE by element size)."""
    return FORMAT_BFLOAT16 if t.dtype_bytes == 2 and half == "bfloat16" else FORMAT_IEEE


def _raw_header(t: TensorSpec, half: str) -> bytes:
    return TENSOR_HEADER.pack(MODE_RAW, t.dtype_bytes, 0, 0, _format_field(t, half), 0, t.numel, t.nbytes)


def _full_chunks(header: bytes, tensors: tuple[TensorSpec, ...], xr: FileView, half: str, chunk_bytes: int) -> Iterator[memoryview]:
    """A full container straight from xr (= x_t), in pieces of exactly `chunk_bytes` (the last
    shorter): headers and tensor bytes are copied into fresh buffers, so the small headers never
    become writes of their own."""

    def parts() -> Iterator:
        yield header
        for t, offset in zip(tensors, _offsets(tensors)):
            yield _raw_header(t, half)
            for at in range(offset, offset + t.nbytes, chunk_bytes):
                yield _read(xr, at, min(chunk_bytes, offset + t.nbytes - at), f"tensor {t.name} (reconstructed state)")

    buffer, filled = bytearray(chunk_bytes), 0
    for part in parts():
        part = memoryview(part).cast("B")
        while len(part):
            take = min(len(part), chunk_bytes - filled)
            buffer[filled : filled + take] = part[:take]
            filled += take
            part = part[take:]
            if filled == chunk_bytes:
                yield memoryview(buffer)
                buffer, filled = bytearray(chunk_bytes), 0
    if filled:
        yield memoryview(buffer)[:filled]


def _container_bound(tensors: tuple[TensorSpec, ...], segment_elems: int, lane: int) -> int:
    """An upper bound on a container's size, for the spool (it may be a sparse file)."""
    total = FILE_HEADER.size
    for t in tensors:
        nseg = max(1, -(-t.numel // segment_elems))
        lanes = -(-t.numel // lane) + nseg
        coded = 9 * 256 + nseg * (SEGMENT_HEADER.size + 1024) + lanes * 4 + 2 * t.numel + t.numel // 128
        total += TENSOR_HEADER.size + max(t.nbytes, coded)
    return total


class LossyEncoder:
    """LC-Checkpoint encoder, per rank: one chain (and one xr store) per file key."""

    name = "lossy"

    def __init__(
        self,
        bits: int,
        coder: str,
        full_every: int,
        tensors_of: Callable[[str], tuple[TensorSpec, ...]],
        scratch: Callable[[int], MutableFileView],
        segment_elems: int = DEFAULT_SEGMENT_ELEMS,
        lane: int = huffman.DEFAULT_LANE,
        mantissa_bits: int = 0,
        half: str = "float16",
    ) -> None:
        if not 1 <= bits <= 8:
            raise ValueError(f"lossy bits must be 1 to 8 (got {bits})")
        if not 0 <= mantissa_bits <= MAX_MANTISSA_BITS:
            raise ValueError(f"lossy mantissa_bits must be 0 to {MAX_MANTISSA_BITS} (got {mantissa_bits})")
        if half not in lossy_kernels.HALF_FORMATS:
            raise ValueError(f"lossy half must be one of {', '.join(lossy_kernels.HALF_FORMATS)} (got {half!r})")
        if coder not in CODERS:
            raise ValueError(f"lossy coder must be one of {', '.join(CODERS)} (got {coder!r})")
        if not 1 <= segment_elems <= MAX_SEGMENT_ELEMS or not 1 <= lane <= MAX_LANE:
            raise ValueError(f"lossy segment_elems must be 1 to {MAX_SEGMENT_ELEMS} and lane 1 to {MAX_LANE}")
        self.bits = bits
        self.mantissa_bits = mantissa_bits
        self.half = half
        self.coder = coder
        self.full_every = full_every
        self.tensors_of = tensors_of
        self.scratch = scratch
        self.segment_elems = segment_elems
        self.lane = lane
        self._chains: dict[str, _Chain] = {}

    def reset(self) -> None:
        for chain in self._chains.values():
            _close(chain.xr)
        self._chains.clear()

    def settle(self, index: int, committed: bool) -> None:
        """After the commit of checkpoint `index`. The reconstructed state xr is advanced in place
        as a file is encoded (a copy kept to roll back would double the encoder's scratch, the
        size of the rank's state), so a checkpoint that was not committed makes the encoder
        forget: the next checkpoint of every file is a full one, and no chain ever refers to a
        checkpoint that is not on disk."""
        if not committed:
            self.reset()

    def encode(self, index: int, key: str, view: FileView) -> EncodedFile:
        started = time.perf_counter()
        tensors = self.tensors_of(key)
        logical = sum(t.nbytes for t in tensors)
        if logical != view.size:
            raise ValueError(f"{key}: the tensors add up to {logical} bytes, the state view has {view.size}")
        chain = self._chains.get(key)
        full = chain is None or (self.full_every > 0 and len(chain.indices) >= self.full_every)
        if chain is None or chain.xr.size != view.size:
            if chain is not None:
                _close(chain.xr)
            chain = self._chains[key] = _Chain(self.scratch(view.size))
        if full:
            chain.indices = []
        chain.indices.append(index)
        spool = None
        if not full:  # a full container is streamed from xr, a delta one spooled (its size comes last)
            spool = _Spool(self.scratch(_container_bound(tensors, self.segment_elems, self.lane)))
            spool.size = FILE_HEADER.size  # the header goes in last, once the digest is known
        run = _EncodeRun(self, key, view, chain.xr, spool)
        for tensor, offset in zip(tensors, _offsets(tensors)):
            run.tensor(tensor, offset, full)
        kind = KIND_FULL if full else KIND_DELTA
        previous = chain.indices[-2] if len(chain.indices) > 1 else -1
        header = FILE_HEADER.pack(
            MAGIC, VERSION, kind, CODERS.index(self.coder), self.bits, self.mantissa_bits, index, chain.indices[0], previous,
            view.size, len(tensors), self.segment_elems, run.digest.digest(),
        )
        if full:
            size = FILE_HEADER.size + sum(TENSOR_HEADER.size + t.nbytes for t in tensors)
            chunks = functools.partial(_full_chunks, header, tensors, chain.xr, self.half)
        else:
            size = spool.size
            spool.store.write_at(0, header)
            chunks = spool.chunks
        metadata = run.metadata + FILE_HEADER.size
        stats = {
            "logical_bytes": view.size,
            "bytes_written": size,
            "metadata_bytes": metadata,
            "compression_ratio": view.size / size if size else 0.0,
            "max_rel_error": run.max_err / run.max_abs_x if run.max_abs_x else 0.0,
            "rms_rel_error": float(np.sqrt(run.sq_err / run.sq_x)) if run.sq_x else 0.0,
            "error_bound": run.bound_abs / run.max_abs_x if run.max_abs_x else 0.0,
            "elem_rel_error_p50": run.hist.percentile(50),
            "elem_rel_error_p99": run.hist.percentile(99),
            "elem_rel_error_max": run.hist.max_rel,
            "elem_zero_changed": run.hist.zero_changed,
            "kept_fraction": run.kept / run.floats if run.floats and not full else 0.0,
            "chain_length": len(chain.indices),
            "coder": self.coder,
            "bits": self.bits,
            "mantissa_bits": self.mantissa_bits,
            "half": self.half,
            "full": full,
        }
        return EncodedFile(
            nbytes=size,
            chunks=chunks,
            metadata_bytes=metadata,
            chain=tuple(chain.indices),
            state_digest=run.digest.hexdigest(),
            stats=stats,
            encode_s=time.perf_counter() - started,
        )


class _EncodeRun:
    """One file's encode: the two passes per tensor, the running digest of xr_t and error sums."""

    def __init__(self, encoder: LossyEncoder, key: str, view: FileView, xr: MutableFileView, spool: _Spool | None) -> None:
        self.enc = encoder
        self.key = key
        self.view = view
        self.xr = xr
        self.spool = spool
        self.digest = xxhash.xxh3_128()
        self.metadata = 0
        self.max_err = 0.0
        self.max_abs_x = 0.0
        self.sq_err = 0.0
        self.sq_x = 0.0
        self.bound_abs = 0.0
        self.kept = 0  # float elements with a non-zero index
        self.floats = 0
        self.hist = lossy_kernels.ErrorHistogram()  # per-element relative errors (lossy_kernels)

    def tensor(self, t: TensorSpec, offset: int, full: bool) -> None:
        fmt = lossy_kernels.float_format(t.dtype_bytes, self.enc.half)
        self.floats += t.numel if fmt is not None else 0
        quantiser = None if full or fmt is None else self._pass1(t, offset, fmt)
        if quantiser is None:
            self._raw(t, offset, fmt)
        else:
            self._pass2(t, offset, fmt, quantiser)

    def _segment(self, t: TensorSpec, offset: int, start: int, n: int):
        """(offset, x_t's raw bytes, xr_{t-1}'s raw bytes) of one segment."""
        at = offset + start * t.dtype_bytes
        what = f"{self.key} tensor {t.name}"
        x = _read(self.view, at, n * t.dtype_bytes, what)
        return at, x, _read(self.xr, at, n * t.dtype_bytes, what + " (reconstructed state)")

    def _deltas(self, t: TensorSpec, offset: int, fmt: lossy_kernels.FloatFormat) -> Iterator[np.ndarray | None]:
        """Pass 1's reads (sparse tables): each segment's float64 delta, or None (and stop) where
        one is not finite."""
        for start, n in _segments(t.numel, self.enc.segment_elems):
            _, x, previous = self._segment(t, offset, start, n)
            delta = fmt.to_f64(x) - fmt.to_f64(previous)
            if not np.isfinite(delta).all():
                yield None
                return
            yield delta

    def _dense_table(self, t: TensorSpec, offset: int, fmt: lossy_kernels.FloatFormat):
        """Every bucket's count, minimum and maximum delta in dense tables (n_buckets entries each);
        then the non-empty ones: (bucket ids ascending, counts, minima, maxima), or None."""
        m = self.enc.mantissa_bits
        nb = n_buckets(m)
        counts = np.zeros(nb, dtype=np.int64)
        lo = np.full(nb, np.inf)
        hi = np.full(nb, -np.inf)
        for start, n in _segments(t.numel, self.enc.segment_elems):
            _, x, previous = self._segment(t, offset, start, n)
            if not lossy_kernels.scan(x, previous, fmt, m, counts, lo, hi):
                return None  # stored raw this time: LC's buckets need finite deltas
        ids = np.flatnonzero(counts)
        return ids, counts[ids], lo[ids], hi[ids]

    def _sparse_table(self, t: TensorSpec, offset: int, fmt: lossy_kernels.FloatFormat):
        """`_dense_table`'s result, holding only the non-empty buckets (for mantissa_bits whose
        dense tables would pass DENSE_TABLE_BYTES): each segment's buckets by np.unique, merged
        into the running ones."""
        m = self.enc.mantissa_bits
        ids, counts = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        lo, hi = np.empty(0), np.empty(0)
        for delta in self._deltas(t, offset, fmt):
            if delta is None:
                return None
            seg_ids, where = np.unique(bucket_ids(delta, m), return_inverse=True)
            seg_counts = np.bincount(where, minlength=len(seg_ids))
            seg_lo, seg_hi = np.full(len(seg_ids), np.inf), np.full(len(seg_ids), -np.inf)
            np.minimum.at(seg_lo, where, delta)
            np.maximum.at(seg_hi, where, delta)
            ids, where = np.unique(np.concatenate((ids, seg_ids)), return_inverse=True)
            counts_before, lo_before, hi_before = counts, lo, hi
            counts = np.zeros(len(ids), dtype=np.int64)
            lo, hi = np.full(len(ids), np.inf), np.full(len(ids), -np.inf)
            np.add.at(counts, where, np.concatenate((counts_before, seg_counts)))
            np.minimum.at(lo, where, np.concatenate((lo_before, seg_lo)))
            np.maximum.at(hi, where, np.concatenate((hi_before, seg_hi)))
        return ids, counts, lo, hi

    def _pass1(self, t: TensorSpec, offset: int, fmt: lossy_kernels.FloatFormat) -> _Quantiser | None:
        m = self.enc.mantissa_bits
        table = self._dense_table if 24 * n_buckets(m) <= DENSE_TABLE_BYTES else self._sparse_table
        found = table(t, offset, fmt)
        if found is None:
            return None
        ids, counts, lo, hi = found
        zero = zero_exponent(ids, m)
        candidates = np.flatnonzero(~zero)  # positions in the table of the buckets that may be kept
        nonempty = ids[candidates]
        mid = (lo[candidates] + hi[candidates]) / 2
        order = np.lexsort((nonempty, -np.abs(mid)))
        keep = order[: (1 << self.enc.bits) - 1]
        dropped = order[len(keep):]
        symbol_of_bucket = np.zeros(n_buckets(m), dtype=np.uint8)
        symbol_of_bucket[nonempty[keep]] = np.arange(1, len(keep) + 1)
        representatives = np.concatenate(([-0.0], mid[keep]))
        symbol_counts = np.bincount(symbol_of_bucket[ids], weights=counts, minlength=len(representatives)).astype(np.int64)
        used = np.flatnonzero(symbol_counts)
        kept_b = candidates[keep]
        half = float(((hi[kept_b] - lo[kept_b]) / 2).max()) if len(keep) else 0.0
        dropped_b = np.concatenate((candidates[dropped], np.flatnonzero(zero)))
        lost = float(np.maximum(np.abs(lo[dropped_b]), np.abs(hi[dropped_b])).max()) if len(dropped_b) else 0.0
        return _Quantiser(
            symbol_of_bucket=symbol_of_bucket,
            representatives=representatives,
            lengths=huffman.code_lengths(symbol_counts),
            fill=int(used[0]) if len(used) == 1 else 0,
            bound_abs=max(half, lost),
        )

    def _raw(self, t: TensorSpec, offset: int, fmt: lossy_kernels.FloatFormat | None) -> None:
        """The tensor as it is: xr_t = x_t, and into the spool unless the container is streamed."""
        if self.spool is not None:
            self.spool.append(_raw_header(t, self.enc.half))
        self.metadata += TENSOR_HEADER.size
        step = self.enc.segment_elems * t.dtype_bytes
        for at in range(offset, offset + t.nbytes, step):
            n = min(step, offset + t.nbytes - at)
            data = _read(self.view, at, n, f"{self.key} tensor {t.name}")
            if self.spool is not None:
                self.spool.append(data)
            self.xr.write_at(at, data)
            self.digest.update(data)
            if fmt is not None and n:
                x = fmt.to_f64(data)
                self.max_abs_x = max(self.max_abs_x, float(np.abs(x).max()))
                self.sq_x += float(np.dot(x, x))
                self.hist.add_exact(len(x))

    def _pass2(self, t: TensorSpec, offset: int, fmt: lossy_kernels.FloatFormat, q: _Quantiser) -> None:
        huff = self.enc.coder == "huffman"
        nsym = len(q.representatives)
        tables = q.representatives.astype("<f8").tobytes() + (q.lengths.astype(np.uint8).tobytes() if huff else b"")
        header_at = self.spool.size
        self.spool.size += TENSOR_HEADER.size
        self.spool.append(tables)
        meta = TENSOR_HEADER.size + len(tables)
        compressor = None if huff else zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        largest = 0.0  # M of the error bound: max |x_t|, |xr_{t-1}|, |xr_t|
        for start, n in _segments(t.numel, self.enc.segment_elems):
            at, x, previous = self._segment(t, offset, start, n)
            symbols, new, errors = lossy_kernels.quantise(x, previous, fmt, self.enc.mantissa_bits, q.symbol_of_bucket,
                                                          q.representatives, self.hist)
            if huff:
                lane_bits, payload = huffman.encode(symbols, q.lengths, self.enc.lane)
                if not q.lengths.any():  # one symbol: no bits, and no lanes to describe
                    lane_bits = lane_bits[:0]
                head = SEGMENT_HEADER.pack(len(payload)) + lane_bits.tobytes()
            else:
                payload = compressor.compress(pack_indices(symbols, index_width(nsym)))
                head = SEGMENT_HEADER.pack(len(payload))
            self.spool.append(head)
            self.spool.append(payload)
            meta += len(head)
            self.xr.write_at(at, new)
            self.digest.update(new)
            self.kept += errors.kept
            self.max_err = max(self.max_err, errors.max_err)
            self.max_abs_x = max(self.max_abs_x, errors.max_abs_x)
            largest = max(largest, errors.largest)
            self.sq_err += errors.sq_err
            self.sq_x += errors.sq_x
        body = self.spool.size - header_at - TENSOR_HEADER.size
        self.spool.store.write_at(
            header_at, TENSOR_HEADER.pack(MODE_QUANTISED, t.dtype_bytes, nsym, q.fill, _format_field(t, self.enc.half),
                                          self.enc.lane, t.numel, body)
        )
        self.metadata += meta
        self.bound_abs = max(self.bound_abs, q.bound_abs + rounding_slack(fmt, largest))


class LossyDecoder:
    """Rebuilds a file from its LC-Checkpoint chain. The containers describe their tensors, so
    `tensors_of` is accepted for symmetry with the encoder and not needed."""

    def __init__(self, tensors_of: Callable[[str], tuple[TensorSpec, ...]] | None = None) -> None:
        self.tensors_of = tensors_of

    def rebuild(self, links: list[ChainLink], out: MutableFileView) -> None:
        if not links:
            raise ValueError("lossy restore: the chain is empty")
        digest = b""
        for position, link in enumerate(links):
            header = self._header(link, position, links, out)
            digest = header[-1]
            self._replay(link, header, out)
        actual = xxhash.xxh3_128()
        for piece in out.stream(1 << 22):
            actual.update(piece)
        if actual.digest() != digest:
            raise ValueError(
                f"lossy checkpoint {links[-1].index}: the rebuilt state's digest {actual.hexdigest()} "
                f"differs from the one recorded ({digest.hex()})"
            )

    @staticmethod
    def _header(link: ChainLink, position: int, links: list[ChainLink], out: MutableFileView) -> tuple:
        where = f"lossy checkpoint {link.index}"
        if link.size < FILE_HEADER.size:
            raise ValueError(f"{where}: container of {link.size} bytes is shorter than its header")
        header = FILE_HEADER.unpack(bytes(_read_link(link, 0, FILE_HEADER.size)))
        magic, version, kind, coder, _bits, _mantissa_bits, index, base, previous, size = header[:10]
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"{where}: not a lossy container (magic {magic!r}, version {version})")
        if coder >= len(CODERS):
            raise ValueError(f"{where}: unknown coder {coder}")
        if index != link.index:
            raise ValueError(f"{where}: the container says it is checkpoint {index}")
        if size != out.size:
            raise ValueError(f"{where}: holds {size} logical bytes, the restore expects {out.size}")
        if position == 0:
            if kind != KIND_FULL:
                raise ValueError(f"{where}: the chain starts with a delta (on {previous}), not a full checkpoint")
        elif kind != KIND_DELTA or base != links[0].index or previous != links[position - 1].index:
            raise ValueError(
                f"{where}: is a delta on checkpoint {previous} of the chain from {base}, "
                f"but follows checkpoint {links[position - 1].index} of the chain from {links[0].index}"
            )
        return header

    def _replay(self, link: ChainLink, header: tuple, out: MutableFileView) -> None:
        where = f"lossy checkpoint {link.index}"
        coder = CODERS[header[3]]
        ntensors, segment_elems = header[10], header[11]
        if not 1 <= segment_elems <= MAX_SEGMENT_ELEMS:
            raise ValueError(f"{where}: segment size {segment_elems} outside 1 to {MAX_SEGMENT_ELEMS}")
        pos = FILE_HEADER.size
        offset = 0
        decompressor = zstandard.ZstdDecompressor()
        for number in range(ntensors):
            mode, dtype_bytes, nsym, fill, float_format, lane, numel, body = TENSOR_HEADER.unpack(
                bytes(_read_link(link, pos, TENSOR_HEADER.size))
            )
            pos += TENSOR_HEADER.size
            end = pos + body
            if end > link.size or offset + numel * dtype_bytes > out.size:
                raise ValueError(f"{where}: tensor {number} runs past the end of the container or the state")
            if mode == MODE_RAW:
                if body != numel * dtype_bytes:
                    raise ValueError(f"{where}: raw tensor {number} has {body} bytes for {numel} elements")
                step = segment_elems * dtype_bytes
                for at in range(0, body, step):
                    out.write_at(offset + at, _read_link(link, pos + at, min(step, body - at)))
            elif (mode == MODE_QUANTISED and dtype_bytes in FLOAT_BYTES and 1 <= nsym <= 256 and 1 <= lane <= MAX_LANE
                  and (float_format == FORMAT_IEEE or (float_format == FORMAT_BFLOAT16 and dtype_bytes == 2))):
                fmt = lossy_kernels.float_format(dtype_bytes, "bfloat16" if float_format == FORMAT_BFLOAT16 else "float16")
                self._quantised(link, pos, end, coder, fmt, nsym, fill, lane, numel,
                                segment_elems, offset, out, decompressor)
            else:
                raise ValueError(f"{where}: tensor {number} has an unknown layout (mode {mode}, {dtype_bytes}-byte elements)")
            pos = end
            offset += numel * dtype_bytes
        if pos != link.size or offset != out.size:
            raise ValueError(f"{where}: the tensors cover {pos} of {link.size} container bytes and {offset} of {out.size} state bytes")

    @staticmethod
    def _quantised(link, pos, end, coder, fmt, nsym, fill, lane, numel, segment_elems, offset, out, decompressor) -> None:
        where = f"lossy checkpoint {link.index}"
        huff = coder == "huffman"
        representatives = np.frombuffer(bytes(_read_link(link, pos, 8 * nsym)), dtype="<f8")
        pos += 8 * nsym
        lengths = None
        if huff:
            lengths = np.frombuffer(bytes(_read_link(link, pos, nsym)), dtype=np.uint8)
            pos += nsym
        lane_type = huffman.lane_dtype(lane)
        coded = huff and bool(lengths.any())  # a single-symbol code has no bits and no lane lengths
        for start, n in _segments(numel, segment_elems):
            (size,) = SEGMENT_HEADER.unpack(bytes(_read_link(link, pos, SEGMENT_HEADER.size)))
            pos += SEGMENT_HEADER.size
            lane_bits = np.zeros(-(-n // lane), dtype=lane_type)
            if coded:
                lanes = -(-n // lane)
                lane_bits = np.frombuffer(bytes(_read_link(link, pos, lanes * lane_type.itemsize)), dtype=lane_type)
                pos += lanes * lane_type.itemsize
            if pos + size > end:
                raise ValueError(f"{where}: a segment runs past its tensor's end")
            payload = _read_link(link, pos, size)
            pos += size
            try:
                if huff:
                    symbols = huffman.decode(payload, lane_bits, n, lengths, lane, fill)
                else:
                    width = index_width(nsym)
                    packed = decompressor.decompress(bytes(payload), max_output_size=-(-n * width // 8))
                    symbols = unpack_indices(packed, n, width)
            except (ValueError, zstandard.ZstdError) as exc:
                raise ValueError(f"{where}: a segment does not decode: {exc}") from None
            if len(symbols) != n or (n and int(symbols.max()) >= nsym):
                raise ValueError(f"{where}: a segment decodes to symbols outside its table")
            at = offset + start * fmt.itemsize
            out.write_at(at, apply_delta(out.read_at(at, n * fmt.itemsize), symbols, representatives, fmt))
        if pos != end:
            raise ValueError(f"{where}: a quantised tensor's segments end at {pos}, its body at {end}")


def _read_link(link: ChainLink, offset: int, nbytes: int) -> memoryview:
    if offset + nbytes > link.size:
        raise ValueError(f"lossy checkpoint {link.index}: read of {nbytes} bytes at {offset} past the container's {link.size}")
    data = link.read_at(offset, nbytes)
    if len(data) != nbytes:
        raise ValueError(f"lossy checkpoint {link.index}: got {len(data)} of {nbytes} bytes at offset {offset}")
    return data


class LossyCodec:
    """The `lossy` state codec (codec_registry.py): its options are checkpoint.lossy.*; the
    reconstructed state it keeps lives in scratch stores under checkpoint.state_dir. It
    quantises how values change, so it needs a state that evolves (not checkpoint.update=random)."""

    name = "lossy"
    kind = "state"
    random_update_problem = "quantises how values change"

    @staticmethod
    def encoder(cfg, tensors_of) -> LossyEncoder:
        lossy = cfg.lossy
        return LossyEncoder(lossy.bits, lossy.coder, lossy.full_every, tensors_of=tensors_of,
                            scratch=lambda size: ScratchStore(size, cfg.state_dir), mantissa_bits=lossy.mantissa_bits,
                            half=lossy.half)

    @staticmethod
    def decoder(tensors) -> LossyDecoder:
        return LossyDecoder(tensors_of=lambda _key: tensors)


CODEC = LossyCodec()
