"""The report document, written once as a list of blocks and rendered to Markdown or HTML (render.py).

Keeping one block list for both formats means the two can never disagree on which figures they
show; every table says what it counts and in which unit, because readers compare these numbers
with other tools' (docs/metrics.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dlio_ckpt.analysis.compare import cell, column_header
from dlio_ckpt.analysis.latency import HEADERS, latency_rows
from dlio_ckpt.analysis.model import MIB, JobAnalysis
from dlio_ckpt.analysis.numbers import fmt, fmt_bytes, fmt_share, fmt_size

Block = tuple  # ("h", level, text) | ("p", text) | ("ul", [text]) | ("table", headers, rows[, fold]) |
#               ("img", src, alt, file) | ("figure", src, alt, file, title, caption) |
#               ("cards", [(label, value, note)]) | ("warn", [text])

_RANKS_SHOWN = 20
_FILES_SHOWN = 20


def _job_blocks(job: JobAnalysis, level: int, out_dir: Path | None) -> list[Block]:
    """Every section of one job's part of the report, in order; a section with no data is left out."""
    return (_input_blocks(job, level) + _figure_blocks(job, level, out_dir) + _summary_blocks(job, level) +
            _phase_blocks(job, level) + _rank_blocks(job, level) + _share_blocks(job, level) +
            _latency_blocks(job, level) + _size_blocks(job, level) + _darshan_summary_blocks(job, level) +
            _file_blocks(job, level) + _run_extra_blocks(job, level))


def _input_blocks(job: JobAnalysis, level: int) -> list[Block]:
    """The job's heading, its inputs, warnings and key-figure cards."""
    blocks: list[Block] = [("h", level, job.label)]
    inputs = job.inputs
    if len(inputs) > 3:
        common = os.path.commonpath(inputs)
        blocks.append(("p", f"{len(inputs)} inputs under {common}"))
    else:
        blocks.append(("p", "Input: " + ", ".join(inputs)))
    if job.warnings:
        blocks.append(("warn", list(job.warnings)))
    blocks.append(("cards", key_figures(job)))
    return blocks


def _figure_blocks(job: JobAnalysis, level: int, out_dir: Path | None) -> list[Block]:
    """The figures, in a fixed order, each with its caption."""
    blocks: list[Block] = []
    if job.figures:
        blocks.append(("h", level + 1, "Figures (the tables below hold the exact numbers)"))
        order = ("bandwidth", "io_cost", "ranks", "access_sizes", "operations", "heatmap")
        for name, path in sorted(job.figures.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99):
            title, caption = FIGURE_CAPTIONS.get(name, (name, ""))
            if name == "access_sizes" and job.extra.get("common_access_sizes"):
                caption += " The most common exact sizes are in the Access sizes table below."
            if name == "bandwidth":
                shaded = ["Shaded: the run's phases."] if job.timeline is not None and job.timeline.phase_spans else []
                caption = " ".join([caption] + shaded + bandwidth_notes(job))
            blocks.append(("figure", _relative(path, out_dir), f"{job.label} {name}", path, title, caption))
    return blocks


def _summary_blocks(job: JobAnalysis, level: int) -> list[Block]:
    """The totals table: bytes, the source, the job (Darshan) or the run (dlio_ckpt), the slowest rank."""
    blocks: list[Block] = []
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
        rows += [["job id", str(job.job.get("jobid", "-"))], ["started (UTC)", job.job.get("start", "-")],
                 ["command line", job.job.get("exe") or "-"], ["logs", fmt(job.job.get("logs"))],
                 ["ranks / processes", fmt(job.job.get("processes"))], ["run time (s)", fmt(job.job.get("run_time_s"))],
                 ["modules", ", ".join(job.job.get("modules", []))],
                 ["partial module data", ", ".join(job.extra.get("partial_modules") or []) or "none (every module complete)"]]
    else:
        rows.insert(0, ["source", "dlio_ckpt run folder: per-rank events"])
        rows += [[key, fmt(job.job.get(key))] for key in ("workload", "mode", "world_size", "wall_s", "started_at")]
    if job.slowest_rank:
        rows.append(["slowest rank", f"{job.slowest_rank['label']}: {fmt(job.slowest_rank['io_s'])} s of I/O"])
    blocks += [("h", level + 1, "Summary"), ("table", ["figure", "value"], rows)]
    return blocks


