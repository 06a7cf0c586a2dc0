"""LC-Checkpoint codec (dlio_ckpt/codec/lossy.py): speed per core, compression ratio and error.

Three states, each checkpointed as a chain (a full checkpoint, then deltas), through the real
LossyEncoder / LossyDecoder in this process (one core; numpy does not thread these operations):

- `sgd`: float32 weights ~ N(0, 0.02), every element moving by lr * 0.02 * Student-t(df=3) per
  checkpoint interval (heavy-tailed, the shape LC-Checkpoint relies on);
- `trace`: the flattened parameters of helper-state's tiny MLP (dlio_ckpt/state/mlp_trace.py) at
  every `--trace-every` SGD steps, when that module is there (26,122 float32: ratio and error
  only, too small to time);
- `sparse`: the same weights where 1 % of the elements change per checkpoint and the rest stay
  bit for bit (`never_changed_exact`: whether those that never changed came back exact);
- `sgd` held as bfloat16 and as float16 (`half`): each 2-byte format's own ratio and errors.

Beside the file-normalised max_rel_error, the per-element figures: p50 / p99 / max of
|x - xr| / |x| (codec stats elem_rel_error_*). `chain`: a 100-link chain of a 1 MiB model in 8
tensors restored (the decoder's cost per link and tensor). `--numpy` runs the numpy reference
kernels instead of the C loops (codec/lossy_kernels.py).

For each coder (huffman, zstd) and `--bits`: compression ratio (logical / container bytes, the
header and tables included), kept_fraction (elements with a non-zero index), bits per element,
max_rel_error (max|x - xr| / max|x|), rms_rel_error, error_bound, all from the codec's stats; the
last checkpoint of every chain is restored by the decoder and checked (digest, error = stats,
error <= bound). Timing (`sgd` at `--time-bits`): encode MB/s of
logical bytes (both passes, spool included) and decode MB/s (replaying one delta onto a rebuilt
state), medians over `--repeats`, in CPU seconds of this process (time.process_time: MB/s per
core, and less disturbed by other work on a shared machine than wall time). Nothing asserts a
time. Results go to
benchmarks/results/lossy_codec.json.

    python benchmarks/lossy_codec.py [--mib 16] [--checkpoints 5] [--bits 1,2,3,4,8] [--repeats 3] [--quick]
    python benchmarks/lossy_codec.py --rss-gib 4    # peak RSS encoding a 4 GiB shard (results/lossy_rss.json)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import xxhash

from dlio_ckpt.codec import lossy_kernels
from dlio_ckpt.codec.base import ChainLink
from dlio_ckpt.codec.lossy import LossyDecoder, LossyEncoder
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.base import BytesView

REPO = Path(__file__).resolve().parent.parent


def sgd_states(numel: int, checkpoints: int, lr: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    weights = rng.normal(0, 0.02, numel).astype(np.float32)
    for index in range(checkpoints):
        if index:
            weights = weights + (lr * 0.02 * rng.standard_t(3, numel)).astype(np.float32)
        yield weights


def sparse_states(numel: int, checkpoints: int, fraction: float, seed: int = 1):
    rng = np.random.default_rng(seed)
    weights = rng.normal(0, 0.02, numel).astype(np.float32)
    for index in range(checkpoints):
        if index:
            weights = weights.copy()
            changed = rng.choice(numel, int(numel * fraction), replace=False)
            weights[changed] += rng.normal(0, 0.002, len(changed)).astype(np.float32)
        yield weights


def trace_states(checkpoints: int, every: int):
    try:
        from dlio_ckpt.state.mlp_trace import MlpTrace
    except ImportError:
        return None
    trace = MlpTrace(seed=0)
    return [trace.params_at(index * every) for index in range(checkpoints)]


class Chain:
    """One file's chain: containers in memory, restores through the decoder."""

    def __init__(self, bits: int, coder: str, numel: int, dtype_bytes: int = 4, half: str = "float16") -> None:
        self.tensors = (TensorSpec("weights", numel, dtype_bytes, "model"),)
        self.encoder = LossyEncoder(bits, coder, 0, lambda key: self.tensors, lambda size: BytesView(bytearray(size)), half=half)
        self.containers: list[bytes] = []

    def write(self, weights: np.ndarray):
        start = time.process_time()
        encoded = self.encoder.encode(len(self.containers), "f", BytesView(weights.view(np.uint8)))
        data = b"".join(bytes(piece) for piece in encoded.chunks(4 << 20))
        seconds = time.process_time() - start
        assert len(data) == encoded.nbytes
        self.containers.append(data)
        return encoded, seconds

    def restore(self, upto: int) -> tuple[np.ndarray, float]:
        links = [ChainLink(i, len(c), lambda offset, n, d=c: memoryview(d)[offset : offset + n])
                 for i, c in enumerate(self.containers[: upto + 1])]
        out = bytearray(self.tensors[0].nbytes)
        start = time.process_time()
        LossyDecoder().rebuild(links, BytesView(out))
        return np.frombuffer(out, dtype=np.uint8), time.process_time() - start


