"""`dlio_ckpt-analyze`: one command for Darshan logs, run folders and sweeps.

All inputs are first detected (so a bad path fails before any work), then reduced to JobAnalysis
objects, then written: terminal tables, a Markdown/HTML report with PNG figures, or one JSON
document on stdout. With --json nothing is written to disk unless --output/--out-dir asks for it,
so the command can sit in a pipeline. User errors (bad path, missing optional dependency) are one
line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from dlio_ckpt import __version__
from dlio_ckpt.analysis import plots as figures, report
from dlio_ckpt.analysis.compare import compare, plotted_rows
from dlio_ckpt.analysis.darshan_logs import analyse_logs
from dlio_ckpt.analysis.inputs import ACCEPTED, Source, detect_all
from dlio_ckpt.analysis.model import JobAnalysis, plain
from dlio_ckpt.analysis.render import render
from dlio_ckpt.analysis.run_folders import analyse_run
from dlio_ckpt.analysis.scaling import format_table, weak_scaling
from dlio_ckpt.analysis.sweeps import analyse_sweep, analyse_sweep_job
from dlio_ckpt.analysis.terminal import show
from dlio_ckpt.errors import USAGE_EXIT_CODE, UserError
from dlio_ckpt.optional import require

PROG = "dlio_ckpt-analyze"
DEFAULT_OUT_DIR = "dlio_ckpt-analysis"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Analyse the I/O of dlio_ckpt runs, sweeps and Darshan logs (built on PyDarshan).",
        epilog=ACCEPTED[0].upper() + ACCEPTED[1:] + ".",
    )
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                   help="Darshan log(s), a folder of logs, run folder(s) or a sweep folder")
    p.add_argument("--compare", action="store_true",
                   help="show runs / sweep jobs side by side (table and bar chart) instead of one by one")
    p.add_argument("--baseline", metavar="JOB", default=None,
                   help="with --compare (implied): show each metric's change in percent against this job "
                        "(a sweep job's folder number, e.g. 0, or a run's column number or label)")
    p.add_argument("--scaling", action="store_true",
                   help="weak-scaling table: per-rank and aggregate bandwidth against ranks, from run folders "
                        "or sweep folders of one configuration run at several `mpirun -np` (prints only)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--format", choices=("md", "html"), default=None, help="report format (default: md, "
                   "or from the --output suffix)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--output", type=Path, metavar="FILE", help="report file; figures go beside it")
    where.add_argument("--out-dir", type=Path, metavar="DIR",
                       help=f"folder for report and figures (default without --json: ./{DEFAULT_OUT_DIR})")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG figures (no matplotlib needed)")
    return p


def load(sources: list[Source], timeline: bool) -> list[JobAnalysis]:
    """Every source to jobs; all Darshan logs together, so a job's logs given apart still group."""
    jobs: list[JobAnalysis] = []
    logs: list[Path] = []
    seen: set[Path] = set()
    darshan_at = None
    for source in sources:
        if source.kind == "darshan":
            darshan_at = len(jobs) if darshan_at is None else darshan_at
            for log in source.logs:
                if log.resolve() not in seen:  # the same log twice would double count
                    seen.add(log.resolve())
                    logs.append(log)
        elif source.kind == "run":
            jobs.append(analyse_sweep_job(source.path, timeline) or analyse_run(source.path, timeline=timeline))
        else:
            jobs.extend(analyse_sweep(source.path, timeline=timeline))
    if logs:
        jobs[darshan_at:darshan_at] = analyse_logs(logs, timeline=timeline)
    return jobs


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:60] or "job"


def _destination(args: argparse.Namespace) -> tuple[Path | None, str]:
    fmt_name = args.format
    if args.output is not None:
        if fmt_name is None:
            fmt_name = "html" if args.output.suffix.lower() in (".html", ".htm") else "md"
        return args.output, fmt_name
    fmt_name = fmt_name or "md"
    if args.out_dir is not None:
        return args.out_dir / f"report.{fmt_name}", fmt_name
    if args.json:
        return None, fmt_name
    return Path(DEFAULT_OUT_DIR) / f"report.{fmt_name}", fmt_name


