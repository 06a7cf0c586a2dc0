"""Figures that must be true: exact totals under threads, write time without the read-back,
byte figures from the tracer, the AU verdict, the time shares and the saved report (issue 7)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from ckpt_util import data_files, make_ctx
from conftest import load_summary, run_cli
from dlio_ckpt.checkpoint import make_checkpoint_engine
from dlio_ckpt.checkpoint.report import checkpoint_summary
from dlio_ckpt.storage.events import OP_CODE, PHASE_CODE, EventRecorder, JobClock, load_run_events


# -- exact totals under threads -----------------------------------------------------------------

def test_recorder_totals_exact_under_threads():
    """Reader threads and the async persist thread record at once: no update may be lost."""
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    threads_n, events_n = 6, 20_000
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show at once

    def work(index: int) -> None:
        phase = "checkpoint" if index % 2 else "train"
        for i in range(events_n):
            path = f"/data/thread-{index}/file-{i % 50}"
            recorder.record("read", phase, path, i, 3, 0.0, 0.0)
            recorder.record("write", phase, path, i, 5, 0.0, 0.0)

    try:
        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads_n)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(previous)
    per_phase = threads_n // 2 * events_n
    assert recorder.bytes_read == {"train": 3 * per_phase, "checkpoint": 3 * per_phase}
    assert recorder.bytes_written == {"train": 5 * per_phase, "checkpoint": 5 * per_phase}
    assert recorder.op_counts == {(p, op): per_phase for p in ("train", "checkpoint") for op in ("read", "write")}
    events = recorder.array()
    assert len(events) == 2 * threads_n * events_n
    # Every event names the file it was recorded with, even when threads add new paths at once.
    assert len(recorder.paths) == len(set(recorder.paths)) == threads_n * 50
    names = np.array(recorder.paths)[events["file"]]
    offsets = events["offset"]
    assert all(name.endswith(f"/file-{offset % 50}") for name, offset in zip(names[::97], offsets[::97]))


# -- checkpoint write time without the read-back; bytes from the tracer -------------------------

def checkpoint_events(ctx, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """The checkpoint-phase events on the data files of one checkpoint folder, and their paths."""
    events = ctx.recorder.array()
    paths = np.array(ctx.recorder.paths)
    data = {str(p) for p in data_files(folder)}
    on_data = np.isin(paths[events["file"]], list(data)) & (events["phase"] == PHASE_CODE["checkpoint"])
    return events[on_data], paths[events["file"][on_data]]


@pytest.mark.parametrize("fmt", ["npz", "hdf5", "raw"])
def test_checkpoint_write_s_leaves_the_checksum_read_back_out(tmp_path, fmt):
    ctx = make_ctx(tmp_path, [f"checkpoint.format={fmt}", "checkpoint.layout=raw"])
    engine = make_checkpoint_engine(ctx)
    record = engine.save(3, 1)
    engine.finish()
    events, _ = checkpoint_events(ctx, Path(engine.root) / engine.layout.folder(3))
    first_open = events["start"][events["op"] == OP_CODE["open"]].min()
    last_fsync = events["end"][events["op"] == OP_CODE["fsync"]].max()
    reads = events[events["op"] == OP_CODE["read"]]
    read_back_s = float((reads["end"] - reads["start"]).sum())
    last_read_back_s = float((reads["end"] - reads["start"])[reads["start"] >= last_fsync].sum())
    assert record.write_s > 0
    if fmt == "raw":  # checksummed as the bytes pass: nothing is read back
        assert len(reads) == 0 and record.verify_s == 0.0
    else:
        assert last_read_back_s > 0
        # the read-back's read calls all lie inside the time reported as verify_s ...
        assert record.verify_s >= read_back_s
        # ... and write_s, from the first open to the last fsync, holds none of the read-back after it
        assert record.write_s < (last_fsync - first_open) + last_read_back_s
    summary = checkpoint_summary([[record.as_dict()]], [None], 1.0, ctx.config)
    assert summary["verify_s_max"] == summary["per_checkpoint"][0]["verify_s_max"] == record.verify_s
    assert summary["write_s_max"] == record.write_s


@pytest.mark.parametrize("fmt", ["npz", "hdf5", "raw"])
@pytest.mark.parametrize("strategy", ["sharded", "async"])
def test_checkpoint_bytes_are_the_tracers_write_counts(tmp_path, fmt, strategy):
    """`bytes` counts what the write calls moved (zip and HDF5 rewrite headers, so it can exceed
    the size on disk); with the coordinator's metadata it is every checkpoint byte traced."""
    ctx = make_ctx(tmp_path, [f"checkpoint.format={fmt}", "checkpoint.layout=raw", f"checkpoint.strategy={strategy}"])
    engine = make_checkpoint_engine(ctx)
    for step in (2, 4):
        engine.save(step, 1)
    engine.finish()
    for record in engine.records:
        events, _ = checkpoint_events(ctx, Path(engine.root) / engine.layout.folder(record.step))
        assert record.bytes == int(events["length"][events["op"] == OP_CODE["write"]].sum()) > 0
    everything = sum(r.bytes + r.metadata_bytes for r in engine.records)
    assert everything == ctx.recorder.bytes_written["checkpoint"]


# -- end to end ---------------------------------------------------------------------------------

def run_ok(args: list[str], cwd: Path, ranks: int = 0):
    done = run_cli(args, cwd, mpi_ranks=ranks)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def phase_writes(run: Path, phase: str) -> int:
    """Bytes moved by write calls in `phase`, all ranks, from the run's event files."""
    return sum(int(r.events["length"][(r.events["op"] == OP_CODE["write"]) & (r.events["phase"] == PHASE_CODE[phase])].sum())
               for r in load_run_events(run))


def test_generated_and_checkpointed_bytes_are_the_tracers_counts(workdir):
    root, run = workdir / "store", workdir / "run"
    run_ok(["workload=unet3d", "scale=tiny", "dataset.format=npz", "progress=false", "train.epochs=1",
            "checkpoint.enabled=true", "checkpoint.format=npz", "checkpoint.layout=raw", "checkpoint.steps_between_checkpoints=1",
            f"storage.root={root}", f"hydra.run.dir={run}"], workdir / "cwd")
    summary = load_summary(run)
    assert summary["dataset"]["generate_bytes_written"] == phase_writes(run, "generate") > summary["dataset"]["bytes_on_disk"]
    ckpt = summary["checkpoint"]
    data_bytes = sum(c["bytes"] for c in ckpt["per_checkpoint"])
    assert data_bytes + sum(c["metadata_bytes"] for c in ckpt["per_checkpoint"]) == phase_writes(run, "checkpoint")
    assert ckpt["total_bytes_written"] == data_bytes
    assert ckpt["verify_s_max"] > 0 and all(c["verify_s_max"] > 0 for c in ckpt["per_checkpoint"])
