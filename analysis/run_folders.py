"""dlio_ckpt run folders -> JobAnalysis, from the per-rank event files.

The events are the ground truth (one per storage operation, with its phase), so every figure is
recomputed from them rather than copied from summary.json: that way the analysis also checks
the summary, and a disagreement becomes a warning in the report. Time per rank is the union of
the rank's operation intervals (Darshan's overlap-free timer), because reader threads overlap and a
plain sum would count the same second several times. When a run was made without events, the
figures fall back to summary.json's io and ranks sections, and the report says so. The event
files are read a block at a time (event_figures.py), so a run of millions of files is analysed in
memory that does not grow with them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlio_ckpt.analysis.darshan_logs import load_logs
from dlio_ckpt.analysis.event_figures import EventFigures
from dlio_ckpt.analysis.model import SIZE_BUCKETS, JobAnalysis, phase_entry, rate_mib_per_s, share
from dlio_ckpt.analysis.run_inputs import checked_summary, open_checked_events
from dlio_ckpt.errors import UserError

_READ_PHASES = ("train", "eval")
_CHECKPOINT_PHASES = ("checkpoint", "restore")


def read_summary(run_dir: Path) -> dict[str, Any]:
    try:
        with open(run_dir / "summary.json", encoding="utf-8") as handle:
            summary = json.load(handle)
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested past Python's stack
        raise UserError(f"{run_dir / 'summary.json'}: cannot read the run summary ({exc})") from exc
    if not isinstance(summary, dict):
        raise UserError(f"{run_dir / 'summary.json'}: not a dlio_ckpt run summary (expected a JSON object)")
    return summary


def _per_rank(figures: list[dict[str, Any]], summary: dict[str, Any]) -> list[dict[str, Any]]:
    extra = {r.get("rank"): r for r in summary.get("ranks", []) if isinstance(r, dict)}
    for fig in figures:
        fig["io_s"] = fig["read_s"] + fig["write_s"] + fig["meta_s"]
        fig["read_mib_per_s"] = rate_mib_per_s(fig["bytes_read"], fig["read_s"])
        fig["write_mib_per_s"] = rate_mib_per_s(fig["bytes_written"], fig["write_s"])
        for key in ("samples", "steps", "peak_rss_bytes"):
            if key in extra.get(fig["rank"], {}):
                fig[key] = extra[fig["rank"]][key]
    return figures


def _io_share(per_phase: dict[str, dict[str, Any]], per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Share of summed busy time: training/eval reads vs checkpoint+restore I/O vs the rest."""
    read_s = sum(per_phase[p]["read_s_sum"] for p in _READ_PHASES if p in per_phase)
    ckpt_s = sum(per_phase[p]["read_s_sum"] + per_phase[p]["write_s_sum"] for p in _CHECKPOINT_PHASES if p in per_phase)
    total_s = sum(p["read_s_sum"] + p["write_s_sum"] for p in per_phase.values()) + sum(r.get("meta_s", 0.0) for r in per_rank)
    other_s = max(0.0, total_s - read_s - ckpt_s)
    return {"read": share(read_s, total_s), "checkpoint": share(ckpt_s, total_s), "other": share(other_s, total_s),
            "read_s": read_s, "checkpoint_s": ckpt_s, "other_s": other_s,
            "basis": "busy time summed over ranks: reads in train+eval vs all I/O in checkpoint+restore vs the "
                     "rest (generate, metadata, other)"}


