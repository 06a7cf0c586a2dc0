"""Figures that must be true: exact totals under threads, write time without the read-back,
byte figures from the tracer, the AU verdict, the time shares and the saved report (issue 7)."""

from __future__ import annotations

import sys
import threading

import numpy as np

from dlio_ckpt.storage.events import EventRecorder, JobClock


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
