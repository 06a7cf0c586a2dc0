"""What PyDarshan's `darshan summary` page shows and a foreign log needs besides byte totals.

Kept apart from darshan_logs.py (which merges many logs into one job) because each figure here
reads one merged frame and answers one question a storage person asks first:

- Which records are the console? `<STDIN>`, `<STDOUT>`, `<STDERR>` are POSIX records too, and a
  program's log lines would otherwise be counted as checkpoint writes.
- Which access sizes and operations dominate? PyDarshan's common-access-size helpers and the
  counters of its operation-count chart, over all logs of the job.
- How were the files striped? The LUSTRE module's stripe size, stripe count and pool per file.
- Is the log complete? A module whose partial flag is set lost records (darshan-runtime ran out
  of memory or record slots), so every total from it is a lower bound.
- How long was data actually moving? The union of the records' first-to-last access intervals:
  the wall-clock seconds a plot over time shows, which Darshan's own bandwidth estimate (bytes /
  the slowest rank's time inside I/O calls) does not look at.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlio_ckpt.analysis.model import MIB
from dlio_ckpt.optional import require

CONSOLE_NAMES = ("<STDIN>", "<STDOUT>", "<STDERR>")
# PyDarshan's operation-count chart for POSIX (plot_opcounts), in its order
OPERATION_COUNTERS = (("read", "POSIX_READS"), ("write", "POSIX_WRITES"), ("open", "POSIX_OPENS"),
                      ("stat", "POSIX_STATS"), ("seek", "POSIX_SEEKS"), ("mmap", "POSIX_MMAPS"),
                      ("fsync", "POSIX_FSYNCS"), ("fdsync", "POSIX_FDSYNCS"))
_COMMON_SIZES = 4  # as many as PyDarshan's Common Access Sizes table lists


def console_mask(counters, names: dict[int, str]) -> np.ndarray:
    """True for the records of the standard streams: console traffic, never checkpoint data."""
    ids = counters["id"].to_numpy()
    console_ids = {i for i, name in names.items() if name in CONSOLE_NAMES}
    return np.fromiter((int(i) in console_ids for i in ids), dtype=bool, count=len(ids))


def console_totals(counters, fcounters, mask: np.ndarray) -> dict[str, Any] | None:
    """Bytes and seconds of the standard streams, None when they moved nothing."""
    c, f = counters[mask], fcounters[mask]
    read, written = int(c["POSIX_BYTES_READ"].sum()), int(c["POSIX_BYTES_WRITTEN"].sum())
    if not read and not written:
        return None
    return {"bytes_read": read, "bytes_written": written, "records": int(mask.sum()),
            "read_s": float(f["POSIX_F_READ_TIME"].sum()), "write_s": float(f["POSIX_F_WRITE_TIME"].sum()),
            "streams": "<STDIN>, <STDOUT>, <STDERR> POSIX records"}


def common_access_sizes(counters) -> list[dict[str, int]]:
    """The most frequent access sizes over all records, by PyDarshan's own table helpers
    (POSIX_ACCESS1..4_ACCESS / _COUNT, the four most common sizes Darshan keeps per record)."""
    table = require("darshan.experimental.plots.plot_common_access_table")
    frame = table.get_access_count_df(mod_df=counters, mod="POSIX")
    frame = table.remove_nonzero_rows(frame)
    if frame.empty:
        return []
    frame = table.combine_access_sizes(frame)
    top = table.get_most_common_access_sizes(frame, n_rows=_COMMON_SIZES)
    return [{"size": int(r["Access Size"]), "count": int(r["Count"])} for _, r in top.iterrows()]


def operation_counts(counters) -> dict[str, int]:
    """Darshan writes -1 for a counter it did not keep (POSIX_MMAPS without mmap tracing): such
    records add nothing, and a counter no record kept is left out rather than shown as 0."""
    out = {}
    for name, column in OPERATION_COUNTERS:
        if column in counters and (counters[column] >= 0).any():
            out[name] = int(counters[column].clip(lower=0).sum())
    return out


def lustre_layout(logs) -> dict[str, Any] | None:
    """Stripe settings per file from the LUSTRE module, grouped: (size, count, pool) -> files."""
    per_file: dict[int, tuple[int, int, str]] = {}  # a file opened by several processes is one file
    osts: set[int] = set()
    for log in logs:
        if "LUSTRE" not in log.report.records or not len(log.report.records["LUSTRE"]):
            continue
        frame = log.report.records["LUSTRE"].to_df()
        components = frame["components"] if isinstance(frame, dict) else frame
        first = components.drop_duplicates(subset=["id"], keep="first")  # first component = the file's layout
        for _, row in first.iterrows():
            per_file.setdefault(int(row["id"]), (int(row["LUSTRE_COMP_STRIPE_SIZE"]), int(row["LUSTRE_COMP_STRIPE_COUNT"]),
                                                 str(row.get("LUSTRE_POOL_NAME", "") or "")))
        for ids in components.get("LUSTRE_OST_IDS", []):
            osts.update(int(i) for i in np.atleast_1d(ids) if int(i) >= 0)
    if not per_file:
        return None
    files = len(per_file)
    settings: dict[tuple[int, int, str], int] = {}
    for key in per_file.values():
        settings[key] = settings.get(key, 0) + 1
    layouts = [{"stripe_size": s, "stripe_count": n, "pool": pool, "files": count}
               for (s, n, pool), count in sorted(settings.items(), key=lambda kv: -kv[1])]
    return {"files": files, "layouts": layouts, "osts_used": len(osts),
            "source": "LUSTRE module, first layout component of each file"}


def partial_modules(logs) -> list[str]:
    """'MODULE in LOG' for every module whose data darshan-runtime marked incomplete."""
    found = []
    for log in logs:
        for name, module in log.report.modules.items():
            if module.get("partial_flag"):
                found.append(f"{name} in {log.path.name}")
    return found


def partial_warning(found: list[str]) -> str | None:
    if not found:
        return None
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return (f"partial log: darshan-runtime marked module data incomplete ({shown}): it ran out of memory "
            f"or record slots, so totals from those modules are lower bounds (set DARSHAN_MODMEM / "
            f"DARSHAN_NAMEMEM higher, in MiB, when tracing again)")


def active_seconds(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of [start, end] intervals: wall-clock time with at least one transfer
    under way, counted once however many ranks overlap."""
    keep = ends > starts
    if not keep.any():
        return 0.0
    order = np.argsort(starts[keep])
    s, e = starts[keep][order], ends[keep][order]
    reach = np.maximum.accumulate(e)
    gaps = np.clip(s[1:] - reach[:-1], 0.0, None).sum()
    return float(reach[-1] - s[0] - gaps)


def wall_clock_figures(nbytes: int, busy_sum_s: float, starts: np.ndarray, ends: np.ndarray) -> dict[str, Any]:
    """A phase's figures over wall-clock time, beside Darshan's slowest-rank estimate.

    `overlap` is the mean number of ranks inside a call while data was moving: the estimate
    (bytes / one rank's busy time) assumes every rank was busy at the same time, and is only
    close to what a plot over time shows when overlap is near the rank count.
    """
    active = active_seconds(starts, ends)
    first = float(starts.min()) if len(starts) else None
    last = float(ends.max()) if len(ends) else None
    return {"active_s": active, "first_start_s": first, "last_end_s": last,
            "wall_mib_per_s": nbytes / active / MIB if active > 0 else None,
            "overlap": busy_sum_s / active if active > 0 else None}
