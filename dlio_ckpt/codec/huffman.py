"""Canonical Huffman coding of small-alphabet index arrays (at most 256 symbols).

LC-Checkpoint entropy-codes its n-bit bucket indices with Huffman. Where the optional C extension
is built (codec/_lossy_c.c, lossy_kernels._C) uint8 symbols are packed and each lane decoded by a
C loop: the same streams, without the numpy decoder's fixed cost of `lane` steps per segment
(~7 ms a tensor however small). Otherwise, and for wider symbols, a per-element Python loop would
make encoding slower than the storage it saves, so both directions are array operations:

- encode: per element code and length by table lookup; groups of four codes joined into one
  value, bit offsets by a cumulative sum, and each group's (disjoint) bits added into the at
  most two 64-bit words it spans (`_pack`);
- decode: the stream is cut into *lanes* of `lane` consecutive symbols whose bit lengths are stored
  (16 bits each: 2 bytes per `lane` symbols, ~1.6 % at the default 1024 and 1 bit per symbol).
  All lanes are decoded together, one symbol per lane per step, by a table lookup on a sliding
  window as wide as the longest code: `lane` numpy steps over arrays of n/lane entries, never a
  step per element. Each lane must end exactly where its stored length says, which catches a
  damaged stream.

Code lengths are limited to `MAX_LEN` (15) bits, so a lane of up to 4369 symbols fits its bit
length in 16 bits (longer lanes use 32, see `lane_dtype`). A symbol that never occurs has length
0; when a single symbol occurs its length is 0 too, the stream is empty, and the decoder fills the
output with the symbol the caller stored (`fill`).
"""

from __future__ import annotations

import heapq

import numpy as np

from dlio_ckpt.codec import lossy_kernels

MAX_LEN = 15  # longest code; the decoder's table has 2**(longest code used) entries
GROUP = 4  # codes joined before packing: 4 * MAX_LEN <= 64 bits
DEFAULT_LANE = 1024  # symbols per independently decodable lane


def lane_dtype(lane: int) -> np.dtype:
    """The stored type of a lane's bit length: uint16 while a lane cannot exceed 65535 bits."""
    return np.dtype("<u2") if lane * MAX_LEN <= 0xFFFF else np.dtype("<u4")


def code_lengths(counts: np.ndarray, max_len: int = MAX_LEN) -> np.ndarray:
    """Huffman code length per symbol (uint8) from symbol counts; 0 for unused symbols, and for
    the only symbol when just one occurs. Lengths over `max_len` are avoided by halving the counts
    (keeping every used symbol at least 1) and rebuilding: the usual length-limiting heuristic, at
    most a few rounds for 256 symbols."""
    counts = np.asarray(counts, dtype=np.int64)
    lengths = np.zeros(len(counts), dtype=np.uint8)
    used = np.flatnonzero(counts > 0)
    if len(used) <= 1:
        return lengths
    weights = counts[used].copy()
    while True:
        depth = _huffman_depths(weights)
        if depth.max() <= max_len:
            lengths[used] = depth
            return lengths
        weights = np.maximum(weights >> 1, 1)


def _huffman_depths(weights: np.ndarray) -> np.ndarray:
    """Leaf depths of a Huffman tree over `weights` (>= 2 leaves); a loop over the alphabet only."""
    heap = [(int(w), i, (i,)) for i, w in enumerate(weights)]
    heapq.heapify(heap)
    depth = np.zeros(len(weights), dtype=np.int64)
    tie = len(weights)
    while len(heap) > 1:
        w1, _, leaves1 = heapq.heappop(heap)
        w2, _, leaves2 = heapq.heappop(heap)
        merged = leaves1 + leaves2
        depth[list(merged)] += 1
        heapq.heappush(heap, (w1 + w2, tie, merged))
        tie += 1
    return depth


