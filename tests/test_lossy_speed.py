"""The LC-Checkpoint codec's C loops (codec/_lossy_c.c via codec/lossy_kernels.py): built and
used, the same containers and restores as the numpy reference bit for bit, true bfloat16, and the
per-element error figures checked against an independent computation. Speed is measured in
benchmarks/lossy_codec.py, never asserted here."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from dlio_ckpt.codec import huffman, lossy_kernels
from dlio_ckpt.codec.base import ChainLink
from dlio_ckpt.codec.lossy import LossyDecoder, LossyEncoder
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.base import BytesView

N = 20_000
SEGMENT = 7_000  # several segments per tensor, a partial last one


def _bf16(values: np.ndarray) -> np.ndarray:
    """bfloat16 raw elements of float64 values, independently of the codec: torch's rounding
    (to float32, then to its top 16 bits, nearest even)."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def _from_bf16(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


TENSORS = (
    TensorSpec("w32", N, 4, "model"),
    TensorSpec("h16", 3_000, 2, "model"),
    TensorSpec("ids", 500, 1, "model"),
    TensorSpec("m64", 4_000, 8, "optimizer"),
)


def _states(steps: int, half: str, seed: int = 0, scale: float = 1.0):
    """States whose floats move by heavy-tailed steps; the 2-byte tensor is bfloat16 or float16
    (at `scale`, magnitudes float16 cannot hold, e.g. 1e6, are bfloat16-only)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.02, N + 3_000 + 4_000)
    raw = rng.integers(0, 256, 500, dtype=np.uint8)
    for step in range(steps):
        if step:
            w = w + 2e-5 * rng.standard_t(3, len(w))
            w[rng.integers(0, len(w), 50)] = 0.0  # exact zeros: relative error undefined there
        half_raw = _bf16(w[N : N + 3000] * scale) if half == "bfloat16" else (w[N : N + 3000] * scale).astype("<f2")
        yield bytearray(w[:N].astype("<f4").tobytes() + half_raw.tobytes() + raw.tobytes() + w[N + 3000 :].astype("<f8").tobytes())


def _encode_chain(states, half: str, coder: str, bits: int = 3, mantissa_bits: int = 0):
    encoder = LossyEncoder(bits, coder, 0, lambda key: TENSORS, lambda size: BytesView(bytearray(size)),
                           segment_elems=SEGMENT, lane=500, mantissa_bits=mantissa_bits, half=half)
    out = []
    for index, state in enumerate(states):
        encoded = encoder.encode(index, "f", BytesView(state))
        out.append((b"".join(bytes(p) for p in encoded.chunks(1 << 16)), encoded))
    return out


def _restore(containers: list[bytes], size: int) -> bytes:
    links = [ChainLink(i, len(c), lambda offset, n, d=c: memoryview(d)[offset : offset + n]) for i, c in enumerate(containers)]
    out = bytearray(size)
    LossyDecoder().rebuild(links, BytesView(out))
    return bytes(out)


def test_the_extension_is_built_and_used(monkeypatch):
    """An install with a compiler builds it (CI has gcc): a silent fallback to numpy fails here."""
    from dlio_ckpt.codec import _lossy_c

    assert lossy_kernels._C is _lossy_c and _lossy_c.HAVE_FLOAT16
    calls = []
    for name in ("scan", "quantise", "apply", "huff_encode", "huff_decode"):
        real = getattr(_lossy_c, name)
        monkeypatch.setattr(_lossy_c, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    containers = [c for c, _ in _encode_chain(_states(2, "bfloat16"), "bfloat16", "huffman")]
    _restore(containers, sum(t.nbytes for t in TENSORS))
    assert set(calls) == {"scan", "quantise", "apply", "huff_encode", "huff_decode"}


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
@pytest.mark.parametrize("coder,mantissa_bits", [("huffman", 0), ("zstd", 0), ("huffman", 3)])
def test_c_and_numpy_write_the_same_containers_and_restores(monkeypatch, half, coder, mantissa_bits):
    states = list(_states(4, half))
    with_c = _encode_chain(states, half, coder, mantissa_bits=mantissa_bits)
    monkeypatch.setattr(lossy_kernels, "_C", None)
    with_numpy = _encode_chain(states, half, coder, mantissa_bits=mantissa_bits)
    size = len(states[0])
    for (a, ea), (b, eb) in zip(with_c, with_numpy):
        assert a == b  # the container, byte for byte
        for key in ("max_rel_error", "error_bound", "kept_fraction", "elem_rel_error_p50", "elem_rel_error_p99",
                    "elem_rel_error_max", "elem_zero_changed"):
            assert ea.stats[key] == eb.stats[key], key
        assert ea.stats["rms_rel_error"] == pytest.approx(eb.stats["rms_rel_error"], rel=1e-9)  # summation order
    restored_numpy = _restore([c for c, _ in with_c], size)
    monkeypatch.setattr(lossy_kernels, "_C", lossy_kernels._load_c())
    assert _restore([c for c, _ in with_c], size) == restored_numpy
    assert xxhash.xxh3_128(restored_numpy).hexdigest() == with_c[-1][1].state_digest


@pytest.mark.parametrize("fmt", lossy_kernels.FORMATS, ids=lambda f: f.name)
def test_the_cast_back_rounds_like_numpy_and_torch_including_ties(monkeypatch, fmt):
    rng = np.random.default_rng(5)
    previous = fmt.from_f64(rng.normal(0, 1, 20_000) * 10.0 ** rng.integers(-6, 4, 20_000))
    prev64 = fmt.to_f64(previous)
    # representatives of exactly half an ulp make sums that sit on a tie between two values
    ulp = np.array([fmt.spacing(abs(v)) for v in prev64[:255]])
    representatives = np.concatenate(([-0.0], ulp / 2))
    symbols = rng.integers(0, 256, len(previous)).astype(np.uint8)
    from_c = lossy_kernels.apply(previous.tobytes(), fmt, symbols, representatives)
    monkeypatch.setattr(lossy_kernels, "_C", None)
    from_numpy = lossy_kernels.apply(previous.tobytes(), fmt, symbols, representatives)
    assert from_c.tobytes() == from_numpy.tobytes()
    expected = prev64 + representatives[symbols]
    if fmt.name == "bfloat16":
        torch = pytest.importorskip("torch")
        by_torch = torch.from_numpy(expected).to(torch.bfloat16).view(torch.int16).numpy().view("<u2")
        np.testing.assert_array_equal(from_c, by_torch)
    else:
        np.testing.assert_array_equal(from_c, expected.astype(fmt.raw))


def test_bfloat16_is_read_as_the_top_16_bits_of_a_float32():
    """Values float16 cannot hold (1e6, 1e-9) come back within the bound as bfloat16, whose
    8-bit mantissa gives a bound ~8x float16's; the container says bfloat16."""
    states = list(_states(3, "bfloat16", scale=1e6))
    chain = _encode_chain(states, "bfloat16", "huffman")
    restored = _restore([c for c, _ in chain], len(states[0]))
    at = 4 * N
    x = _from_bf16(np.frombuffer(states[-1][at : at + 6000], dtype="<u2"))
    xr = _from_bf16(np.frombuffer(restored[at : at + 6000], dtype="<u2"))
    assert np.isfinite(x).all() and np.abs(x).max() > 1e3  # not float16's range
    stats = chain[-1][1].stats
    assert stats["half"] == "bfloat16"
    top = max(np.abs(x).max(), np.abs(np.frombuffer(states[-1][:at], dtype="<f4")).max(),
              np.abs(np.frombuffer(states[-1][at + 6500 :], dtype="<f8")).max())
    assert np.abs(x - xr).max() / top <= stats["error_bound"]
    # the same bits read as float16 are other numbers: the codec must not mix them up
    as_f16 = np.frombuffer(states[-1][at : at + 6000], dtype="<f2").astype(np.float64)
    assert not np.allclose(as_f16, x)
    float16_chain = _encode_chain(states, "float16", "huffman")
    assert float16_chain[-1][0] != chain[-1][0]


