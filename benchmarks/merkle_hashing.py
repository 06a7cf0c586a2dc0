"""Merkle hashing throughput per core against this machine's memory bandwidth (issue 9).

The reference is a numpy copy of the same buffer (np.copyto into a second, already faulted one):
what one core moves through memory. Against it, on one core and the same buffer (larger than the
caches), for each leaf size:
- `leaf_hash`: the 16-byte digest of every leaf alone (the tree's leaves);
- `hash_pass`: merkle.hash_leaves, what the encoder's first pass does: every leaf's digest plus
  the xxh3_128 state digest of the whole buffer, each leaf hashed twice while it is in cache;
- `encode`: IncrementalEncoder.encode of a second checkpoint in which 2% of the 64 KiB blocks
  changed (hash pass, tree, labels, table), then its emit pass (EncodedFile.chunks, the changed
  leaves); `written` = its container / the state (smaller leaves find the changes more exactly);
- `blake3_pass`: hash_pass with BLAKE3 leaves (checkpoint.incremental.hash=blake3).
Copy and hashing alternate round by round so load from other work falls on both; medians are
reported, with ratio = throughput / copy throughput (the issue's target: >= 0.5). Nothing is asserted.

    python benchmarks/merkle_hashing.py [--mib 256] [--leaves 4KiB,16KiB,64KiB,256KiB,1MiB,4MiB] [--rounds 5] [--out FILE]
    python benchmarks/merkle_hashing.py --quick        # 64 MiB, 3 rounds, ~10 s
    python benchmarks/merkle_hashing.py --rss-gib 4 --leaves 256KiB --out results/merkle_rss.json
        # peak RSS of encoding a 4 GiB shard (generated piece by piece, never whole) twice
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, parse_size, table, write_json

from dlio_ckpt.codec import merkle
from dlio_ckpt.codec.incremental import IncrementalEncoder
from dlio_ckpt.state.base import BytesView

GIB = 1 << 30


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def leaf_hash(buffer: memoryview, leaf: int) -> None:
    digest = xxhash.xxh3_128_digest
    b"".join([digest(buffer[at : at + leaf]) for at in range(0, len(buffer), leaf)])


def changed_copy(state: np.ndarray, unit: int, fraction: float) -> np.ndarray:
    """The state with `fraction` of its `unit`-sized blocks changed (checkpoint.update=sparse's
    model, whatever the leaf size, so bytes written compare across leaf sizes)."""
    rng = np.random.default_rng(1)
    units = len(state) // unit
    changed = rng.choice(units, max(1, int(units * fraction)), replace=False)
    new = state.copy()
    blocks = new[: units * unit].reshape(units, unit)
    blocks[changed] = rng.integers(0, 256, (len(changed), unit), dtype=np.uint8)
    return new


def measure(state: np.ndarray, second: np.ndarray, leaf: int, rounds: int) -> dict:
    size = len(state)
    target = np.empty_like(state)
    target[:] = 0  # fault its pages in before timing
    buffer = memoryview(state)
    times: dict[str, list[float]] = {k: [] for k in ("copy", "leaf_hash", "hash_pass", "encode", "emit", "blake3_pass")}
    encoded = None
    for _ in range(rounds):
        times["copy"].append(timed(lambda: np.copyto(target, state)))
        times["leaf_hash"].append(timed(lambda: leaf_hash(buffer, leaf)))
        times["hash_pass"].append(timed(lambda: merkle.hash_leaves(BytesView(state), leaf, "xxh3_128")))
        encoder = IncrementalEncoder(leaf)
        for chunk in encoder.encode(0, "f", BytesView(state)).chunks(4 << 20):
            pass
        start = time.perf_counter()
        encoded = encoder.encode(1, "f", BytesView(second))
        times["encode"].append(time.perf_counter() - start)
        times["emit"].append(timed(lambda e=encoded: sum(len(p) for p in e.chunks(4 << 20))))
        times["blake3_pass"].append(timed(lambda: merkle.hash_leaves(BytesView(state), leaf, "blake3")))
    medians = {k: statistics.median(v) for k, v in times.items()}
    copy_gibs = size / medians["copy"] / GIB
    row = {"leaf_bytes": leaf, "leaves": merkle.leaf_count(size, leaf), "copy_gib_s": round(copy_gibs, 2)}
    for name in ("leaf_hash", "hash_pass", "encode", "blake3_pass"):
        gibs = size / medians[name] / GIB
        row[f"{name}_gib_s"] = round(gibs, 2)
        row[f"{name}_ratio"] = round(gibs / copy_gibs, 3)
    row["encode_s"] = round(medians["encode"], 4)
    row["emit_s"] = round(medians["emit"], 4)
    row["written_fraction"] = round(encoded.nbytes / size, 5)
    keys = ("bytes_written", "metadata_bytes", "first_leaves", "fixed_leaves", "first_regions", "baseline_changed_chunks_bytes", "baseline_chunk_list_bytes")
    row["encode_stats"] = {k: encoded.stats[k] for k in keys}
    row["spread"] = {k: [round(size / t / GIB, 2) for t in v] for k, v in times.items() if k != "emit"}
    return row


class SyntheticState:
    """A FileView of `size` bytes that exist nowhere whole: each read is generated into one
    reused buffer from an 8 MiB random block, every 64 KiB unit stamped with its index (and, for
    the units `changed` holds, with the step too), so leaves differ and a step changes a few."""

    UNIT = 64 << 10

    def __init__(self, size: int, step: int = 0, changed: frozenset = frozenset()) -> None:
        self.size = size
        self.step = step
        self.changed = changed
        self._block = np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8)
        self._buffer = np.empty(0, np.uint8)

    def read_at(self, offset: int, nbytes: int) -> memoryview:
        nbytes = max(0, min(nbytes, self.size - offset))
        if len(self._buffer) < nbytes:
            self._buffer = np.empty(nbytes, np.uint8)
        out = self._buffer[:nbytes]
        done = 0
        while done < nbytes:
            at = (offset + done) % len(self._block)
            take = min(nbytes - done, len(self._block) - at)
            out[done : done + take] = self._block[at : at + take]
            done += take
        first = -(-offset // self.UNIT)
        for unit in range(first, (offset + nbytes - 1) // self.UNIT + 1):
            start = unit * self.UNIT - offset
            stamp = np.array([unit, self.step if unit in self.changed else 0], "<u8").view(np.uint8)
            end = min(start + 16, nbytes)
            out[start:end] = stamp[: end - start]
        return memoryview(out)

    def stream(self, chunk_bytes: int):
        from dlio_ckpt.state.base import stream_by_reads

        return stream_by_reads(self, chunk_bytes)


def peak_rss(gib: float, leaf: int) -> dict:
    """Peak RSS of encoding (and writing nowhere) two checkpoints of a `gib` GiB synthetic state:
    a full one, then one with 2% of its 64 KiB units changed."""
    import resource

    size = int(gib * GIB)
    units = size // SyntheticState.UNIT
    changed = frozenset(np.random.default_rng(2).choice(units, units // 50, replace=False).tolist())
    encoder = IncrementalEncoder(leaf)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    rows = []
    for index, state in enumerate([SyntheticState(size), SyntheticState(size, 1, changed)]):
        start = time.perf_counter()
        encoded = encoder.encode(index, "shard", state)
        encode_s = time.perf_counter() - start
        written = sum(len(p) for p in encoded.chunks(4 << 20))
        rows.append({"index": index, "encode_s": round(encode_s, 2), "bytes_written": written,
                     "first_leaves": encoded.stats["first_leaves"], "fixed_leaves": encoded.stats["fixed_leaves"]})
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    return {"state_bytes": size, "leaf_bytes": leaf, "rss_before_bytes": before, "peak_rss_bytes": after,
            "growth_bytes": after - before, "checkpoints": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="buffer size in MiB (default 256: larger than the caches)")
    parser.add_argument("--leaves", default="4KiB,16KiB,64KiB,256KiB,1MiB,4MiB", help="leaf sizes (checkpoint.incremental.chunk_bytes)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--unit", default="64KiB", help="the second checkpoint changes blocks of this size (checkpoint.update_chunk_bytes)")
    parser.add_argument("--fraction", type=float, default=0.02, help="... this fraction of them")
    parser.add_argument("--quick", action="store_true", help="64 MiB, 3 rounds")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "merkle_hashing.json"))
    parser.add_argument("--rss-gib", type=float, default=0,
                        help="instead: peak RSS while encoding two checkpoints of a synthetic state of this size")
    args = parser.parse_args()
    if args.rss_gib:
        report = peak_rss(args.rss_gib, parse_size(args.leaves.split(",")[0]))
        print(json.dumps(report, indent=2))
        write_json(Path(args.out), {"environment": environment(tempfile.gettempdir()), **report})
        return
    if args.quick:
        args.mib, args.rounds = 64, 3
    state = np.random.default_rng(0).integers(0, 256, args.mib << 20, dtype=np.uint8)
    second = changed_copy(state, parse_size(args.unit), args.fraction)
    rows = [measure(state, second, parse_size(leaf), args.rounds) for leaf in args.leaves.split(",")]
    print(
        table(
            [[r["leaf_bytes"] >> 10, r["copy_gib_s"], r["leaf_hash_gib_s"], r["hash_pass_gib_s"], r["hash_pass_ratio"],
              r["encode_gib_s"], r["encode_ratio"], r["blake3_pass_gib_s"], r["emit_s"], r["written_fraction"]] for r in rows],
            ["leaf KiB", "copy GiB/s", "leaf hash", "hash pass", "ratio", "encode", "ratio", "blake3 pass", "emit s", "written"],
        )
    )
    report = {"buffer_bytes": args.mib << 20, "rounds": args.rounds, "changed_unit_bytes": parse_size(args.unit),
              "changed_fraction": args.fraction, "results": rows}
    write_json(Path(args.out), {"environment": environment(tempfile.gettempdir()), **report})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