def canonical_codes(lengths: np.ndarray) -> np.ndarray:
    """Canonical code per symbol (uint32, right-aligned in its length): symbols sorted by (length,
    symbol) get consecutive codes, so the lengths alone describe the code (what the container stores)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    codes = np.zeros(len(lengths), dtype=np.uint32)
    order = np.lexsort((np.arange(len(lengths)), lengths))
    code = 0
    previous = 0
    for symbol in order:
        length = int(lengths[symbol])
        if length == 0:
            continue
        code <<= length - previous
        codes[symbol] = code
        code += 1
        previous = length
    return codes


def encoded_bits(counts: np.ndarray, lengths: np.ndarray) -> int:
    """The exact payload size in bits of symbols with these counts."""
    return int(np.dot(np.asarray(counts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)))


def encode(symbols: np.ndarray, lengths: np.ndarray, lane: int = DEFAULT_LANE) -> tuple[np.ndarray, bytes]:
    """(bit length of each lane, the packed bit stream, MSB first) of `symbols` (an integer array
    whose values all have a non-zero length, or all one symbol of length 0)."""
    lengths = np.asarray(lengths, dtype=np.uint8)
    n = len(symbols)
    nlanes = -(-n // lane)
    if n == 0:
        return np.zeros(0, dtype=lane_dtype(lane)), b""
    c = lossy_kernels._C
    if c is not None and len(lengths) <= 256 and symbols.dtype == np.uint8:  # the same stream, in one C loop
        table = np.zeros(256, dtype=np.uint8)
        table[: len(lengths)] = lengths
        codes = np.zeros(256, dtype=np.uint32)
        codes[: len(lengths)] = canonical_codes(lengths)
        lane_bits = np.zeros(nlanes, dtype=lane_dtype(lane))
        data = c.huff_encode(np.ascontiguousarray(symbols), codes, table, lane, lane_bits, lane_bits.itemsize)
        return lane_bits, data
    sym_len = lengths[symbols]
    if not sym_len.any():
        return np.zeros(nlanes, dtype=lane_dtype(lane)), b""
    if not sym_len.all():
        raise ValueError("a symbol to encode has no code (its count was 0 when the code was built)")
    lane_bits = np.add.reduceat(sym_len, np.arange(0, n, lane), dtype=np.int64).astype(lane_dtype(lane))
    return lane_bits, _pack(canonical_codes(lengths).astype(np.uint64)[symbols], sym_len)


def _pack(codes: np.ndarray, lengths: np.ndarray) -> bytes:
    """Concatenate right-aligned codes (uint64) of the given bit lengths (<= 15), MSB first.
    Groups of 4 codes are joined into one value of at most 60 bits, each group lands in at most
    two 64-bit words, and the groups' bits are disjoint, so adding them into the words (ufunc.at)
    places them: ~6 array passes over n/4 groups, no per-element loop."""
    pad = -len(codes) % GROUP
    if pad:
        codes = np.concatenate((codes, np.zeros(pad, dtype=np.uint64)))
        lengths = np.concatenate((lengths, np.zeros(pad, dtype=lengths.dtype)))
    codes = codes.reshape(-1, GROUP)
    lengths = lengths.reshape(-1, GROUP)
    value = codes[:, 0].copy()
    width = lengths[:, 0].astype(np.int64)
    for k in range(1, GROUP):
        value <<= lengths[:, k].astype(np.uint64)
        value |= codes[:, k]
        width += lengths[:, k]
    ends = np.cumsum(width)
    total = int(ends[-1])
    starts = ends - width
    word = starts >> 6
    shift = 64 - (starts & 63) - width  # < 0: the group spills into the next word
    words = np.zeros((total + 63) // 64 + 1, dtype=np.uint64)
    fits = shift >= 0
    high = np.where(fits, value << np.where(fits, shift, 0).astype(np.uint64), value >> np.where(fits, 0, -shift).astype(np.uint64))
    np.add.at(words, word, high)
    spill = np.flatnonzero(~fits)
    np.add.at(words, word[spill] + 1, value[spill] << (64 + shift[spill]).astype(np.uint64))
    return words.astype(">u8").tobytes()[: -(-total // 8)]


def decode(data, lane_bits: np.ndarray, n: int, lengths: np.ndarray, lane: int = DEFAULT_LANE, fill: int = 0) -> np.ndarray:
    """The `n` symbols (uint8 when they fit, else uint16) of a stream made by `encode`; `fill` is
    the symbol when none has a code (a single symbol occurred). Raises ValueError when the code
    lengths are not a complete code of at most MAX_LEN bits, or the stream does not decode to
    exactly its lanes' bit lengths (a corrupt stream never reads outside its buffer)."""
    lengths = np.asarray(lengths, dtype=np.uint8)
    out_dtype = np.uint8 if len(lengths) <= 256 else np.uint16
    nlanes = -(-n // lane)
    if len(lane_bits) != nlanes:
        raise ValueError(f"{len(lane_bits)} lane lengths for {nlanes} lanes")
    used = np.flatnonzero(lengths)
    if n == 0:
        return np.zeros(0, dtype=out_dtype)
    if len(used) == 0:
        if int(np.asarray(lane_bits, dtype=np.int64).sum()) or len(data):
            raise ValueError("the stream has bits but no symbol has a code")
        return np.full(n, fill, dtype=out_dtype)
    buf = np.frombuffer(data, dtype=np.uint8)
    lane_bits = np.asarray(lane_bits, dtype=np.int64)
    total = int(lane_bits.sum())
    if -(-total // 8) != len(buf):
        raise ValueError(f"lane lengths add up to {total} bits, the stream holds {len(buf)} bytes")
    width = int(lengths.max())
    if width > MAX_LEN or sum(1 << (MAX_LEN - int(lengths[s])) for s in used) != 1 << MAX_LEN:
        raise ValueError("the code lengths do not form a complete Huffman code")
    table_sym, table_len = _decode_table(lengths, width)
    c = lossy_kernels._C
    if c is not None and out_dtype == np.uint8:  # one C loop per lane instead of a numpy step per symbol
        out = np.empty(n, dtype=np.uint8)
        c.huff_decode(buf, lane_bits.astype(np.uint32), 4, table_sym, table_len.astype(np.uint8), width, lane, out)
        return out
    # zero padding: a corrupt lane may run on for up to lane * width bits, never past the buffer
    padded = np.zeros(len(buf) + (lane * width) // 8 + 8, dtype=np.uint32)
    padded[: len(buf)] = buf
    windows = (padded[:-3] << 24) | (padded[1:-2] << 16) | (padded[2:-1] << 8) | padded[3:]
    starts = np.concatenate(([0], np.cumsum(lane_bits[:-1])))
    pos = starts.copy()
    shift_base = 32 - width
    mask = (1 << width) - 1
    out = np.empty((nlanes, lane), dtype=out_dtype)
    last = n - (nlanes - 1) * lane  # symbols in the last lane
    last_end = None
    for j in range(lane):
        if j == last:
            last_end = int(pos[-1])
            pos = pos[:-1]
            if not len(pos):
                break
        code = (windows[pos >> 3] >> (shift_base - (pos & 7)).astype(np.uint32)) & mask
        out[: len(pos), j] = table_sym[code]
        pos = pos + table_len[code]
    ends = starts + lane_bits
    if last_end is not None:
        pos = np.append(pos, last_end)
    if not np.array_equal(pos, ends):
        raise ValueError("the stream does not decode to its lanes' bit lengths")
    return out.reshape(-1)[:n]


def _decode_table(lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(symbol, code length) for every `width`-bit window: the windows that start with a symbol's
    code map to it."""
    codes = canonical_codes(lengths)
    table_sym = np.zeros(1 << width, dtype=np.uint8 if len(lengths) <= 256 else np.uint16)
    table_len = np.zeros(1 << width, dtype=np.int64)
    for symbol in np.flatnonzero(lengths):
        length = int(lengths[symbol])
        lo = int(codes[symbol]) << (width - length)
        hi = (int(codes[symbol]) + 1) << (width - length)
        table_sym[lo:hi] = symbol
        table_len[lo:hi] = length
    return table_sym, table_len