def write_outputs(jobs: list[JobAnalysis], table: dict[str, Any] | None, report_path: Path, fmt_name: str,
                  plots: bool, job_figures: bool) -> tuple[list[str], str | None]:
    out_dir = report_path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    compare_figure = None
    if plots:
        if table is not None:
            rows = plotted_rows(table)
            if rows:
                compare_figure = str(figures.compare_png(rows, table["runs"], out_dir / "comparison.png",
                                                            ids=[table["ids"][run] for run in table["runs"]]))
                written.append(compare_figure)
        for index, job in enumerate(jobs):
            if not job_figures:
                continue
            stem = _slug(job.label) if len(jobs) == 1 else f"{index + 1:02d}-{_slug(job.label)}"
            if job.timeline is not None:
                job.figures["heatmap"] = str(figures.heatmap_png(job.timeline, out_dir / f"{stem}-heatmap.png", job.label))
                wall = {op: ((job.per_phase.get(op) or {}).get("wall_mib_per_s"), (job.per_phase.get(op) or {}).get("active_s"))
                        for op in ("read", "write")}
                job.figures["bandwidth"] = str(figures.bandwidth_png(job.timeline, out_dir / f"{stem}-bandwidth.png",
                                                                     job.label, wall))
            for name, draw in (("io_cost", figures.io_cost_png), ("access_sizes", figures.access_sizes_png),
                               ("operations", figures.operations_png), ("ranks", figures.ranks_png)):
                drawn = draw(job, out_dir / f"{stem}-{name.replace('_', '-')}.png")
                if drawn is not None:
                    job.figures[name] = str(drawn)
            written += list(job.figures.values())
    text = render(report.build(jobs, table, compare_figure, out_dir), fmt_name)
    report_path.write_text(text, encoding="utf-8")
    written.append(str(report_path))
    return written, compare_figure


def document(args: argparse.Namespace, jobs: list[JobAnalysis], table: dict[str, Any] | None,
             report_path: Path | None, compare_figure: str | None) -> dict[str, Any]:
    """One job: its figures at the top level. Several: totals at the top, each job under "jobs"."""
    common = {"tool": PROG, "tool_version": __version__, "arguments": [str(p) for p in args.paths],
              "report": str(report_path) if report_path else None}
    if table is None and len(jobs) == 1:
        return plain({**common, **jobs[0].to_json()})
    return plain({
        **common,
        "mode": "compare" if args.compare else "jobs",
        "inputs": [i for job in jobs for i in job.inputs],
        "bytes_read": sum(job.bytes_read for job in jobs),
        "bytes_written": sum(job.bytes_written for job in jobs),
        "comparison": table,
        "figures": {"comparison": compare_figure} if compare_figure else {},
        "jobs": [job.to_json() for job in jobs],
    })


def run(args: argparse.Namespace) -> int:
    args.compare = args.compare or args.baseline is not None
    if args.scaling:
        return show_scaling(args)
    sources = detect_all(args.paths)
    report_path, fmt_name = _destination(args)
    plots = not args.no_plots and report_path is not None
    if plots:
        require("matplotlib")  # fail before the work, not after it
    jobs = load(sources, timeline=plots)
    if not jobs:
        raise UserError(f"no jobs found in {', '.join(map(str, args.paths))}; {ACCEPTED}")
    if args.compare and len(jobs) < 2:
        raise UserError(f"--compare needs at least two runs, sweep jobs or Darshan jobs; found {len(jobs)} "
                        f"in {', '.join(map(str, args.paths))}")
    table = compare(jobs, args.baseline) if args.compare or len(jobs) > 1 else None
    written: list[str] = []
    compare_figure = None
    if report_path is not None:
        written, compare_figure = write_outputs(jobs, table, report_path, fmt_name, plots, job_figures=not args.compare)
    if args.json:
        json.dump(document(args, jobs, table, report_path, compare_figure), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        show(jobs, table, written, compare_only=args.compare)
    return 0


def show_scaling(args: argparse.Namespace) -> int:
    """--scaling: the weak-scaling table on stdout (or JSON); nothing is written to disk."""
    rows = weak_scaling(args.paths)
    if args.json:
        json.dump({"tool": PROG, "tool_version": __version__, "mode": "scaling", "rows": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except UserError as exc:
        message = " ".join(str(exc).split())
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return USAGE_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
