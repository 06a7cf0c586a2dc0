"""POSIX module records computed from dlio_ckpt events, by the rules darshan-runtime applies.

A log is only worth comparing with a real Darshan log if every counter means the same thing, so
each event is replayed through the same state machine the runtime's POSIX wrappers run (per rank
and file: offset, last byte read/written, last access type, overlap-free timers, the first 32
distinct access sizes and strides) in the order the events completed, which is the order the
runtime would have seen them. `reduce_shared` then collapses files that every rank touched into
one rank -1 record with the runtime's reduction operator, including its merge of the top-4
common values, so the rank -1 record is the one a real MPI job would leave.

What events cannot say: buffer addresses (every access counts as memory aligned), the target of a
rename (the event names only the source), and the mode bits of a create (a file this rank wrote
to is taken as created with 0644, which is what PosixStorage.open_write does).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from dlio_ckpt.storage.events import OP_CODE, RankEvents

_BUCKETS = ("0_100", "100_1K", "1K_10K", "10K_100K", "100K_1M", "1M_4M", "4M_10M", "10M_100M", "100M_1G", "1G_PLUS")
# Exclusive upper bounds of the size buckets, as DARSHAN_BUCKET_INC tests them.
_BUCKET_LIMITS = (101, 1025, 10241, 102401, 1048577, 4194305, 10485761, 104857601, 1073741825)

POSIX_COUNTERS = (
    "POSIX_OPENS", "POSIX_FILENOS", "POSIX_DUPS", "POSIX_READS", "POSIX_WRITES", "POSIX_SEEKS",
    "POSIX_STATS", "POSIX_MMAPS", "POSIX_FSYNCS", "POSIX_FDSYNCS", "POSIX_RENAME_SOURCES",
    "POSIX_RENAME_TARGETS", "POSIX_RENAMED_FROM", "POSIX_MODE", "POSIX_BYTES_READ",
    "POSIX_BYTES_WRITTEN", "POSIX_MAX_BYTE_READ", "POSIX_MAX_BYTE_WRITTEN", "POSIX_CONSEC_READS",
    "POSIX_CONSEC_WRITES", "POSIX_SEQ_READS", "POSIX_SEQ_WRITES", "POSIX_RW_SWITCHES",
    "POSIX_MEM_NOT_ALIGNED", "POSIX_MEM_ALIGNMENT", "POSIX_FILE_NOT_ALIGNED", "POSIX_FILE_ALIGNMENT",
    "POSIX_MAX_READ_TIME_SIZE", "POSIX_MAX_WRITE_TIME_SIZE",
    *(f"POSIX_SIZE_READ_{b}" for b in _BUCKETS),
    *(f"POSIX_SIZE_WRITE_{b}" for b in _BUCKETS),
    *(f"POSIX_STRIDE{i}_STRIDE" for i in range(1, 5)),
    *(f"POSIX_STRIDE{i}_COUNT" for i in range(1, 5)),
    *(f"POSIX_ACCESS{i}_ACCESS" for i in range(1, 5)),
    *(f"POSIX_ACCESS{i}_COUNT" for i in range(1, 5)),
    "POSIX_FASTEST_RANK", "POSIX_FASTEST_RANK_BYTES", "POSIX_SLOWEST_RANK", "POSIX_SLOWEST_RANK_BYTES",
)
POSIX_FCOUNTERS = (
    "POSIX_F_OPEN_START_TIMESTAMP", "POSIX_F_READ_START_TIMESTAMP", "POSIX_F_WRITE_START_TIMESTAMP",
    "POSIX_F_CLOSE_START_TIMESTAMP", "POSIX_F_OPEN_END_TIMESTAMP", "POSIX_F_READ_END_TIMESTAMP",
    "POSIX_F_WRITE_END_TIMESTAMP", "POSIX_F_CLOSE_END_TIMESTAMP", "POSIX_F_READ_TIME",
    "POSIX_F_WRITE_TIME", "POSIX_F_META_TIME", "POSIX_F_MAX_READ_TIME", "POSIX_F_MAX_WRITE_TIME",
    "POSIX_F_FASTEST_RANK_TIME", "POSIX_F_SLOWEST_RANK_TIME", "POSIX_F_VARIANCE_RANK_TIME",
    "POSIX_F_VARIANCE_RANK_BYTES",
)
C = {name: index for index, name in enumerate(POSIX_COUNTERS)}
F = {name: index for index, name in enumerate(POSIX_FCOUNTERS)}

# A record as the log stores it: record id, rank, counters, fcounters (darshan-log-format.md).
POSIX_RECORD = struct.Struct(f"<Qq{len(POSIX_COUNTERS)}q{len(POSIX_FCOUNTERS)}d")

MEM_ALIGNMENT = 8  # darshan-runtime's default memory alignment setting
CREATE_MODE = 0o644  # PosixStorage creates files with this mode
COMMON_VALUES_TRACKED = 32  # DARSHAN_COMMON_VAL_MAX_RUNTIME_COUNT
_READ, _WRITE = 1, 2  # DARSHAN_IO_READ, DARSHAN_IO_WRITE


def clean_path(path: str, cwd: str | None = None) -> str:
    """The name darshan-runtime records: absolute, without `//` and `/./` (symlinks kept)."""
    if path.startswith("<"):
        return path
    name = path if path.startswith("/") else f"{cwd or os.getcwd()}/{path}"
    while "//" in name:
        name = name.replace("//", "/")
    while "/./" in name:
        name = name.replace("/./", "/")
    return name


def file_alignment(path: str) -> int:
    """statfs block size of the folder holding `path` (what the runtime stores), else 4096."""
    folder = os.path.dirname(path) or "."
    try:
        return int(os.statvfs(folder).f_bsize) or 4096
    except OSError:
        return 4096


def update_common(values: list[int], counts: list[int], value: int, count: int, add: bool) -> None:
    """DARSHAN_UPDATE_COMMON_VAL_COUNTERS on 4 slots: keep them ordered by count, then value."""
    if value == 0:
        return
    total = count
    if add:
        for slot in range(4):
            if values[slot] == value:
                total += counts[slot]
                break
    new_values: list[int] = []
    new_counts: list[int] = []
    slot = 0
    while slot < 4:
        if counts[slot] > total or (counts[slot] == total and values[slot] > value):
            new_values.append(values[slot])
            new_counts.append(counts[slot])
            slot += 1
        else:
            break
    if len(new_values) == 4:
        return
    new_values.append(value)
    new_counts.append(total)
    while len(new_values) < 4 and slot < 4:
        if values[slot] != value:
            new_values.append(values[slot])
            new_counts.append(counts[slot])
        slot += 1
    while len(new_values) < 4:
        new_values.append(0)
        new_counts.append(0)
    values[:] = new_values
    counts[:] = new_counts


@dataclass
class PosixRecord:
    """One (rank, file) POSIX record: the counters the log stores, as plain lists."""

    name: str
    rank: int
    counters: list[int]
    fcounters: list[float]

    @classmethod
    def empty(cls, name: str, rank: int, alignment: int) -> "PosixRecord":
        counters = [0] * len(POSIX_COUNTERS)
        counters[C["POSIX_MMAPS"]] = -1  # the runtime's default build does not wrap mmap
        counters[C["POSIX_MEM_ALIGNMENT"]] = MEM_ALIGNMENT
        counters[C["POSIX_FILE_ALIGNMENT"]] = alignment
        return cls(name=name, rank=rank, counters=counters, fcounters=[0.0] * len(POSIX_FCOUNTERS))

    def pack(self, record_id: int) -> bytes:
        """The record's bytes in the log, under its id (darshan_hash of its name)."""
        return POSIX_RECORD.pack(record_id, self.rank, *self.counters, *self.fcounters)

    @classmethod
    def unpack(cls, name: str, data: bytes) -> "PosixRecord":
        values = POSIX_RECORD.unpack(data)
        split = 2 + len(POSIX_COUNTERS)
        return cls(name=name, rank=values[1], counters=list(values[2:split]), fcounters=list(values[split:]))

    def io_time(self) -> float:
        f = self.fcounters
        return f[F["POSIX_F_READ_TIME"]] + f[F["POSIX_F_WRITE_TIME"]] + f[F["POSIX_F_META_TIME"]]

    def bytes_moved(self) -> int:
        return self.counters[C["POSIX_BYTES_READ"]] + self.counters[C["POSIX_BYTES_WRITTEN"]]


