"""What a person at the terminal sees: the headline and where the full report went.

The terminal gets a short view (rich tables); the report file and --json carry everything, so
nothing here has to be parseable.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from dlio_ckpt.analysis.compare import cell
from dlio_ckpt.analysis.latency import HEADERS, latency_rows
from dlio_ckpt.analysis.model import JobAnalysis
from dlio_ckpt.analysis.numbers import fmt, fmt_bytes, fmt_share, fmt_size

_RANKS_SHOWN = 8


def _job(console: Console, job: JobAnalysis) -> None:
    table = Table(title=job.label, show_header=False)
    table.add_column("figure")
    table.add_column("value", overflow="fold")
    table.add_row("bytes read", fmt_bytes(job.bytes_read))
    table.add_row("bytes written", fmt_bytes(job.bytes_written))
    for module in ("stdio", "mpiio"):
        other = job.extra.get(module)
        if other:
            table.add_row(f"{module.upper()} (not in totals)", f"read {fmt_size(other['bytes_read'])}, written {fmt_size(other['bytes_written'])}")
    if job.slowest_rank:
        table.add_row("slowest rank", f"{job.slowest_rank['label']} ({fmt(job.slowest_rank['io_s'])} s)")
    share = job.io_time_share
    if share:
        table.add_row("I/O time share", f"read {fmt_share(share.get('read'))}, checkpoint {fmt_share(share.get('checkpoint'))}, "
                                        f"other {fmt_share(share.get('other'))}")
    if job.files.get("count") is not None:
        table.add_row("files touched", fmt(job.files["count"]))
    if job.extra.get("console"):
        c = job.extra["console"]
        table.add_row("console (not checkpoint)", f"<STDIN>/<STDOUT>/<STDERR>: read {fmt_size(c['bytes_read'])}, "
                                                  f"written {fmt_size(c['bytes_written'])}")
    if job.extra.get("common_access_sizes"):
        table.add_row("common access sizes", ", ".join(f"{fmt_size(a['size'])} x {fmt(a['count'])}"
                                                       for a in job.extra["common_access_sizes"]))
    ops = job.extra.get("operations")
    if ops:
        table.add_row("operations", ", ".join(f"{k} {fmt(v)}" for k, v in ops.items() if v))
    lustre = job.extra.get("lustre")
    if lustre:
        table.add_row("Lustre striping", "; ".join(f"{fmt(x['files'])} files: {x['stripe_count']} x {fmt_size(x['stripe_size'])}"
                                                   for x in lustre["layouts"][:3]))
    console.print(table)
    if job.per_phase:
        wall = any("wall_mib_per_s" in p for p in job.per_phase.values())
        phases = Table(title="per phase (MiB/s = bytes / slowest rank's time in calls"
                             + ("; wall MiB/s = bytes / wall-clock s with transfers under way)" if wall else ")"))
        columns = ["phase", "bytes read", "bytes written", "read s", "write s", "read MiB/s", "write MiB/s"]
        for col in columns + (["wall s", "wall MiB/s"] if wall else []):
            phases.add_column(col, justify="right")
        for name, p in job.per_phase.items():
            row = [name, fmt_size(p["bytes_read"]), fmt_size(p["bytes_written"]), fmt(p["read_s"]), fmt(p["write_s"]),
                   fmt(p["read_mib_per_s"]), fmt(p["write_mib_per_s"])]
            phases.add_row(*row + ([fmt(p.get("active_s")), fmt(p.get("wall_mib_per_s"))] if wall else []))
        console.print(phases)
    if job.extra.get("latency"):
        latency = Table(title="latency and IOPS (calls / slowest rank's busy time)")
        for col in HEADERS:
            latency.add_column(col, justify="right")
        for row in latency_rows(job.extra["latency"]):
            latency.add_row(*[fmt(c) for c in row])
        console.print(latency)
    if job.per_rank:
        ranks = Table(title=f"slowest ranks (of {len(job.per_rank)})")
        for col in ("rank", "bytes read", "bytes written", "I/O s"):
            ranks.add_column(col, justify="right")
        for r in sorted(job.per_rank, key=lambda r: -(r.get("io_s") or 0.0))[:_RANKS_SHOWN]:
            ranks.add_row(r["label"], fmt_size(r.get("bytes_read")), fmt_size(r.get("bytes_written")), fmt(r.get("io_s")))
        console.print(ranks)
    for warning in job.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")


# terminal comparison layout: the metric names' column, and the widest value cell ("12,345 (+100%)")
_METRIC_WIDTH = 26
_VALUE_WIDTH = 16
# rows the legend above the table already says (what each job varied)
_LEGEND_ROWS = ("overrides",)


def comparison(console: Console, table: dict[str, Any]) -> None:
    """Columns named by short ids (a sweep job's folder number), each explained once above the
    table; as many jobs per table as fit the console's width (80 columns when not a terminal), the
    rest in further tables, so metric names are never squeezed out."""
    runs = table["runs"]
    for run in runs:
        short = table["ids"][run]
        console.print(f"{short}: {run.removeprefix(short).lstrip(': ') or run}"
                      + ("  (baseline)" if run == table.get("baseline") else ""), soft_wrap=True)
    per_table = max(1, (console.width - _METRIC_WIDTH - 4) // (_VALUE_WIDTH + 3))
    rows = [row for row in table["rows"] if row["metric"] not in _LEGEND_ROWS]
    for first in range(0, len(runs), per_table):
        shown = runs[first:first + per_table]
        view = Table(title="comparison" + (" (change against the baseline in brackets)" if table.get("baseline") else ""))
        view.add_column("metric", overflow="fold", min_width=_METRIC_WIDTH // 2, ratio=1)
        for run in shown:
            view.add_column(table["ids"][run], justify="right", no_wrap=True, overflow="ellipsis", max_width=_VALUE_WIDTH)
        for row in rows:
            view.add_row(row["label"], *[cell(table, row, run) for run in shown])
        console.print(view)


def show(jobs: list[JobAnalysis], table: dict[str, Any] | None, written: list[str], compare_only: bool) -> None:
    console = Console()
    if table is not None:
        comparison(console, table)
    if not compare_only:
        for job in jobs:
            _job(console, job)
    for path in written:
        console.print(f"wrote {path}", soft_wrap=True)  # a path cut at 80 columns could not be copied
