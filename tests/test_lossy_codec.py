"""LC-Checkpoint codec (codec/lossy.py) and its Huffman coder (codec/huffman.py), without MPI."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import xxhash

from dlio_ckpt.codec import huffman, lossy
from dlio_ckpt.codec.base import ChainLink
from dlio_ckpt.codec.lossy import (
    FILE_HEADER,
    LossyDecoder,
    LossyEncoder,
    index_width,
    pack_indices,
    unpack_indices,
)
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.base import BytesView
from dlio_ckpt.state.store import ScratchStore

N = 50_000
SEGMENT = 16_384  # several segments per tensor, a partial last one
LANE = 1000


# ---------------------------------------------------------------- Huffman


def _round_trip(symbols: np.ndarray, alphabet: int) -> bytes:
    counts = np.bincount(symbols, minlength=alphabet)
    lengths = huffman.code_lengths(counts)
    lane_bits, data = huffman.encode(symbols, lengths, LANE)
    assert len(data) == -(-huffman.encoded_bits(counts, lengths) // 8)
    fill = int(np.flatnonzero(counts)[0]) if np.count_nonzero(counts) == 1 else 0
    back = huffman.decode(data, lane_bits, len(symbols), lengths, LANE, fill)
    np.testing.assert_array_equal(back, symbols)
    return data


@pytest.mark.parametrize("n", [1, LANE - 1, LANE, LANE + 1, 3 * LANE + 7])
def test_huffman_round_trip_skewed(n):
    rng = np.random.default_rng(n)
    symbols = np.minimum(rng.geometric(0.6, n) - 1, 7).astype(np.uint8)
    _round_trip(symbols, 8)


def test_huffman_skewed_beats_fixed_width():
    symbols = np.minimum(np.random.default_rng(1).geometric(0.7, 20_000) - 1, 7).astype(np.uint8)
    assert len(_round_trip(symbols, 8)) * 8 < 1.6 * len(symbols)  # entropy ~1.3 bits, fixed width 3


def test_huffman_single_symbol_is_empty():
    assert _round_trip(np.full(5000, 5, dtype=np.uint8), 8) == b""


def test_huffman_all_256_symbols():
    symbols = np.random.default_rng(2).integers(0, 256, 30_000).astype(np.uint8)
    data = _round_trip(symbols, 256)
    assert len(data) == 30_000  # uniform: every code 8 bits


def test_huffman_lengths_are_limited_and_complete():
    fib = [1, 1]
    while len(fib) < 40:
        fib.append(fib[-1] + fib[-2])
    lengths = huffman.code_lengths(np.array(fib))
    assert lengths.max() <= huffman.MAX_LEN
    assert sum(2.0 ** -int(length) for length in lengths) == 1.0  # Kraft equality: a complete code


def test_huffman_rejects_lane_lengths_that_do_not_fit():
    symbols = np.arange(8, dtype=np.uint8).repeat(300)
    lengths = huffman.code_lengths(np.bincount(symbols))
    lane_bits, data = huffman.encode(symbols, lengths, LANE)
    with pytest.raises(ValueError, match="lane lengths"):
        huffman.decode(data[:-1], lane_bits, len(symbols), lengths, LANE)


def test_huffman_rejects_corrupt_codes_and_streams():
    symbols = np.minimum(np.random.default_rng(3).geometric(0.5, 5000) - 1, 7).astype(np.uint8)
    lengths = huffman.code_lengths(np.bincount(symbols, minlength=8))
    lane_bits, data = huffman.encode(symbols, lengths, LANE)
    for bad in ([40] + [1] * 7, [1, 1, 1, 0, 0, 0, 0, 0], [2, 2, 2, 0, 0, 0, 0, 0]):  # too long, over-, under-full
        with pytest.raises(ValueError, match="complete Huffman code"):
            huffman.decode(data, lane_bits, len(symbols), np.array(bad, dtype=np.uint8), LANE)
    shifted = lane_bits.copy()
    shifted[0] += 1
    shifted[1] -= 1  # same total, wrong boundary
    with pytest.raises(ValueError, match="does not decode to its lanes"):
        huffman.decode(data, shifted, len(symbols), lengths, LANE)
    garbage = np.random.default_rng(4).integers(0, 256, len(data), dtype=np.uint8).tobytes()
    with pytest.raises(ValueError, match="does not decode to its lanes"):
        huffman.decode(garbage, lane_bits, len(symbols), lengths, LANE)


# ---------------------------------------------------------------- LC-Checkpoint


@pytest.mark.parametrize("nsym, width", [(1, 1), (2, 1), (3, 2), (4, 2), (8, 4), (16, 4), (17, 8), (256, 8)])
def test_zstd_indices_are_packed_as_narrow_as_the_table_allows(nsym, width):
    assert index_width(nsym) == width
    rng = np.random.default_rng(nsym)
    for n in (0, 1, 7, 1001):
        symbols = rng.integers(0, nsym, n).astype(np.uint8)
        packed = pack_indices(symbols, width)
        assert len(packed) == -(-n * width // 8)
        np.testing.assert_array_equal(unpack_indices(packed, n, width), symbols)

TENSORS = (
    TensorSpec("w32", N, 4, "model"),
    TensorSpec("w16", 3000, 2, "model"),
    TensorSpec("ids", 777, 1, "model"),
    TensorSpec("m64", 5000, 8, "optimizer"),
)
DTYPES = ("<f4", "<f2", None, "<f8")


def _state(weights: np.ndarray, raw: np.ndarray) -> bytearray:
    parts = []
    for tensor, dtype in zip(TENSORS, DTYPES):
        parts.append(raw.tobytes() if dtype is None else weights[: tensor.numel].astype(dtype).tobytes())
    return bytearray(b"".join(parts))


def _floats(data: bytes) -> np.ndarray:
    """The float elements of a state, as float64, read independently of the codec."""
    out, at = [], 0
    for tensor, dtype in zip(TENSORS, DTYPES):
        if dtype is not None:
            out.append(np.frombuffer(data[at : at + tensor.nbytes], dtype=dtype).astype(np.float64))
        at += tensor.nbytes
    return np.concatenate(out)


def _sgd_states(steps: int, seed: int = 0, lr: float = 1e-3):
    rng = np.random.default_rng(seed)
    weights = rng.normal(0, 0.02, N)
    raw = rng.integers(0, 256, TENSORS[2].numel, dtype=np.uint8)
    for step in range(steps):
        if step:
            weights = weights + lr * 0.02 * rng.standard_t(3, N)
            raw = raw.copy()
            raw[rng.integers(0, len(raw), 20)] = rng.integers(0, 256, 20, dtype=np.uint8)
        yield _state(weights, raw)


def _encoder(bits=3, coder="huffman", full_every=0):
    return LossyEncoder(bits, coder, full_every, lambda key: TENSORS, lambda size: BytesView(bytearray(size)),
                        segment_elems=SEGMENT, lane=LANE)


class _Chain:
    """Encodes checkpoints and restores them through the decoder, as the engine would."""

    def __init__(self, encoder: LossyEncoder) -> None:
        self.encoder = encoder
        self.containers: dict[int, bytes] = {}

    def write(self, index: int, state: bytearray):
        encoded = self.encoder.encode(index, "model_states.pt", BytesView(state))
        pieces = [bytes(piece) for piece in encoded.chunks(4096)]
        assert all(len(piece) == 4096 for piece in pieces[:-1]) and 0 < len(pieces[-1]) <= 4096
        data = b"".join(pieces)
        assert len(data) == encoded.nbytes
        self.containers[index] = data
        return encoded

    def links(self, chain) -> list[ChainLink]:
        return [
            ChainLink(i, len(self.containers[i]), lambda offset, n, d=self.containers[i]: memoryview(d)[offset : offset + n])
            for i in chain
        ]

    def restore(self, chain, size: int) -> bytes:
        out = bytearray(size)
        LossyDecoder(lambda key: TENSORS).rebuild(self.links(chain), BytesView(out))
        return bytes(out)


@pytest.mark.parametrize("coder", ["huffman", "zstd"])
def test_restore_is_bit_identical_to_the_encoders_state(coder):
    chain = _Chain(_encoder(coder=coder))
    for index, state in enumerate(_sgd_states(4)):
        encoded = chain.write(index, state)
        assert encoded.chain == tuple(range(index + 1))
        restored = chain.restore(encoded.chain, len(state))
        assert xxhash.xxh3_128(restored).hexdigest() == encoded.state_digest
        stats = encoded.stats
        assert stats["bytes_written"] == encoded.nbytes and stats["logical_bytes"] == len(state)
        assert stats["chain_length"] == index + 1 and stats["coder"] == coder
        if index == 0:
            assert restored == bytes(state) and encoded.nbytes > len(state)
        else:
            assert stats["compression_ratio"] > 5


@pytest.mark.parametrize("coder", ["huffman", "zstd"])
def test_error_stays_within_the_bound_of_the_kept_buckets(coder):
    chain = _Chain(_encoder(coder=coder))
    for index, state in enumerate(_sgd_states(4)):
        encoded = chain.write(index, state)
        x = _floats(bytes(state))
        err = np.abs(x - _floats(chain.restore(encoded.chain, len(state)))).max() / np.abs(x).max()
        assert err == pytest.approx(encoded.stats["max_rel_error"], rel=1e-12, abs=1e-300)
        assert err <= encoded.stats["error_bound"]
        if index:
            assert 0 < err and encoded.stats["error_bound"] < 1.5 * err  # not a vacuous bound


def test_more_bits_give_smaller_error():
    rms, maxima, sizes = [], [], []
    for bits in (1, 2, 3, 4, 8):  # from ~5 bits on every non-empty bucket is kept
        encoder = _encoder(bits=bits)
        for index, state in enumerate(_sgd_states(2)):
            encoded = encoder.encode(index, "f", BytesView(state))
            list(encoded.chunks(1 << 20))
        rms.append(encoded.stats["rms_rel_error"])
        maxima.append(encoded.stats["max_rel_error"])
        sizes.append(encoded.nbytes)
    assert all(b < a for a, b in itertools.pairwise(rms[:4])) and rms[4] <= rms[3], rms
    assert all(b <= a for a, b in itertools.pairwise(maxima)), maxima
    assert sizes[0] < sizes[-1]


def test_unchanged_elements_come_back_exact_and_zero_deltas_cost_nothing():
    rng = np.random.default_rng(3)
    weights = rng.normal(0, 0.02, N)
    raw = rng.integers(0, 256, TENSORS[2].numel, dtype=np.uint8)
    weights[7] = -0.0  # signed zero survives too: index 0 adds -0.0
    chain = _Chain(_encoder())
    first = _state(weights, raw)
    chain.write(0, first)
    same = chain.write(1, _state(weights, raw))
    # only headers, a one-entry table per float tensor (-0.0, code length 0), segment sizes, uint8 raw
    floats = [t for t in TENSORS if t.dtype_bytes > 1]
    segments = sum(-(-t.numel // SEGMENT) for t in floats)
    expected = FILE_HEADER.size + 32 * len(TENSORS) + 9 * len(floats) + 4 * segments + TENSORS[2].nbytes
    assert same.nbytes == expected and same.stats["max_rel_error"] == 0
    changed = rng.choice(N, N // 100, replace=False)
    weights2 = weights.copy()
    weights2[changed] += rng.normal(0, 0.01, len(changed))
    encoded = chain.write(2, _state(weights2, raw))
    restored = chain.restore(encoded.chain, len(first))
    unchanged = np.setdiff1d(np.arange(N), changed)
    before = np.frombuffer(bytes(first[: 4 * N]), dtype="<u4")
    after = np.frombuffer(restored[: 4 * N], dtype="<u4")
    np.testing.assert_array_equal(after[unchanged], before[unchanged])
    assert not np.array_equal(after[changed], before[changed])


def test_uint8_tensors_are_stored_raw_and_exact():
    chain = _Chain(_encoder())
    start = sum(t.nbytes for t in TENSORS[:2])
    for index, state in enumerate(_sgd_states(3)):
        encoded = chain.write(index, state)
        restored = chain.restore(encoded.chain, len(state))
        assert restored[start : start + 777] == bytes(state[start : start + 777])


def test_non_finite_values_are_stored_raw():
    states = list(_sgd_states(2))
    weights = np.frombuffer(bytes(states[1][: 4 * N]), dtype="<f4").copy()
    weights[5] = np.inf
    states[1][: 4 * N] = weights.tobytes()
    chain = _Chain(_encoder())
    chain.write(0, states[0])
    encoded = chain.write(1, states[1])
    restored = chain.restore(encoded.chain, len(states[1]))
    assert restored[: 4 * N] == bytes(states[1][: 4 * N])


def test_full_every_starts_a_new_chain():
    chain = _Chain(_encoder(full_every=2))
    seen = []
    for index, state in enumerate(_sgd_states(5)):
        encoded = chain.write(index, state)
        seen.append(encoded.chain)
        restored = chain.restore(encoded.chain, len(state))
        assert xxhash.xxh3_128(restored).hexdigest() == encoded.state_digest
    assert seen == [(0,), (0, 1), (2,), (2, 3), (4,)]
    assert chain.containers[2][:8] == chain.containers[0][:8] and len(chain.containers[2]) > len(state)


def test_reset_makes_the_next_checkpoint_full():
    encoder = _encoder()
    states = list(_sgd_states(3))
    for index in range(2):
        list(encoder.encode(index, "f", BytesView(states[index])).chunks(1 << 20))
    encoder.reset()
    encoded = encoder.encode(2, "f", BytesView(states[2]))
    assert encoded.chain == (2,) and encoded.stats["full"]


def test_broken_chains_and_corrupt_containers_are_rejected():
    chain = _Chain(_encoder())
    for index, state in enumerate(_sgd_states(3)):
        chain.write(index, state)
    size = len(state)
    with pytest.raises(ValueError, match="checkpoint 2: is a delta on checkpoint 1"):
        chain.restore((0, 2), size)
    with pytest.raises(ValueError, match="starts with a delta"):
        chain.restore((1, 2), size)
    good = chain.containers[2]
    chain.containers[2] = b"XXXXXXXX" + good[8:]
    with pytest.raises(ValueError, match="checkpoint 2: not a lossy container"):
        chain.restore((0, 1, 2), size)
    flipped = bytearray(good)
    flipped[-10] ^= 0x5A  # inside the last coded segment
    chain.containers[2] = bytes(flipped)
    with pytest.raises(ValueError, match="checkpoint 2"):
        chain.restore((0, 1, 2), size)
    chain.containers[2] = good[:-1]
    with pytest.raises(ValueError, match="checkpoint 2"):
        chain.restore((0, 1, 2), size)
    chain.containers[2] = good
    assert xxhash.xxh3_128(chain.restore((0, 1, 2), size)).digest() == good[FILE_HEADER.size - 16 : FILE_HEADER.size]


def test_tensor_sizes_must_match_the_view():
    with pytest.raises(ValueError, match="tensors add up to"):
        _encoder().encode(0, "f", BytesView(bytearray(10)))


def test_file_backed_scratch_and_bounded_memory(tmp_path):
    """States, xr and spools in unlinked files (ScratchStore's reused read buffer): the codec
    still round-trips, and its peak Python/numpy allocation stays a few segments, far below the
    16 MiB state."""
    import tracemalloc

    numel, segment = 4 << 20, 1 << 16
    tensors = (TensorSpec("w", numel, 4, "model"),)

    def store(size):
        return ScratchStore(size, str(tmp_path), memory_limit=0)

    encoder = LossyEncoder(3, "huffman", 0, lambda key: tensors, store, segment_elems=segment)
    rng = np.random.default_rng(5)
    weights = rng.normal(0, 0.02, numel).astype("<f4")
    containers = []
    for index in range(2):
        if index:
            weights += (1e-5 * rng.standard_t(3, numel)).astype("<f4")
        state = store(4 * numel)
        state.write_at(0, weights)
        tracemalloc.start()
        encoded = encoder.encode(index, "f", state)
        with open(tmp_path / f"c{index}", "wb") as out:
            out.writelines(encoded.chunks(1 << 20))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 8 << 20, peak
        containers.append((tmp_path / f"c{index}").read_bytes())
        state.close()
    out = store(4 * numel)
    links = [ChainLink(i, len(c), lambda offset, n, d=c: memoryview(d)[offset : offset + n]) for i, c in enumerate(containers)]
    LossyDecoder().rebuild(links, out)
    digest = xxhash.xxh3_128()
    for piece in out.stream(1 << 20):
        digest.update(piece)
    assert digest.hexdigest() == encoded.state_digest
    encoder.reset()


@pytest.mark.parametrize("coder", ["huffman", "zstd"])
def test_random_damage_is_a_value_error_or_harmless(coder):
    """Flipped bytes anywhere in a delta container (headers, tables, lane lengths, payload) and
    truncations: the decoder either rebuilds the same state (a padding byte) or raises ValueError,
    never another exception."""
    chain = _Chain(_encoder(coder=coder))
    for index, state in enumerate(_sgd_states(2)):
        chain.write(index, state)
    good = chain.containers[1]
    expected = chain.restore((0, 1), len(state))
    rng = np.random.default_rng(7)
    harmless = 0
    for trial in range(60):
        damaged = bytearray(good)
        if trial % 6 == 5:
            damaged = damaged[: int(rng.integers(0, len(good)))]
        else:
            at = int(rng.integers(0, 400)) if trial % 2 else int(rng.integers(0, len(good)))
            damaged[at] ^= 1 << int(rng.integers(0, 8))
        chain.containers[1] = bytes(damaged)
        try:
            restored = chain.restore((0, 1), len(state))
        except ValueError:
            continue
        assert restored == expected
        harmless += 1
    assert harmless < 10


@pytest.mark.parametrize("bits", [3, 8])
def test_a_state_that_stops_changing_comes_back_exact(bits):
    """Error feedback: once the state stops changing, each delta re-quantises the residual (a kept
    bucket's elements are off by less than half their own delta), so the error shrinks every
    checkpoint and reaches exactly zero: sparse changes end up restored bit for bit."""
    numel = 20_000
    tensors = (TensorSpec("w", numel, 4, "model"),)
    encoder = LossyEncoder(bits, "huffman", 0, lambda key: tensors, lambda size: BytesView(bytearray(size)))
    rng = np.random.default_rng(8)
    weights = rng.normal(0, 0.02, numel).astype("<f4")
    list(encoder.encode(0, "f", BytesView(bytearray(weights.tobytes()))).chunks(1 << 20))
    changed = rng.choice(numel, numel // 100, replace=False)
    weights[changed] += rng.normal(0, 0.01, len(changed)).astype("<f4")
    errors = []
    for index in range(1, 40):
        encoded = encoder.encode(index, "f", BytesView(bytearray(weights.tobytes())))
        list(encoded.chunks(1 << 20))
        errors.append(encoded.stats["max_rel_error"])
        if errors[-1] == 0:
            break
    assert errors[-1] == 0 and len(errors) < 30, errors
    assert all(b <= a for a, b in itertools.pairwise(errors)), errors
    assert encoded.state_digest == xxhash.xxh3_128(weights.tobytes()).hexdigest()


# ---------------------------------------------------------------- mantissa_bits (finer buckets)

SPARSE_N = 1 << 18


def _sparse_pair(seed: int = 11, fraction: float = 0.1, chunk: int = 256):
    """A float32 N(0, 1) state, then the same with `fraction` of its `chunk`-element chunks
    rewritten with new N(0, 1) values (the `sparse` update model): (before, after, changed)."""
    rng = np.random.default_rng(seed)
    before = rng.normal(0, 1, SPARSE_N).astype("<f4")
    changed = np.repeat(rng.random(SPARSE_N // chunk) < fraction, chunk)
    after = before.copy()
    after[changed] = rng.normal(0, 1, int(changed.sum())).astype("<f4")
    return before, after, changed


def _sparse_round_trip(mantissa_bits: int, bits: int = 8, coder: str = "huffman"):
    """Full checkpoint of `before`, delta checkpoint of `after`, both rebuilt by the decoder:
    (before, after, changed, restored, the delta's stats, the two containers)."""
    before, after, changed = _sparse_pair()
    tensors = (TensorSpec("w", SPARSE_N, 4, "model"),)
    encoder = LossyEncoder(bits, coder, 0, lambda key: tensors, lambda size: BytesView(bytearray(size)),
                           segment_elems=SEGMENT, lane=LANE, mantissa_bits=mantissa_bits)
    containers = []
    for index, state in enumerate((before, after)):
        encoded = encoder.encode(index, "f", BytesView(bytearray(state.tobytes())))
        containers.append(b"".join(bytes(piece) for piece in encoded.chunks(1 << 20)))
    links = [ChainLink(i, len(c), lambda offset, n, d=c: memoryview(d)[offset : offset + n]) for i, c in enumerate(containers)]
    out = bytearray(4 * SPARSE_N)
    LossyDecoder().rebuild(links, BytesView(out))
    assert xxhash.xxh3_128(bytes(out)).hexdigest() == encoded.state_digest
    return before, after, changed, np.frombuffer(bytes(out), dtype="<f4"), encoded.stats, containers


def test_mantissa_bits_shrink_the_in_bucket_error_on_sparse_until_the_kept_buckets_run_out():
    """On `sparse` a changed element's delta is as large as the element, so LC's whole-binade
    buckets leave up to half of it (m=0). m mantissa bits cut a bucket to 1/2^m of a binade: the
    error falls about twofold per bit while the 255 kept buckets still cover the deltas' binades;
    at m=6 they cover only about two binades a sign and the dropped deltas dominate."""
    errors = {}
    for m in (0, 2, 4, 6):
        before, after, changed, restored, stats, _ = _sparse_round_trip(m)
        x = after.astype(np.float64)
        err = np.abs(x - restored.astype(np.float64))
        errors[m] = err.max() / np.abs(x).max()
        assert errors[m] == pytest.approx(stats["max_rel_error"], rel=1e-12)
        assert errors[m] <= stats["error_bound"] < 1.5 * errors[m]  # within the bound, and it is not vacuous
        assert stats["bits"] == 8 and stats["mantissa_bits"] == m
        # unchanged elements come back bit for bit
        np.testing.assert_array_equal(restored.view("<u4")[~changed], before.view("<u4")[~changed])
    assert errors[0] > 0.15, errors  # LC as published: half a binade
    assert errors[0] > errors[2] > errors[4], errors
    assert errors[4] < 0.05 and errors[4] < errors[0] / 4, errors
    assert errors[6] > 2 * errors[4], errors  # 255 buckets of 1/64 binade: the dropped term is back


@pytest.mark.parametrize("mantissa_bits", [0, 3, 4])
def test_a_kept_element_is_within_its_sub_bucket_and_a_dropped_one_is_unchanged(mantissa_bits):
    """Each element either keeps xr_{t-1} exactly (index 0) or is off by at most 2^-(m+1) of its
    own delta (half its bucket's span), plus the float32 rounding of the sum."""
    before, after, changed, restored, stats, _ = _sparse_round_trip(mantissa_bits)
    x, delta = after.astype(np.float64), after.astype(np.float64) - before.astype(np.float64)
    err = np.abs(x - restored.astype(np.float64))
    dropped = restored.view("<u4") == before.view("<u4")
    kept = ~dropped
    slack = np.spacing(np.abs(x[kept]).astype("<f4")).astype(np.float64)
    assert np.all(err[kept] <= 2.0 ** -(mantissa_bits + 1) * np.abs(delta[kept]) + slack)
    assert kept.sum() > changed.sum() // 2  # most changed elements are kept at 8 bits
    assert np.all(dropped[~changed])


def test_sparse_tables_give_the_same_containers_as_dense_ones(monkeypatch):
    """Beyond DENSE_TABLE_BYTES (m = 9, 10 at 32 MiB) pass 1 gathers only the non-empty buckets:
    forced at m=2, it must write the very bytes the dense tables write; m=10 round-trips."""
    dense = _sparse_round_trip(2, coder="zstd")[-1]
    monkeypatch.setattr(lossy, "DENSE_TABLE_BYTES", 0)
    assert _sparse_round_trip(2, coder="zstd")[-1] == dense
    monkeypatch.undo()
    before, after, changed, restored, stats, containers = _sparse_round_trip(10)
    err = np.abs(after.astype(np.float64) - restored).max() / np.abs(after).max()
    assert 0 < err <= stats["error_bound"] and containers[1][13] == 10


@pytest.mark.parametrize("coder, digest", [("huffman", "a3354d7c66eedbbb")])
def test_mantissa_bits_0_writes_the_published_containers(coder, digest):
    """m=0 is LC-Checkpoint as before the option existed: the containers of three sgd checkpoints
    hash to what the codec wrote before mantissa_bits (commit a67d66a), and giving 0 explicitly
    changes nothing (byte 13 of the header, mantissa_bits, was padding and stays 0)."""
    outputs = []
    for kwargs in ({}, {"mantissa_bits": 0}):
        encoder = LossyEncoder(3, coder, 0, lambda key: TENSORS, lambda size: BytesView(bytearray(size)),
                               segment_elems=SEGMENT, lane=LANE, **kwargs)
        h = xxhash.xxh3_64()
        for index, state in enumerate(_sgd_states(3)):
            for piece in encoder.encode(index, "model_states.pt", BytesView(state)).chunks(4096):
                h.update(piece)
        outputs.append(h.hexdigest())
    assert outputs == [digest, digest]


def test_mantissa_bits_out_of_range_is_rejected():
    from dlio_ckpt.config.load import load_config
    from dlio_ckpt.errors import ConfigError

    assert load_config([]).checkpoint.lossy.mantissa_bits == 0
    assert load_config(["checkpoint.lossy.mantissa_bits=10"]).checkpoint.lossy.mantissa_bits == 10
    for bad in (-1, 11):
        with pytest.raises(ConfigError) as info:
            load_config([f"checkpoint.lossy.mantissa_bits={bad}"])
        assert str(info.value) == f"checkpoint.lossy.mantissa_bits: must be 0 to 10 (got {bad})"
        with pytest.raises(ValueError, match="mantissa_bits must be 0 to 10"):
            LossyEncoder(3, "huffman", 0, lambda key: TENSORS, lambda size: BytesView(bytearray(size)), mantissa_bits=bad)


def test_bucket_settings_are_not_added_up_over_files():
    from dlio_ckpt.checkpoint.encoded import merge_stats

    merged = merge_stats([{"bits": 8, "mantissa_bits": 4, "bytes_written": 10, "max_rel_error": 0.1},
                          {"bits": 8, "mantissa_bits": 4, "bytes_written": 5, "max_rel_error": 0.3}])
    assert merged == {"bits": 8, "mantissa_bits": 4, "bytes_written": 15, "max_rel_error": 0.3}


@pytest.mark.parametrize("mantissa_bits", [0, 4, 10])
def test_exponent_field_0_is_never_kept_in_any_sub_bucket(mantissa_bits):
    """float64-subnormal deltas of either sign land in exponent field 0, in a sub-bucket other than
    0 when their top mantissa bits are set: they still get index 0 (the element is unchanged), and
    the other buckets are kept."""
    tensors = (TensorSpec("w", 1000, 8, "model"),)
    encoder = LossyEncoder(8, "huffman", 0, lambda key: tensors, lambda size: BytesView(bytearray(size)),
                           mantissa_bits=mantissa_bits)
    x = np.zeros(1000)
    x[:10], x[10:20], x[20:30] = 2e-309, -1.5e-309, np.linspace(1.0, 3.0, 10)
    assert np.frexp(x[:20])[1].max() < -1021  # subnormal
    containers = []
    for index, state in enumerate((np.zeros(1000), x)):
        encoded = encoder.encode(index, "f", BytesView(bytearray(state.tobytes())))
        containers.append(b"".join(bytes(piece) for piece in encoded.chunks(1 << 20)))
    links = [ChainLink(i, len(c), lambda offset, n, d=c: memoryview(d)[offset : offset + n]) for i, c in enumerate(containers)]
    out = bytearray(8000)
    LossyDecoder().rebuild(links, BytesView(out))
    restored = np.frombuffer(bytes(out), dtype="<f8")
    assert np.all(restored[:20] == 0) and np.all(restored[30:] == 0)
    assert np.all(np.abs(restored[20:30] - x[20:30]) <= 2.0 ** -(mantissa_bits + 1) * x[20:30] + 1e-15)
    assert encoded.stats["kept_fraction"] == pytest.approx(10 / 1000)