def _phase_blocks(job: JobAnalysis, level: int) -> list[Block]:
    """Bytes, busy times and bandwidth per phase."""
    blocks: list[Block] = []
    if job.per_phase:
        blocks += [("h", level + 1, "Per phase"),
                   ("p", "Bandwidth = bytes of the phase / busy time of the slowest rank in it (MiB/s = 2^20 B/s). "
                         "'time, summed' adds every rank's busy time.")]
        head = ["phase", "bytes read", "bytes written", "read s (slowest rank)", "write s (slowest rank)",
                "read s (summed)", "write s (summed)", "read MiB/s", "write MiB/s", "ops"]
        body = [[name, fmt(p["bytes_read"]), fmt(p["bytes_written"]), fmt(p["read_s"]), fmt(p["write_s"]),
                 fmt(p["read_s_sum"]), fmt(p["write_s_sum"]), fmt(p["read_mib_per_s"]), fmt(p["write_mib_per_s"]),
                 fmt(p["ops"])] for name, p in job.per_phase.items()]
        if any("wall_mib_per_s" in p for p in job.per_phase.values()):
            head += ["wall-clock s under way", "wall-clock MiB/s"]
            body = [row + [fmt(p.get("active_s")), fmt(p.get("wall_mib_per_s"))]
                    for row, p in zip(body, job.per_phase.values())]
            blocks.append(("p", "For Darshan logs the read/write MiB/s is Darshan's estimate (it assumes all ranks were "
                                "in calls at the same time); 'wall-clock MiB/s' divides the same bytes by the seconds "
                                "during which at least one file was being read or written (the union of each record's "
                                "first-to-last access), which is what the bandwidth plot shows."
                                + (" The console phase is <STDIN>/<STDOUT>/<STDERR>: counted in the totals, never "
                                   "as checkpoint data." if "console" in job.per_phase else "")))
        blocks.append(("table", head, body))
    return blocks


def _rank_blocks(job: JobAnalysis, level: int) -> list[Block]:
    """The slowest ranks' bytes, times and bandwidth."""
    blocks: list[Block] = []
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
        blocks.append(("table", head, body, f"the table of the {len(shown)} slowest ranks (plotted above, in 'I/O time per rank')"))
    return blocks


def _share_blocks(job: JobAnalysis, level: int) -> list[Block]:
    """Read vs checkpoint share of the I/O time."""
    blocks: list[Block] = []
    share = job.io_time_share
    if share:
        blocks += [("h", level + 1, "Read vs checkpoint share of I/O time"), ("p", share.get("basis", "")),
                   ("table", ["part", "share", "seconds"],
                    [["read", fmt_share(share.get("read")), fmt(share.get("read_s"))],
                     ["checkpoint", fmt_share(share.get("checkpoint")), fmt(share.get("checkpoint_s"))],
                     ["other", fmt_share(share.get("other")), fmt(share.get("other_s"))]])]
    return blocks


def _latency_blocks(job: JobAnalysis, level: int) -> list[Block]:
    """Latency percentiles and IOPS per phase and call kind."""
    blocks: list[Block] = []
    latency = job.extra.get("latency")
    if latency:
        blocks += [("h", level + 1, "Latency and IOPS"),
                   ("p", f"Per phase and call kind, all ranks: percentiles of call durations "
                         f"({job.extra.get('latency_source', '')}); IOPS = calls / the slowest rank's busy time in them."),
                   ("table", HEADERS, [[fmt(c) for c in row] for row in latency_rows(latency)])]
    return blocks