def ratios(name: str, states, bits_list, coders) -> list[dict]:
    """Compression and error per checkpoint of one state, for every coder and bits."""
    states = list(states)
    rows = []
    for coder in coders:
        for bits in bits_list:
            chain = Chain(bits, coder, len(states[0]))
            per = []
            for index, weights in enumerate(states):
                encoded, _ = chain.write(weights)
                if index == 0:
                    continue
                row = {k: encoded.stats[k] for k in ("compression_ratio", "kept_fraction", "max_rel_error",
                                                       "rms_rel_error", "error_bound", "elem_rel_error_p50",
                                                       "elem_rel_error_p99", "elem_rel_error_max", "elem_zero_changed")}
                row["bits_per_element"] = 8 * encoded.nbytes / len(weights)
                row["metadata_bytes"] = encoded.metadata_bytes
                per.append(row)
            # the last checkpoint restored independently: digest, error against the bound, and
            # for sparse, whether the elements that never changed came back bit for bit
            restored, _ = chain.restore(len(states) - 1)
            assert xxhash.xxh3_128(restored.tobytes()).hexdigest() == encoded.state_digest
            restored = restored.view(np.float32)
            err = float(np.abs(weights.astype(np.float64) - restored).max() / np.abs(weights).max())
            assert err <= encoded.stats["error_bound"] and err == per[-1]["max_rel_error"], (err, encoded.stats)
            summary = {
                "state": name, "coder": coder, "bits": bits, "elements": len(states[0]), "deltas": len(per),
                "compression_ratio_mean": statistics.fmean(r["compression_ratio"] for r in per),
                "compression_ratio_min": min(r["compression_ratio"] for r in per),
                "compression_ratio_max": max(r["compression_ratio"] for r in per),
                "kept_fraction_mean": statistics.fmean(r["kept_fraction"] for r in per),
                "bits_per_element_mean": statistics.fmean(r["bits_per_element"] for r in per),
                "max_rel_error_max": max(r["max_rel_error"] for r in per),
                "rms_rel_error_last": per[-1]["rms_rel_error"],
                "error_bound_max": max(r["error_bound"] for r in per),
                "elem_rel_error_p50_max": max(r["elem_rel_error_p50"] for r in per),
                "elem_rel_error_p99_max": max(r["elem_rel_error_p99"] for r in per),
                "elem_rel_error_max": max(r["elem_rel_error_max"] for r in per),
                "per_checkpoint": per,
            }
            if name == "sparse":
                never = np.all([w == states[0] for w in states], axis=0)
                summary["never_changed_exact"] = bool(np.array_equal(
                    restored[never].view(np.uint32), states[0][never].view(np.uint32)))
            rows.append(summary)
            print(f"{name:6s} {coder:7s} bits={bits} ratio {summary['compression_ratio_mean']:8.1f} "
                  f"(min {summary['compression_ratio_min']:.1f}) kept {summary['kept_fraction_mean']:.2e} "
                  f"max_rel {summary['max_rel_error_max']:.2e} rms_rel {summary['rms_rel_error_last']:.2e} "
                  f"per element p50 {summary['elem_rel_error_p50_max']:.2e} p99 {summary['elem_rel_error_p99_max']:.2e} "
                  f"max {summary['elem_rel_error_max']:.2e}", flush=True)
    return rows


