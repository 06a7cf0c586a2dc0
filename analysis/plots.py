"""PNG figures: a rank x time heat map, bandwidth over time, the I/O cost per phase, access-size
histograms, per-rank I/O time, and the comparison bar chart.

Figures are drawn on matplotlib's object API with the Agg canvas (no pyplot), so plotting never
switches the process-wide backend nor keeps figures alive in pyplot's global registry, and works
on a cluster node without a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dlio_ckpt.analysis.model import MIB, JobAnalysis, Timeline
from dlio_ckpt.optional import require

# one colour per kind of time in every figure, so read is the same blue in all of them
_KIND_COLOURS = {"read": "#1f77b4", "write": "#d62728", "meta": "#9e9e9e"}
_RANKS_PLOTTED = 40
_PHASE_COLOURS = {"generate": "#cccccc", "train": "#a6cee3", "eval": "#b2df8a", "checkpoint": "#fb9a99",
                  "restore": "#fdbf6f", "other": "#e0e0e0"}


def _figure(width: float, height: float):
    require("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def heatmap_png(timeline: Timeline, path: Path, title: str) -> Path:
    """Bytes moved per rank and time bin, read and write in separate panels (MiB per bin)."""
    fig = _figure(10, 6)
    axes = fig.subplots(2, 1, sharex=True)
    extent = (0.0, timeline.nbins * timeline.bin_width_s, timeline.read.shape[0] - 0.5, -0.5)
    for ax, op, data in ((axes[0], "read", timeline.read), (axes[1], "write", timeline.write)):
        shown = np.ma.masked_less_equal(data / MIB, 0.0)
        image = ax.imshow(shown, aspect="auto", interpolation="nearest", extent=extent, cmap="viridis")
        ax.set_ylabel("rank / process")
        ax.set_title(f"{op}: MiB per {timeline.bin_width_s:.3g} s bin (blank = no I/O)", fontsize=9)
        fig.colorbar(image, ax=ax, label="MiB")
        if len(timeline.row_labels) <= 32:
            ax.set_yticks(range(len(timeline.row_labels)))
            ax.set_yticklabels(timeline.row_labels, fontsize=6)
    axes[1].set_xlabel("seconds since job start")
    fig.suptitle(f"{_short(title)} (source: {timeline.source})", fontsize=10)
    fig.savefig(path)
    return path


def bandwidth_png(timeline: Timeline, path: Path, title: str, wall_rates: dict[str, tuple] | None = None) -> Path:
    """Aggregate MiB/s over all ranks per bin; run-folder phases shaded behind the lines; dashed,
    each op's bytes / the wall-clock seconds it was under way (the figure the tables print)."""
    fig = _figure(10, 4)
    ax = fig.subplots()
    times = (np.arange(timeline.nbins) + 0.5) * timeline.bin_width_s
    for name, start, end in timeline.phase_spans:
        ax.axvspan(start, end, color=_PHASE_COLOURS.get(name, "#eeeeee"), alpha=0.4, label=f"phase {name}")
    for op, data in (("read", timeline.read), ("write", timeline.write)):
        ax.plot(times, data.sum(axis=0) / timeline.bin_width_s / MIB, label=f"{op} MiB/s", color=_KIND_COLOURS[op],
                linewidth=1.2)
    for op, (rate, active_s) in (wall_rates or {}).items():
        # a rate over less time than two bins cannot be compared with the binned curve
        if rate and active_s and active_s >= 2 * timeline.bin_width_s:
            ax.axhline(rate, color=_KIND_COLOURS[op], linestyle="--", linewidth=0.9,
                       label=f"{op}: mean while under way, {rate:,.0f} MiB/s")
    ax.set_xlabel("seconds since job start")
    ax.set_ylabel("MiB/s (all ranks)")
    ax.set_xlim(0, timeline.nbins * timeline.bin_width_s)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(f"{_short(title)}: bandwidth over time ({timeline.bin_width_s:.3g} s bins, source: {timeline.source})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    return path


def _short(title: str, limit: int = 40) -> str:
    """A log's file name can run to 70 characters; the report names it in full beside the figure."""
    return title if len(title) <= limit else title[:limit - 3] + "..."


def _legend_above(ax) -> None:
    """Legend in one row above the axes, where it can never cover a bar."""
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)


