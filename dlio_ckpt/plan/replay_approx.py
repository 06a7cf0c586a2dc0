"""An approximate replay plan from a Darshan log's POSIX counters, for logs without DXT traces.

Production logs rarely carry DXT (it is off by default in darshan-runtime), but every log has the
POSIX module's per-file counters: bytes and calls per rank, the access-size histogram, how many
calls were sequential and consecutive, the furthest byte touched, and when reading and writing
began and ended. That is enough to issue I/O of the same volume, call count, size mix and
sequentiality per rank and file; the order of calls within a file, the exact offsets and their
timing are synthesised, so everything built from this plan is labelled approximate. The plan
is a pure value (seeded, no I/O), like the DXT one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlio_ckpt.plan.replay import OP_DTYPE, READ, WRITE, ReplayFile
from dlio_ckpt.plan.replay import _relative_paths as relative_paths

# Darshan's access-size buckets: (counter suffix, smallest size, largest size) in bytes.
SIZE_BUCKETS = (("0_100", 0, 100), ("100_1K", 101, 1024), ("1K_10K", 1025, 10240), ("10K_100K", 10241, 102400),
                ("100K_1M", 102401, 1 << 20), ("1M_4M", (1 << 20) + 1, 4 << 20), ("4M_10M", (4 << 20) + 1, 10 << 20),
                ("10M_100M", (10 << 20) + 1, 100 << 20), ("100M_1G", (100 << 20) + 1, 1 << 30),
                ("1G_PLUS", (1 << 30) + 1, 1 << 30))
KINDS = {READ: ("READ", "READS", "BYTES_READ", "MAX_BYTE_READ"), WRITE: ("WRITE", "WRITES", "BYTES_WRITTEN", "MAX_BYTE_WRITTEN")}
APPROXIMATION = ("approximate: synthesised from the POSIX counters (bytes, calls, access-size histogram, sequential "
                 "and consecutive fractions, files per rank); offsets, call order and timing within a file are not in the log")


def call_sizes(total_bytes: int, count: int, bucket_counts: list[int], rng: np.random.Generator) -> np.ndarray:
    """`count` call sizes that add up to `total_bytes` exactly, distributed over the histogram's
    buckets (each near the middle of its bucket, scaled to the total), in a seeded random order."""
    if count <= 0:
        return np.zeros(0, np.int64)
    if sum(bucket_counts) == count:
        sizes = np.concatenate([np.full(n, _middle(lo, hi), np.float64)
                                for n, (_, lo, hi) in zip(bucket_counts, SIZE_BUCKETS) if n])
        lows = np.concatenate([np.full(n, lo) for n, (_, lo, _) in zip(bucket_counts, SIZE_BUCKETS) if n])
        highs = np.concatenate([np.full(n, hi if hi > lo else np.iinfo(np.int64).max)
                                for n, (_, lo, hi) in zip(bucket_counts, SIZE_BUCKETS) if n])
        sizes = np.clip(np.rint(sizes * total_bytes / sizes.sum()), lows, highs).astype(np.int64)
    else:  # no usable histogram: equal calls
        sizes = np.full(count, total_bytes // count, np.int64)
    sizes = _fix_total(sizes, total_bytes)
    return sizes[rng.permutation(count)]


def _middle(lo: int, hi: int) -> float:
    return float(np.sqrt(max(lo, 1) * hi)) if hi > lo else float(lo)


def _fix_total(sizes: np.ndarray, total: int) -> np.ndarray:
    """Spread the difference to `total` over the calls, never making one negative."""
    sizes = sizes.copy()
    for _ in range(4):
        diff = int(total - sizes.sum())
        if diff == 0:
            break
        share, rest = divmod(abs(diff), len(sizes))
        step = np.full(len(sizes), share, np.int64)
        step[:rest] += 1
        sizes = sizes + step if diff > 0 else np.maximum(sizes - step, 0)
    return sizes


def call_offsets(sizes: np.ndarray, sequential: int, consecutive: int, extent: int, rng: np.random.Generator) -> np.ndarray:
    """Offsets for calls of `sizes` in order: `consecutive` of them start where the previous one
    ended, `sequential - consecutive` further on, the rest earlier (Darshan's definitions); the
    forward gaps share the room the file's extent leaves beyond the bytes moved.

    Every call stays inside the extent (the log's furthest byte + 1): a file read many times over
    moves more bytes than it holds, and running on past its end would make the replay recreate
    (and write) a larger file than the log's job ever had. A call that would pass the end wraps
    back into the file, so the replayed file is never larger than the log says."""
    count = len(sizes)
    offsets = np.zeros(count, np.int64)
    if count <= 1:
        return offsets
    consecutive = min(max(consecutive, 0), count - 1)
    forward = min(max(sequential - consecutive, 0), count - 1 - consecutive)
    kinds = np.array([0] * consecutive + [1] * forward + [2] * (count - 1 - consecutive - forward))[rng.permutation(count - 1)]
    room = max(extent - int(sizes.sum()), forward)
    gap = room // forward if forward else 0
    for i in range(1, count):
        previous_end = int(offsets[i - 1] + sizes[i - 1])
        if kinds[i - 1] == 0:
            offsets[i] = previous_end
        elif kinds[i - 1] == 1:
            offsets[i] = previous_end + max(gap, 1)
        else:
            offsets[i] = int(rng.integers(0, max(int(offsets[i - 1]), 1)))  # before the previous call: not sequential
        room = extent - int(sizes[i])
        if offsets[i] > room:
            offsets[i] = int(offsets[i]) % (room + 1) if room > 0 else 0
    return offsets


def approximate_calls(counters: dict[str, Any], fcounters: dict[str, Any], op: int, file_index: int,
                      rng: np.random.Generator) -> np.ndarray:
    """One record's reads or writes as OP_DTYPE calls, spread evenly over the record's read
    (write) span, each lasting the record's read (write) time / calls."""
    word, calls_key, bytes_key, max_key = KINDS[op]
    count = int(counters[f"POSIX_{calls_key}"])
    if count <= 0:
        return np.zeros(0, OP_DTYPE)
    buckets = [int(counters.get(f"POSIX_SIZE_{word}_{name}", 0)) for name, _, _ in SIZE_BUCKETS]
    sizes = call_sizes(int(counters[f"POSIX_{bytes_key}"]), count, buckets, rng)
    extent = int(counters[f"POSIX_{max_key}"]) + 1
    offsets = call_offsets(sizes, int(counters[f"POSIX_SEQ_{calls_key}"]), int(counters[f"POSIX_CONSEC_{calls_key}"]),
                           extent, rng)
    start, end = float(fcounters[f"POSIX_F_{word}_START_TIMESTAMP"]), float(fcounters[f"POSIX_F_{word}_END_TIMESTAMP"])
    calls = np.zeros(count, OP_DTYPE)
    calls["op"], calls["file"], calls["offset"], calls["length"] = op, file_index, offsets, sizes
    calls["start"] = start + np.arange(count) * max(end - start, 0.0) / count
    calls["end"] = calls["start"] + max(float(fcounters[f"POSIX_F_{word}_TIME"]), 0.0) / count
    return calls


def approximate_ops(records: list[tuple[dict, dict]], names: dict[int, str], nprocs: int,
                    seed: int = 0) -> tuple[tuple[ReplayFile, ...], tuple[np.ndarray, ...], dict[str, float]]:
    """(files, per-rank calls, the log's own figures) from POSIX records given as (counters,
    fcounters) dicts. A shared record (rank -1, all ranks' calls reduced into one) deals its
    calls out to the ranks in turn. The figures are what the replay is compared with: bytes and
    calls, and the slowest rank's read and write time (a shared record's time split evenly)."""
    rng = np.random.default_rng(seed)
    ranks = max(nprocs, 1)
    file_index: dict[str, int] = {}
    extents: list[int] = []
    read_files: set[int] = set()
    per_rank: list[list[np.ndarray]] = [[] for _ in range(ranks)]
    read_s, write_s = np.zeros(ranks), np.zeros(ranks)
    for counters, fcounters in records:
        name = names.get(int(counters["id"]))
        if not name or name.startswith("<"):
            continue
        index = file_index.setdefault(name, len(file_index))
        if index == len(extents):
            extents.append(0)
        rank = int(counters["rank"])
        for op in (READ, WRITE):
            calls = approximate_calls(counters, fcounters, op, index, rng)
            if not len(calls):
                continue
            extents[index] = max(extents[index], int((calls["offset"] + calls["length"]).max()))
            if op == READ:
                read_files.add(index)
            seconds = max(float(fcounters[f"POSIX_F_{KINDS[op][0]}_TIME"]), 0.0)
            spent = read_s if op == READ else write_s
            if rank < 0:
                for target in range(ranks):
                    per_rank[target].append(calls[target::ranks])
                spent += seconds / ranks
            else:
                per_rank[rank % ranks].append(calls)
                spent[rank % ranks] += seconds
    ops = []
    for calls in per_rank:
        merged = np.concatenate(calls) if calls else np.zeros(0, OP_DTYPE)
        ops.append(merged[np.argsort(merged["start"], kind="stable")])
    originals = list(file_index)
    files = tuple(ReplayFile(original=o, relative=r, size=extents[i], read=i in read_files)
                  for i, (o, r) in enumerate(zip(originals, relative_paths(originals))))
    return files, tuple(ops), {"read_s": float(read_s.max()), "write_s": float(write_s.max())}
