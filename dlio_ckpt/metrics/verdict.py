"""The one verdict of a training run: what limits it, judged once from all the evidence.

Before this module the AU line, the storage line and a page-cache warning each judged the run on
their own, and said contradicting things: "too few steps to judge" beside "storage-bound",
"storage-bound" beside "the reader limits this run", "not storage-bound" beside "that may be
the page cache's speed". Here the evidence (steps, AU, required and delivered read rate, the
shares of time spent waiting for data and blocked in checkpoints, whether the page cache could
have served the reads) goes through one decision, in order of what settles the question first:

1. too few steps: a start-up, not a steady state; nothing is judged.
2. AU target met: nothing limits the run.
3. no compute emulated: the run is all I/O; storage-boundness does not apply.
4. no read time measured: the storage cannot be judged.
5. checkpoints blocked training longer than it waited for data (and 10 % or more): checkpoints.
6. reads slower than required: the storage, unless the dataset fits in memory; then the page
   cache likely served the reads and the reader itself (threads, decoding) was too slow.
7. reads within 10 % of the requirement, on storage (not memory): borderline storage.
8. training waited for data 10 % or more although reads were fast enough: the input pipeline.
9. otherwise the loop's own time (other).

Every printed line that takes a side (verdict, AU target, storage) is worded from the result, and
`storage_bound` is true only when the verdict is the storage; it is null when the storage was not
what was measured (too few steps, no compute, no read time, reads likely from the page cache).
The function is pure: tests construct figures for every pair of lines that could disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Fewer steps than this on some rank and the run is mostly its start-up (the first batch of an
# epoch waits for the reader to fill its pipeline): no verdict.
MIN_STEPS_TO_JUDGE = 3
# Within this factor of the requirement the storage is called borderline, not bound or free.
MARGIN = 1.1
# A share of training time (waiting for data, blocked in checkpoints) this large is worth naming.
NOTABLE_SHARE = 0.1

# verdict -> what limits the run (summary.json train.run_verdict.limited_by)
LIMITED_BY = {
    "too_few_steps": None, "met": None, "no_compute": "storage", "no_read_time": None, "checkpoints": "checkpoints",
    "storage": "storage", "reader": "input pipeline", "storage_borderline": "storage", "input_pipeline": "input pipeline",
    "other": "other",
}


@dataclass(frozen=True)
class Evidence:
    """What the verdict is judged on; every figure comes from summary.json's train section."""

    fewest_steps: int  # steps of the rank that trained fewest
    au_overall: float  # compute / training wall time, averaged over ranks (the judged AU)
    au_target: float
    required_mib_per_s: float | None  # None: no compute emulated
    delivered_mib_per_s: float | None  # None: no read time measured
    data_wait_share: float  # training time waiting for the next batch, all ranks
    checkpoint_share: float  # training time blocked in checkpoint saves, all ranks
    page_cache_risk: bool  # the dataset fits in free memory and nothing dropped the cache


def judge(e: Evidence) -> dict[str, Any]:
    """The run's verdict and every line and flag derived from it (see the module docstring)."""
    ratio = (e.delivered_mib_per_s / e.required_mib_per_s
             if e.delivered_mib_per_s is not None and e.required_mib_per_s else None)
    verdict = _decide(e, ratio)
    measured = ratio is not None and not e.page_cache_risk and verdict != "too_few_steps"
    met = None if verdict == "too_few_steps" else e.au_overall >= e.au_target
    return {
        "verdict": verdict,
        "limited_by": LIMITED_BY[verdict],
        "line": _verdict_line(verdict, e, ratio),
        "au_target_met": met,
        "au_verdict": "too few steps to judge" if met is None else ("met" if met else "not met"),
        "au_verdict_reason": _au_reason(verdict, e),
        "storage_bound": verdict == "storage" if measured else None,
        "delivered_over_required": ratio,
        "storage_line": _storage_line(verdict, e, ratio),
    }


def _decide(e: Evidence, ratio: float | None) -> str:
    if e.fewest_steps < MIN_STEPS_TO_JUDGE:
        return "too_few_steps"
    if e.au_overall >= e.au_target:
        return "met"
    if e.required_mib_per_s is None:
        return "no_compute"
    if ratio is None:
        return "no_read_time"
    if e.checkpoint_share >= NOTABLE_SHARE and e.checkpoint_share > e.data_wait_share:
        return "checkpoints"
    if ratio < 1.0:
        return "reader" if e.page_cache_risk else "storage"
    if ratio < MARGIN and not e.page_cache_risk:
        return "storage_borderline"
    if e.data_wait_share >= NOTABLE_SHARE:
        return "input_pipeline"
    return "other"