def test_per_element_errors_match_an_independent_computation():
    states = list(_states(3, "float16"))
    chain = _encode_chain(states, "float16", "huffman")
    restored = _restore([c for c, _ in chain], len(states[0]))
    stats = chain[-1][1].stats

    def floats(data: bytes) -> np.ndarray:
        return np.concatenate([np.frombuffer(data[: 4 * N], "<f4").astype(np.float64),
                               np.frombuffer(data[4 * N : 4 * N + 6000], "<f2").astype(np.float64),
                               np.frombuffer(data[4 * N + 6500 :], "<f8")])

    x, xr = floats(bytes(states[-1])), floats(restored)
    zero = x == 0
    assert stats["elem_zero_changed"] == int(np.count_nonzero(zero & (xr != 0)))
    rel = np.concatenate([np.abs(x[~zero] - xr[~zero]) / np.abs(x[~zero]), np.zeros(int(np.count_nonzero(zero & (xr == 0))))])
    assert stats["elem_rel_error_max"] == rel.max()
    for p in (50, 99):
        true = np.sort(rel)[int(np.ceil(p / 100 * len(rel))) - 1]
        assert true <= stats[f"elem_rel_error_p{p}"] <= true * (1 + 1 / 16)  # a 1/16-binade bin's upper edge
    assert stats["elem_rel_error_p99"] > stats["max_rel_error"]  # the file-normalised figure hides small weights' errors


