"""`train.gradient_sync` from the ranks' batch times (DXT; pure).

Data-parallel ranks that meet every step (DDP's gradient all-reduce, Horovod, MirroredStrategy)
ask their loaders for the next batch at the same moment, step after step: a loader reads a batch
when its loop takes one (after its prefetch), so rank r's k-th batch is read when rank r's loop
reached step k - prefetch. Ranks that never meet (DLIO's) drift apart: each step's time varies
from rank to rank (a read, the scheduler), and nothing pulls them back, so the gap between their
k-th batches is the sum of those differences, growing like the square root of the steps.

So, per epoch: each reading process's batches (every `files_per_batch`-th file read to its end, in
read order) are paired with the process of another rank whose batches lie nearest (a DataLoader
worker of each rank serves the same steps); the steps the loop paced (each batch read later than
the one before by more than a fifth of the process's median gap between batches: the prefetch at an
epoch's start is not) are compared. The ranks step together when their paced batches were read
within a tenth of a step (median) of each other, none beyond a quarter. How sure that is comes
from the jitter: ranks that never met, with each step varying as much as these ranks' own steps
did from their median, would after n steps be about jitter x sqrt(2 n) apart; far below that (a
third at most, over 8 paced steps or more) is "strong", else "weak". One rank: `none`, nothing to
meet. No DXT, or reads that do not split into epochs: `none`, assumed, named.
"""

from __future__ import annotations

import math
import statistics

from dlio_ckpt.profile.values import INFERRED, MEASURED, Value, assumed

ALIGNED_MEDIAN = 0.10  # of a step: the ranks' paced batches, median gap
ALIGNED_MAX = 0.25  # of a step: the largest gap
PACED = 0.2  # a batch read later than the one before by more than this of the median gap was paced by the loop
STRONG_STEPS = 8
STRONG_SHARE = 1 / 3  # the largest gap against independent ranks' expected drift


def gradient_sync_value(reads: list[tuple[float, float, int]], files: int, epochs: int, files_per_batch: float,
                        ranks: int) -> Value:
    """`reads`: (start, end, process index) of every use of a dataset file, in start order
    (infer_timing.file_reads). Which rank a DataLoader worker serves is not in a per-process log
    (torchrun's ranks share one command line), so every reading process is paired with the nearest
    other one: a worker of another rank serving the same steps, where the ranks meet."""
    if ranks <= 1:
        return Value("train.gradient_sync", "none", MEASURED, "one rank: no other to meet at a step")
    if not reads or len(reads) < files * epochs or files <= 0:
        return assumed("train.gradient_sync", "none", "no DXT read times per rank (or the reads do not split into epochs): "
                       "whether the ranks meet each step cannot be seen; set barrier for a DDP/Horovod program")
    size = max(1, int(round(files_per_batch)))
    gaps, periods, jitter, steps = [], [], [], 0
    for e in range(epochs):
        streams: dict[int, list[float]] = {}
        for _, end, index in reads[e * files:(e + 1) * files]:
            streams.setdefault(index, []).append(end)
        batches = {i: _batches(sorted(ends), size) for i, ends in streams.items()}
        for index, times in batches.items():
            partner = _partner(index, times, batches)
            if partner is None:
                continue
            paced = _paced(times)
            other = batches[partner]
            gaps += [abs(times[k] - other[k]) for k in paced if k < len(other)]
            intervals = [times[k] - times[k - 1] for k in paced]
            if intervals:
                period = statistics.median(intervals)
                periods.append(period)
                jitter += [t - period for t in intervals]
                steps = max(steps, len(intervals))
    if not gaps or not periods:
        return assumed("train.gradient_sync", "none", "the ranks' reads show no steps paced by their loops (a small run "
                       "prefetches every batch): whether they meet each step cannot be seen")
    period = statistics.median(periods)
    median_gap, max_gap = statistics.median(gaps), max(gaps)
    spread = math.sqrt(sum(j * j for j in jitter) / len(jitter))
    drift = spread * math.sqrt(2 * steps)  # where independent ranks would be after the epoch's paced steps
    seen = (f"the ranks' batches of each step were read {median_gap * 1e3:.1f} ms apart (median; at most "
            f"{max_gap * 1e3:.1f} ms) over {len(gaps)} paced batches, steps of {period * 1e3:.0f} ms; ranks that never met, "
            f"each step varying as these did ({spread * 1e3:.1f} ms), would be ~{drift * 1e3:.0f} ms apart after "
            f"{steps} steps")
    if median_gap <= ALIGNED_MEDIAN * period and max_gap <= ALIGNED_MAX * period:
        strong = steps >= STRONG_STEPS and max_gap <= STRONG_SHARE * drift
        sure = "strong" if strong else "weak (few steps, or steps too even to tell drift from meeting)"
        return Value("train.gradient_sync", "barrier", INFERRED,
                     f"DXT: the ranks step together (DDP's all-reduce or the like): {seen}; evidence {sure}")
    return Value("train.gradient_sync", "none", INFERRED, f"DXT: the ranks do not step together: {seen}")


def _batches(ends: list[float], size: int) -> list[float]:
    """When each batch's reads ended: every `size`-th file's, and the last (a short batch)."""
    times = ends[size - 1::size]
    if len(ends) % size:
        times.append(ends[-1])
    return times


def _partner(index: int, times: list[float], batches: dict[int, list[float]]) -> int | None:
    """The other reading process whose batches lie nearest this one's (median gap)."""
    best, chosen = math.inf, None
    for other, theirs in batches.items():
        if other == index:
            continue
        n = min(len(times), len(theirs))
        if n == 0:
            continue
        gap = statistics.median(abs(a - b) for a, b in zip(times[:n], theirs[:n]))
        if gap < best:
            best, chosen = gap, other
    return chosen


def _paced(times: list[float]) -> list[int]:
    """The batches (index k >= 1) read later than the one before by more than PACED of the median
    of the process's larger half of gaps: batches its loop asked for, not the epoch's prefetch."""
    intervals = [times[k] - times[k - 1] for k in range(1, len(times))]
    if not intervals:
        return []
    larger = sorted(intervals)[len(intervals) // 2:]
    floor = PACED * statistics.median(larger)
    return [k for k in range(1, len(times)) if times[k] - times[k - 1] > floor]