def _from_summary_only(summary: dict[str, Any]) -> tuple[dict, list, int, int]:
    io = summary.get("io", {}) or {}
    per_phase = {}
    for name, p in (io.get("by_phase") or {}).items():
        # summary.json's by_phase times are sums over ranks: the slowest rank's time is unknown
        per_phase[name] = phase_entry(p.get("bytes_read", 0), p.get("bytes_written", 0), None, None,
                                      p.get("read_s", 0.0), p.get("write_s", 0.0), p.get("ops", 0), 0, 0)
    per_rank = []
    for r in summary.get("ranks", []) or []:
        fig = {k: r.get(k) for k in ("rank", "hostname", "bytes_read", "bytes_written", "read_s", "write_s", "samples", "steps", "peak_rss_bytes")}
        fig["label"] = f"rank {r.get('rank')} ({r.get('hostname')})"
        fig["meta_s"] = 0.0
        fig["io_s"] = (r.get("read_s") or 0.0) + (r.get("write_s") or 0.0)
        fig["read_mib_per_s"] = rate_mib_per_s(r.get("bytes_read") or 0, r.get("read_s") or 0.0)
        fig["write_mib_per_s"] = rate_mib_per_s(r.get("bytes_written") or 0, r.get("write_s") or 0.0)
        per_rank.append(fig)
    return per_phase, per_rank, int(io.get("bytes_read", 0) or 0), int(io.get("bytes_written", 0) or 0)


def _headline(summary: dict[str, Any], analysis: JobAnalysis) -> dict[str, Any]:
    train = summary.get("train") or {}
    ckpt = summary.get("checkpoint") or {}
    ranks = analysis.per_rank
    read_s = max((r.get("read_s") or 0.0 for r in ranks), default=0.0)
    write_s = max((r.get("write_s") or 0.0 for r in ranks), default=0.0)
    return {
        "workload": summary.get("workload"),
        "mode": summary.get("mode"),
        "strategy": ckpt.get("strategy"),
        "ranks": summary.get("world_size", len(ranks)),
        "bytes_read": analysis.bytes_read,
        "bytes_written": analysis.bytes_written,
        "read_s": read_s,
        "write_s": write_s,
        "read_mib_per_s": rate_mib_per_s(analysis.bytes_read, read_s),
        "write_mib_per_s": rate_mib_per_s(analysis.bytes_written, write_s),
        "slowest_rank_io_s": analysis.slowest_rank["io_s"] if analysis.slowest_rank else None,
        "read_share": analysis.io_time_share.get("read"),
        "checkpoint_share": analysis.io_time_share.get("checkpoint"),
        "files": analysis.files.get("count"),
        "wall_s": summary.get("wall_s"),
        "samples_per_s": train.get("samples_per_s"),
        "au": train.get("au"),
        "train_read_mib_per_s": train.get("read_mib_per_s"),
        "checkpoint_write_gib_per_s": ckpt.get("write_gib_per_s"),
        "checkpoint_write_gib_per_s_min_rank": ckpt.get("write_gib_per_s_min_rank"),
        "checkpoint_blocking_s_max": ckpt.get("blocking_s_max"),
        "checkpoint_persist_s_max": ckpt.get("persist_s_max"),
        "training_time_lost_fraction": ckpt.get("training_time_lost_fraction"),
        # a run that restored nothing has no restore rate (summary.json keeps 0.0 there)
        "restore_gib_per_s": ckpt.get("restore_gib_per_s") if ckpt.get("restore_verified") is not None else None,
        "au_overall": train.get("au_overall"),
        "goodput": summary.get("goodput"),
        "failures": (summary.get("failures") or {}).get("count"),
        "lost_work_s": (summary.get("failures") or {}).get("lost_work_s"),
        "restart_s": (summary.get("failures") or {}).get("restart_s"),
        "checkpoint_interval_steps": (ckpt.get("policy") or {}).get("interval_steps"),
        "required_read_mib_per_s": (train.get("storage") or {}).get("required_mib_per_s"),
        "storage_bound": (train.get("storage") or {}).get("storage_bound"),
        "train_read_p99_s": ((summary.get("latency") or {}).get("train") or {}).get("read", {}).get("p99_s"),
        "train_read_iops": ((summary.get("latency") or {}).get("train") or {}).get("read", {}).get("iops"),
    }