@dataclass
class _FileState:
    """The runtime's per-record bookkeeping that never reaches the log."""

    record: PosixRecord
    offset: int = 0
    last_byte_read: int = 0
    last_byte_written: int = 0
    last_io_type: int = 0
    last_read_end: float = 0.0
    last_write_end: float = 0.0
    last_meta_end: float = 0.0
    access_freq: dict[int, int] = field(default_factory=dict)
    stride_freq: dict[int, int] = field(default_factory=dict)


def _timer(record: PosixRecord, index: int, t1: float, t2: float, last: float) -> float:
    """DARSHAN_TIMER_INC_NO_OVERLAP; returns the new `last`."""
    if t1 == 0.0 or t2 == 0.0:
        return last
    record.fcounters[index] += (t2 - t1) if t1 > last else (t2 - last)
    return t2 if t2 > last else last


def _track(freq: dict[int, int], value: int, values: list[int], counts: list[int]) -> None:
    """darshan_track_common_val_counters + update: the first 32 distinct values (0 included)."""
    if value in freq:
        freq[value] += 1
    elif len(freq) < COMMON_VALUES_TRACKED:
        freq[value] = 1
    else:
        return
    update_common(values, counts, value, freq[value], add=False)


def _first_start(record: PosixRecord, index: int, t1: float) -> None:
    current = record.fcounters[index]
    if current == 0 or current > t1:
        record.fcounters[index] = t1