def _size_blocks(job: JobAnalysis, level: int) -> list[Block]:
    """Calls per access-size bucket."""
    blocks: list[Block] = []
    hist = job.histogram
    if hist and hist.get("buckets"):
        blocks += [("h", level + 1, "Access sizes"),
                   ("p", f"Number of read and write calls per size bucket (bytes; bucket upper bounds inclusive). "
                         f"Source: {hist.get('source', '')}."),
                   ("table", ["size", "reads", "writes"],
                    [[b, fmt(r), fmt(w)] for b, r, w in zip(hist["buckets"], hist["read"], hist["write"])],
                    "calls per size bucket, as a table")]
    return blocks


def _file_blocks(job: JobAnalysis, level: int) -> list[Block]:
    """Files touched, and the ones with the most bytes."""
    blocks: list[Block] = []
    files = job.files
    if files and files.get("count") is not None:
        blocks += [("h", level + 1, "Files touched"),
                   ("p", f"{files['count']} files: {files.get('read_only', 0)} read-only, "
                         f"{files.get('write_only', 0)} write-only, {files.get('read_write', 0)} read/write, "
                         f"{files.get('metadata_only', 0)} opened or stat'ed without data.")]
        top = files.get("top", [])[:_FILES_SHOWN]
        if top:
            blocks.append(("table", ["file", "bytes read", "bytes written", "ranks"],
                           [[f["path"], fmt(f["bytes_read"]), fmt(f["bytes_written"]), fmt(f["ranks"])] for f in top],
                           f"the {len(top)} files with the most bytes"))
    return blocks


def _run_extra_blocks(job: JobAnalysis, level: int) -> list[Block]:
    """PyDarshan's derived metrics, summary.json's sections, and the run's Darshan cross-check."""
    blocks: list[Block] = []
    darshan = job.extra.get("darshan")
    if darshan:
        blocks += [("h", level + 1, "PyDarshan derived metrics"), ("p", darshan.get("note", "")),
                   ("table", ["metric", "value"], [[k, fmt(v)] for k, v in darshan.items() if k != "note"],
                    "PyDarshan's accumulator figures")]
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
    return blocks


def _darshan_summary_blocks(job: JobAnalysis, level: int) -> list[Block]:
    """What PyDarshan's summary page adds to the histogram: exact common sizes, operation counts
    (seeks among them) and the Lustre striping the files had."""
    blocks: list[Block] = []
    common = job.extra.get("common_access_sizes")
    if common:
        blocks += [("p", "Most common access sizes (POSIX_ACCESS1..4 over all records, console left out, "
                         "PyDarshan's Common Access Sizes):"),
                   ("table", ["access size (bytes)", "calls"], [[fmt(c["size"]), fmt(c["count"])] for c in common])]
    ops = job.extra.get("operations")
    if ops:
        blocks += [("p", "Operation counts over all ranks (console left out):"),
                   ("table", list(ops), [[fmt(v) for v in ops.values()]])]
    lustre = job.extra.get("lustre")
    if lustre:
        blocks += [("h", level + 1, "Lustre striping"),
                   ("p", f"{fmt(lustre['files'])} files on Lustre, {fmt(lustre['osts_used'])} OSTs used; "
                         f"source: {lustre['source']}."),
                   ("table", ["stripe size", "stripe count", "pool", "files"],
                    [[fmt_size(x["stripe_size"]), fmt(x["stripe_count"]), x["pool"] or "-", fmt(x["files"])]
                     for x in lustre["layouts"]])]
    return blocks