def _crosscheck(run_dir: Path, summary: dict[str, Any], analysis: JobAnalysis) -> None:
    """A Darshan log of the same run must report the same bytes as the events."""
    rel = (summary.get("traces") or {}).get("darshan")
    if not rel:
        return
    path = run_dir / rel
    if not path.is_file():
        analysis.warnings.append(f"summary.json names a Darshan log {rel} that is not in the run folder")
        return
    try:
        log = load_logs([path])[0]
        c = log.report.records["POSIX"].to_df()["counters"] if "POSIX" in log.report.records else None
        br = int(c["POSIX_BYTES_READ"].sum()) if c is not None else 0
        bw = int(c["POSIX_BYTES_WRITTEN"].sum()) if c is not None else 0
    except UserError as exc:
        analysis.warnings.append(f"Darshan log {rel} not cross-checked: {exc}")
        return
    agrees = (br, bw) == (analysis.bytes_read, analysis.bytes_written)
    analysis.extra["darshan_crosscheck"] = {"path": str(path), "bytes_read": br, "bytes_written": bw, "agrees": agrees}
    if not agrees:
        analysis.warnings.append(f"Darshan log {rel} reports {br} bytes read / {bw} written, events {analysis.bytes_read} / {analysis.bytes_written}")


def analyse_run(run_dir: Path, label: str | None = None, timeline: bool = True) -> JobAnalysis:
    run_dir = Path(run_dir)
    summary = checked_summary(read_summary(run_dir), run_dir / "summary.json")
    files = open_checked_events(run_dir) if (run_dir / "events").is_dir() else []
    try:
        figures = EventFigures(files, timeline) if files else None
    finally:
        for events in files:
            events.close()
    warnings = [f"summary.json: {w}" for w in summary.get("warnings", []) or []]
    job = {k: summary.get(k) for k in ("workload", "mode", "world_size", "hostnames", "started_at", "wall_s", "tool_version")}
    job["run_dir"] = str(run_dir)
    extra = {"summary": {k: summary.get(k) for k in ("train", "checkpoint", "dataset") if summary.get(k)}}
    if figures is not None:
        per_rank = _per_rank(figures.per_rank(), summary)
        per_phase = figures.per_phase()
        bytes_read = sum(r["bytes_read"] for r in per_rank)
        bytes_written = sum(r["bytes_written"] for r in per_rank)
        histogram = figures.histogram()
        file_figures = figures.file_figures
        extra["latency"] = figures.latency()
        extra["latency_source"] = "exact, from the events"
        io = summary.get("io") or {}
        for key, value in (("bytes_read", bytes_read), ("bytes_written", bytes_written)):
            if key in io and int(io[key]) != value:
                warnings.append(f"events total {key}={value} differs from summary.json io.{key}={io[key]}")
    else:
        warnings.append("no events/ in the run folder: figures come from summary.json (no histogram, files or timeline)")
        per_phase, per_rank, bytes_read, bytes_written = _from_summary_only(summary)
        histogram = {"buckets": list(SIZE_BUCKETS), "read": [0] * len(SIZE_BUCKETS), "write": [0] * len(SIZE_BUCKETS),
                     "source": "unavailable (no events)"}
        file_figures = {"count": None, "top": []}
        if summary.get("latency"):
            extra["latency"] = summary["latency"]
            extra["latency_source"] = "summary.json (per-rank histograms: within 2.3 % above the true value)"
    slow = max(per_rank, key=lambda r: r.get("io_s") or 0.0) if per_rank else None
    slowest = ({"rank": slow["rank"], "label": slow["label"], "io_s": slow["io_s"],
                "bytes": (slow.get("bytes_read") or 0) + (slow.get("bytes_written") or 0),
                "basis": "busy time in reads + writes/fsyncs + metadata operations"} if slow else None)
    analysis = JobAnalysis(
        label=label or run_dir.name, kind="run", inputs=[str(run_dir)], bytes_read=int(bytes_read),
        bytes_written=int(bytes_written), per_phase=per_phase, per_rank=per_rank, slowest_rank=slowest,
        histogram=histogram, files=file_figures, io_time_share=_io_share(per_phase, per_rank), job=job,
        extra=extra, warnings=warnings,
    )
    analysis.headline = _headline(summary, analysis)
    if figures is not None:
        analysis.timeline = figures.timeline(per_phase)
    _crosscheck(run_dir, summary, analysis)
    return analysis