def _access(state: _FileState, is_read: bool, offset: int, size: int, t1: float, t2: float) -> None:
    """POSIX_RECORD_READ / POSIX_RECORD_WRITE for one call."""
    rec = state.record
    c, f = rec.counters, rec.fcounters
    last = state.last_byte_read if is_read else state.last_byte_written
    kind = "READ" if is_read else "WRITE"
    plural = "READS" if is_read else "WRITES"
    if offset > last:
        c[C[f"POSIX_SEQ_{plural}"]] += 1
    if offset == last + 1:
        c[C[f"POSIX_CONSEC_{plural}"]] += 1
    stride = offset - last - 1 if (offset > 0 and offset > last and last != 0) else 0
    if is_read:
        state.last_byte_read = offset + size - 1
    else:
        state.last_byte_written = offset + size - 1
    state.offset = offset + size
    max_index = C["POSIX_MAX_BYTE_READ" if is_read else "POSIX_MAX_BYTE_WRITTEN"]
    if c[max_index] < offset + size - 1:
        c[max_index] = offset + size - 1
    c[C["POSIX_BYTES_READ" if is_read else "POSIX_BYTES_WRITTEN"]] += size
    c[C[f"POSIX_{plural}"]] += 1
    bucket = 0
    while bucket < len(_BUCKET_LIMITS) and size >= _BUCKET_LIMITS[bucket]:
        bucket += 1
    c[C[f"POSIX_SIZE_{kind}_0_100"] + bucket] += 1
    a0, s0 = C["POSIX_ACCESS1_ACCESS"], C["POSIX_STRIDE1_STRIDE"]
    access_values, access_counts = c[a0 : a0 + 4], c[a0 + 4 : a0 + 8]
    _track(state.access_freq, size, access_values, access_counts)
    c[a0 : a0 + 4], c[a0 + 4 : a0 + 8] = access_values, access_counts
    stride_values, stride_counts = c[s0 : s0 + 4], c[s0 + 4 : s0 + 8]
    _track(state.stride_freq, stride, stride_values, stride_counts)
    c[s0 : s0 + 4], c[s0 + 4 : s0 + 8] = stride_values, stride_counts
    alignment = c[C["POSIX_FILE_ALIGNMENT"]]
    if alignment > 0 and offset % alignment != 0:
        c[C["POSIX_FILE_NOT_ALIGNED"]] += 1
    if state.last_io_type == (_WRITE if is_read else _READ):
        c[C["POSIX_RW_SWITCHES"]] += 1
    state.last_io_type = _READ if is_read else _WRITE
    _first_start(rec, F[f"POSIX_F_{kind}_START_TIMESTAMP"], t1)
    f[F[f"POSIX_F_{kind}_END_TIMESTAMP"]] = t2
    elapsed = t2 - t1
    if f[F[f"POSIX_F_MAX_{kind}_TIME"]] < elapsed:
        f[F[f"POSIX_F_MAX_{kind}_TIME"]] = elapsed
        c[C[f"POSIX_MAX_{kind}_TIME_SIZE"]] = size
    if is_read:
        state.last_read_end = _timer(rec, F["POSIX_F_READ_TIME"], t1, t2, state.last_read_end)
    else:
        state.last_write_end = _timer(rec, F["POSIX_F_WRITE_TIME"], t1, t2, state.last_write_end)