@pytest.mark.parametrize("n", [1, 499, 500, 501, 12_345])
def test_c_huffman_matches_numpy_and_rejects_damage(monkeypatch, n):
    rng = np.random.default_rng(n)
    symbols = np.minimum(rng.geometric(0.5, n) - 1, 7).astype(np.uint8)
    lengths = huffman.code_lengths(np.bincount(symbols, minlength=8))
    lane_bits, data = huffman.encode(symbols, lengths, 500)
    fill = int(symbols[0]) if not lengths.any() else 0  # one symbol: no bits, the caller's fill
    np.testing.assert_array_equal(huffman.decode(data, lane_bits, n, lengths, 500, fill), symbols)
    monkeypatch.setattr(lossy_kernels, "_C", None)
    lane_bits_np, data_np = huffman.encode(symbols, lengths, 500)
    assert data == data_np and lane_bits.tobytes() == lane_bits_np.tobytes()
    if lengths.any() and len(lane_bits) > 1 and lane_bits[0] > 1:
        bad = lane_bits.copy()
        bad[0] -= 1
        bad[1] += 1  # same total, wrong split: the first lane does not end where it says
        for c in (None, lossy_kernels._load_c()):
            monkeypatch.setattr(lossy_kernels, "_C", c)
            with pytest.raises(ValueError, match="lanes' bit lengths"):
                huffman.decode(data, bad, n, lengths, 500)


def test_the_half_setting_reaches_the_encoder():
    from dlio_ckpt.errors import ConfigError
    from dlio_ckpt.config.load import load_config

    assert load_config([]).checkpoint.lossy.half == "float16"  # what the emulated state generates
    assert load_config(["checkpoint.lossy.half=bfloat16"]).checkpoint.lossy.half == "bfloat16"
    with pytest.raises(ConfigError, match="checkpoint.lossy.half: 'fp8' is not allowed"):
        load_config(["checkpoint.lossy.half=fp8"])
    with pytest.raises(ValueError, match="lossy half must be one of bfloat16, float16"):
        LossyEncoder(3, "huffman", 0, lambda key: TENSORS, lambda size: BytesView(bytearray(size)), half="fp16")
