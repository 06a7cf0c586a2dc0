"""Row-sparse incremental checkpoints: savings against the Merkle leaf size (issue 23, item 3).

An embedding-like file of `--rows` rows of `--row-bytes` bytes evolves under
`checkpoint.update=sparse` with the row as the update unit (`update_chunk_bytes`); `--fraction`
of the rows change per training step, and a checkpoint is taken every `--interval` steps through
the real IncrementalEncoder (codec/incremental.py) at each leaf size, and at the default leaf
(`checkpoint.incremental.chunk_bytes=0`: chosen from the update unit, `choose_leaf_bytes`).
For each incremental checkpoint: the bytes it writes, the rows that really changed (counted by
comparing the state's rows before and after, independently of the encoder), and the ideal: the
changed rows' bytes plus a 32-byte header and 8 bytes of row index per changed row. Printed: the
savings (logical bytes / written) and written / ideal per leaf size. Nothing is asserted; --out
writes JSON.

    python benchmarks/sparse_leaves.py [--rows 65536] [--row-bytes 256] [--fraction 0.01] [--interval 1]
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
from dlio_ckpt.config.load import load_config
from dlio_ckpt.content import ByteSource
from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.rank_state import RankState

LEAVES = (256, 1 << 10, 4 << 10, 16 << 10, 64 << 10)
HEADER_BYTES, INDEX_BYTES = 32, 8


def run_leaf(leaf: int, args, pf: PlannedFile, cfg) -> dict:
    state = RankState((pf,), cfg, args.seed, ByteSource(seed=args.seed, pool_bytes=4 << 20))
    encoder = IncrementalEncoder(leaf)
    written, ideal, changed, logical, encode_s = [], [], [], [], []
    previous = None
    for index in range(args.checkpoints + 1):
        state.advance(index * args.interval)
        rows = np.frombuffer(bytes(state.view(pf).read_at(0, pf.payload_bytes)), np.uint8).reshape(-1, args.row_bytes)
        started = time.perf_counter()
        encoded = encoder.encode(index, pf.relpath, state.view(pf))
        encode_s.append(time.perf_counter() - started)
        encoder.settle(index, True)
        if previous is not None:
            moved = int(np.any(rows != previous, axis=1).sum())
            changed.append(moved)
            written.append(encoded.nbytes)
            ideal.append(moved * args.row_bytes + HEADER_BYTES + INDEX_BYTES * moved)
            logical.append(pf.payload_bytes)
        previous = rows.copy()
    state.close()
    return {"leaf_bytes": leaf, "savings": float(np.sum(logical) / np.sum(written)),
            "written_over_ideal": float(np.sum(written) / np.sum(ideal)),
            "ideal_savings": float(np.sum(logical) / np.sum(ideal)),
            "changed_rows_per_checkpoint": float(np.mean(changed)), "bytes_written_mean": float(np.mean(written)),
            "encode_s_median": float(np.median(encode_s[1:]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=65536)
    parser.add_argument("--row-bytes", type=int, default=256)
    parser.add_argument("--fraction", type=float, default=0.01, help="chance that a row changes per training step")
    parser.add_argument("--interval", type=int, default=1, help="training steps between checkpoints")
    parser.add_argument("--checkpoints", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pf = PlannedFile("embedding/{step}.bin", 0, (TensorSpec("table", args.rows * args.row_bytes // 4, 4, "model"),))
    cfg = dataclasses.replace(load_config([]).checkpoint, update="sparse", update_chunk_bytes=args.row_bytes,
                              update_fraction=args.fraction)
    default = choose_leaf_bytes(0, "sparse", args.row_bytes)
    results = [run_leaf(leaf, args, pf, cfg) for leaf in sorted(set(LEAVES) | {default})]
    rows = [[f"{r['leaf_bytes']} B" + (" (default)" if r["leaf_bytes"] == default else ""), f"{r['savings']:.1f}x",
             f"{r['written_over_ideal']:.2f}", f"{r['ideal_savings']:.1f}x", f"{r['changed_rows_per_checkpoint']:.0f}",
             f"{r['encode_s_median'] * 1000:.0f}"] for r in results]
    print(f"{args.rows} rows of {args.row_bytes} B ({pf.payload_bytes >> 20} MiB), {args.fraction:.2%} of rows change per "
          f"step, a checkpoint every {args.interval} step(s)")
    print(table(rows, ["leaf", "savings", "written / ideal", "ideal savings", "rows changed", "encode ms"]))
    if args.out:
        write_json(args.out, {"environment": environment(str(Path.cwd())), "args": {k: str(v) for k, v in vars(args).items()},
                              "default_leaf_bytes": default, "results": results})


if __name__ == "__main__":
    main()