_OPEN, _CLOSE, _READ_OP, _WRITE_OP = OP_CODE["open"], OP_CODE["close"], OP_CODE["read"], OP_CODE["write"]
_FSYNC, _STAT, _RENAME, _SEEK = OP_CODE["fsync"], OP_CODE["stat"], OP_CODE["rename"], OP_CODE["seek"]


def _apply(state: _FileState, op: int, offset: int, length: int, t1: float, t2: float) -> None:
    rec = state.record
    c, f = rec.counters, rec.fcounters
    if op == _READ_OP or op == _WRITE_OP:
        _access(state, op == _READ_OP, offset, length, t1, t2)
    elif op == _OPEN:
        state.offset = state.last_byte_read = state.last_byte_written = 0
        c[C["POSIX_OPENS"]] += 1
        _first_start(rec, F["POSIX_F_OPEN_START_TIMESTAMP"], t1)
        f[F["POSIX_F_OPEN_END_TIMESTAMP"]] = t2
        state.last_meta_end = _timer(rec, F["POSIX_F_META_TIME"], t1, t2, state.last_meta_end)
    elif op == _CLOSE:
        state.last_byte_read = state.last_byte_written = 0
        _first_start(rec, F["POSIX_F_CLOSE_START_TIMESTAMP"], t1)
        f[F["POSIX_F_CLOSE_END_TIMESTAMP"]] = t2
        state.last_meta_end = _timer(rec, F["POSIX_F_META_TIME"], t1, t2, state.last_meta_end)
    elif op == _FSYNC:
        state.last_write_end = _timer(rec, F["POSIX_F_WRITE_TIME"], t1, t2, state.last_write_end)
        c[C["POSIX_FSYNCS"]] += 1
    elif op == _STAT:
        c[C["POSIX_STATS"]] += 1
        state.last_meta_end = _timer(rec, F["POSIX_F_META_TIME"], t1, t2, state.last_meta_end)
    elif op == _SEEK:
        if offset >= 0:
            state.offset = offset
        c[C["POSIX_SEEKS"]] += 1
        state.last_meta_end = _timer(rec, F["POSIX_F_META_TIME"], t1, t2, state.last_meta_end)
    elif op == _RENAME:
        c[C["POSIX_RENAME_SOURCES"]] += 1
        state.last_meta_end = _timer(rec, F["POSIX_F_META_TIME"], t1, t2, state.last_meta_end)


def rank_records(rank: RankEvents, cwd: str | None = None) -> list[PosixRecord]:
    """This rank's POSIX records, one per file, in the order the files were first touched.

    Unlink is not instrumented by darshan-runtime, and a rename of a file the runtime has no record
    for is dropped, as the runtime does.
    """
    events = rank.events
    names = [clean_path(p, cwd) for p in rank.paths]
    states: dict[int, _FileState] = {}
    alignments: dict[str, int] = {}
    columns = zip(events["op"].tolist(), events["file"].tolist(), events["offset"].tolist(),
                  events["length"].tolist(), events["start"].tolist(), events["end"].tolist())
    for op, file_index, offset, length, t1, t2 in columns:
        state = states.get(file_index)
        if state is None:
            if op == OP_CODE["unlink"] or op == _RENAME:
                continue
            name = names[file_index]
            folder = os.path.dirname(name)
            if folder not in alignments:
                alignments[folder] = file_alignment(name)
            state = _FileState(PosixRecord.empty(name, rank.rank, alignments[folder]))
            states[file_index] = state
        elif op == OP_CODE["unlink"]:
            continue
        _apply(state, op, offset, length, t1, t2)
    for state in states.values():
        _set_mode(state.record)
    return [s.record for s in states.values()]


def _set_mode(record: PosixRecord) -> None:
    if record.counters[C["POSIX_WRITES"]] > 0:
        record.counters[C["POSIX_MODE"]] = CREATE_MODE


