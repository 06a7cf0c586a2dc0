"""MLPerf Storage's checkpoint figures: mean (std) over the writes and over the reads.

MLPerf Storage reports a checkpoint's duration as the maximum over ranks and its throughput as
the minimum over ranks of per-rank throughput, then the mean and standard deviation of those over
the N saves and N loads, in decimal GB/s. Users compare against published results, so both the
decimal and the binary units are kept, and the rule is named wherever the figures are shown.
"""

from __future__ import annotations

from statistics import mean, pstdev
from typing import Any

GB = 1e9
GIB = float(1 << 30)
RULE = "duration = max over ranks; throughput = min over ranks of per-rank throughput"


def _spread(values: list[float]) -> dict[str, float | None]:
    """Mean and population standard deviation (numpy's default, as MLPerf's tools use); None for none."""
    if not values:
        return {"mean": None, "std": None}
    return {"mean": mean(values), "std": pstdev(values)}


def mlperf_figures(per_checkpoint: list[dict[str, Any]], per_read: list[dict[str, Any]]) -> dict[str, Any]:
    """Save and load duration (s) and throughput (GB/s and GiB/s) as mean and std, with counts."""
    figures: dict[str, Any] = {}
    for kind, rows, duration_key, rate_key in (("write", per_checkpoint, "write_s_max", "write_gib_per_s_min_rank"),
                                               ("read", per_read, "read_s_max", "read_gib_per_s_min_rank")):
        durations = _spread([r[duration_key] for r in rows])
        gib = _spread([r[rate_key] for r in rows])
        figures[f"{kind}s"] = len(rows)
        figures[f"{kind}_duration_s_mean"] = durations["mean"]
        figures[f"{kind}_duration_s_std"] = durations["std"]
        figures[f"{kind}_throughput_gib_per_s_mean"] = gib["mean"]
        figures[f"{kind}_throughput_gib_per_s_std"] = gib["std"]
        figures[f"{kind}_throughput_gb_per_s_mean"] = None if gib["mean"] is None else gib["mean"] * GIB / GB
        figures[f"{kind}_throughput_gb_per_s_std"] = None if gib["std"] is None else gib["std"] * GIB / GB
    return figures


def mlperf_rows(checkpoint: dict[str, Any]) -> list[tuple[str, str]]:
    """The printed rows MLPerf Storage users expect, from summary.json's checkpoint section."""
    figures = checkpoint.get("mlperf", {})
    rows = []
    distinct = len({r.get("step") for r in checkpoint.get("per_read", [])})
    for kind, label, noun in (("write", "save (MLPerf)", "write"), ("read", "load (MLPerf)", "read")):
        count = figures.get(f"{kind}s")
        if not count or figures.get(f"{kind}_duration_s_mean") is None:
            continue
        repeated = ""
        if kind == "read" and distinct < count:
            repeated = (f", of {distinct} distinct checkpoint{'s' if distinct != 1 else ''} (checkpoint.keep_last kept "
                        "only those; keep_last=0 reads each one written, as MLPerf does)")
        rows.append((label, (
            f"duration {figures[f'{kind}_duration_s_mean']:.3f} ({figures[f'{kind}_duration_s_std']:.3f}) s, "
            f"throughput {figures[f'{kind}_throughput_gb_per_s_mean']:.3f} ({figures[f'{kind}_throughput_gb_per_s_std']:.3f}) GB/s"
            f" = {figures[f'{kind}_throughput_gib_per_s_mean']:.3f} ({figures[f'{kind}_throughput_gib_per_s_std']:.3f}) GiB/s,"
            f" mean (std) over {count} {noun}{'s' if count != 1 else ''}{repeated}")))
    if rows:
        rows.append(("MLPerf rule", figures.get("rule", RULE)))
        cache = checkpoint.get("page_cache_drop", "not requested")
        rows.append(("page cache", "dropped before the reads" if cache == "dropped" else f"not dropped ({cache})"))
    return rows
