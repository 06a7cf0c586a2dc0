"""The replay summary's comparison: the log's own figures beside what the replay did here.

A replay is run to ask "how would that job's I/O fare on this storage?", so the answer is a table
of the same figures for both: bytes and calls (which must agree, or the replay is not the same
I/O) and bandwidth, each as bytes / the slowest rank's time in those calls.
"""

from __future__ import annotations

from typing import Any

MIB = float(1 << 20)
FIGURES = (("reads", "reads"), ("bytes_read", "bytes read"), ("read_mib_per_s", "read MiB/s"),
           ("writes", "writes"), ("bytes_written", "bytes written"), ("write_mib_per_s", "write MiB/s"))


def side(totals: dict[str, int], read_s: float, write_s: float) -> dict[str, Any]:
    """One column: counts, bytes, the slowest rank's read and write time, and the rates from them."""
    return {**totals, "read_s": read_s, "write_s": write_s,
            "read_mib_per_s": totals["bytes_read"] / read_s / MIB if read_s > 0 else None,
            "write_mib_per_s": totals["bytes_written"] / write_s / MIB if write_s > 0 else None}


def comparison_rows(replay: dict[str, Any]) -> list[tuple[str, str]]:
    """Printed rows: what the replay was (exact or approximate), then a small table of original
    against replayed figures with their ratio."""
    method = ("approximate (from POSIX counters: the log has no DXT traces)" if replay.get("approximate")
              else "exact (the log's DXT_POSIX calls)")
    rows = [("replay", f"{replay['log']}: {replay['log_ranks']} log ranks, {replay['files']} files, {method}")]
    original, replayed = replay.get("original"), replay.get("replayed")
    if not original or not replayed:
        return rows
    width = max(len(label) for _, label in FIGURES)
    rows.append(("replay vs log", f"{'':<{width}}  {'original':>14}  {'replayed':>14}  {'ratio':>7}"))
    for key, label in FIGURES:
        before, after = original.get(key), replayed.get(key)
        if not before and not after:
            continue
        ratio = f"{after / before:.2f}x" if before and after is not None else "-"
        rows.append(("", f"{label:<{width}}  {_number(before):>14}  {_number(after):>14}  {ratio:>7}"))
    return rows


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"