def file_record(name: str, rank: int, alignment: int, ops: Sequence[int], offsets: Sequence[int],
                lengths: Sequence[int], starts: Sequence[float], ends: Sequence[float]) -> PosixRecord | None:
    """The record of one file of one rank from its events alone, in the order they completed: what
    `rank_records` makes for it (files do not affect each other's counters), for a writer that
    groups events by file (trace/darshan_stream.py). None where the runtime would keep no record
    (only unlinks and renames before any other call)."""
    state: _FileState | None = None
    for op, offset, length, t1, t2 in zip(ops, offsets, lengths, starts, ends):
        if state is None:
            if op == OP_CODE["unlink"] or op == _RENAME:
                continue
            state = _FileState(PosixRecord.empty(name, rank, alignment))
        elif op == OP_CODE["unlink"]:
            continue
        _apply(state, op, offset, length, t1, t2)
    if state is None:
        return None
    _set_mode(state.record)
    return state.record


def _merge_common(out: PosixRecord, inp: list[int], inout: list[int], first: str) -> None:
    """The reduction's merge of two top-4 tables: collapse duplicates, then insert both sets."""
    base = C[first]
    inp_v, inp_c = inp[base : base + 4], inp[base + 4 : base + 8]
    io_v, io_c = inout[base : base + 4], inout[base + 4 : base + 8]
    for j in range(4):
        for k in range(4):
            if inp_v[j] == io_v[k]:
                inp_c[j] += io_c[k]
                io_v[k] = 0
                io_c[k] = 0
    values, counts = [0] * 4, [0] * 4
    for j in range(4):
        update_common(values, counts, inp_v[j], inp_c[j], add=True)
    for j in range(4):
        update_common(values, counts, io_v[j], io_c[j], add=True)
    out.counters[base : base + 4] = values
    out.counters[base + 4 : base + 8] = counts


def _reduce_pair(inp: PosixRecord, inout: PosixRecord) -> PosixRecord:
    """posix_record_reduction_op for one record: `inp` folded into `inout`."""
    out = PosixRecord(name=inout.name, rank=-1, counters=[0] * len(POSIX_COUNTERS), fcounters=[0.0] * len(POSIX_FCOUNTERS))
    a, b, o = inp.counters, inout.counters, out.counters
    fa, fb, fo = inp.fcounters, inout.fcounters, out.fcounters
    for j in range(C["POSIX_OPENS"], C["POSIX_RENAME_TARGETS"] + 1):
        o[j] = a[j] + b[j]
        if o[j] < 0:
            o[j] = -1
    for name in ("POSIX_RENAMED_FROM", "POSIX_MODE", "POSIX_MEM_ALIGNMENT", "POSIX_FILE_ALIGNMENT"):
        o[C[name]] = a[C[name]]
    for name in ("POSIX_BYTES_READ", "POSIX_BYTES_WRITTEN", "POSIX_FILE_NOT_ALIGNED"):
        o[C[name]] = a[C[name]] + b[C[name]]
    for name in ("POSIX_MAX_BYTE_READ", "POSIX_MAX_BYTE_WRITTEN"):
        o[C[name]] = max(a[C[name]], b[C[name]])
    for j in range(C["POSIX_CONSEC_READS"], C["POSIX_MEM_NOT_ALIGNED"] + 1):
        o[j] = a[j] + b[j]
    for j in range(C["POSIX_SIZE_READ_0_100"], C["POSIX_SIZE_WRITE_1G_PLUS"] + 1):
        o[j] = a[j] + b[j]
    a_copy, b_copy = list(a), list(b)
    _merge_common(out, a_copy, b_copy, "POSIX_STRIDE1_STRIDE")
    a_copy, b_copy = list(a), list(b)
    _merge_common(out, a_copy, b_copy, "POSIX_ACCESS1_ACCESS")
    for j in range(F["POSIX_F_OPEN_START_TIMESTAMP"], F["POSIX_F_CLOSE_START_TIMESTAMP"] + 1):
        fo[j] = fa[j] if ((fa[j] < fb[j] and fa[j] > 0) or fb[j] == 0) else fb[j]
    for j in range(F["POSIX_F_OPEN_END_TIMESTAMP"], F["POSIX_F_CLOSE_END_TIMESTAMP"] + 1):
        fo[j] = fa[j] if fa[j] > fb[j] else fb[j]
    for j in range(F["POSIX_F_READ_TIME"], F["POSIX_F_META_TIME"] + 1):
        fo[j] = fa[j] + fb[j]
    for kind in ("READ", "WRITE"):
        t, s = F[f"POSIX_F_MAX_{kind}_TIME"], C[f"POSIX_MAX_{kind}_TIME_SIZE"]
        src_f, src_c = (fa, a) if fa[t] > fb[t] else (fb, b)
        fo[t], o[s] = src_f[t], src_c[s]
    fast_f, fast_c = (fa, a) if fa[F["POSIX_F_FASTEST_RANK_TIME"]] < fb[F["POSIX_F_FASTEST_RANK_TIME"]] else (fb, b)
    o[C["POSIX_FASTEST_RANK"]] = fast_c[C["POSIX_FASTEST_RANK"]]
    o[C["POSIX_FASTEST_RANK_BYTES"]] = fast_c[C["POSIX_FASTEST_RANK_BYTES"]]
    fo[F["POSIX_F_FASTEST_RANK_TIME"]] = fast_f[F["POSIX_F_FASTEST_RANK_TIME"]]
    slow_f, slow_c = (fa, a) if fa[F["POSIX_F_SLOWEST_RANK_TIME"]] > fb[F["POSIX_F_SLOWEST_RANK_TIME"]] else (fb, b)
    o[C["POSIX_SLOWEST_RANK"]] = slow_c[C["POSIX_SLOWEST_RANK"]]
    o[C["POSIX_SLOWEST_RANK_BYTES"]] = slow_c[C["POSIX_SLOWEST_RANK_BYTES"]]
    fo[F["POSIX_F_SLOWEST_RANK_TIME"]] = slow_f[F["POSIX_F_SLOWEST_RANK_TIME"]]
    return out


