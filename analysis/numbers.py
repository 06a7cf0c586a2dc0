"""Numbers for people, as every report, table and terminal view prints them (report.py, compare.py,
terminal.py): exact counts with their GiB, short sizes, about four significant digits, percentages."""

from __future__ import annotations

from typing import Any

from dlio_ckpt.analysis.model import GIB


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