def _style(ax) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="x", color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)


def io_cost_png(job: JobAnalysis, path: Path) -> Path | None:
    """Mean seconds per rank inside read, write and metadata calls, one bar per phase: where the
    I/O time of an average rank went (PyDarshan's "I/O cost" chart, split by phase)."""
    ranks = int(job.headline.get("ranks") or job.job.get("processes") or job.job.get("world_size")
                or len([r for r in job.per_rank if r.get("rank", 0) >= 0]) or 1)
    names, parts = [], {"read": [], "write": [], "meta": []}
    for name, p in job.per_phase.items():
        read, write = (p.get("read_s_sum") or 0.0) / ranks, (p.get("write_s_sum") or 0.0) / ranks
        if read <= 0 and write <= 0:
            continue
        names.append("checkpoint writes" if job.kind == "darshan" and name == "write" else name)
        parts["read"].append(read)
        parts["write"].append(write)
        parts["meta"].append(0.0)
    meta = job.io_time_share.get("other_s") if job.kind == "darshan" else None
    if meta:
        names.append("metadata (open, stat, seek...)")
        parts["read"].append(0.0)
        parts["write"].append(0.0)
        parts["meta"].append((meta - (job.io_time_share.get("console_s") or 0.0)) / ranks)
    if not names:
        return None
    fig = _figure(6, 0.5 * len(names) + 1.3)
    ax = fig.subplots()
    y = np.arange(len(names))[::-1]
    left = np.zeros(len(names))
    for kind, label in (("read", "read calls"), ("write", "write calls (incl. fsync)"), ("meta", "metadata calls")):
        values = np.array(parts[kind])
        if values.any():
            ax.barh(y, values, left=left, color=_KIND_COLOURS[kind], label=label, height=0.6)
            left += values
    for yy, total in zip(y, left):
        ax.text(total, yy, f"  {total:.3g} s" if total >= 0.001 else "  < 1 ms", va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel(f"seconds per rank (mean over {ranks} ranks)")
    ax.set_xlim(0, max(left.max() * 1.25, 1e-6))
    _legend_above(ax)
    _style(ax)
    fig.tight_layout()
    fig.savefig(path)
    return path


def access_sizes_png(job: JobAnalysis, path: Path) -> Path | None:
    """Read and write calls per Darshan size bucket, side by side (log scale: a few large calls
    next to thousands of small ones must both show)."""
    hist = job.histogram or {}
    if not hist.get("buckets") or not (any(hist.get("read", [])) or any(hist.get("write", []))):
        return None
    fig = _figure(6, 3.2)
    ax = fig.subplots()
    x = np.arange(len(hist["buckets"]))
    for offset, op in ((-0.2, "read"), (0.2, "write")):
        counts = np.array(hist[op], dtype=float)
        bars = ax.bar(x + offset, np.where(counts > 0, counts, np.nan), width=0.4, color=_KIND_COLOURS[op], label=f"{op} calls")
        for bar, count in zip(bars, counts):
            if count > 0:
                ax.text(bar.get_x() + bar.get_width() / 2, count, f"{int(count):,}", ha="center", va="bottom", fontsize=6)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels([b.replace("_", "-") for b in hist["buckets"]], fontsize=7)
    ax.set_xlabel("access size (bytes)")
    ax.set_ylabel("calls (log scale)")
    _legend_above(ax)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    return path


def ranks_png(job: JobAnalysis, path: Path) -> Path | None:
    """The per-rank table as a picture: read, write and metadata seconds per rank (stacked), the
    slowest at the top, bytes moved beside each bar; imbalance between ranks shows at a glance."""
    ranked = sorted(job.per_rank, key=lambda r: -(r.get("io_s") or 0.0))[:_RANKS_PLOTTED]
    if not ranked or not any(r.get("io_s") for r in ranked):
        return None
    fig = _figure(6, 0.22 * len(ranked) + 1.4)
    ax = fig.subplots()
    y = np.arange(len(ranked))[::-1]
    left = np.zeros(len(ranked))
    for kind, key, label in (("read", "read_s", "read"), ("write", "write_s", "write"), ("meta", "meta_s", "metadata")):
        values = np.array([r.get(key) or 0.0 for r in ranked])
        ax.barh(y, values, left=left, color=_KIND_COLOURS[kind], label=label, height=0.7)
        left += values
    for yy, total, r in zip(y, left, ranked):
        moved = (r.get("bytes_read") or 0) + (r.get("bytes_written") or 0)
        ax.text(total, yy, f" {moved / (1 << 30):.2f} GiB", va="center", fontsize=6, color="#555555")
    ax.set_yticks(y)
    ax.set_yticklabels([r["label"] for r in ranked], fontsize=7)
    ax.set_xlabel("seconds inside I/O calls")
    ax.set_xlim(0, left.max() * 1.2)
    _legend_above(ax)
    _style(ax)
    fig.tight_layout()
    fig.savefig(path)
    return path


def operations_png(job: JobAnalysis, path: Path) -> Path | None:
    """Calls per operation kind (PyDarshan's operation counts), log scale."""
    ops = {k: v for k, v in (job.extra.get("operations") or {}).items() if v > 0}  # zeros are in the table
    if not any(ops.values()):
        return None
    fig = _figure(6, 2.8)
    ax = fig.subplots()
    names = list(ops)
    values = np.array([ops[n] for n in names], dtype=float)
    colours = [_KIND_COLOURS.get(n, _KIND_COLOURS["meta"]) for n in names]
    bars = ax.bar(names, np.where(values > 0, values, np.nan), color=colours)
    for bar, value in zip(bars, values):
        ax.text(bar.get_x() + bar.get_width() / 2, max(value, 1), f"{int(value):,}", ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("calls (log scale)")
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    return path


def compare_png(rows: list[dict[str, Any]], runs: list[str], path: Path, title: str = "comparison",
                ids: list[str] | None = None) -> Path:
    compare_figure(rows, runs, title, ids).savefig(path)
    return path


def compare_figure(rows: list[dict[str, Any]], runs: list[str], title: str = "comparison", ids: list[str] | None = None):
    """One bar panel per headline metric, the same run order and colours in every panel. Bars are
    labelled with the comparison table's column ids (a sweep job's folder: "job 0" is folder 0),
    so a bar and the table column it stands for carry the same name."""
    ids = ids if ids is not None else [str(i + 1) for i in range(len(runs))]
    ncols = min(3, max(len(rows), 1))
    nrows = -(-max(len(rows), 1) // ncols)
    fig = _figure(3.4 * ncols + 0.6, 3.0 * nrows + 0.6 + 0.2 * len(runs))
    axes = np.atleast_1d(fig.subplots(nrows, ncols)).ravel()
    for ax in axes[len(rows):]:
        ax.set_visible(False)
    colours = [f"C{i % 10}" for i in range(len(runs))]
    for ax, row in zip(axes, rows):
        values = [row["values"].get(run) for run in runs]
        heights = [v if isinstance(v, (int, float)) else 0.0 for v in values]
        ax.bar(range(len(runs)), heights, color=colours)
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels(ids, fontsize=7)
        ax.set_title(row["label"], fontsize=8, wrap=True)
    from matplotlib.patches import Patch

    names = [run if run.startswith(f"{ident}: ") else f"{ident}: {run}" for ident, run in zip(ids, runs)]
    handles = [Patch(color=colours[i], label=name) for i, name in enumerate(names)]
    fig.legend(handles=handles, loc="lower center", ncol=min(3, len(runs)), fontsize=7)
    fig.suptitle(title, fontsize=10)
    legend_height = (0.2 * (-(-len(runs) // 3)) + 0.2) / (3.0 * nrows + 0.6 + 0.2 * len(runs))
    fig.tight_layout(rect=(0, legend_height, 1, 0.95))
    return fig
