"""The report document, written once as a list of blocks and rendered to Markdown or HTML.

Keeping one block list for both formats means the two can never disagree on which figures they
show; every table says what it counts and in which unit, because readers compare these numbers
with other tools' (docs/metrics.md).
"""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path
from typing import Any

from dlio_ckpt.analysis.model import GIB, MIB, JobAnalysis

Block = tuple  # ("h", level, text) | ("p", text) | ("ul", [text]) | ("table", headers, rows) | ("img", src, alt, file)

_RANKS_SHOWN = 20
_FILES_SHOWN = 20


def fmt_bytes(value: Any) -> str:
    if value is None:
        return "-"
    return f"{int(value):,} ({int(value) / GIB:.3f} GiB)"


def fmt_size(value: Any) -> str:
    """Short binary size for narrow places (terminal columns): exact counts are in the report."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return str(value)


def fmt(value: Any) -> str:
    """Numbers for people: thousands separated, about 4 significant digits, never exponents.

    Shares as percentages are left to the caller.
    """
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        magnitude = abs(value)
        if magnitude >= 1000:
            return f"{value:,.0f}"
        if magnitude == 0 or magnitude >= 0.001:
            return f"{value:.4g}"
        return f"{value:.6f}".rstrip("0")
    return str(value)


def fmt_share(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _job_blocks(job: JobAnalysis, level: int, out_dir: Path | None) -> list[Block]:
    blocks: list[Block] = [("h", level, job.label)]
    inputs = job.inputs
    if len(inputs) > 3:
        common = os.path.commonpath(inputs)
        blocks.append(("p", f"{len(inputs)} inputs under {common}"))
    else:
        blocks.append(("p", "Input: " + ", ".join(inputs)))
    rows = [
        ["bytes read", fmt_bytes(job.bytes_read)],
        ["bytes written", fmt_bytes(job.bytes_written)],
    ]
    if job.kind == "darshan":
        rows.insert(0, ["source", "Darshan: sums of POSIX_BYTES_READ / POSIX_BYTES_WRITTEN over all POSIX records"])
        for module in ("stdio", "mpiio"):
            other = job.extra.get(module)
            if other:
                rows.append([f"{module.upper()} (not in the totals)",
                             f"read {fmt_bytes(other['bytes_read'])}, written {fmt_bytes(other['bytes_written'])}"])
        rows += [["job id", fmt(job.job.get("jobid"))], ["logs", fmt(job.job.get("logs"))],
                 ["ranks / processes", fmt(job.job.get("processes"))], ["run time (s)", fmt(job.job.get("run_time_s"))],
                 ["modules", ", ".join(job.job.get("modules", []))]]
    else:
        rows.insert(0, ["source", "dlio_ckpt run folder: per-rank events"])
        rows += [[key, fmt(job.job.get(key))] for key in ("workload", "mode", "world_size", "wall_s", "started_at")]
    if job.slowest_rank:
        rows.append(["slowest rank", f"{job.slowest_rank['label']}: {fmt(job.slowest_rank['io_s'])} s of I/O"])
    blocks += [("h", level + 1, "Summary"), ("table", ["figure", "value"], rows)]

    if job.per_phase:
        blocks += [("h", level + 1, "Per phase"),
                   ("p", "Bandwidth = bytes of the phase / busy time of the slowest rank in it (MiB/s = 2^20 B/s). "
                         "'time, summed' adds every rank's busy time.")]
        head = ["phase", "bytes read", "bytes written", "read s (slowest rank)", "write s (slowest rank)",
                "read s (summed)", "write s (summed)", "read MiB/s", "write MiB/s", "ops"]
        body = [[name, fmt(p["bytes_read"]), fmt(p["bytes_written"]), fmt(p["read_s"]), fmt(p["write_s"]),
                 fmt(p["read_s_sum"]), fmt(p["write_s_sum"]), fmt(p["read_mib_per_s"]), fmt(p["write_mib_per_s"]),
                 fmt(p["ops"])] for name, p in job.per_phase.items()]
        blocks.append(("table", head, body))

    if job.per_rank:
        ranked = sorted(job.per_rank, key=lambda r: -(r.get("io_s") or 0.0))
        shown = ranked[:_RANKS_SHOWN]
        note = (f"{len(shown)} of {len(ranked)} ranks, slowest first (all of them are in the JSON output). "
                if len(ranked) > len(shown) else "Slowest first. ")
        blocks += [("h", level + 1, "Per rank"),
                   ("p", note + "I/O time = read + write (incl. fsync) + metadata time, seconds.")]
        head = ["rank", "bytes read", "bytes written", "read s", "write s", "meta s", "I/O s", "read MiB/s", "write MiB/s"]
        body = [[r["label"], fmt(r.get("bytes_read")), fmt(r.get("bytes_written")), fmt(r.get("read_s")),
                 fmt(r.get("write_s")), fmt(r.get("meta_s")), fmt(r.get("io_s")), fmt(r.get("read_mib_per_s")),
                 fmt(r.get("write_mib_per_s"))] for r in shown]
        blocks.append(("table", head, body))

    share = job.io_time_share
    if share:
        blocks += [("h", level + 1, "Read vs checkpoint share of I/O time"), ("p", share.get("basis", "")),
                   ("table", ["part", "share", "seconds"],
                    [["read", fmt_share(share.get("read")), fmt(share.get("read_s"))],
                     ["checkpoint", fmt_share(share.get("checkpoint")), fmt(share.get("checkpoint_s"))],
                     ["other", fmt_share(share.get("other")), fmt(share.get("other_s"))]])]

    latency = job.extra.get("latency")
    if latency:
        from dlio_ckpt.analysis.latency import HEADERS, latency_rows

        blocks += [("h", level + 1, "Latency and IOPS"),
                   ("p", f"Per phase and call kind, all ranks: percentiles of call durations "
                         f"({job.extra.get('latency_source', '')}); IOPS = calls / the slowest rank's busy time in them."),
                   ("table", HEADERS, [[fmt(c) for c in row] for row in latency_rows(latency)])]

    hist = job.histogram
    if hist and hist.get("buckets"):
        blocks += [("h", level + 1, "Access sizes"),
                   ("p", f"Number of read and write calls per size bucket (bytes; bucket upper bounds inclusive). "
                         f"Source: {hist.get('source', '')}."),
                   ("table", ["size", "reads", "writes"],
                    [[b, fmt(r), fmt(w)] for b, r, w in zip(hist["buckets"], hist["read"], hist["write"])])]

    files = job.files
    if files and files.get("count") is not None:
        blocks += [("h", level + 1, "Files touched"),
                   ("p", f"{files['count']} files: {files.get('read_only', 0)} read-only, "
                         f"{files.get('write_only', 0)} write-only, {files.get('read_write', 0)} read/write, "
                         f"{files.get('metadata_only', 0)} opened or stat'ed without data.")]
        top = files.get("top", [])[:_FILES_SHOWN]
        if top:
            blocks.append(("table", ["file", "bytes read", "bytes written", "ranks"],
                           [[f["path"], fmt(f["bytes_read"]), fmt(f["bytes_written"]), fmt(f["ranks"])] for f in top]))

    if job.figures:
        blocks.append(("h", level + 1, "Figures"))
        captions = {
            "heatmap": "Heat map: bytes moved per rank (rows) and time bin (columns), read and write panels.",
            "bandwidth": "Bandwidth over time: bytes of all ranks per bin / bin width, MiB/s; phases shaded.",
        }
        for name, path in job.figures.items():
            blocks.append(("p", captions.get(name, name)))
            if name == "bandwidth":
                blocks += [("p", note) for note in bandwidth_notes(job)]
            blocks.append(("img", _relative(path, out_dir), f"{job.label} {name}", path))

    darshan = job.extra.get("darshan")
    if darshan:
        blocks += [("h", level + 1, "PyDarshan derived metrics"), ("p", darshan.get("note", "")),
                   ("table", ["metric", "value"], [[k, fmt(v)] for k, v in darshan.items() if k != "note"])]
    summary = job.extra.get("summary")
    if summary:
        blocks.append(("h", level + 1, "From summary.json"))
        storage = (summary.get("train") or {}).get("storage")
        if storage:
            need = storage.get("required_mib_per_s")
            blocks.append(("p", f"Is the storage the bottleneck? {storage['verdict']} (required = ranks x batch x "
                                f"bytes per sample / compute per step{'' if need is None else f' = {fmt(need)} MiB/s'})."))
        for section, values in summary.items():
            if isinstance(values, dict):
                rows = [[k, fmt(v)] for k, v in values.items() if not isinstance(v, (dict, list))]
                blocks += [("p", section), ("table", ["key", "value"], rows)]
    cross = job.extra.get("darshan_crosscheck")
    if cross:
        blocks.append(("p", f"Darshan log of this run: {fmt(cross['bytes_read'])} bytes read, "
                            f"{fmt(cross['bytes_written'])} written; agrees with the events: {cross['agrees']}."))
    if job.warnings:
        blocks += [("h", level + 1, "Warnings"), ("ul", list(job.warnings))]
    return blocks


def bandwidth_notes(job: JobAnalysis) -> list[str]:
    """Why a phase's headline bandwidth differs from the bandwidth plot's curve: the table divides
    by the slowest rank's busy time in reads or writes, the plot by wall-clock time over all ranks
    (ranks also compute, wait and checkpoint), so the plot's mean over the phase is lower."""
    notes = []
    for phase, p in job.per_phase.items():
        span = (p.get("last_end_s") or 0.0) - (p.get("first_start_s") or 0.0)
        for kind in ("read", "write"):
            nbytes, rate, busy = p.get(f"bytes_{kind}"), p.get(f"{kind}_mib_per_s"), p.get(f"{kind}_s")
            if not nbytes or rate is None or span <= 0:
                continue
            plotted = nbytes / span / MIB
            notes.append(f"{phase} {kind}s: the tables' {fmt(rate)} MiB/s is {fmt(nbytes)} bytes / the slowest rank's "
                         f"{fmt(busy)} s busy in {kind} calls; the plot averages {fmt(plotted)} MiB/s over the phase's "
                         f"{fmt(span)} s of wall-clock time, all ranks together (time outside {kind} calls included).")
    return notes


