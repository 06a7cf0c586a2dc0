"""reader.name=tensorflow in memory that does not grow with the rank's share (issue 26, item 3):
tf.data gets the share's file names from a generator (plan/read_order.RunFiles: file k of the share
by arithmetic), the file of each record position follows from arithmetic (InterleaveOrder, equal to
the interleave's table), and each file's calls are recorded once its last record is consumed,
instead of keeping every consumed record's position, size and stamp until the epoch ends: the same
events as the epoch-end recording made (its algorithm copied below as the reference)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from dlio_ckpt.config.load import load_config
from dlio_ckpt.engine import tf_reader
from dlio_ckpt.engine.readers import SharePaths
from dlio_ckpt.engine.tf_reader import InterleaveOrder, interleave_files
from dlio_ckpt.plan.file_list import FileList, SplitFiles
from dlio_ckpt.plan.read import plan_epoch
from dlio_ckpt.plan.read_order import RunFiles


@pytest.mark.parametrize("files", [1, 2, 5, 7, 12])
@pytest.mark.parametrize("per_file", [1, 3, 4])
@pytest.mark.parametrize("cycle", [0, 1, 2, 3, 5])
def test_the_interleave_by_arithmetic_is_the_interleaves_table(files, per_file, cycle):
    table = interleave_files([per_file] * files, cycle)  # checked against TensorFlow in tests/test_formats.py
    assert InterleaveOrder(per_file, files, cycle)(np.arange(len(table))).tolist() == table.tolist()
    assert InterleaveOrder([per_file] * files, files, cycle)(np.arange(len(table))).tolist() == table.tolist()


def test_files_of_differing_counts_use_the_table():
    order = InterleaveOrder([5, 2, 7], 3, 2)
    assert order(np.arange(14)).tolist() == interleave_files([5, 2, 7], 2).tolist()
    assert [order.records_of(i) for i in range(3)] == [5, 2, 7]


class _Recorder:
    class clock:  # noqa: N801 - the recorder's clock, identity
        @staticmethod
        def from_wall(t: float) -> float:
            return t

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def record(self, *event) -> None:
        self.events.append(event)


class _Storage:
    phase = "train"

    def __init__(self, size: int) -> None:
        self.recorder = _Recorder()
        self.inner = self
        self.size = size
        self.sized: list[str] = []

    def file_size(self, path: str) -> int:
        self.sized.append(path)
        return self.size


def _reference(storage, paths, file_of: np.ndarray, started: float, parts) -> None:
    """The recording as it was made at the epoch's end, every consumed record held until then
    (each file's events then made by the unchanged `_record_file`)."""
    positions = np.concatenate([p[0] for p in parts])
    sizes = np.concatenate([p[1] for p in parts])
    stamps = np.concatenate([p[2] for p in parts])
    order = np.argsort(positions, kind="stable")
    positions, sizes, stamps = positions[order], sizes[order], stamps[order]
    before = np.minimum(np.concatenate([[started], stamps[:-1]]), stamps)
    files = file_of[positions]
    maker = tf_reader._ConsumedFiles(storage, paths, None, started)
    for index in np.unique(files):
        mine = files == index
        maker._record_file(paths[index], storage.file_size(paths[index]), stamps[mine], before[mine], sizes[mine])


@pytest.mark.parametrize("files, per_file, cycle, window, batch, cut", [
    (9, 40, 3, 16, 8, None), (7, 25, 2, 64, 5, 11), (12, 10, 1, 1, 4, None), (5, 33, 4, 200, 7, 9)])
@pytest.mark.parametrize("take_every", [1, 16, 4096])
def test_files_recorded_as_they_finish_give_the_epoch_end_recordings_events(monkeypatch, files, per_file, cycle, window,
                                                                            batch, cut, take_every):
    monkeypatch.setattr(tf_reader, "TAKE_EVERY", take_every)
    rng = np.random.default_rng(files * 100 + per_file)
    total = files * per_file
    stream = np.arange(total)
    for lo in range(0, total, window):  # a shuffle buffer's disorder: within windows of the stream
        rng.shuffle(stream[lo:lo + window])
    sizes = rng.integers(3000, 9000, total)  # each record's size, by position
    stamps = np.cumsum(rng.uniform(0.001, 0.01, total)) + rng.uniform(0, 0.02, total)  # parsed in parallel: jitter
    parts = [(stream[i:i + batch], sizes[stream[i:i + batch]], stamps[i:i + batch]) for i in range(0, total, batch)]
    parts = parts[:cut]  # an epoch cut short consumes only some batches
    paths = [f"/data/f{i}.tfrecord" for i in range(files)]
    file_size = per_file * 6000
    want = _Storage(file_size)
    _reference(want, paths, interleave_files([per_file] * files, cycle), 100.0, parts)
    got = _Storage(file_size)
    consumed = tf_reader._ConsumedFiles(got, paths, InterleaveOrder(per_file, files, cycle), 100.0)
    held = []
    for part in parts:
        consumed.consume(*part)
        held.append(consumed._held + len(consumed._waiting[0]) +
                    sum(len(c[0]) for p in consumed._in_progress.values() for c in p))
    recorded_early = len(got.recorder.events)
    consumed.record()
    assert sorted(got.recorder.events) == sorted(want.recorder.events) and len(want.recorder.events) > 0
    assert sorted(got.sized) == sorted(want.sized)
    if cut is None and take_every < total // 4:  # files recorded during the epoch, not all at its end
        # what is held: the disorder window, the files in progress (a cycle of them), what waits to be looked at
        assert max(held) < window + cycle * per_file + take_every + batch and held[-1] <= cycle * per_file + take_every
        assert recorded_early > len(want.recorder.events) // 2


def _plan(files, rank, size, epoch, shuffle=True, start=0):
    reader = dataclasses.replace(load_config(["scale=tiny", "storage.root=/nonexistent"]).reader,
                                 file_shuffle=shuffle, sample_shuffle=True, batch_size=4)
    plan = plan_epoch(files, reader, rank, size, epoch, sequential=True, whole_files=True)
    return dataclasses.replace(plan, start=start) if start else plan


def _files(count: int, per_file: int = 3) -> FileList:
    return FileList((SplitFiles(folder="/d", split="train", count=count, subfolders=0, prefix="img",
                                extension="tfrecord", num_samples=per_file, first_index=0, sample_bytes=10),))


@pytest.mark.parametrize("rank, size, shuffle, start", [(0, 1, True, 0), (1, 3, True, 0), (2, 3, False, 0),
                                                        (0, 2, True, 4), (1, 4, True, 2), (0, 1, False, 7)])
def test_the_shares_files_by_arithmetic_are_its_files_in_first_touch_order(rank, size, shuffle, start):
    files = _files(23)
    plan = _plan(files, rank, size, 2, shuffle, start)
    lazy = plan.files_in_order()
    assert isinstance(lazy, RunFiles) and list(lazy) == plan.files() and len(lazy) == len(plan.files())
    assert [lazy[k] for k in range(len(lazy))] == plan.files() and lazy[-1] == plan.files()[-1]
    paths = SharePaths(files, lazy)
    assert list(paths) == [files[p].path for p in plan.files()] and paths[0] == files[plan.files()[0]].path


def test_a_shares_identity_is_its_set_of_files():
    files = _files(23)
    whole = [_plan(files, 0, 1, epoch).files_in_order() for epoch in (1, 2)]
    assert list(whole[0]) != list(whole[1]) and whole[0].identity() == whole[1].identity()  # every file, reordered
    parts = [_plan(files, 1, 3, epoch).files_in_order() for epoch in (1, 2, 3)]
    for a in parts:
        for b in parts:
            assert (a.identity() == b.identity()) == (sorted(a) == sorted(b))
    same_set = RunFiles(first=3, files=5, file_order=parts[0].file_order)
    assert same_set.identity() == RunFiles(first=3, files=5, file_order=parts[0].file_order).identity()
    assert same_set.identity() != RunFiles(first=4, files=5, file_order=parts[0].file_order).identity()
    unshuffled = [_plan(files, 1, 3, epoch, shuffle=False).files_in_order() for epoch in (1, 2)]
    assert unshuffled[0].identity() == unshuffled[1].identity()
    assert _plan(files, 0, 2, 1, start=4).files_in_order().identity() != _plan(files, 0, 2, 1).files_in_order().identity()
