"""The printed table's checkpoint lines that name how the checkpoints were written: the protocol and
writer (`durability`) and, on an encoded run, what the codecs saved and cost (`encoding`).

They read only summary.json's `checkpoint` section, as the rest of the table does, so they live
with the table (report.py), not with the checkpoint code that wrote the section.
"""

from __future__ import annotations

from statistics import mean

from dlio_ckpt.codec_registry import ratio_name
from dlio_ckpt.metrics.words import plural

MIB = float(1 << 20)


def writer_rows(ckpt: dict) -> list[tuple[str, str]]:
    """The printed table's line naming the protocol and writer that ran, and how the write time
    split between building the container and the write calls."""
    if "durability" not in ckpt:
        return []
    text = f"{ckpt['durability']}"
    if ckpt.get("durability_reason"):
        text += f" ({ckpt['durability_reason']})"
    text += f"; writer: {ckpt['writer']}, data files {'fsynced' if ckpt['data_fsync'] else 'not fsynced'}"
    rows = ckpt.get("per_checkpoint") or []
    if ckpt.get("serialization_share") is not None and rows:
        per_save = {key: sum(r[key] for r in rows) / len(rows) for key in ("write_calls_s", "fsync_s", "serialize_s")}
        text += (f"; serialization {100 * ckpt['serialization_share']:.0f} % of the write time "
                 f"(write calls {per_save['write_calls_s']:.3f} s, fsync {per_save['fsync_s']:.3f} s, "
                 f"serialization {per_save['serialize_s']:.3f} s per save, all ranks)")
    elif rows:
        text += "; serialization share unknown (the framework makes its own write calls)"
    if rows and any(r.get("framework_s_max", 0.0) for r in rows):
        text += (f"; framework work before the bytes {mean(r.get('framework_s_max', 0.0) for r in rows):.3f} s per save "
                 f"(checkpoint.framework_cpu_s {ckpt.get('framework_cpu_s', 0.0):g} s CPU)")
    return [("durability", text)]


def encoding_rows(ckpt: dict) -> list[tuple[str, str]]:
    """The printed table's line on an encoded run: what the state was, what reached storage, and
    what it cost (lossy: the error)."""
    rows = ckpt.get("per_checkpoint") or []
    if not rows or rows[0].get("encoding", "full") == "full":
        return []
    logical = sum(r["logical_bytes"] for r in rows)
    written = sum(r["bytes_written"] for r in rows)
    later = rows[1:] or rows
    text = (f"{rows[0]['encoding']}: {plural(len(rows), 'checkpoint')} of a {rows[0]['logical_bytes'] / MIB:.1f} MiB "
            f"state wrote {written / MIB:.1f} MiB ({logical / written:.2f}x less than full)" if written else "")
    key = ratio_name(rows[0]["encoding"])
    later = [r for r in later if key in r] or [{key: 0.0}]  # a checkpoint abandoned by a failure has no codec figures
    text += f"; after the first: {mean(r[key] for r in later):.1f}x, longest chain {max(r.get('chain_length', 1) for r in rows)}"
    if key == "compression_ratio" and any("max_rel_error" in r for r in rows):  # a lossy codec
        worst = max(r.get("max_rel_error", 0.0) for r in rows)
        text += f", max relative error {worst:.2e}"
        if any("elem_rel_error_p99" in r for r in rows):  # |x - xr| / |x| per element, not per file's max|x|
            text += f" (per element: p99 {max(r.get('elem_rel_error_p99', 0.0) for r in rows):.2e})"
    text += f", encoding {max(r['encode_s_max'] for r in rows):.3f} s at most"
    return [("encoding", text)]