def _seed_rank_extremes(record: PosixRecord) -> PosixRecord:
    """Before reducing, each rank claims to be both the fastest and the slowest."""
    seeded = PosixRecord(record.name, record.rank, list(record.counters), list(record.fcounters))
    c, f = seeded.counters, seeded.fcounters
    c[C["POSIX_FASTEST_RANK"]] = c[C["POSIX_SLOWEST_RANK"]] = record.rank
    c[C["POSIX_FASTEST_RANK_BYTES"]] = c[C["POSIX_SLOWEST_RANK_BYTES"]] = record.bytes_moved()
    f[F["POSIX_F_FASTEST_RANK_TIME"]] = f[F["POSIX_F_SLOWEST_RANK_TIME"]] = record.io_time()
    return seeded


def reduce_shared(per_rank: Sequence[Sequence[PosixRecord]], nprocs: int) -> tuple[list[list[PosixRecord]], list[PosixRecord]]:
    """Split records into what each rank keeps and the rank -1 records of files all ranks touched.

    Ranks are folded in rank order (the runtime leaves the order to MPI_Reduce, so which rank wins
    a tie for fastest or slowest is not defined there; here the lower rank wins).
    """
    by_rank: dict[int, dict[str, PosixRecord]] = {}
    for records in per_rank:
        for record in records:
            by_rank.setdefault(record.rank, {})[record.name] = record
    ranks = sorted(by_rank)
    if nprocs < 1 or ranks != list(range(nprocs)):
        return [list(r) for r in per_rank], []
    shared_names = set(by_rank[0])
    for rank in ranks[1:]:
        shared_names &= set(by_rank[rank])
    shared = [reduce_file([by_rank[rank][r.name] for rank in ranks])
              for r in per_rank_order(per_rank) if r.name in shared_names]
    kept = [[r for r in records if r.name not in shared_names] for records in per_rank]
    return kept, shared


def reduce_file(records: Sequence[PosixRecord]) -> PosixRecord:
    """The rank -1 record of one file from every rank's record of it, given in rank order."""
    inputs = [_seed_rank_extremes(record) for record in records]
    result = inputs[0]
    for record in inputs[1:]:
        result = _reduce_pair(record, result)
    result.rank = -1
    times = np.array([r.io_time() for r in inputs])
    moved = np.array([float(r.bytes_moved()) for r in inputs])
    result.fcounters[F["POSIX_F_VARIANCE_RANK_TIME"]] = float(times.var())
    result.fcounters[F["POSIX_F_VARIANCE_RANK_BYTES"]] = float(moved.var())
    return result


def per_rank_order(per_rank: Iterable[Sequence[PosixRecord]]) -> list[PosixRecord]:
    """Rank 0's records in first-touch order, each name once: a stable order for shared records."""
    seen: set[str] = set()
    ordered = []
    for records in per_rank:
        for record in records:
            if record.name not in seen:
                seen.add(record.name)
                ordered.append(record)
    return ordered
