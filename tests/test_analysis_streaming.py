"""The offline analysis of a run folder read a block at a time (issue 26, item 3).

It used to load every rank's events and path table whole and keep a dict entry per file. It now
streams over blocks (analysis/event_figures.py): the figures must be the old ones (the old code is
kept in analysis_reference.py): counts, bytes, files, histograms, minima, maxima and percentiles
exactly, sums of floats to the last bits; and its memory must not grow with the files.
"""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from analysis_reference import old_figures
from dlio_ckpt.analysis import order_statistics
from dlio_ckpt.analysis.order_statistics import OrderStatistics, order_index
from dlio_ckpt.analysis.run_folders import analyse_run
from dlio_ckpt.storage import events as events_module
from dlio_ckpt.storage.events import EventRecorder, JobClock, RankEvents, event_files
from dlio_ckpt.trace import darshan_spill
from varied_events import write_varied_run

EXACT_KEYS = {"count", "min_s", "max_s", "p50_s", "p90_s", "p99_s", "p99_9_s"}


def _same(new, old, where: str = "") -> None:
    """Equal, floats to 1e-12 relative (sums added a block at a time), except EXACT_KEYS."""
    if isinstance(old, dict):
        assert list(new) == list(old), where
        for key in old:
            _same(new[key], old[key], f"{where}.{key}")
    elif isinstance(old, (list, tuple)):
        assert len(new) == len(old), where
        for number, (a, b) in enumerate(zip(new, old)):
            _same(a, b, f"{where}[{number}]")
    elif isinstance(old, float) and not where.rsplit(".", 1)[-1] in EXACT_KEYS and math.isfinite(old):
        assert new == pytest.approx(old, rel=1e-12, abs=1e-15), where
    else:
        assert new == old and type(new) is type(old), (where, new, old)


def _summary(run: Path, ranks: int) -> None:
    (run / "summary.json").write_text(json.dumps({"workload": "unet3d", "mode": "train", "world_size": ranks}))


@pytest.mark.parametrize("small", [False, True])
def test_the_streamed_figures_are_the_old_ones(tmp_path, monkeypatch, small):
    run = tmp_path / "run"
    write_varied_run(run, monkeypatch, ranks=3, files=60)
    _summary(run, 3)
    old = old_figures([RankEvents.load(path) for path in event_files(run)])
    if small:  # many blocks, partitions and passes on a tiny run: every seam is crossed
        monkeypatch.setattr(events_module, "EVENT_BLOCK_ROWS", 7)
        monkeypatch.setattr(darshan_spill, "BUCKET_BYTES", 64)  # the per-file totals' spill: many buckets,
        monkeypatch.setattr(darshan_spill, "BUCKET_MAX_BYTES", 128)  # each split again, many flushes
        monkeypatch.setattr(darshan_spill, "FLUSH_BYTES", 300)
        monkeypatch.setattr(darshan_spill, "MAX_BUCKETS", 4)
        monkeypatch.setattr(order_statistics, "COLLECT", 2)
    new = analyse_run(run)
    for key in ("count", "read_only", "write_only", "read_write", "metadata_only"):
        assert new.files[key] == old["files"][key]
    assert new.files["count"] == 60 + 2 + 3 * 2 + 1  # dataset files, two more eval reads, shards and their .tmp, /tmp/x
    _same(new.files, old["files"], "files")
    _same(new.histogram, old["histogram"], "histogram")
    _same(new.extra["latency"], old["latency"], "latency")
    _same(new.per_phase, old["per_phase"], "per_phase")
    for rank, figures in zip(new.per_rank, old["per_rank"]):
        _same({key: rank[key] for key in figures}, figures, "per_rank")
    assert (new.timeline.bin_width_s, new.timeline.row_labels, new.timeline.phase_spans) == (
        old["timeline"].bin_width_s, old["timeline"].row_labels, old["timeline"].phase_spans)
    for name in ("read", "write"):
        np.testing.assert_allclose(getattr(new.timeline, name), getattr(old["timeline"], name), rtol=1e-9, atol=1e-6)
        assert getattr(new.timeline, name).sum() == pytest.approx(getattr(old["timeline"], name).sum(), rel=1e-12)


