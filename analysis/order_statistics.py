"""Exact percentiles of values seen a block at a time, in memory that does not grow with them.

The analysis reports p50 ... p99.9 of every call's duration (latency.py), over all ranks' events:
~40 million durations a rank at 10 million files, which np.percentile would need in one array
(320 MB a rank). The k-th smallest of non-negative floats can instead be found digit by digit
(a radix select): a non-negative float64's bits, read as an unsigned integer, sort as the float
does, so a first pass counts the values of each group under each of the 2^16 values of the top 16
bits (sign, exponent, 4 bits of mantissa: 512 KiB a group), which names the bucket that holds the
k-th value and its rank in it; each later pass looks only at the values in that bucket, and counts
the next 12 bits (32 KiB), until the bucket holds at most COLLECT values, which the next pass keeps
and sorts, or all 64 bits are known. The value found is the exact k-th value (the same float
np.percentile's "inverted_cdf" picks, `order_index`), after two to five passes over the values
(three for the latency figures of runs measured so far), holding per bucket still in question one
histogram or at most COLLECT values (128 KiB).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FIRST_BITS = 16  # the top digit, counted for every group in the first pass
DIGIT_BITS = 12  # each later digit, counted only for the buckets in question
COLLECT = 1 << 14  # values a bucket may hold to be kept and sorted rather than counted again


def order_index(count: int, percents: list[float]) -> list[int]:
    """The 0-based rank of the value np.percentile(values, percents, method="inverted_cdf") gives
    for `count` values: numpy's own arithmetic (H&F method 1: n * q - 1, rounded up where not whole,
    clipped to the values), so the value picked is the same one."""
    index = count * np.true_divide(np.asarray(percents, dtype=np.float64), 100) - 1
    previous = np.floor(index)
    picked = np.where(index - previous == 0, previous, previous + 1).astype(np.int64)
    return np.clip(picked, 0, count - 1).tolist()


@dataclass
class _Target:
    """One order statistic being looked for, the `wanted`-th smallest (0-based) of its group: the
    `rank`-th smallest among the values whose top `known` bits are `prefix`; `value` once found."""

    group: int
    wanted: int
    rank: int
    prefix: int = 0
    known: int = 0
    collect: bool = False
    value: float | None = None
    histogram: np.ndarray | None = None
    kept: list = field(default_factory=list)

    def key(self) -> tuple[int, int, int]:
        return self.group, self.prefix, self.known


class OrderStatistics:
    """The exact k-th smallest of the non-negative floats of several groups (a group: a phase and
    an operation), given a block at a time, over as many passes as `done` asks for.

    First pass: `add` every block, then `want(group, rank)` for each order statistic needed (the
    counts known by then: `counts`), then `end_pass()`. Each further pass: `add` every block again,
    in any order, then `end_pass()`, until `done`; `value(group, rank)` then gives each."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self._first: dict[int, np.ndarray] = {}  # group -> counts of the top digit (first pass)
        self._targets: list[_Target] = []
        self._first_pass = True

    @property
    def done(self) -> bool:
        return not self._first_pass and all(t.value is not None for t in self._targets)

    def add(self, group: int, values: np.ndarray) -> None:
        """Values of one group (non-negative, float64)."""
        if not len(values):
            return
        bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
        if self._first_pass:
            self.counts[group] = self.counts.get(group, 0) + len(bits)
            top = (bits >> np.uint64(64 - FIRST_BITS)).astype(np.int64)
            counted = np.bincount(top, minlength=1 << FIRST_BITS)
            if group in self._first:
                self._first[group] += counted
            else:
                self._first[group] = counted
            return
        for target in self._open_targets(group):
            inside = bits if not target.known else bits[(bits >> np.uint64(64 - target.known)) == np.uint64(target.prefix)]
            if target.collect:
                target.kept.append(inside)
            elif len(inside):
                shift = np.uint64(64 - target.known - DIGIT_BITS)
                digit = ((inside >> shift) & np.uint64((1 << DIGIT_BITS) - 1)).astype(np.int64)
                target.histogram += np.bincount(digit, minlength=1 << DIGIT_BITS)

    def want(self, group: int, rank: int) -> None:
        """Look for the `rank`-th smallest value of `group` (0-based; the group must have values)."""
        if not 0 <= rank < self.counts.get(group, 0):
            raise ValueError(f"no value of rank {rank} among {self.counts.get(group, 0)}")
        self._targets.append(_Target(group, rank, rank))

    def end_pass(self) -> None:
        if self._first_pass:
            for target in self._targets:
                self._narrow(target, self._first[target.group], FIRST_BITS)
            self._first.clear()
            self._first_pass = False
            self._share()
            return
        finished: dict[tuple, np.ndarray] = {}
        for target in self._targets:
            if target.value is not None:
                continue
            if target.collect:
                kept = finished.get(target.key())
                if kept is None:
                    kept = finished[target.key()] = np.sort(np.concatenate(target.kept))
                target.value = float(kept[target.rank:target.rank + 1].view(np.float64)[0])
                target.kept = []
            else:
                counts, target.histogram = target.histogram, None
                self._narrow(target, counts, DIGIT_BITS)
        self._share()

    def value(self, group: int, rank: int) -> float:
        for target in self._targets:
            if (target.group, target.wanted) == (group, rank) and target.value is not None:
                return target.value
        raise KeyError((group, rank))

    def _narrow(self, target: _Target, counts: np.ndarray, bits: int) -> None:
        """Given the counts of the next digit of the target's bucket: the digit that holds its
        value becomes part of its prefix; then either all bits are known (the value), the bucket is
        small enough to keep, or the next digit is counted in the next pass."""
        below = np.cumsum(counts)
        digit = int(np.searchsorted(below, target.rank, side="right"))
        target.rank -= int(below[digit - 1]) if digit else 0
        target.prefix = (target.prefix << bits) | digit
        target.known += bits
        target.collect = counts[digit] <= COLLECT
        if target.known == 64:
            target.value = float(np.array([target.prefix], dtype=np.uint64).view(np.float64)[0])

    def _share(self) -> None:
        """One histogram, or one list of kept values, per bucket still in question: targets in the
        same bucket share it."""
        shared: dict[tuple, _Target] = {}
        for target in self._targets:
            if target.value is not None:
                continue
            first = shared.setdefault(target.key(), target)
            if first is target:
                target.kept = []
                target.histogram = None if target.collect else np.zeros(1 << DIGIT_BITS, dtype=np.int64)
            else:
                target.kept, target.histogram = first.kept, first.histogram

    def _open_targets(self, group: int) -> list[_Target]:
        """The group's targets still open, one for each bucket (the others share its counts)."""
        seen: dict[tuple, _Target] = {}
        for target in self._targets:
            if target.group == group and target.value is None:
                seen.setdefault(target.key(), target)
        return list(seen.values())
