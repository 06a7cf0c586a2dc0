"""summary.json's `checkpoint` section from every rank's records (rank 0, after a gather).

Definitions (docs/metrics.md):
- a rank's `bytes` are what its write calls moved into its data files (the tracer's count);
- a checkpoint's duration is the slowest rank's write time, fsync included (`write_s_max`); the
  read-back that formats which seek back (npz, hdf5, torch, tensorflow) need for their checksums
  is timed apart, as `verify_s_max`, and is in no rate;
- `write_gib_per_s` = all ranks' bytes / write_s_max: the aggregate rate the storage delivered;
- `write_gib_per_s_min_rank` = the minimum over writing ranks of rank bytes / rank write time
  (the slowest rank's own rate; MLPerf Storage's figure divides the whole checkpoint instead:
  metrics/mlperf.py);
- averages over checkpoints are of bytes and times; every rate is derived from averaged times,
  never averaged itself;
- `training_time_lost_fraction` = the largest per-rank sum of blocking time / training wall time
  (synchronous training waits for its slowest rank).
"""

from __future__ import annotations

from statistics import mean
from typing import Any

from dlio_ckpt.checkpoint.encoded import merge_stats
from dlio_ckpt.codec_registry import ratio_name
from dlio_ckpt.plan.checkpoint_formats import format_spec
from dlio_ckpt.plan.durability import data_fsync, resolve_durability
from dlio_ckpt.plan.layouts import get_layout

GIB = float(1 << 30)


