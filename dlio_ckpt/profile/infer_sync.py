"""`train.gradient_sync` from the ranks' batch times (DXT; pure).

Data-parallel ranks that meet every step (DDP's gradient all-reduce, Horovod, MirroredStrategy)
ask their loaders for the next batch at the same moment, step after step: a loader reads a batch
when its loop takes one (after its prefetch), so rank r's k-th batch is read when rank r's loop
reached step k - prefetch. Ranks that never meet (DLIO's) drift apart: each step's time varies
from rank to rank (a read, the scheduler), and nothing pulls them back, so the gap between their
k-th batches is the sum of those differences, growing like the square root of the steps.

So, per epoch: each reading process's batches (when each began: the first read of every
`files_per_batch`-th file, in read order) are paired with the process of another rank whose
batches lie nearest (a DataLoader worker of each rank serves the same steps); the batches its loop
paced (from the first read later than the one before by more than half the process's median gap
between batches: the prefetch at an epoch's start is read back to back, and the workers of two
ranks start tens of ms apart on a loaded machine) are compared. The ranks step together when their
paced batches were read at a steady lag of a quarter step at most (a worker woken later than its
partner, step after step, on a loaded machine), varying by a tenth of a step at most (median),
three in four within a quarter. How sure that is comes from the jitter: ranks that never met, with each step varying as
much as these ranks' own steps did from their median, would after n steps be about
jitter x sqrt(2 n) apart; far below that (three in four gaps within a third of it, over 8 paced
steps or more) is "strong", else "weak". One rank: `none`, nothing to meet. No DXT, or reads that
do not split into epochs: `none`, assumed, named.
"""

from __future__ import annotations

import math
import statistics

from dlio_ckpt.profile.values import INFERRED, MEASURED, Value, assumed

ALIGNED_MEDIAN = 0.10  # of a step: the ranks' paced batches, median gap
ALIGNED_MOST = 0.25  # of a step: the gap three in four pairs stay within (a prefetched batch taken for paced may not)
PACED = 0.5  # the first batch read later than the one before by more than this of the median gap: the loop's pace
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
    gaps, periods, jitter, offsets, steps = [], [], [], [], 0
    for e in range(epochs):
        streams: dict[int, list[float]] = {}
        for start, _, index in reads[e * files:(e + 1) * files]:
            streams.setdefault(index, []).append(start)
        batches = {i: _batches(sorted(starts), size) for i, starts in streams.items()}
        for index, times in batches.items():
            partner = _partner(index, times, batches)
            if partner is None:
                continue
            paced = _paced(times)
            other = batches[partner]
            lags = [times[k] - other[k] for k in paced if k < len(other)]
            if lags:  # a worker woken later than its partner, step after step, lags by as much each time
                steady = statistics.median(lags)
                gaps += [abs(d - steady) for d in lags]
                offsets.append(abs(steady))
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
    gaps.sort()
    median_gap, most_gap, max_gap = statistics.median(gaps), gaps[(3 * (len(gaps) - 1)) // 4], gaps[-1]
    spread = math.sqrt(sum(j * j for j in jitter) / len(jitter))
    drift = spread * math.sqrt(2 * steps)  # where independent ranks would be after the epoch's paced steps
    lag = statistics.median(offsets)
    seen = (f"the ranks' batches of each step were read at a steady lag (median {lag * 1e3:.1f} ms) "
            f"give or take {median_gap * 1e3:.1f} ms (median; 3 in 4 within {most_gap * 1e3:.1f} ms, at most "
            f"{max_gap * 1e3:.1f} ms) over {len(gaps)} paced batches, steps of {period * 1e3:.0f} ms; ranks that "
            f"never met, each step varying as these did ({spread * 1e3:.1f} ms), would be ~{drift * 1e3:.0f} ms "
            f"apart after {steps} steps")
    if median_gap <= ALIGNED_MEDIAN * period and most_gap <= ALIGNED_MOST * period and lag <= ALIGNED_MOST * period:
        strong = steps >= STRONG_STEPS and most_gap <= STRONG_SHARE * drift
        sure = "strong" if strong else "weak (few steps, or steps too even to tell drift from meeting)"
        return Value("train.gradient_sync", "barrier", INFERRED,
                     f"DXT: the ranks step together (DDP's all-reduce or the like): {seen}; evidence {sure}")
    return Value("train.gradient_sync", "none", INFERRED, f"DXT: the ranks do not step together: {seen}")


def _batches(starts: list[float], size: int) -> list[float]:
    """When each batch's reads began (its first file's first read: when its loader was asked for
    it; a slow read inside the batch, common on a loaded machine, does not move it)."""
    return starts[::size]


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
    """The batches its loop asked for: every one from the first read later than the one before by
    more than PACED of the median of the process's larger half of gaps (the epoch's prefetch before
    it is read back to back, as soon as the worker starts, and workers of two ranks start apart)."""
    intervals = [times[k] - times[k - 1] for k in range(1, len(times))]
    if not intervals:
        return []
    larger = sorted(intervals)[len(intervals) // 2:]
    floor = PACED * statistics.median(larger)
    first = next((k for k in range(1, len(times)) if times[k] - times[k - 1] > floor), len(times))
    return list(range(first, len(times)))
