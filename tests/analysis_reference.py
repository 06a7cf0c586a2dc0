"""The run-folder analysis as it was before it streamed (analysis/run_folders.py and latency.py at
61b7924), kept as the reference the streamed analysis must agree with: it took every rank's
events whole (RankEvents.load) and a dict entry per file."""

from __future__ import annotations

from typing import Any

import numpy as np

from dlio_ckpt.analysis.model import SIZE_BUCKETS, Timeline, histogram_from_sizes, phase_entry, rate_mib_per_s
from dlio_ckpt.analysis.timeline import grid, spread
from dlio_ckpt.metrics.latency import REPORTED_OPS
from dlio_ckpt.metrics.timing import busy_seconds
from dlio_ckpt.storage.events import OP_CODE, OPS, PHASES, RankEvents

_READ = OPS.index("read")
_WRITE = OPS.index("write")
_FSYNC = OPS.index("fsync")
_DATA_OPS = (_READ, _WRITE, _FSYNC)
_TOP_FILES = 50


def _rank_figures(rank: RankEvents) -> dict[str, Any]:
    ev = rank.events
    ops = ev["op"]
    reads, writes = ops == _READ, ops == _WRITE
    write_like = writes | (ops == _FSYNC)
    meta = ~np.isin(ops, _DATA_OPS)
    return {
        "rank": rank.rank,
        "label": f"rank {rank.rank} ({rank.hostname})",
        "hostname": rank.hostname,
        "bytes_read": int(ev["length"][reads].sum()),
        "bytes_written": int(ev["length"][writes].sum()),
        "reads": int(reads.sum()),
        "writes": int(writes.sum()),
        "read_s": busy_seconds(ev["start"][reads], ev["end"][reads]),
        "write_s": busy_seconds(ev["start"][write_like], ev["end"][write_like]),
        "meta_s": busy_seconds(ev["start"][meta], ev["end"][meta]),
    }


def _per_rank(ranks: list[RankEvents], summary: dict[str, Any]) -> list[dict[str, Any]]:
    extra = {r.get("rank"): r for r in summary.get("ranks", []) if isinstance(r, dict)}
    out = []
    for rank in ranks:
        fig = _rank_figures(rank)
        fig["io_s"] = fig["read_s"] + fig["write_s"] + fig["meta_s"]
        fig["read_mib_per_s"] = rate_mib_per_s(fig["bytes_read"], fig["read_s"])
        fig["write_mib_per_s"] = rate_mib_per_s(fig["bytes_written"], fig["write_s"])
        for key in ("samples", "steps", "peak_rss_bytes"):
            if key in extra.get(rank.rank, {}):
                fig[key] = extra[rank.rank][key]
        out.append(fig)
    return out


def _per_phase(ranks: list[RankEvents]) -> dict[str, dict[str, Any]]:
    """Totals per phase; a phase's time is its slowest rank's busy time (docs/metrics.md)."""
    table: dict[str, dict[str, Any]] = {}
    present = sorted({int(p) for r in ranks for p in np.unique(r.events["phase"])})
    for code in present:
        name = PHASES[code]
        br = bw = ops = nreads = nwrites = 0
        read_times, write_times = [], []
        first, last = np.inf, -np.inf
        for rank in ranks:
            ev = rank.events[rank.events["phase"] == code]
            if not len(ev):
                continue
            reads, writes = ev["op"] == _READ, ev["op"] == _WRITE
            write_like = writes | (ev["op"] == _FSYNC)
            br += int(ev["length"][reads].sum())
            bw += int(ev["length"][writes].sum())
            ops += len(ev)
            nreads += int(reads.sum())
            nwrites += int(writes.sum())
            read_times.append(busy_seconds(ev["start"][reads], ev["end"][reads]))
            write_times.append(busy_seconds(ev["start"][write_like], ev["end"][write_like]))
            first, last = min(first, float(ev["start"].min())), max(last, float(ev["end"].max()))
        entry = phase_entry(br, bw, max(read_times, default=0.0), max(write_times, default=0.0),
                            sum(read_times), sum(write_times), ops, nreads, nwrites)
        entry["first_start_s"], entry["last_end_s"] = first, last
        table[name] = entry
    return table