def key_figures(job: JobAnalysis) -> list[tuple[str, str, str]]:
    """The few numbers a reader looks for first, each with what it counts, so that two figures
    for one thing (Darshan's bandwidth estimate and the wall-clock rate) never stand unlabelled."""
    cards = [("bytes read", fmt_size(job.bytes_read), f"{fmt(job.bytes_read)} B"),
             ("bytes written", fmt_size(job.bytes_written), f"{fmt(job.bytes_written)} B")]
    console = job.extra.get("console")
    if console:
        cards[1] = ("bytes written", fmt_size(job.bytes_written),
                    f"{fmt(job.bytes_written)} B, of which {fmt(console['bytes_written'])} B console (<STDERR>/<STDOUT>)")
    for phase, kind in (("read", "read"), ("write", "write"), ("train", "read"), ("checkpoint", "write")):
        p = job.per_phase.get(phase)
        if not p or p.get(f"{kind}_mib_per_s") is None:
            continue
        name = "checkpoint write" if phase in ("write", "checkpoint") else f"{phase} read" if phase == "train" else "read"
        value = f"{fmt(p[f'{kind}_mib_per_s'])} MiB/s"
        note = f"bytes / slowest rank's {fmt(p[f'{kind}_s'])} s in {kind} calls"
        if p.get("wall_mib_per_s") is not None:
            note += (f" (Darshan's estimate); {fmt(p['wall_mib_per_s'])} MiB/s over the {fmt(p['active_s'])} s "
                     f"of wall-clock time with {kind}s under way")
        cards.append((f"{name} bandwidth", value, note))
    wall = job.job.get("run_time_s") if job.kind == "darshan" else job.job.get("wall_s")
    ranks = job.job.get("processes") if job.kind == "darshan" else job.job.get("world_size")
    if wall is not None:
        cards.append(("run time", f"{fmt(wall)} s", f"{fmt(ranks)} ranks / processes" if ranks else ""))
    if job.slowest_rank:
        cards.append(("slowest rank", job.slowest_rank["label"], f"{fmt(job.slowest_rank['io_s'])} s inside I/O calls"))
    return cards


FIGURE_CAPTIONS = {
    "bandwidth": ("Bandwidth over time",
                  "Bytes moved by all ranks per time bin / bin width (MiB/s); dashed: an op's bytes / the "
                  "wall-clock seconds it was under way (when that spans two bins or more)."),
    "heatmap": ("Heat map", "Bytes moved per rank (rows) and time bin (columns), reads above, writes below; "
                            "blank means no I/O in that bin. "
                            "For Darshan logs the HEATMAP module counts console (<STDERR>) writes too."),
    "io_cost": ("I/O cost per phase", "Mean seconds one rank spent inside read, write (with fsync) and metadata "
                                      "calls, per phase: the time I/O took from an average rank."),
    "access_sizes": ("Access sizes", "Read and write calls per size bucket (Darshan's buckets, upper bounds "
                                     "inclusive), log scale."),
    "operations": ("Operation counts", "Calls per operation kind over all ranks, as in PyDarshan's summary "
                                       "(console streams left out), log scale; operations with no calls only in the table."),
    "ranks": ("I/O time per rank", "Seconds each rank spent inside read, write and metadata calls, slowest at "
                                   "the top (at most 40), with the bytes it moved; unequal bars mean imbalance."),
}


def bandwidth_notes(job: JobAnalysis) -> list[str]:
    """Why a phase's headline bandwidth differs from the bandwidth plot's curve: the table divides
    by the slowest rank's busy time in reads or writes, the plot by wall-clock time over all ranks
    (ranks also compute, wait and checkpoint), so the plot's mean over the phase is lower."""
    notes = []
    for phase, p in job.per_phase.items():
        if p.get("active_s"):  # Darshan: the seconds with a transfer under way, gaps between epochs left out
            busy_kind = "read" if p.get("bytes_read") else "write"
            rate, wall = p.get(f"{busy_kind}_mib_per_s"), p.get("wall_mib_per_s")
            if rate is not None and wall is not None:
                width = job.timeline.bin_width_s if job.timeline is not None else 0.0
                line = (f"the dashed line, {fmt(wall)} MiB/s," if p["active_s"] >= 2 * width
                        else f"{fmt(wall)} MiB/s (too short for the plot's {fmt(width)} s bins to show)")
                nbytes = p["bytes_read" if busy_kind == "read" else "bytes_written"]
                notes.append(f"{phase}s: the tables' {fmt(rate)} MiB/s is {fmt(nbytes)} bytes / the "
                             f"slowest rank's {fmt(p[f'{busy_kind}_s'])} s inside {busy_kind} calls (Darshan's estimate, "
                             f"as if all ranks were in calls at once); {line} is the same "
                             f"bytes / the {fmt(p['active_s'])} s of wall-clock time with {busy_kind}s under way, "
                             f"when on average {fmt(p.get('overlap'))} ranks were in a call.")
            continue
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