def half_ratios(numel: int, checkpoints: int, bits: int, lr: float, coders) -> list[dict]:
    """The sgd state held as bfloat16 and as float16 (2-byte tensors, `checkpoint.lossy.half`):
    each format's own ratio and errors, measured against its own values."""
    rows = []
    for half in ("bfloat16", "float16"):
        fmt = lossy_kernels.float_format(2, half)
        states = [fmt.from_f64(w.astype(np.float64)) for w in sgd_states(numel, checkpoints, lr)]
        for coder in coders:
            chain = Chain(bits, coder, numel, 2, half)
            per = [chain.write(w.view(np.uint8))[0].stats for w in states][1:]
            restored, _ = chain.restore(len(states) - 1)
            x, xr = fmt.to_f64(states[-1].tobytes()), fmt.to_f64(restored.tobytes())
            assert float(np.abs(x - xr).max() / np.abs(x).max()) <= per[-1]["error_bound"]
            row = {"half": half, "coder": coder, "bits": bits, "elements": numel,
                   **{k: max(r[k] for r in per) for k in ("max_rel_error", "error_bound", "elem_rel_error_p50",
                                                          "elem_rel_error_p99", "elem_rel_error_max")},
                   "compression_ratio_mean": statistics.fmean(r["compression_ratio"] for r in per)}
            rows.append(row)
            print(f"{half:8s} {coder:7s} bits={bits} ratio {row['compression_ratio_mean']:8.1f} max_rel {row['max_rel_error']:.2e} "
                  f"bound {row['error_bound']:.2e} per element p50 {row['elem_rel_error_p50']:.2e} "
                  f"p99 {row['elem_rel_error_p99']:.2e}", flush=True)
    return rows


def speed(numel: int, bits: int, coders, repeats: int, lr: float) -> list[dict]:
    """Encode and decode MB/s per core on the sgd state (one delta at a time)."""
    states = list(sgd_states(numel, 2 + repeats, lr))
    logical = 4 * numel
    rows = []
    for coder in coders:
        chain = Chain(bits, coder, numel)
        full_s = chain.write(states[0])[1]
        encode_s = [chain.write(w)[1] for w in states[1:]]
        restore_s = [chain.restore(i)[1] for i in range(len(states))]  # chain of i+1 links
        one_link = restore_s[0]
        decode_s = [(restore_s[i] - one_link) / i for i in range(1, len(restore_s))]
        rows.append({
            "coder": coder, "bits": bits, "logical_bytes": logical,
            "encode_full_MBps": logical / full_s / 1e6,
            "encode_delta_MBps": logical / statistics.median(encode_s) / 1e6,
            "decode_delta_MBps": logical / statistics.median(decode_s) / 1e6,
            "restore_full_link_MBps": logical / one_link / 1e6,
            "restore_s_by_chain_length": restore_s,
            "encode_delta_s": encode_s,
        })
        r = rows[-1]
        print(f"speed  {coder:7s} bits={bits} encode {r['encode_delta_MBps']:.0f} MB/s, decode {r['decode_delta_MBps']:.0f} MB/s "
              f"(full: encode {r['encode_full_MBps']:.0f}, restore {r['restore_full_link_MBps']:.0f} MB/s)", flush=True)
    return rows