def _relative(path: str, out_dir: Path | None) -> str:
    if out_dir is None:
        return path
    try:
        return os.path.relpath(path, out_dir)
    except ValueError:
        return path


def comparison_blocks(table: dict[str, Any], figure: str | None, level: int, out_dir: Path | None) -> list[Block]:
    from dlio_ckpt.analysis.compare import cell, column_header

    runs = table["runs"]
    head = ["metric"] + [column_header(table, run) for run in runs]
    body = [[row["label"]] + [cell(table, row, run) for run in runs] for row in table["rows"]]
    blocks: list[Block] = [("h", level, "Comparison")]
    if table.get("baseline"):
        blocks.append(("p", f"In brackets: the change against the baseline, {table['baseline']}, in percent of its value."))
    blocks.append(("table", head, body))
    if figure:
        blocks += [("p", "Bars: the first headline metrics with values; numbers under the bars are the columns above."),
                   ("img", _relative(figure, out_dir), "comparison", figure)]
    return blocks


def build(jobs: list[JobAnalysis], table: dict[str, Any] | None, compare_figure: str | None,
          out_dir: Path | None) -> list[Block]:
    title = jobs[0].label if len(jobs) == 1 else f"{len(jobs)} jobs"
    blocks: list[Block] = [("h", 1, f"dlio_ckpt I/O analysis: {title}"),
                           ("p", f"Totals over the input: {fmt_bytes(sum(j.bytes_read for j in jobs))} read, "
                                 f"{fmt_bytes(sum(j.bytes_written for j in jobs))} written.")]
    if table is not None:
        blocks += comparison_blocks(table, compare_figure, 2, out_dir)
    for job in jobs:
        blocks += _job_blocks(job, 2, out_dir)
    return blocks