def _figures(e: Evidence, ratio: float | None) -> str:
    return (f"delivered {e.delivered_mib_per_s:.1f} MiB/s, required {e.required_mib_per_s:.1f} MiB/s "
            f"({ratio:.{2 if ratio < MARGIN else 1}f}x the requirement)")


CACHE = "reads likely served from the page cache (the dataset fits in free memory)"
LARGER = "the storage itself was not measured (storage.direct_io=true or a dataset larger than memory measures it)"


def _storage_line(verdict: str, e: Evidence, ratio: float | None) -> str:
    """The `storage` row: the storage's side of the verdict, with its figures."""
    if e.required_mib_per_s is None:
        return "cannot judge: no compute is emulated (train.computation_time=0), so any storage rate bounds this run"
    if ratio is None:
        return f"cannot judge: no read time was measured (needs {e.required_mib_per_s:.1f} MiB/s)"
    figures = _figures(e, ratio)
    if verdict == "too_few_steps":
        return f"not judged (too few steps): {figures}"
    if e.page_cache_risk:
        return f"not measured: {CACHE}; {figures}"
    if verdict == "storage":
        return f"storage-bound: {figures}; the storage would need {1 / ratio:.1f}x its rate to keep the accelerators busy"
    if verdict == "storage_borderline":
        return f"borderline: {figures}, within {MARGIN - 1:.0%} of it"
    if ratio < 1.0:  # the AU target met, or checkpoints cost more than waiting for data
        return f"not what limits this run: {figures}, but reading cost training little of its time"
    return f"not storage-bound: {figures}"


def _verdict_line(verdict: str, e: Evidence, ratio: float | None) -> str:
    """The `verdict` row: what limits the run, in one line a user can act on."""
    wait, ckpt = e.data_wait_share, e.checkpoint_share
    cache = f"; {CACHE}, so {LARGER}" if e.page_cache_risk and verdict not in ("too_few_steps", "no_compute") else ""
    if verdict == "too_few_steps":
        return (f"too few steps to judge: a rank trained only {e.fewest_steps} step{'' if e.fewest_steps == 1 else 's'}; "
                "run more steps (train.epochs, train.total_steps)")
    if verdict == "met":
        return f"AU target met: nothing limits this run{cache}"
    if verdict == "no_compute":
        return ("I/O only: no compute is emulated (train.computation_time=0), so the run reads as fast as it can and "
                "the AU target cannot be met; it measures the read rate, not whether the storage keeps up")
    head = "AU target NOT met: "
    if verdict == "no_read_time":
        return head + "no read time was measured, so whether the storage limits it cannot be said"
    if verdict == "checkpoints":
        return head + (f"checkpoints limit this run: training was blocked in checkpoint saves {ckpt:.1%} of its time "
                       f"(waiting for data {wait:.1%}); try checkpoint.strategy=async or a longer interval{cache}")
    if verdict == "storage":
        return head + (f"storage-bound: the storage delivered {ratio:.2f}x the read rate training needs "
                       f"(waiting for data {wait:.1%} of the time)")
    if verdict == "reader":
        return head + (f"the input pipeline limits this run: reads gave only {ratio:.2f}x the rate training needs even "
                       "though they were likely served from the page cache (the dataset fits in free memory); more "
                       "reader threads (reader.read_threads) or prefetch would help, whatever the storage")
    if verdict == "storage_borderline":
        return head + (f"the storage is borderline: it delivered {ratio:.2f}x the read rate training needs, within "
                       f"{MARGIN - 1:.0%} (waiting for data {wait:.1%} of the time)")
    if verdict == "input_pipeline":
        return head + (f"the input pipeline limits this run: training waited for data {wait:.1%} of its time although "
                       f"reads gave {ratio:.1f}x the rate it needs; the reader (threads, prefetch, decoding) or the "
                       f"start-up of a short run makes it wait, not the read rate{cache}")
    return head + (f"neither reading (waiting {wait:.1%}) nor checkpoints ({ckpt:.1%}) explain it: the rest is the "
                   f"loop's own time and sleep overshoot{cache}")


def _au_reason(verdict: str, e: Evidence) -> str:
    """Why the AU target row says what it says (summary.json `au_verdict_reason`)."""
    if verdict == "too_few_steps":
        return (f"a rank trained only {e.fewest_steps} step{'' if e.fewest_steps == 1 else 's'} (fewer than "
                f"{MIN_STEPS_TO_JUDGE}): the first batch of an epoch waits for the reader to fill its pipeline, "
                "so a run this short shows its start-up, not a steady state; run more steps (train.epochs, train.total_steps)")
    met = e.au_overall >= e.au_target
    return (f"au_overall {e.au_overall:.3f} {'>=' if met else '<'} {e.au_target:.2f} "
            "(compute / training wall time, waits for data and checkpoints included)")
