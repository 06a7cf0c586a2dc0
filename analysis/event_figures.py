"""Every figure the analysis takes from a run folder's events, read a block at a time.

A run over 10 million files leaves ~40 million events and 10 million paths per rank; the
analysis used to load each rank's whole event file (RankEvents.load) and build a dict entry per
file. Here the event files are read a block at a time (EventFile.blocks), over a few passes:

1. every block checked (run_inputs.checked_blocks), then counted: bytes, calls, sizes per rank and
   phase, each block's earliest start, the durations' counts and top digits (order_statistics.py),
   per-file bytes (file_totals.py: spilled by hash to temporary files), the last end (the
   timeline's span);
2. the overlap-free busy times (metrics/timing.UnionLength, which needs each later block's
   earliest start from pass 1), the timeline bins (its grid needs the span), the durations'
   squared deviations (stdev, which needs the mean), the next digit of each percentile;
3. and on, until each percentile is exact: only the few values still in question are looked at.

What is held is a block, the busy periods still open, the bins, one histogram (or a few thousand
values) per percentile and one bucket of per-file records: nothing that grows with the files.
Sums of floats (busy times, means, bins) are added a block at a time, so they can differ from a
whole-array sum in the last bits; counts, bytes, minima, maxima and percentiles are exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlio_ckpt.analysis.file_totals import FileTotals
from dlio_ckpt.analysis.model import SIZE_BUCKETS, Timeline, histogram_from_sizes, phase_entry
from dlio_ckpt.analysis.order_statistics import OrderStatistics, order_index
from dlio_ckpt.analysis.run_inputs import checked_blocks
from dlio_ckpt.analysis.timeline import grid, spread
from dlio_ckpt.metrics.latency import REPORTED_OPS
from dlio_ckpt.metrics.timing import UnionLength
from dlio_ckpt.storage.events import OP_CODE, OPS, PHASES, EventFile

_READ, _WRITE, _FSYNC = OP_CODE["read"], OP_CODE["write"], OP_CODE["fsync"]
_DATA_OPS = (_READ, _WRITE, _FSYNC)
PERCENTS = (50, 90, 99, 99.9)
_LATENCY_OPS = tuple(OP_CODE[op] for op in REPORTED_OPS)


def _group(phase: int, op: int) -> int:
    return phase * len(OPS) + op


@dataclass
class _Sums:
    """Exact counts and byte sums of one rank, or of one phase over ranks."""

    bytes_read: int = 0
    bytes_written: int = 0
    reads: int = 0
    writes: int = 0
    ops: int = 0
    first: float = np.inf
    last: float = -np.inf

    def add(self, ev: np.ndarray, reads: np.ndarray, writes: np.ndarray) -> None:
        self.bytes_read += int(ev["length"].sum(where=reads))
        self.bytes_written += int(ev["length"].sum(where=writes))
        self.reads += int(reads.sum())
        self.writes += int(writes.sum())
        self.ops += len(ev)
        if len(ev):
            self.first, self.last = min(self.first, float(ev["start"].min())), max(self.last, float(ev["end"].max()))


@dataclass
class _Durations:
    """One (phase, op)'s call durations over ranks: what the latency table needs besides the
    percentiles."""

    count: int = 0
    total: float = 0.0
    low: float = np.inf
    high: float = -np.inf
    squares: float = 0.0  # sum of squared deviations from the mean (pass 2)

    def add(self, took: np.ndarray) -> None:
        self.count += len(took)
        self.total += float(took.sum())
        self.low, self.high = min(self.low, float(took.min())), max(self.high, float(took.max()))


@dataclass
class _Rank:
    """What is kept of one rank between passes."""

    events: EventFile
    sums: _Sums = field(default_factory=_Sums)
    later: list[float] = field(default_factory=list)  # per block: earliest start of any later block
    busy: dict[Any, UnionLength] = field(default_factory=dict)

    def union(self, key: Any) -> UnionLength:
        if key not in self.busy:
            self.busy[key] = UnionLength()
        return self.busy[key]

    def seconds(self, key: Any) -> float:
        return self.busy[key].seconds() if key in self.busy else 0.0


def _durations(ev: np.ndarray) -> np.ndarray:
    return np.maximum(ev["end"] - ev["start"], 0.0) + 0.0  # + 0.0: no -0.0, whose bits sort last


def _latency_calls(ev: np.ndarray):
    """(phase, op, the block's mask of its calls) for each reported kind of call the block holds,
    phase by phase: what every pass over the durations walks."""
    ops, phase = ev["op"], ev["phase"]
    for code in np.unique(phase).tolist():
        in_phase = phase == code
        for op in _LATENCY_OPS:
            chosen = in_phase & (ops == op)
            if chosen.any():
                yield code, op, chosen


class EventFigures:
    """The figures of a run's event files (opened and sorted by rank: run_inputs.open_checked_events)."""

    def __init__(self, files: list[EventFile], timeline: bool = True) -> None:
        self.ranks = [_Rank(events) for events in files]
        self.phases: dict[int, _Sums] = {}
        self.phase_ranks: dict[int, list[int]] = {}  # phase -> positions of the ranks with events in it
        self.sizes = {"read": np.zeros(len(SIZE_BUCKETS), np.int64), "write": np.zeros(len(SIZE_BUCKETS), np.int64)}
        self.durations: dict[int, _Durations] = {}
        self.order = OrderStatistics()
        self.span = -np.inf
        self.bins: dict[str, np.ndarray] | None = None
        self.files = FileTotals(sum(rank.events.path_count for rank in self.ranks))
        try:
            self._count()
            self._measure(timeline)
            while not self.order.done:
                self._refine()
            self.file_figures = self.files.result(lambda position, index: self.ranks[position].events.names([index])[index])
        finally:
            self.files.close()

    # ---- the passes ---------------------------------------------------------------------------

    def _count(self) -> None:
        for position, rank in enumerate(self.ranks):
            starts = []
            seen_phases: set[int] = set()
            for ev, names in checked_blocks(rank.events):
                starts.append(float(ev["start"].min()))
                ops = ev["op"]
                reads, writes = ops == _READ, ops == _WRITE
                rank.sums.add(ev, reads, writes)
                for phase in np.unique(ev["phase"]).tolist():
                    in_phase = ev["phase"] == phase
                    self.phases.setdefault(phase, _Sums()).add(ev[in_phase], reads[in_phase], writes[in_phase])
                    seen_phases.add(phase)
                for phase, op, chosen in _latency_calls(ev):
                    took = _durations(ev[chosen])
                    self.durations.setdefault(_group(phase, op), _Durations()).add(took)
                    self.order.add(_group(phase, op), took)
                self.sizes["read"] += histogram_from_sizes(ev["length"][reads])
                self.sizes["write"] += histogram_from_sizes(ev["length"][writes])
                self.files.add_events(position, reads, writes, ev["file"], ev["length"], names)
                self.span = max(self.span, float(ev["end"].max()))
            for phase in sorted(seen_phases):
                self.phase_ranks.setdefault(phase, []).append(position)
            rank.later = (np.minimum.accumulate(starts[::-1])[::-1].tolist()[1:] + [np.inf]) if starts else []
            for first, paths in rank.events.path_blocks():
                self.files.add_paths(position, first, paths)
            rank.events.close()
        for group, counted in self.durations.items():
            for index in order_index(counted.count, list(PERCENTS)):
                self.order.want(group, index)
        self.order.end_pass()

    def _measure(self, timeline: bool) -> None:
        if timeline and np.isfinite(self.span):
            width, nbins = grid(self.span)
            self.bins = {"width": width, "read": np.zeros((len(self.ranks), nbins)),
                         "write": np.zeros((len(self.ranks), nbins))}
        refine = not self.order.done
        for position, rank in enumerate(self.ranks):
            for number, (ev, _) in enumerate(rank.events.blocks(paths=False)):
                later = rank.later[number]
                ops, phase = ev["op"], ev["phase"]
                reads, writes = ops == _READ, ops == _WRITE
                write_like, meta = writes | (ops == _FSYNC), ~np.isin(ops, _DATA_OPS)
                for key, chosen in (("read", reads), ("write", write_like), ("meta", meta)):
                    self._busy(rank, key, ev, chosen, later)
                for code in np.unique(phase).tolist():
                    in_phase = phase == code
                    self._busy(rank, (code, "read"), ev, in_phase & reads, later)
                    self._busy(rank, (code, "write"), ev, in_phase & write_like, later)
                for code, op, chosen in _latency_calls(ev):
                    self._busy(rank, (code, op), ev, chosen, later)
                    took = _durations(ev[chosen])
                    counted = self.durations[_group(code, op)]
                    counted.squares += float(np.square(took - counted.total / counted.count).sum())
                    if refine:
                        self.order.add(_group(code, op), took)
                if self.bins is not None:
                    for name, chosen in (("read", reads), ("write", writes)):
                        picked = ev[chosen]
                        self.bins[name] += spread(np.full(len(picked), position), picked["start"], picked["end"],
                                                  picked["length"], len(self.ranks), self.bins["width"],
                                                  self.bins[name].shape[1])
            rank.events.close()
        if refine:
            self.order.end_pass()

    def _refine(self) -> None:
        for rank in self.ranks:
            for ev, _ in rank.events.blocks(paths=False):
                for code, op, chosen in _latency_calls(ev):
                    self.order.add(_group(code, op), _durations(ev[chosen]))
            rank.events.close()
        self.order.end_pass()

    @staticmethod
    def _busy(rank: _Rank, key: Any, ev: np.ndarray, chosen: np.ndarray, later: float) -> None:
        if chosen.any():
            rank.union(key).add(ev["start"][chosen], ev["end"][chosen], later)

    # ---- the figures --------------------------------------------------------------------------

    def per_rank(self) -> list[dict[str, Any]]:
        return [{"rank": rank.events.rank, "label": f"rank {rank.events.rank} ({rank.events.hostname})",
                 "hostname": rank.events.hostname, "bytes_read": rank.sums.bytes_read,
                 "bytes_written": rank.sums.bytes_written, "reads": rank.sums.reads, "writes": rank.sums.writes,
                 "read_s": rank.seconds("read"), "write_s": rank.seconds("write"), "meta_s": rank.seconds("meta")}
                for rank in self.ranks]

    def per_phase(self) -> dict[str, dict[str, Any]]:
        """Totals per phase; a phase's time is its slowest rank's busy time (docs/metrics.md)."""
        table: dict[str, dict[str, Any]] = {}
        for code in sorted(self.phases):
            sums = self.phases[code]
            present = [self.ranks[position] for position in self.phase_ranks[code]]
            read_times = [rank.seconds((code, "read")) for rank in present]
            write_times = [rank.seconds((code, "write")) for rank in present]
            entry = phase_entry(sums.bytes_read, sums.bytes_written, max(read_times, default=0.0),
                                max(write_times, default=0.0), sum(read_times), sum(write_times), sums.ops,
                                sums.reads, sums.writes)
            entry["first_start_s"], entry["last_end_s"] = sums.first, sums.last
            table[PHASES[code]] = entry
        return table

    def histogram(self) -> dict[str, Any]:
        return {"buckets": list(SIZE_BUCKETS), "read": self.sizes["read"].astype(int).tolist(),
                "write": self.sizes["write"].astype(int).tolist(), "source": "event lengths in Darshan's size buckets"}

    def latency(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per phase and operation kind over all ranks: count, min, mean, stdev (n - 1, as fio's),
        p50, p90, p99, p99.9 (exact: the values np.percentile's inverted_cdf picks), max (seconds)
        and IOPS (calls / the slowest rank's overlap-free time in those calls), with the keys of
        summary.json's `latency`."""
        table: dict[str, dict[str, dict[str, Any]]] = {}
        for code, phase in enumerate(PHASES):
            for op in _LATENCY_OPS:
                counted = self.durations.get(_group(code, op))
                if counted is None:
                    continue
                p50, p90, p99, p99_9 = (self.order.value(_group(code, op), index)
                                        for index in order_index(counted.count, list(PERCENTS)))
                slowest = max(rank.seconds((code, op)) for rank in self.ranks if (code, op) in rank.busy)
                table.setdefault(phase, {})[OPS[op]] = {
                    "count": counted.count, "min_s": counted.low, "mean_s": counted.total / counted.count,
                    "stdev_s": float(np.sqrt(counted.squares / (counted.count - 1))) if counted.count > 1 else 0.0,
                    "p50_s": p50, "p90_s": p90, "p99_s": p99, "p99_9_s": p99_9, "max_s": counted.high,
                    "iops": counted.count / slowest if slowest > 0 else None}
        return table

    def timeline(self, per_phase: dict[str, dict[str, Any]]) -> Timeline | None:
        if self.bins is None:
            return None
        spans = [(name, p["first_start_s"], p["last_end_s"]) for name, p in per_phase.items()]
        return Timeline(self.bins["width"], self.bins["read"], self.bins["write"],
                        [f"rank {rank.events.rank}" for rank in self.ranks], "events", spans)