def to_markdown(blocks: list[Block]) -> str:
    def cell(text: Any) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines: list[str] = []
    for block in blocks:
        kind = block[0]
        if kind == "h":
            lines += ["#" * block[1] + " " + block[2], ""]
        elif kind == "p":
            if block[1]:
                lines += [block[1], ""]
        elif kind == "ul":
            lines += [f"- {item}" for item in block[1]] + [""]
        elif kind == "table":
            headers, rows = block[1], block[2]
            lines.append("| " + " | ".join(cell(h) for h in headers) + " |")
            lines.append("|" + "|".join("---" for _ in headers) + "|")
            lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
            lines.append("")
        elif kind == "img":
            lines += [f"![{block[2]}]({block[1]})", ""]
    return "\n".join(lines)


def to_html(blocks: list[Block]) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'><title>dlio_ckpt I/O analysis</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
             "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;"
             "font-size:13px;text-align:right}td:first-child,th:first-child{text-align:left}img{max-width:100%}</style>",
             "</head><body>"]
    for block in blocks:
        kind = block[0]
        if kind == "h":
            parts.append(f"<h{block[1]}>{e(block[2])}</h{block[1]}>")
        elif kind == "p":
            if block[1]:
                parts.append(f"<p>{e(block[1])}</p>")
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{e(str(i))}</li>" for i in block[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{e(str(h))}</th>" for h in block[1])
            body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in block[2])
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif kind == "img":
            parts.append(f"<p><img src='{_data_uri(block)}' alt='{e(block[2])}' data-file='{e(block[1])}'></p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _data_uri(block: Block) -> str:
    """The figure inside the page (base64 PNG), so the HTML report is one file that can be mailed
    or attached; the relative link when the file is not there to read."""
    source = Path(block[3]) if len(block) > 3 else None
    if source is None or not source.is_file():
        return html.escape(block[1])
    return "data:image/png;base64," + base64.b64encode(source.read_bytes()).decode("ascii")


def render(blocks: list[Block], fmt_name: str) -> str:
    return to_html(blocks) if fmt_name == "html" else to_markdown(blocks)
