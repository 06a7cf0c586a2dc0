"""Whole-file readers in memory that does not grow with the rank's share (issue 26, item 3):
reader.access=transfer opens each file as the batch that first reads it is handed out and closes it
after its last sample, so it holds the files of the batches in flight, not one handle per file of
the share, and issues the calls it issued when it opened the whole share at the start: per file an
open, reads from offset 0 in transfer_size requests as far as the consumed samples reach, a close."""

from __future__ import annotations

import dataclasses
import os

import pytest

from dlio_ckpt.config.load import load_config
from dlio_ckpt.engine.readers import TransferReader
from dlio_ckpt.plan.file_list import FileList, SplitFiles
from dlio_ckpt.plan.read import plan_epoch, transfer_end, transfer_requests
from dlio_ckpt.storage.events import OPS, EventRecorder, JobClock
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.traced import TracedStorage

SAMPLES, SAMPLE_BYTES, TAIL = 5, 700, 123  # each file: 5 samples of 700 bytes and 123 bytes after them


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> FileList:
    folder = tmp_path_factory.mktemp("share")
    rule = SplitFiles(folder=str(folder), split="train", count=13, subfolders=2, prefix="img", extension="bin",
                      num_samples=SAMPLES, first_index=0, sample_bytes=SAMPLE_BYTES)
    listed = FileList((rule,))
    for spec in listed:
        os.makedirs(os.path.dirname(spec.path), exist_ok=True)
        with open(spec.path, "wb") as out:
            out.write(os.urandom(SAMPLES * SAMPLE_BYTES + TAIL))
    return listed


def _plan(files, rank, size, batch, max_batches=None, start=0):
    reader = dataclasses.replace(load_config(["scale=tiny", "storage.root=/nonexistent"]).reader,
                                 file_shuffle=True, sample_shuffle=True, batch_size=batch)
    plan = plan_epoch(files, reader, rank, size, 2, sequential=True, whole_files=True, max_batches=max_batches)
    return dataclasses.replace(plan, start=start) if start else plan


def _read(files, plan, transfer, threads):
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    storage = TracedStorage(PosixStorage(), recorder).with_phase("train")
    batches = [(b.samples, b.payload_bytes) for b in TransferReader(storage, files, transfer, threads, 2).batches(plan)]
    paths = recorder.paths
    return batches, [(OPS[e["op"]], paths[e["file"]], int(e["offset"]), int(e["length"])) for e in recorder.array()]


def _expected(files, plan, transfer):
    """The calls, from the plan's rows alone: each file's reads as its samples are consumed, its
    close after its last one (the order the reader issued them in with the whole share open)."""
    rows = plan.samples[:plan.samples_read].tolist()
    last = {position: i for i, (position, _) in enumerate(rows)}
    size = SAMPLES * SAMPLE_BYTES + TAIL
    done: dict[int, int] = {}
    calls = []
    for i, (position, sample) in enumerate(rows):
        path = files[position].path
        end = transfer_end(size, SAMPLES, sample, transfer)
        calls += [("read", path, offset, length) for offset, length in transfer_requests(done.get(position, 0), end, size, transfer)]
        done[position] = max(done.get(position, 0), end)
        if last[position] == i:
            calls.append(("close", path, -1, 0))
    batches = [(len(plan.batch(b)), len(plan.batch(b)) * SAMPLE_BYTES) for b in range(plan.num_batches)]
    return batches, calls


CASES = [  # rank, ranks, batch, max_batches, start (a resumed epoch), transfer_size
    (0, 1, 4, None, 0, 1024), (1, 3, 3, None, 0, 1024), (2, 3, 7, 2, 0, 512), (0, 2, 4, None, 9, 1000),
    (1, 2, 2, None, 0, 256)]


@pytest.mark.parametrize("rank, size, batch, max_batches, start, transfer", CASES)
def test_transfer_reads_issue_the_calls_of_the_whole_share_one_file_open_at_a_time(files, rank, size, batch,
                                                                                   max_batches, start, transfer):
    plan = _plan(files, rank, size, batch, max_batches, start)
    batches, calls = _read(files, plan, transfer, threads=0)
    want_batches, want_calls = _expected(files, plan, transfer)
    assert batches == want_batches
    assert [c for c in calls if c[0] != "open"] == want_calls
    touched = list(dict.fromkeys(position for position, _ in plan.samples[:plan.samples_read].tolist()))
    opens = [c[1] for c in calls if c[0] == "open"]
    assert opens == [files[p].path for p in touched]  # each file once, in read order
    held, most = set(), 0
    for op, path, _, _ in calls:
        if op == "read":
            assert path in held  # opened before its first read
        held = held | {path} if op == "open" else held - {path} if op == "close" else held
        most = max(most, len(held))
    assert most <= 2  # the file being read and the next batch's: never the share (here up to 13 files)
    assert not held  # a share cut short (max_batches) closes its last file too


@pytest.mark.parametrize("threads", [2, 3])
def test_read_threads_issue_each_files_calls_in_its_order(files, threads):
    plan = _plan(files, 1, 2, 2)
    batches, calls = _read(files, plan, 256, threads)
    want_batches, want_calls = _expected(files, plan, 256)
    assert batches == want_batches
    for spec in files:
        mine = [c for c in calls if c[1] == spec.path]
        wanted = [c for c in want_calls if c[1] == spec.path]
        assert mine == ([("open", spec.path, -1, 0)] + wanted if wanted else [])