def _rate(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / GIB if seconds > 0 else 0.0


def _min_rank_rate(per_rank: dict[int, tuple[float, float]]) -> float:
    rates = [_rate(b, s) for b, s in per_rank.values() if b > 0 and s > 0]
    return min(rates) if rates else 0.0


def _codec_figures(rows: list[dict], data_bytes: int) -> dict:
    """One checkpoint's encoding figures over every rank: the state it represents
    (`logical_bytes`), what reached storage (`bytes_written`: data files as the tracer counted them,
    plus manifest and metadata), the encoding time of the slowest rank, and the codec's figures
    (sizes added up, errors and chain length the worst rank's; docs/metrics.md)."""
    encoding = rows[0].get("encoding", "full")
    logical = sum(r.get("logical_bytes", 0) for r in rows)
    written = data_bytes + sum(r.get("metadata_bytes", 0) for r in rows)
    figures: dict[str, Any] = {
        "encoding": encoding,
        "logical_bytes": logical,
        "bytes_written": written,
        "encode_s_max": max(r.get("encode_s", 0.0) for r in rows),
    }
    if encoding == "full":
        return figures
    codec = merge_stats([r.get("codec", {}) for r in rows])
    ratio = logical / written if written else 0.0
    figures["chain_length"] = int(codec.get("chain_length", 1))
    if ratio_name(encoding) == "dedup_ratio":
        figures["dedup_ratio"] = ratio
    else:
        figures["compression_ratio"] = ratio
        for key in ("max_rel_error", "rms_rel_error", "error_bound", "elem_rel_error_p50", "elem_rel_error_p99",
                    "elem_rel_error_max"):
            if key in codec:
                figures[key] = codec[key]
    figures["codec"] = codec  # everything the codec counted (leaf labels, the paper's baselines, ...)
    return figures


def _serialization_figures(rows: list[dict]) -> dict:
    """One save's write time split over every rank: inside write calls, inside fsync, and the rest,
    the format building its container (`serialize_s`: pickling, headers, CRCs, copies), with the
    share of the write time that serialization took. None where a framework made its own write
    calls (TensorFlow), which cannot be timed apart."""
    write_s = sum(r["write_s"] for r in rows)
    fsync_s = sum(r.get("fsync_s", 0.0) for r in rows)
    calls = [r.get("write_calls_s", 0.0) for r in rows]
    if any(c is None for c in calls):
        return {"write_calls_s": None, "fsync_s": fsync_s, "serialize_s": None, "serialization_share": None}
    serialize_s = max(write_s - sum(calls) - fsync_s, 0.0)
    return {"write_calls_s": sum(calls), "fsync_s": fsync_s, "serialize_s": serialize_s,
            "serialization_share": serialize_s / write_s if write_s > 0 else 0.0}


def _writer_figures(config: Any, per_checkpoint: list[dict]) -> dict:
    """Which protocol and writer ran (checkpoint.durability, the format's writer kind, whether data
    files were fsynced), and the serialization share over every save (docs/metrics.md)."""
    ck = config.checkpoint
    durability = resolve_durability(config)
    fmt = format_spec(ck.format, get_layout(ck.layout).name)
    shares = [c["serialize_s"] for c in per_checkpoint]
    known = per_checkpoint and all(s is not None for s in shares)
    total = sum(c["write_calls_s"] + c["fsync_s"] + c["serialize_s"] for c in per_checkpoint) if known else 0.0
    return {
        **durability.describe(),
        "writer": fmt.writer_kind,
        "data_fsync": data_fsync(durability, fmt, get_layout(ck.layout), ck.fsync),
        "serialization_share": (sum(shares) / total if total > 0 else 0.0) if known else None,
        "framework_cpu_s": ck.framework_cpu_s,
    }


def checkpoint_summary(records_by_rank: list[list[dict]], restores_by_rank: list[dict | None],
                       train_wall_s: float, config: Any) -> dict:
    ck = config.checkpoint
    per_checkpoint = _per_checkpoint(records_by_rank)
    writes = len(per_checkpoint)
    summary: dict[str, Any] = {
        "strategy": ck.strategy,
        "layout": ck.layout,
        "format": ck.format,
        **_writer_figures(config, per_checkpoint),
        "writes": writes,
        "bytes": 0,
        "total_bytes_written": sum(c["bytes"] for c in per_checkpoint),
        "files": 0,
        "write_s_max": 0.0,
        "write_gib_per_s": 0.0,
        "write_gib_per_s_min_rank": 0.0,
        "verify_s_max": 0.0,
        "blocking_s_max": 0.0,
        "blocking_s_mean": 0.0,
        "persist_s_max": 0.0,
        "training_time_lost_fraction": 0.0,
    }
    if writes:
        summary.update(_checkpoint_means(records_by_rank, per_checkpoint, train_wall_s))

    restores = [r for r in restores_by_rank if r]
    summary.update(_restore_figures(restores))
    rss = [r.get("peak_rss_bytes", 0) for records in records_by_rank for r in records or []]
    rss += [r.get("peak_rss_bytes", 0) for r in restores]
    summary["peak_rss_bytes_max"] = max(rss) if rss else 0
    summary["per_checkpoint"] = per_checkpoint
    return summary


def _per_checkpoint(records_by_rank: list[list[dict]]) -> list[dict]:
    """One row per checkpoint: all its ranks' bytes, files and times (the slowest rank's, where a duration)."""
    by_index: dict[int, dict[int, dict]] = {}
    for rank, records in enumerate(records_by_rank):
        for r in records or []:
            by_index.setdefault(int(r["index"]), {})[rank] = r
    per_checkpoint = []
    for index in sorted(by_index):
        ranks = by_index[index]
        rows = list(ranks.values())
        nbytes = sum(r["bytes"] for r in rows)
        write_max = max(r["write_s"] for r in rows)
        per_checkpoint.append({
            "index": index,
            "step": rows[0]["step"],
            "epoch": rows[0]["epoch"],
            "folder": rows[0].get("folder", ""),
            "level": rows[0].get("level", ""),  # checkpoint.levels: the level it was written to ("": one level)
            "bytes": nbytes,
            "files": sum(r["files"] for r in rows),
            "metadata_bytes": sum(r.get("metadata_bytes", 0) for r in rows),
            "write_s_max": write_max,
            "write_gib_per_s": _rate(nbytes, write_max),
            "write_gib_per_s_min_rank": _min_rank_rate({k: (r["bytes"], r["write_s"]) for k, r in ranks.items()}),
            "verify_s_max": max(r.get("verify_s", 0.0) for r in rows),
            "prepare_s_max": max(r.get("prepare_s", 0.0) for r in rows),
            "framework_s_max": max(r.get("framework_s", 0.0) for r in rows),
            "cpu_s_max": max(r.get("cpu_s", 0.0) for r in rows),
            "blocking_s_max": max(r["blocking_s"] for r in rows),
            "blocking_s_mean": mean(r["blocking_s"] for r in rows),
            "persist_s_max": max(r["persist_s"] for r in rows),
            "wait_s_max": max(r.get("wait_s", 0.0) for r in rows),
            "snapshot_s_max": max(r.get("snapshot_s", 0.0) for r in rows),
            "committed": all(r.get("committed", True) for r in rows),
            **_serialization_figures(rows),
            **_codec_figures(rows, nbytes),
        })
    return per_checkpoint


def _checkpoint_means(records_by_rank: list[list[dict]], per_checkpoint: list[dict], train_wall_s: float) -> dict:
    """Means over the checkpoints (of bytes and times; rates derived from them), per-rank rows, lost time."""
    avg_bytes = mean(c["bytes"] for c in per_checkpoint)
    avg_write = mean(c["write_s_max"] for c in per_checkpoint)
    per_rank: dict[int, tuple[float, float]] = {}
    rank_rows = []
    lost = []
    for rank, records in enumerate(records_by_rank):
        if records:
            per_rank[rank] = (mean(r["bytes"] for r in records), mean(r["write_s"] for r in records))
            lost.append(sum(r["blocking_s"] for r in records))
            rank_rows.append({"rank": rank, "bytes": per_rank[rank][0], "write_s": per_rank[rank][1],
                              "verify_s": mean(r.get("verify_s", 0.0) for r in records),
                              "blocking_s": mean(r["blocking_s"] for r in records)})
    return {
        "bytes": int(round(avg_bytes)),
        "files": int(round(mean(c["files"] for c in per_checkpoint))),
        "write_s_max": avg_write,
        "write_gib_per_s": _rate(avg_bytes, avg_write),
        "write_gib_per_s_min_rank": _min_rank_rate(per_rank),
        "verify_s_max": mean(c["verify_s_max"] for c in per_checkpoint),
        "blocking_s_max": mean(c["blocking_s_max"] for c in per_checkpoint),
        "blocking_s_mean": mean(c["blocking_s_mean"] for c in per_checkpoint),
        "persist_s_max": mean(c["persist_s_max"] for c in per_checkpoint),
        "blocking_s_total_max_rank": max(lost) if lost else 0.0,
        "training_time_lost_fraction": (max(lost) / train_wall_s) if lost and train_wall_s > 0 else 0.0,
        "per_rank": rank_rows,  # means over checkpoints, one row per rank that took part
    }


def _restore_figures(restores: list[dict]) -> dict:
    """The restore's bytes, files, slowest read and rates, all ranks; zeros and None when nothing was restored."""
    if not restores:
        return {"restore_s_max": 0.0, "restore_gib_per_s": 0.0, "restore_verified": None}
    nbytes = sum(r["bytes"] for r in restores)
    read_max = max(r["read_s"] for r in restores)
    return {
        "restore_bytes": nbytes,
        "restore_files": sum(r["files"] for r in restores),
        "restore_s_max": read_max,
        "restore_gib_per_s": _rate(nbytes, read_max),
        "restore_gib_per_s_min_rank": _min_rank_rate({i: (r["bytes"], r["read_s"]) for i, r in enumerate(restores)}),
        "restore_verified": all(r["verified"] for r in restores),
        "restore_step": restores[0].get("checkpoint_step", -1),
        "restore_message": restores[0].get("message", ""),
        "restore_skipped": restores[0].get("skipped", []),
        "restore_chain_length": max(r.get("chain_length", 0) for r in restores),
    }