def _files(ranks: list[RankEvents]) -> dict[str, Any]:
    per_path: dict[str, dict[str, Any]] = {}
    for rank in ranks:
        ev = rank.events
        for op_code, key in ((_READ, "bytes_read"), (_WRITE, "bytes_written")):
            sel = ev["op"] == op_code
            sums = np.bincount(ev["file"][sel].astype(np.int64), weights=ev["length"][sel], minlength=len(rank.paths))
            for index, nbytes in enumerate(sums):
                entry = per_path.setdefault(rank.paths[index], {"bytes_read": 0, "bytes_written": 0, "ranks": set()})
                entry[key] += int(nbytes)
        for index in np.unique(ev["file"]):
            per_path.setdefault(rank.paths[int(index)], {"bytes_read": 0, "bytes_written": 0, "ranks": set()})["ranks"].add(rank.rank)
    counts = {"read_only": 0, "write_only": 0, "read_write": 0, "metadata_only": 0}
    for entry in per_path.values():
        r, w = entry["bytes_read"] > 0, entry["bytes_written"] > 0
        counts["read_write" if r and w else "read_only" if r else "write_only" if w else "metadata_only"] += 1
    top = sorted(per_path.items(), key=lambda kv: -(kv[1]["bytes_read"] + kv[1]["bytes_written"]))[:_TOP_FILES]
    return {
        "count": len(per_path), **counts,
        "top": [{"path": p, "bytes_read": e["bytes_read"], "bytes_written": e["bytes_written"], "ranks": len(e["ranks"])}
                for p, e in top],
        "listed": len(top),
    }


def _timeline(ranks: list[RankEvents], per_phase: dict[str, dict[str, Any]]) -> Timeline | None:
    if not ranks or not any(len(r.events) for r in ranks):
        return None
    span = max(float(r.events["end"].max()) for r in ranks if len(r.events))
    width, nbins = grid(span)
    out = {}
    for op_name, code in (("read", _READ), ("write", _WRITE)):
        rows, starts, ends, lengths = [], [], [], []
        for row, rank in enumerate(ranks):
            sel = rank.events["op"] == code
            ev = rank.events[sel]
            rows.append(np.full(len(ev), row))
            starts.append(ev["start"])
            ends.append(ev["end"])
            lengths.append(ev["length"])
        out[op_name] = spread(np.concatenate(rows), np.concatenate(starts), np.concatenate(ends),
                              np.concatenate(lengths), len(ranks), width, nbins)
    spans = [(name, p["first_start_s"], p["last_end_s"]) for name, p in per_phase.items()]
    return Timeline(width, out["read"], out["write"], [f"rank {r.rank}" for r in ranks], "events", spans)


def event_latency(ranks: list[RankEvents]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per phase and operation kind over all ranks: count, min, mean, stdev (n - 1, as fio's), p50,
    p90, p99, p99.9, max (seconds) and IOPS (calls / the slowest rank's overlap-free time in those
    calls), with the keys of summary.json's `latency`."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for code, phase in enumerate(PHASES):
        for op in REPORTED_OPS:
            took, busy = [], []
            for rank in ranks:
                mask = (rank.events["phase"] == code) & (rank.events["op"] == OP_CODE[op])
                if mask.any():
                    took.append(rank.events["end"][mask] - rank.events["start"][mask])
                    busy.append(busy_seconds(rank.events["start"][mask], rank.events["end"][mask]))
            if not took:
                continue
            durations = np.maximum(np.concatenate(took), 0.0)
            p50, p90, p99, p99_9 = np.percentile(durations, [50, 90, 99, 99.9], method="inverted_cdf")
            slowest = max(busy)
            table.setdefault(phase, {})[op] = {"count": int(len(durations)), "min_s": float(durations.min()),
                                               "mean_s": float(durations.mean()),
                                               "stdev_s": float(durations.std(ddof=1)) if len(durations) > 1 else 0.0,
                                               "p50_s": float(p50), "p90_s": float(p90), "p99_s": float(p99),
                                               "p99_9_s": float(p99_9), "max_s": float(durations.max()),
                                               "iops": len(durations) / slowest if slowest > 0 else None}
    return table


def old_figures(ranks: list[RankEvents]) -> dict[str, Any]:
    """What the old analyse_run took from the events."""
    per_phase = _per_phase(ranks)
    read_sizes = np.concatenate([r.events["length"][r.events["op"] == _READ] for r in ranks])
    write_sizes = np.concatenate([r.events["length"][r.events["op"] == _WRITE] for r in ranks])
    return {"per_rank": [_rank_figures(rank) for rank in ranks], "per_phase": per_phase,
            "histogram": {"buckets": list(SIZE_BUCKETS), "read": histogram_from_sizes(read_sizes),
                          "write": histogram_from_sizes(write_sizes), "source": "event lengths in Darshan's size buckets"},
            "files": _files(ranks), "latency": event_latency(ranks), "timeline": _timeline(ranks, per_phase)}
