"""How close the `sgd` update model's deltas are to real SGD's (`trace`), as LC-Checkpoint sees them.

Both models evolve the same float32 file through RankState (dlio_ckpt/state), checkpointed every
`--interval` steps. For each checkpoint interval the delta x_b - x_a of every element is
summarised: its size against the weights (rel_rms), its shape (kurtosis, median |d| / rms, the
fraction of exactly unchanged elements), the distribution of its binary exponents (frexp) counted
from the exponent of its rms, and the entropy of the (sign, exponent) buckets LC-Checkpoint forms;
and the same states go through the real LossyEncoder (codec/lossy.py; Huffman, `--bits`), whose
compression ratio and rms error are printed beside them. `trace` is the reference (a tiny numpy MLP
trained with SGD, its parameters tiled over the file); `sgd` is what a large run uses. Nothing is
asserted; --out writes the figures as JSON.

    python benchmarks/state_deltas.py [--mib 16] [--interval 100] [--checkpoints 10] [--bits 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, table, write_json

from dlio_ckpt.codec.lossy import LossyEncoder
from dlio_ckpt.config.load import load_config
from dlio_ckpt.content import ByteSource
from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.rank_state import RankState
from dlio_ckpt.state.store import ScratchStore

EXPONENTS = range(-8, 4)  # exponent of |delta| minus the exponent of rms(delta), for the histogram


def delta_figures(before: np.ndarray, after: np.ndarray) -> dict:
    delta = after - before
    rms = float(np.sqrt(np.mean(delta**2)))
    moved = delta[delta != 0]
    exponents = np.frexp(moved)[1] - np.frexp(rms)[1]
    signed = exponents * 2 + (moved < 0)
    counts = np.unique(signed, return_counts=True)[1] / len(moved)
    histogram = {str(e): float(np.mean(exponents == e)) for e in EXPONENTS}
    histogram["lower"] = float(np.mean(exponents < EXPONENTS[0]))
    histogram["higher"] = float(np.mean(exponents > EXPONENTS[-1]))
    return {
        "rel_rms": rms / float(np.sqrt(np.mean(before**2))),
        "kurtosis": float(np.mean(delta**4) / rms**4),
        "median_over_rms": float(np.median(np.abs(delta)) / rms),
        "unchanged": float(np.mean(delta == 0)),
        "bucket_entropy_bits": float(-(counts * np.log2(counts)).sum()),
        "exponent_histogram": histogram,
    }


def run_model(model: str, args, pf: PlannedFile) -> list[dict]:
    cfg = dataclasses.replace(load_config([]).checkpoint, update=model, learning_rate=args.learning_rate)
    state = RankState((pf,), cfg, args.seed, ByteSource(seed=args.seed, pool_bytes=4 << 20))
    encoder = LossyEncoder(args.bits, "huffman", 0, lambda key: pf.tensors, lambda size: ScratchStore(size))
    rows, previous = [], None
    for index in range(args.checkpoints + 1):
        state.advance(index * args.interval)
        values = np.frombuffer(bytes(state.view(pf).read_at(0, pf.payload_bytes)), dtype=np.float32).astype(np.float64)
        encoded = encoder.encode(index, pf.relpath, state.view(pf))
        for _ in encoded.chunks(1 << 20):
            pass
        if previous is not None:
            row = {"interval": [(index - 1) * args.interval, index * args.interval], **delta_figures(previous, values)}
            row["lc_ratio"] = encoded.stats["compression_ratio"]
            row["lc_rms_rel_error"] = encoded.stats["rms_rel_error"]
            rows.append(row)
        previous = values
    encoder.reset()
    state.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--interval", type=int, default=100)
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument("--bits", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pf = PlannedFile("deltas/{step}.bin", 0, (TensorSpec("w", (args.mib << 20) // 4, 4, "model"),))
    results = {model: run_model(model, args, pf) for model in ("sgd", "trace")}

    header = ["interval", "model", "rel_rms", "kurtosis", "med/rms", "unchanged", "H(bucket)", f"LC {args.bits}b ratio", "LC rms err"]
    rows = [[f"{r['interval'][0]}-{r['interval'][1]}", model, f"{r['rel_rms']:.2e}", f"{r['kurtosis']:.1f}",
             f"{r['median_over_rms']:.2f}", f"{r['unchanged']:.3f}", f"{r['bucket_entropy_bits']:.2f}",
             f"{r['lc_ratio']:.1f}", f"{r['lc_rms_rel_error']:.1e}"]
            for pair in zip(results["sgd"], results["trace"]) for model, r in zip(("sgd", "trace"), pair)]
    print(table(rows, header))
    print("\nexponent of |delta| relative to rms(delta), share of changed elements, averaged over intervals:")
    keys = ["lower", *map(str, EXPONENTS), "higher"]
    print(table([[model] + [f"{np.mean([r['exponent_histogram'][k] for r in results[model]]):.3f}" for k in keys]
                 for model in results], ["model", *keys]))
    if args.out:
        write_json(args.out, {"environment": environment(str(Path.cwd())), "args": {k: str(v) for k, v in vars(args).items()},
                              "results": results})


if __name__ == "__main__":
    main()
