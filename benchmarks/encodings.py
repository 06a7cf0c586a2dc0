#!/usr/bin/env python3
"""Bytes written and time per checkpoint encoding (full / incremental / lossy) on one evolving state.

Why: incremental (Merkle tree) and lossy (LC-Checkpoint) checkpoints trade encoding work for
fewer bytes on storage; whether that pays depends on how the state changes and on the storage.
This runs the same state through every encoding with `mode=checkpoint` (MLPerf's procedure: W
writes, then W reads, each read a restore through the chain), and prints per configuration:
the state per checkpoint, what reached storage over the run, the ratio to a full checkpoint of
the same state, the encoding time and write time per checkpoint against the full run's, the
paper's incremental baselines (changed chunks only, per-chunk list), the lossy error, restore
time against chain length, and the peak RSS of the rank.

The model: float16 weights (`--params` elements in 4 layers) plus the optimizer's three float32
states of the default config (master weights, Adam's m and v): 14 bytes a parameter, so
`--params 19173961` is a 256 MiB state. One rank.
Updates: sparse (`--fraction` of 64 KiB units change per step), sgd (every value moves a
heavy-tailed step), trace (deltas of a tiny numpy MLP trained with SGD); mode=checkpoint
advances one training step between checkpoints, which is CheckFreq's per-iteration regime.

    .venv/bin/python benchmarks/encodings.py --quick          # 32 MiB state, 3 checkpoints
    .venv/bin/python benchmarks/encodings.py                  # 256 MiB state, 4 checkpoints
    .venv/bin/python benchmarks/encodings.py --params 429496730 --only lossy-sgd-huffman,incremental-sparse \
        --checkpoints 2 --out encodings_4gib.json            # a 4 GiB shard: peak RSS while encoding
    .venv/bin/python benchmarks/encodings.py --params 4793490 --checkpoints 3 --bits 8 \
        --mantissa-bits 0,2,4,6,8 --only lossy-sparse-huffman --out lossy_mantissa.json
                                                             # 64 MiB: checkpoint.lossy.mantissa_bits on sparse
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import MIB, Workdir, environment, run, table, tool, write_json  # noqa: E402

HERE = Path(__file__).resolve().parent

CONFIGS = {  # name -> overrides
    "full-random": ["checkpoint.update=random", "checkpoint.encoding=full"],
    "full-sparse": ["checkpoint.update=sparse", "checkpoint.encoding=full"],
    "incremental-sparse": ["checkpoint.update=sparse", "checkpoint.encoding=incremental"],
    "incremental-sgd": ["checkpoint.update=sgd", "checkpoint.encoding=incremental"],
    "full-sgd": ["checkpoint.update=sgd", "checkpoint.encoding=full"],
    "lossy-sgd-huffman": ["checkpoint.update=sgd", "checkpoint.encoding=lossy", "checkpoint.lossy.coder=huffman"],
    "lossy-sgd-zstd": ["checkpoint.update=sgd", "checkpoint.encoding=lossy", "checkpoint.lossy.coder=zstd"],
    "lossy-trace-huffman": ["checkpoint.update=trace", "checkpoint.encoding=lossy", "checkpoint.lossy.coder=huffman"],
    "lossy-trace-zstd": ["checkpoint.update=trace", "checkpoint.encoding=lossy", "checkpoint.lossy.coder=zstd"],
    "lossy-sparse-huffman": ["checkpoint.update=sparse", "checkpoint.encoding=lossy", "checkpoint.lossy.coder=huffman"],
}
FULL_OF = {"sparse": "full-sparse", "sgd": "full-sgd", "trace": "full-sgd", "random": "full-random"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="32 MiB state, 3 checkpoints")
    p.add_argument("--params", type=int, default=19173961, help="parameters (14 bytes each); default 256 MiB")
    p.add_argument("--checkpoints", type=int, default=4)
    p.add_argument("--fraction", type=float, default=0.01, help="sparse: fraction of units changed per step")
    p.add_argument("--bits", type=int, default=3, help="lossy: checkpoint.lossy.bits")
    p.add_argument("--mantissa-bits", default="0",
                   help="lossy: checkpoint.lossy.mantissa_bits; several, comma-separated: each lossy configuration once per value")
    p.add_argument("--leaf", default="256KiB", help="incremental: checkpoint.incremental.chunk_bytes")
    p.add_argument("--only", default="", help="comma-separated configuration names (default: all)")
    p.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--out", default="encodings.json", help="file name under benchmarks/results")
    args = p.parse_args(argv)
    if args.quick:
        args.params, args.checkpoints = 2396745, 3  # 32 MiB
    return args


def mib(nbytes: float) -> str:
    return f"{nbytes / MIB:.1f} MiB"


def one_run(name: str, args: argparse.Namespace, work: Path, mantissa_bits: int = 0, label: str = "") -> dict:
    label = label or name
    store, run_dir = work / f"store-{label}", work / f"run-{label}"
    quarter = args.params // 4
    cmd = [tool("dlio_ckpt"), "mode=checkpoint", "progress=false", "model.kind=explicit", "model.model_size_bytes=0",
           f"model.layer_parameters=[{quarter},{quarter},{quarter},{args.params - 3 * quarter}]",
           f"model.optimization_groups=[{args.params}]", f"checkpoint.num_checkpoints_write={args.checkpoints}",
           f"checkpoint.num_checkpoints_read={args.checkpoints}", "checkpoint.keep_last=0",
           f"checkpoint.update_fraction={args.fraction}", f"checkpoint.lossy.bits={args.bits}",
           f"checkpoint.lossy.mantissa_bits={mantissa_bits}",
           f"checkpoint.incremental.chunk_bytes={args.leaf}", f"checkpoint.state_dir={work}",
           f"storage.root={store}", f"hydra.run.dir={run_dir}", *CONFIGS[name]]
    _, wall = run(cmd, cwd=str(work), log=work / "commands.log")
    summary = json.loads((run_dir / "summary.json").read_text())
    ck = summary["checkpoint"]
    rows = ck["per_checkpoint"]
    later = rows[1:] or rows
    codec = [r.get("codec", {}) for r in later]
    result = {
        "name": label, "configuration": name, "overrides": CONFIGS[name], "mantissa_bits": mantissa_bits, "wall_s": wall,
        "logical_bytes": rows[0]["logical_bytes"],
        "bytes_written_total": sum(r["bytes_written"] for r in rows),
        "bytes_written_after_first_mean": sum(r["bytes_written"] for r in later) / len(later),
        "encode_s_mean": sum(r["encode_s_max"] for r in rows) / len(rows),
        "write_s_mean": sum(r["write_s_max"] for r in rows) / len(rows),
        "blocking_s_mean": sum(r["blocking_s_max"] for r in rows) / len(rows),
        "peak_rss_bytes": ck.get("peak_rss_bytes_max", 0),
        "restores": [{"chain_length": r.get("chain_length", 0), "read_s": r["read_s_max"], "bytes": r["bytes"],
                      "verified": r["verified"]} for r in ck.get("per_read", [])],
        "per_checkpoint": rows,
    }
    for key in ("max_rel_error", "rms_rel_error", "error_bound"):
        if key in rows[-1]:
            result[key] = max(r.get(key, 0.0) for r in rows)
    for key in ("baseline_changed_chunks_bytes", "baseline_chunk_list_bytes", "baseline_full_bytes"):
        if any(key in c for c in codec):
            result[key + "_after_first_mean"] = sum(c.get(key, 0) for c in codec) / len(codec)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"unknown configuration(s) {', '.join(unknown)}; choose from {', '.join(CONFIGS)}", file=sys.stderr)
        return 2
    mantissa = [int(m) for m in args.mantissa_bits.split(",")]
    runs = []  # (configuration, mantissa_bits, label)
    for name in names:
        if name.startswith("lossy") and len(mantissa) > 1:
            runs += [(name, m, f"{name}-m{m}") for m in mantissa]
        else:
            runs.append((name, mantissa[0] if name.startswith("lossy") else 0, name))
    results = []
    with Workdir(args.dir, args.keep, "dlio_ckpt_encodings_") as work:
        env = environment(str(work))
        for name, m, label in runs:
            start = time.perf_counter()
            results.append(one_run(name, args, work, m, label))
            print(f"{label}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    by_name = {r["name"]: r for r in results}
    rows = []
    for r in results:
        update = next(o.split("=")[1] for o in r["overrides"] if o.startswith("checkpoint.update="))
        full = by_name.get(FULL_OF[update])
        later = r["bytes_written_after_first_mean"]
        restores = r["restores"]
        rows.append([
            r["name"], mib(r["logical_bytes"]), mib(int(later)), f"{r['logical_bytes'] / later:.1f}x",
            f"{r['encode_s_mean']:.3f}", f"{r['write_s_mean']:.3f}",
            f"{r['blocking_s_mean'] / full['blocking_s_mean']:.2f}" if full else "-",
            f"{r.get('max_rel_error', 0):.2e}" if "max_rel_error" in r else "-",
            (f"{restores[-1]['read_s']:.2f}s/{restores[-1]['chain_length']}" if restores else "-"),
            mib(r["peak_rss_bytes"]),
        ])
    print(table(rows, ["configuration", "state", "written/ckpt", "ratio", "encode s", "write s", "time vs full",
                       "max rel err", "restore s/chain", "peak RSS"]))
    baselines = [[r["name"], mib(int(r["bytes_written_after_first_mean"])),
                  mib(int(r["baseline_changed_chunks_bytes_after_first_mean"])),
                  mib(int(r["baseline_chunk_list_bytes_after_first_mean"]))]
                 for r in results if "baseline_changed_chunks_bytes_after_first_mean" in r]
    if baselines:
        print("\nincremental against the paper's baselines (mean per checkpoint after the first):")
        print(table(baselines, ["configuration", "tree (written)", "changed chunks only", "per-chunk list"]))
    write_json(HERE / "results" / args.out, {"environment": env, "command": " ".join(["benchmarks/encodings.py", *(sys.argv[1:] if argv is None else argv)]),
                                             "args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
