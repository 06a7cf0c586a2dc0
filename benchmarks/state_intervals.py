"""Savings against the checkpoint interval, now that the state evolves per training step (issue 23).

The state at step s is a function of the seed and s, so the delta between two checkpoints grows
with the steps between them, and so does what an incremental or lossy checkpoint must write, as in
training. For each interval k (training steps between checkpoints) a file evolves through
RankState and is checkpointed every k steps through the real encoders:
- `sparse` (rows of `--row-bytes`, `--fraction` of them changing per step), IncrementalEncoder at
  the default leaf (the row): savings = logical bytes / bytes written, against 1 / (1-(1-f)^k);
- `sgd` and `trace` (float32), LossyEncoder (LC-Checkpoint, `--bits`, Huffman): compression ratio.
The median time of `advance` over an interval is printed beside (the per-step evolution's cost:
one pass per checkpoint whatever k). Nothing is asserted; --out writes JSON.

    python benchmarks/state_intervals.py [--mib 4] [--intervals 1 10 100] [--checkpoints 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, table, write_json

from dlio_ckpt.codec.incremental import IncrementalEncoder, choose_leaf_bytes
from dlio_ckpt.codec.lossy import LossyEncoder
from dlio_ckpt.config.load import load_config
from dlio_ckpt.content import ByteSource
from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.rank_state import RankState
from dlio_ckpt.state.store import ScratchStore


def run(model: str, interval: int, args, pf: PlannedFile) -> dict:
    cfg = dataclasses.replace(load_config([]).checkpoint, update=model, update_chunk_bytes=args.row_bytes,
                              update_fraction=args.fraction)
    state = RankState((pf,), cfg, args.seed, ByteSource(seed=args.seed, pool_bytes=4 << 20))
    if model == "sparse":
        encoder = IncrementalEncoder(choose_leaf_bytes(0, model, args.row_bytes))
    else:
        encoder = LossyEncoder(args.bits, "huffman", 0, lambda key: pf.tensors, lambda size: ScratchStore(size))
    logical, written, advance_s = 0, 0, []
    for index in range(args.checkpoints + 1):
        started = time.perf_counter()
        state.advance(args.start + index * interval)
        advance_s.append(time.perf_counter() - started)
        encoded = encoder.encode(index, pf.relpath, state.view(pf))
        for _ in encoded.chunks(1 << 20):
            pass
        if hasattr(encoder, "settle"):
            encoder.settle(index, True)
        if index:
            logical += pf.payload_bytes
            written += encoded.nbytes
    state.close()
    return {"model": model, "interval": interval, "ratio": logical / written,
            "advance_ms_median": float(np.median(advance_s[1:]) * 1000)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("--start", type=int, default=100, help="the first checkpoint's step (past the steepest decay)")
    parser.add_argument("--row-bytes", type=int, default=256)
    parser.add_argument("--fraction", type=float, default=0.001)
    parser.add_argument("--bits", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["sparse", "sgd", "trace"])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pf = PlannedFile("state/{step}.bin", 0, (TensorSpec("w", (args.mib << 20) // 4, 4, "model"),))
    results = [run(model, k, args, pf) for model in args.models for k in args.intervals]
    rows = []
    for r in results:
        expected = ""
        if r["model"] == "sparse":
            expected = f"{1 / (1 - (1 - args.fraction) ** r['interval']):.1f}x"
        rows.append([r["model"], str(r["interval"]), f"{r['ratio']:.1f}x", expected, f"{r['advance_ms_median']:.1f}"])
    print(f"{args.mib} MiB float32 file; sparse: {args.row_bytes} B rows, {args.fraction:.2%} change per step, incremental "
          f"at the default leaf; sgd/trace: LC-Checkpoint {args.bits}-bit Huffman")
    print(table(rows, ["model", "interval (steps)", "ratio", "1/changed (sparse)", "advance ms"]))
    if args.out:
        write_json(args.out, {"environment": environment(str(Path.cwd())), "args": {k: str(v) for k, v in vars(args).items()},
                              "results": results})


if __name__ == "__main__":
    main()
