"""PNG figures: a rank x time heat map, bandwidth over time, and the comparison bar chart.

Figures are drawn on matplotlib's object API with the Agg canvas (no pyplot), so plotting never
switches the process-wide backend nor keeps figures alive in pyplot's global registry, and works
on a cluster node without a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dlio_ckpt.analysis.model import MIB, Timeline
from dlio_ckpt.optional import require

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
    fig.suptitle(f"{title} (source: {timeline.source})", fontsize=10)
    fig.savefig(path)
    return path


def bandwidth_png(timeline: Timeline, path: Path, title: str) -> Path:
    """Aggregate MiB/s over all ranks per bin; run-folder phases shaded behind the lines."""
    fig = _figure(10, 4)
    ax = fig.subplots()
    times = (np.arange(timeline.nbins) + 0.5) * timeline.bin_width_s
    for name, start, end in timeline.phase_spans:
        ax.axvspan(start, end, color=_PHASE_COLOURS.get(name, "#eeeeee"), alpha=0.4, label=f"phase {name}")
    for op, data, colour in (("read", timeline.read, "tab:blue"), ("write", timeline.write, "tab:red")):
        ax.plot(times, data.sum(axis=0) / timeline.bin_width_s / MIB, label=f"{op} MiB/s", color=colour, linewidth=1.2)
    ax.set_xlabel("seconds since job start")
    ax.set_ylabel("MiB/s (all ranks)")
    ax.set_xlim(0, timeline.nbins * timeline.bin_width_s)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(f"{title}: bandwidth over time ({timeline.bin_width_s:.3g} s bins, source: {timeline.source})", fontsize=10)
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