def chain_restore(mib: float, ntensors: int, links: int, bits: int, coders, lr: float) -> list[dict]:
    """Restore of a `links`-link chain of a `mib` MiB float32 model of `ntensors` tensors (CPU s):
    the decoder's cost per link and per tensor, the issue's 100-link chain of a 1 MiB model."""
    numel = int(mib * (1 << 20)) // 4
    sizes = [numel // ntensors] * ntensors
    sizes[-1] += numel - sum(sizes)
    tensors = tuple(TensorSpec(f"t{i}", n, 4, "model") for i, n in enumerate(sizes))
    rows = []
    for coder in coders:
        encoder = LossyEncoder(bits, coder, 0, lambda key: tensors, lambda size: BytesView(bytearray(size)))
        containers, encode_s = [], 0.0
        for index, weights in enumerate(sgd_states(numel, links, lr, seed=3)):
            start = time.process_time()
            encoded = encoder.encode(index, "f", BytesView(weights.view(np.uint8)))
            containers.append(b"".join(bytes(piece) for piece in encoded.chunks(4 << 20)))
            encode_s += time.process_time() - start
        chain = [ChainLink(i, len(c), lambda offset, n, d=c: memoryview(d)[offset : offset + n]) for i, c in enumerate(containers)]
        out = bytearray(4 * numel)
        start = time.process_time()
        LossyDecoder().rebuild(chain, BytesView(out))
        restore_s = time.process_time() - start
        assert xxhash.xxh3_128(bytes(out)).hexdigest() == encoded.state_digest
        rows.append({"coder": coder, "bits": bits, "mib": mib, "tensors": ntensors, "links": links,
                     "restore_s": restore_s, "restore_ms_per_link_per_tensor": 1e3 * restore_s / links / ntensors,
                     "encode_MBps": links * 4 * numel / encode_s / 1e6})
        print(f"chain  {coder:7s} bits={bits} {links} links of a {mib} MiB model in {ntensors} tensors: restore "
              f"{restore_s:.3f} s ({rows[-1]['restore_ms_per_link_per_tensor']:.2f} ms per link per tensor), "
              f"encode {rows[-1]['encode_MBps']:.0f} MB/s", flush=True)
    return rows


def peak_rss(gib: float, coder: str, folder: str) -> dict:
    """Peak RSS while encoding a `gib` GiB float32 shard that never is in memory whole: the state,
    xr and the spool are unlinked files (ScratchStore), the state is generated and updated piece by
    piece, and the containers are streamed out and dropped: a full checkpoint, then one delta."""
    import resource

    from dlio_ckpt.state.store import ScratchStore

    numel = int(gib * (1 << 30)) // 4
    piece = 1 << 22  # elements generated at a time
    tensors = (TensorSpec("weights", numel, 4, "model"),)
    def store(size: int) -> ScratchStore:
        return ScratchStore(size, folder, memory_limit=0)

    def rss_mib() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    baseline = rss_mib()
    state = store(4 * numel)
    rng = np.random.default_rng(0)
    for at in range(0, numel, piece):
        state.write_at(4 * at, rng.normal(0, 0.02, min(piece, numel - at)).astype(np.float32))
    encoder = LossyEncoder(3, coder, 0, lambda key: tensors, store)
    row = {"coder": coder, "logical_bytes": 4 * numel, "rss_baseline_mib": baseline}
    for index in range(2):
        if index:
            for at in range(0, numel, piece):
                n = min(piece, numel - at)
                w = np.frombuffer(state.read_at(4 * at, 4 * n), dtype=np.float32)
                state.write_at(4 * at, w + (2e-5 * rng.standard_t(3, n)).astype(np.float32))
        start = time.process_time()
        encoded = encoder.encode(index, "shard", state)
        for _ in encoded.chunks(8 << 20):
            pass
        row[f"{'delta' if index else 'full'}_encode_cpu_s"] = time.process_time() - start
        row[f"{'delta' if index else 'full'}_bytes"] = encoded.nbytes
        row[f"rss_after_{'delta' if index else 'full'}_mib"] = rss_mib()
    encoder.reset()
    state.close()
    print(f"rss    {coder:7s} {gib} GiB shard: peak RSS {row['rss_after_delta_mib']:.0f} MiB "
          f"(baseline {baseline:.0f} MiB), delta {row['delta_bytes'] / 2**20:.1f} MiB", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=16, help="float32 state size for sgd/sparse (MiB)")
    parser.add_argument("--checkpoints", type=int, default=5, help="checkpoints per chain (the first is full)")
    parser.add_argument("--bits", default="1,2,3,4,8")
    parser.add_argument("--time-bits", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3, help="sgd: step scale relative to the weights' 0.02")
    parser.add_argument("--trace-every", type=int, default=50, help="trace: SGD steps between checkpoints")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chain-links", type=int, default=100, help="links of the 1 MiB model's chain restored")
    parser.add_argument("--chain-tensors", type=int, default=8, help="tensors of the 1 MiB model")
    parser.add_argument("--rss-gib", type=float, default=0,
                        help="only measure peak RSS encoding a shard of this many GiB (files in --tmp)")
    parser.add_argument("--rss-child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", default="", help="folder for --rss-gib's scratch files (default: system temp)")
    parser.add_argument("--quick", action="store_true", help="8 MiB, bits 3, 3 checkpoints, 1 repeat")
    parser.add_argument("--numpy", action="store_true", help="the numpy reference path, without the C loops (the before)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "lossy_codec.json"))
    args = parser.parse_args()
    if args.numpy:
        lossy_kernels._C = None
    if args.quick:
        args.mib, args.bits, args.checkpoints, args.repeats = 8, "3", 3, 1
    if args.rss_child:  # one coder per process, so that ru_maxrss is that coder's alone
        Path(args.out).write_text(json.dumps(peak_rss(args.rss_gib, args.rss_child, args.tmp)))
        return
    if args.rss_gib:
        out = Path(args.out)
        if out.name == "lossy_codec.json":
            out = out.with_name("lossy_rss.json")
        rows = []
        for coder in ("huffman", "zstd"):
            child = out.with_name(f".lossy_rss_{coder}.json")
            subprocess.run([sys.executable, __file__, "--rss-gib", str(args.rss_gib), "--rss-child", coder,
                            "--tmp", args.tmp, "--out", str(child)], check=True)
            rows.append(json.loads(child.read_text()))
            child.unlink()
        out.write_text(json.dumps({"benchmark": "lossy_codec --rss-gib", "gib": args.rss_gib, "rows": rows,
                                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                   "load_average": os.getloadavg()}, indent=1) + "\n")
        print(f"wrote {out}")
        return
    bits_list = [int(b) for b in args.bits.split(",")]
    coders = ("huffman", "zstd")
    numel = args.mib * (1 << 20) // 4
    load_before = os.getloadavg()
    started = time.time()
    results = {
        "benchmark": "lossy_codec",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "numpy": np.__version__,
                    "platform": platform.platform()},
        "kernels": "numpy" if lossy_kernels._C is None else "C (codec/_lossy_c.c)",
        "settings": vars(args),
        "ratios": [],
    }
    results["ratios"] += ratios("sgd", sgd_states(numel, args.checkpoints, args.lr), bits_list, coders)
    results["ratios"] += ratios("sparse", sparse_states(numel, args.checkpoints, 0.01), bits_list, coders)
    trace = trace_states(max(args.checkpoints, 2) * 2, args.trace_every)
    if trace is None:
        print("trace: dlio_ckpt/state/mlp_trace.py is not there; skipped")
    else:
        results["ratios"] += ratios("trace", trace, bits_list, coders)
    results["half"] = half_ratios(numel // 2, args.checkpoints, args.time_bits, args.lr, coders)
    results["speed"] = speed(numel, args.time_bits, coders, args.repeats, args.lr)
    results["chain"] = chain_restore(1, args.chain_tensors, args.chain_links, args.time_bits, coders, args.lr)
    results["load_average"] = {"before": load_before, "after": os.getloadavg()}
    results["wall_s"] = time.time() - started
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
