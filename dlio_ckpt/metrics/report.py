"""The short human table rank 0 prints at the end of a run."""

from __future__ import annotations

import sys
from typing import Any

MIB = float(1 << 20)
GIB = float(1 << 30)


def headline_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [("workload", f"{summary['workload']} ({summary['mode']}, {summary['world_size']} ranks)")]
    dataset = summary.get("dataset")
    if dataset:
        state = "reused" if dataset["reused"] else f"generated in {dataset['generate_s']:.2f} s"
        rows.append(("dataset", f"{dataset['files_train']} {dataset['format']} files, {dataset['bytes_on_disk'] / MIB:.1f} MiB, {state}"))
    train = summary.get("train")
    if train:
        rows += [
            ("train", f"{train['epochs']} epochs, {train['steps']} steps, {train['samples']} samples in {train['wall_s']:.2f} s"),
            ("samples/s", f"{train['samples_per_s']:.1f}"),
            ("read", f"{train['bytes_read'] / MIB:.1f} MiB read at {train['read_mib_per_s']:.1f} MiB/s (bytes from storage / slowest rank's read time)"),
            ("AU", f"{train['au']:.3f} (target {train['au_target']:.2f}: {'met' if train['au_target_met'] else 'NOT met'})"),
        ]
    ckpt = summary.get("checkpoint")
    if ckpt and ckpt.get("writes"):
        rows.append(("checkpoint", f"{ckpt['writes']} writes of {ckpt['bytes'] / GIB:.3f} GiB, slowest rank {ckpt['write_s_max']:.3f} s, "
                                   f"{ckpt['write_gib_per_s']:.3f} GiB/s"))
        if ckpt.get("restore_verified") is not None and ckpt.get("restore_s_max") is not None:
            rows.append(("restore", f"{ckpt['restore_s_max']:.3f} s, {ckpt.get('restore_gib_per_s', 0):.3f} GiB/s, verified: {ckpt['restore_verified']}"))
    replay = summary.get("replay")
    if replay:
        rows.append(("replay", ", ".join(f"{k}={v}" for k, v in replay.items())))
    rows.append(("run folder", summary["run_dir"]))
    for note in summary.get("warnings", []):
        rows.append(("warning", note))
    return rows


def print_report(summary: dict[str, Any], fancy: bool = True) -> None:
    rows = headline_rows(summary)
    if fancy and sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title="dlio_ckpt", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        for key, value in rows:
            table.add_row(key, value)
        Console().print(table)
        return
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    sys.stdout.flush()
