"""`sgd` against real torch trajectories, as LC-Checkpoint sees them (issue 23: calibration).

Real: small MLPs (64-W-W-10, ReLU) trained on a random teacher's labels with torch, SGD with
momentum 0.9 (lr 0.05) and Adam (lr 1e-3), their parameters (float32) taken every step. Emulated:
the `sgd` update model (RankState, a float32 file of `--elements`), at the default learning rate.
For each checkpoint interval k, a chain of checkpoints every k steps from `--start` goes through
the real LossyEncoder (codec/lossy.py, `--bits`, Huffman); printed: the compression ratio after
the first checkpoint (logical / written). Only the project's public pieces are used, so the same
script measures an older checkout (PYTHONPATH=<checkout>; `--label` names it in the JSON).
Nothing is asserted; --out writes JSON.

    python benchmarks/sgd_calibration.py [--intervals 1 5 10 20] [--checkpoints 4] [--out FILE]
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
from dlio_ckpt.state.base import BytesView
from dlio_ckpt.state.rank_state import RankState
from dlio_ckpt.state.store import ScratchStore


def lc_ratio(states: list[np.ndarray], bits: int) -> float:
    pf = PlannedFile("c/{step}.bin", 0, (TensorSpec("w", len(states[0]), 4, "model"),))
    encoder = LossyEncoder(bits, "huffman", 0, lambda key: pf.tensors, lambda size: ScratchStore(size))
    written = 0
    for index, values in enumerate(states):
        encoded = encoder.encode(index, "c", BytesView(bytearray(values.astype(np.float32).tobytes())))
        for _ in encoded.chunks(1 << 20):
            pass
        written += encoded.nbytes if index else 0
    return len(states[0]) * 4 * (len(states) - 1) / written


def torch_states(optimizer: str, steps: int, width: int, seed: int) -> list[np.ndarray]:
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 10))
    teacher = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
    opt = (torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if optimizer == "sgd+momentum"
           else torch.optim.Adam(model.parameters(), lr=1e-3))
    flat = lambda: torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().copy()
    states = [flat()]
    for _ in range(steps):
        x = torch.randn(64, 64)
        with torch.no_grad():
            labels = teacher(x).argmax(1)
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        states.append(flat())
    return states


def sgd_states(steps: list[int], elements: int, seed: int) -> list[np.ndarray]:
    cfg = dataclasses.replace(load_config([]).checkpoint, update="sgd")
    pf = PlannedFile("w/{step}.bin", 0, (TensorSpec("w", elements, 4, "model"),))
    state = RankState((pf,), cfg, seed, ByteSource(seed=seed, pool_bytes=4 << 20))
    out = []
    for step in steps:
        state.advance(step)
        out.append(np.frombuffer(bytes(state.view(pf).read_at(0, elements * 4)), np.float32).copy())
    state.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 5, 10, 20])
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--elements", type=int, default=1 << 19)
    parser.add_argument("--bits", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--no-torch", action="store_true", help="only the emulated model")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    last = args.start + max(args.intervals) * args.checkpoints
    results = []
    if not args.no_torch:
        for width in args.widths:
            for optimizer in ("sgd+momentum", "adam"):
                states = torch_states(optimizer, last, width, args.seed)
                for k in args.intervals:
                    chain = [states[s] for s in range(args.start, args.start + k * args.checkpoints + 1, k)]
                    results.append({"source": f"torch {optimizer}, width {width} ({len(states[0])} params)",
                                    "interval": k, "ratio": lc_ratio(chain, args.bits)})
    for k in args.intervals:
        steps = list(range(args.start, args.start + k * args.checkpoints + 1, k))
        results.append({"source": f"sgd model ({args.label})", "interval": k,
                        "ratio": lc_ratio(sgd_states(steps, args.elements, args.seed + 42), args.bits)})
    sources = list(dict.fromkeys(r["source"] for r in results))
    rows = [[source] + [f"{r['ratio']:.1f}x" for k in args.intervals for r in results
                        if r["source"] == source and r["interval"] == k] for source in sources]
    print(f"LC-Checkpoint {args.bits}-bit Huffman ratio, a checkpoint every k steps from step {args.start}, "
          f"{args.checkpoints} deltas")
    print(table(rows, ["states"] + [f"k={k}" for k in args.intervals]))
    if args.out:
        write_json(args.out, {"environment": environment(str(Path.cwd())), "args": {k: str(v) for k, v in vars(args).items()},
                              "results": results})


if __name__ == "__main__":
    main()