@pytest.mark.parametrize("collect", [2, 1 << 14])
def test_percentiles_by_radix_select_are_numpys_exactly(monkeypatch, collect):
    monkeypatch.setattr(order_statistics, "COLLECT", collect)
    rng = np.random.default_rng(26)
    percents = [0, 50, 90, 99, 99.9, 100]
    samples = {1: rng.random(1), 2: np.full(40, 3.5e-6), 3: np.round(rng.random(1001), 3), 4: np.zeros(9),
               5: 1e-5 + rng.random(5000) * 1e-12, 6: rng.exponential(1e-4, 20_000)}
    order = OrderStatistics()
    blocks = {group: np.array_split(values, 6) for group, values in samples.items()}
    for group in samples:
        for block in blocks[group]:
            order.add(group, block)
    for group, values in samples.items():
        for index in order_index(len(values), percents):
            order.want(group, index)
    order.end_pass()
    passes = 1
    while not order.done:
        for group in samples:
            for block in reversed(blocks[group]):
                order.add(group, block)
        order.end_pass()
        passes += 1
    assert passes <= 5
    for group, values in samples.items():
        got = [order.value(group, index) for index in order_index(len(values), percents)]
        assert got == np.percentile(values, percents, method="inverted_cdf").tolist(), group
    for count in (1, 2, 3, 999, 1000, 1001, 123_457):
        assert order_index(count, percents) == np.percentile(np.arange(count, dtype=float), percents,
                                                             method="inverted_cdf").astype(int).tolist()


def _run_folder(folder: Path, files: int) -> Path:
    """A one-rank run folder over `files` files: an open, two reads and a close of each."""
    rec = EventRecorder(0, JobClock.start(job_start_wall=1.0))
    for k in range(files):
        path, t = f"/dataset/train/img_{k:07d}_of_{files:07d}.npz", k * 1e-4
        rec.record("open", "train", path, -1, 0, t, t + 1e-5)
        rec.record("read", "train", path, 0, 4096, t + 1e-5, t + 3e-5 + (k % 7) * 1e-6)
        rec.record("read", "train", path, 4096, 4096, t + 3e-5, t + 6e-5)
        rec.record("close", "train", path, -1, 0, t + 6e-5, t + 7e-5)
    rec.save(folder / "events", "node0")
    _summary(folder, 1)
    return folder


def _peak_bytes(run: Path) -> tuple[int, object]:
    tracemalloc.start()
    try:
        analysis = analyse_run(run)
        return tracemalloc.get_traced_memory()[1], analysis
    finally:
        tracemalloc.stop()


def test_the_analysis_memory_does_not_grow_with_the_files(tmp_path, monkeypatch):
    """The spill's bounds made small (its buckets capped at 8, as they are at 256), so that 10,000
    files are past the cap as 10 million are at the real sizes: a fixed number of partitions, as
    the per-file totals had, then holds 10x more at 10x the files (1.3x allowed)."""
    monkeypatch.setattr(events_module, "EVENT_BLOCK_ROWS", 512)
    monkeypatch.setattr(darshan_spill, "BUCKET_BYTES", 8 << 10)
    monkeypatch.setattr(darshan_spill, "BUCKET_MAX_BYTES", 32 << 10)
    monkeypatch.setattr(darshan_spill, "FLUSH_BYTES", 16 << 10)
    monkeypatch.setattr(darshan_spill, "MAX_BUCKETS", 8)
    analyse_run(_run_folder(tmp_path / "small", 1_000))  # what the first call allocates once is not the analysis's
    small_peak, small = _peak_bytes(tmp_path / "small")
    large_peak, large = _peak_bytes(_run_folder(tmp_path / "large", 10_000))
    assert large_peak < 1.3 * small_peak, (small_peak, large_peak)  # the old analysis: 4.5x (it held everything)
    assert (large.files["count"], large.files["read_only"], large.bytes_read) == (10_000, 10_000, 10_000 * 8192)
    assert large.extra["latency"]["train"]["read"]["count"] == 20_000


def test_a_rank_without_events_and_an_older_path_table_give_the_old_figures(tmp_path, monkeypatch):
    run = tmp_path / "run"
    files = write_varied_run(run, monkeypatch, ranks=2, files=20)
    with np.load(files[0]) as data:
        arrays = {name: data[name] for name in data.files if name not in ("path_bytes", "path_ends")}
        paths = events_module.decoded_paths(data["path_bytes"], data["path_ends"])
    np.savez(files[0], **arrays, paths=np.array(paths))  # the unicode table of older versions
    EventRecorder(2, JobClock.start(job_start_wall=1.0)).save(run / "events", "node9")
    _summary(run, 3)
    old = old_figures([RankEvents.load(path) for path in event_files(run)])
    new = analyse_run(run)
    _same(new.files, old["files"], "files")
    _same(new.extra["latency"], old["latency"], "latency")
    _same(new.per_phase, old["per_phase"], "per_phase")
    assert [r["bytes_read"] for r in new.per_rank] == [r["bytes_read"] for r in old["per_rank"]]
    assert new.per_rank[2]["reads"] == 0 and new.per_rank[2]["read_s"] == 0.0
