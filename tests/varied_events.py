"""A varied run's event files, written by the real recorder, for comparing readers of event files.

Several ranks; generate writes with fsyncs, train opens, reads (some overlapping, one of 0 bytes)
and closes, stats, checkpoint writes, fsyncs and renames, restore reads; paths shared between
ranks, a non-ASCII one and one with a newline; and, with the recorder's path cache cut small, a
path given a second index after it left the cache (what `merged_paths` folds back).
"""

from __future__ import annotations

from pathlib import Path

from dlio_ckpt.storage import events as events_module
from dlio_ckpt.storage.events import EventRecorder, JobClock


def write_varied_run(folder: Path, monkeypatch, ranks: int = 3, files: int = 40) -> list[Path]:
    """Event files of `ranks` ranks under folder/events; `files` dataset files a rank."""
    monkeypatch.setattr(events_module, "PATH_CACHE", 16)
    monkeypatch.setattr(events_module, "COMPACT_EVENTS", 64)
    monkeypatch.setattr(events_module, "SPILL_ROWS", 64)
    clock = JobClock.start(job_start_wall=1_700_000_000.5)
    written = []
    for rank in range(ranks):
        rec = EventRecorder(rank, clock)
        t = 0.001 * (rank + 1)
        for k in range(files):
            path = f"/data/train/img_{(k + rank * 7) % files:04d}.npz"  # ranks share files
            if rank == 0:
                rec.record("write", "generate", path, 0, 4096 + k, t, t + 0.0002)
                rec.record("fsync", "generate", path, -1, 0, t + 0.0002, t + 0.0005)
            rec.record("open", "train", path, -1, 0, t + 0.001, t + 0.0011)
            rec.record("read", "train", path, 0, 1024 * (k % 5), t + 0.0011, t + 0.0013 + 1e-5 * k)
            rec.record("read", "train", path, 1024, 300, t + 0.0012, t + 0.0019)  # overlaps the one before
            rec.record("close", "train", path, -1, 0, t + 0.002, t + 0.00201)
            t += 0.003
        for name in ("/data/é ü.npz", "/data/new\nline.npz", "/data/train/img_0000.npz"):
            rec.record("stat", "eval", name, -1, 0, t, t)
            rec.record("read", "eval", name, 5, 77, t, t + 0.0001)
            t += 0.0002
        shard = f"/ckpt/step-2/model-r{rank}.bin"
        for k in range(3):
            rec.record("write", "checkpoint", shard + ".tmp", k << 20, 1 << 20, t, t + 0.004 * (rank + 1))
            t += 0.004 * (rank + 1)
        rec.record("fsync", "checkpoint", shard + ".tmp", -1, 0, t, t + 0.003)
        rec.record("rename", "checkpoint", shard + ".tmp", -1, 0, t + 0.003, t + 0.0031)
        rec.record("read", "restore", shard, 0, 1 << 20, t + 0.01, t + 0.012)
        rec.record("unlink", "other", "/tmp/x", -1, 0, t + 0.02, t + 0.02)
        written.append(rec.save(folder / "events", f"node{rank // 2}"))
    return written
