"""summary.json's `checkpoint.levels` from every rank's MultiLevelEngine.level_report() (rank 0,
after a gather): one row per level, fastest first.

Definitions (docs/levels.md, docs/summary-schema.md): a checkpoint's or a flush's duration is its
slowest rank's (synchronous training and a flush's manifest wait for the last rank); `bytes` is
every rank's write calls into the level, direct checkpoints and flushes together; means are over
the level's checkpoints, flushes and restores.
"""

from __future__ import annotations

from statistics import mean
from typing import Any


def _mean_of_max(rows_by_rank: list[list[dict]], key: str, keep: Any = None) -> float:
    """Mean over items (aligned by position on every rank) of the maximum over ranks of `key`."""
    count = min((len(rows) for rows in rows_by_rank), default=0)
    worst = [max(rows[i][key] for rows in rows_by_rank) for i in range(count)
             if keep is None or all(keep(rows[i]) for rows in rows_by_rank)]
    return mean(worst) if worst else 0.0


def levels_summary(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per level from every rank's report (ranks without one are left out)."""
    reports = [r for r in reports if r]
    if not reports:
        return []
    rows = []
    for number, level in enumerate(reports[0]["levels"]):
        writes = [r["writes"][number] for r in reports]
        flushes = [[f for f in r["flushes"] if f["level"] == level["name"]] for r in reports]
        restores = [r["restores"][number] for r in reports]
        committed = [f for f in flushes[0] if f["committed"]]
        rows.append({
            **level,
            "checkpoints": len(writes[0]),
            "bytes": sum(w["bytes"] for rank in writes for w in rank) + sum(f["bytes"] for rank in flushes for f in rank),
            "write_s_mean": _mean_of_max(writes, "write_s"),
            "flushes": len(committed),
            "flushes_failed": len(flushes[0]) - len(committed),
            "flush_s_mean": _mean_of_max(flushes, "copy_s", keep=lambda f: f["committed"]),
            "flush_latency_s_mean": _mean_of_max(flushes, "flush_s", keep=lambda f: f["committed"]),
            "restores": len(restores[0]),
            "restore_s_mean": _mean_of_max(restores, "read_s"),
        })
    return rows
