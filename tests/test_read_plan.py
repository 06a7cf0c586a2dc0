"""ReadPlan and DatasetPlan: pure functions, no MPI, no files."""

from __future__ import annotations

import dataclasses
import functools
import tracemalloc

import numpy as np
import pytest

from dlio_ckpt.config.load import load_config
from dlio_ckpt.formats.base import FileSpec
from dlio_ckpt.plan.dataset import plan_dataset
from dlio_ckpt.plan.permutation import KeyedPermutation
from dlio_ckpt.plan.read import (BLOCK_ROWS, check_world, dlio_steps_per_epoch, plan_epoch, transfer_end,
                                 transfer_requests)
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.world import rank_slices


def files(count: int, samples: int) -> tuple[FileSpec, ...]:
    return tuple(FileSpec(index=i, path=f"/d/f{i}", num_samples=samples, sample_bytes=10) for i in range(count))


@functools.cache
def _shuffling_reader():
    """Composed once per module (a Hydra compose costs a fraction of a second; RunConfig is frozen)."""
    return load_config(["scale=tiny", "reader.file_shuffle=true", "reader.sample_shuffle=true"]).reader


def reader(**changes):
    """A shuffling reader (the default workload, resnet, does not shuffle, as in DLIO)."""
    return dataclasses.replace(_shuffling_reader(), **changes)


@pytest.mark.parametrize("num_files,samples,size", [(7, 3, 1), (7, 3, 2), (10, 1, 3), (5, 13, 4), (3, 2, 6)])
@pytest.mark.parametrize("sequential", [False, True])
def test_every_sample_read_exactly_once_per_epoch(num_files, samples, size, sequential):
    spec = files(num_files, samples)
    for epoch in (1, 2):
        seen = np.concatenate([plan_epoch(spec, reader(), r, size, epoch, sequential).samples for r in range(size)])
        pairs = {(int(f), int(s)) for f, s in seen}
        assert len(seen) == num_files * samples
        assert pairs == {(f, s) for f in range(num_files) for s in range(samples)}


def test_shares_differ_by_at_most_one_sample():
    spec = files(7, 3)
    counts = [plan_epoch(spec, reader(), r, 4, 1, False).num_samples for r in range(4)]
    assert sum(counts) == 21 and max(counts) - min(counts) <= 1


def test_shuffle_is_seeded_and_differs_per_epoch():
    spec = files(20, 5)
    first = plan_epoch(spec, reader(), 0, 1, 1, False).samples
    again = plan_epoch(spec, reader(), 0, 1, 1, False).samples
    second_epoch = plan_epoch(spec, reader(), 0, 1, 2, False).samples
    other_seed = plan_epoch(spec, reader(shuffle_seed=7), 0, 1, 1, False).samples
    assert np.array_equal(first, again)
    assert not np.array_equal(first, second_epoch)
    assert not np.array_equal(first, other_seed)


def test_no_shuffle_keeps_file_order():
    spec = files(4, 2)
    plan = plan_epoch(spec, reader(file_shuffle=False, sample_shuffle=False), 0, 1, 3, False)
    assert plan.samples.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0], [3, 1]]


def test_sequential_formats_read_each_file_in_order():
    plan = plan_epoch(files(6, 4), reader(), 0, 1, 1, sequential=True)
    for position in range(0, len(plan.samples), 4):
        block = plan.samples[position : position + 4]
        assert len(set(block[:, 0].tolist())) == 1
        assert block[:, 1].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("drop_last,expected", [(False, 4), (True, 3)])
def test_batch_counts(drop_last, expected):
    plan = plan_epoch(files(10, 1), reader(batch_size=3, drop_last=drop_last), 0, 1, 1, False)
    assert plan.num_batches == expected
    sizes = [len(plan.batch(i)) for i in range(plan.num_batches)]
    assert sizes == ([3, 3, 3, 1] if not drop_last else [3, 3, 3])


def test_whole_file_sharding_gives_each_file_to_one_rank():
    spec = files(9, 3)
    owners: dict[int, int] = {}
    for rank in range(4):
        plan = plan_epoch(spec, reader(), rank, 4, 1, True, whole_files=True)
        for f in set(plan.samples[:, 0].tolist()):
            assert f not in owners
            owners[f] = rank
        assert len(plan.samples) % 3 == 0
    assert sorted(owners) == list(range(9))


def test_world_larger_than_dataset_is_rejected():
    with pytest.raises(ConfigError, match="larger than the dataset"):
        check_world(files(2, 1), 3, whole_files=False)
    with pytest.raises(ConfigError, match="at least 4 files"):
        check_world(files(3, 10), 4, whole_files=True)


def test_dataset_plan_sizes_are_seeded_and_clipped():
    config = load_config(["workload=unet3d", "scale=tiny", "storage.root=/nonexistent"])
    plan = plan_dataset(config, "npz")
    again = plan_dataset(config, "npz")
    sizes = [f.sample_bytes for f in plan.train]
    assert sizes == [f.sample_bytes for f in again.train]
    assert len(set(sizes)) > 1  # unet3d has a size spread
    assert min(sizes) >= config.dataset.record_length_bytes_min
    assert plan.folder == f"/nonexistent/data/unet3d/{plan.fingerprint}"
    assert all(f.path.startswith(f"/nonexistent/data/unet3d/{plan.fingerprint}/train/") for f in plan.train)


def test_fingerprint_follows_what_decides_the_bytes():
    base = plan_dataset(load_config(["scale=tiny", "dataset.format=npz"]), "npz").fingerprint
    assert base == plan_dataset(load_config(["scale=tiny", "dataset.format=npz", "reader.batch_size=2"]), "npz").fingerprint
    assert base != plan_dataset(load_config(["scale=tiny", "dataset.format=npz", "dataset.seed=8"]), "npz").fingerprint
    assert base != plan_dataset(load_config(["scale=tiny", "dataset.format=npz", "dataset.num_files_train=3"]), "npz").fingerprint
    # the fingerprint names the folder: datasets of different shapes never share one
    other = plan_dataset(load_config(["scale=tiny", "dataset.format=npz", "dataset.record_length_bytes=2KiB"]), "npz")
    assert other.folder != plan_dataset(load_config(["scale=tiny", "dataset.format=npz"]), "npz").folder


def test_subfolders_spread_files():
    config = load_config(["scale=tiny", "dataset.num_subfolders_train=3", "storage.root=/r"])
    folders = {f.path.rsplit("/", 2)[1] for f in plan_dataset(config, "npz").train}
    assert folders == {"0", "1", "2"}


def test_dlio_step_counting_gives_every_rank_floor_of_samples_over_batch_and_ranks():
    spec = files(16, 1)  # the unet3d: 16 files, batch 3, 2 ranks -> 2 steps per rank
    assert dlio_steps_per_epoch(spec, 3, 2, whole_files=False) == 2
    assert dlio_steps_per_epoch(spec, 3, 2, whole_files=False, total_steps=1) == 1
    assert dlio_steps_per_epoch(files(17, 1), 3, 2, whole_files=False) == 2  # a 9-sample share does not get 3
    plans = [plan_epoch(spec, reader(batch_size=3), r, 2, 1, False, max_batches=2) for r in range(2)]
    assert [(p.num_batches, p.samples_read) for p in plans] == [(2, 6), (2, 6)]
    assert not any(p.drop_last is False for p in plans)
    # a share smaller than one batch per rank gives 0 steps (DLIO's evaluation of a small eval set)
    assert plan_epoch(files(2, 1), reader(batch_size=3), 0, 2, 1, False, max_batches=0).num_batches == 0
    # whole-file shares: the shortest share decides, so no rank waits in a checkpoint another never reaches
    assert dlio_steps_per_epoch(files(3, 10), 5, 2, whole_files=True) == 2  # shares of 20 and 10 samples


def test_transfer_reads_cover_whole_requests_from_the_start_of_the_file():
    # 4 records in a 1,000-byte file, 256-byte requests: record 0 ends at byte 250 -> 256 read
    assert [transfer_end(1000, 4, s, 256) for s in range(4)] == [256, 512, 768, 1000]
    assert transfer_end(1000, 4, 1, 0) == 500  # no transfer size: exactly through the sample
    assert transfer_requests(0, 768, 1000, 256) == [(0, 256), (256, 256), (512, 256)]
    assert transfer_requests(768, 1000, 1000, 256) == [(768, 232)]
    assert transfer_requests(0, 1000, 1000, 4096) == [(0, 1000)]


def _reference_plan(spec, read, rank, size, epoch, sequential=False, whole_files=False):
    """The plan as docs/architecture.md defines it, built whole and naively: the files in the
    epoch's file order (KeyedPermutation keyed (seed, epoch, 0)), each file's samples in place,
    the rank's contiguous share, then that share in the order of KeyedPermutation (seed, epoch,
    rank + 1); whole-file shares take a contiguous run of the file order instead."""
    order = KeyedPermutation(len(spec), [read.shuffle_seed, epoch, 0])(np.arange(len(spec))) \
        if read.file_shuffle and len(spec) > 1 else np.arange(len(spec))
    if whole_files:
        first, last = rank_slices(len(spec), size)[rank]
        order, rank, size = order[first:last], 0, 1
    sequence = [(int(f), s) for f in order for s in range(spec[int(f)].num_samples)]
    begin, end = rank_slices(len(sequence), size)[rank]
    share = np.array(sequence[begin:end], dtype=np.int64).reshape(-1, 2)
    if read.sample_shuffle and not sequential and len(share) > 1:
        share = share[KeyedPermutation(len(share), [read.shuffle_seed, epoch, rank + 1])(np.arange(len(share)))]
    return share


@pytest.mark.parametrize("counts,size", [((1,) * 101, 3), ((4,) * 37, 2), ((1, 5, 2, 0, 7, 3) * 9, 4)])
@pytest.mark.parametrize("whole_files", [False, True])
def test_the_streamed_plan_is_the_reference_plan(counts, size, whole_files):
    """Alike files (the column arithmetic) and files of differing sample counts (bisection over
    each file's first row), several ranks and epochs, shuffled or not: batch by batch, the rows of
    the naive whole construction, in 4-byte integers."""
    spec = tuple(FileSpec(index=i, path=f"/d/f{i}", num_samples=n, sample_bytes=10) for i, n in enumerate(counts))
    for read in (reader(batch_size=5), reader(batch_size=5, file_shuffle=False), reader(batch_size=5, sample_shuffle=False)):
        for epoch in (1, 2):
            for rank in range(size):
                plan = plan_epoch(spec, read, rank, size, epoch, False, whole_files=whole_files)
                batches = [plan.batch(i) for i in range(plan.num_batches)]
                assert all(b.dtype == np.int32 for b in batches)
                expected = _reference_plan(spec, read, rank, size, epoch, whole_files=whole_files)
                assert np.concatenate(batches).tolist() == expected.tolist()
                assert plan.samples.tolist() == expected.tolist()


@pytest.mark.parametrize("num_files,samples,size,whole_files", [(7, 3, 4, False), (10, 1, 3, False), (9, 3, 4, True),
                                                                (5, 13, 2, True), (1000, 7, 6, False)])
def test_each_rank_reads_as_many_samples_as_before(num_files, samples, size, whole_files):
    """The per-rank counts of the plan before it streamed: contiguous sample shares differing by
    at most one (floor and ceiling of total / ranks, the larger first), or whole-file shares."""
    spec = files(num_files, samples)
    total = num_files * samples
    if whole_files:
        base, extra = divmod(num_files, size)
        expected = [(base + (r < extra)) * samples for r in range(size)]
    else:
        base, extra = divmod(total, size)
        expected = [base + (r < extra) for r in range(size)]
    for epoch in (1, 2):
        plans = [plan_epoch(spec, reader(batch_size=4), r, size, epoch, False, whole_files=whole_files) for r in range(size)]
        assert [p.num_samples for p in plans] == expected
        assert [p.num_batches for p in plans] == [-(-n // 4) for n in expected]
        dropping = [plan_epoch(spec, reader(batch_size=4, drop_last=True), r, size, epoch, False,
                               whole_files=whole_files) for r in range(size)]
        assert [(p.num_batches, p.samples_read) for p in dropping] == [(n // 4, n // 4 * 4) for n in expected]


def test_batches_across_the_blocks_the_plan_computes_at_once():
    """An epoch longer than BLOCK_ROWS, batches of 7 (some straddle a block's end), asked in
    order, out of order and again: every sample once, each batch the same rows every time."""
    count = BLOCK_ROWS * 2 + 123
    plan = plan_epoch(files(count, 1), reader(batch_size=7), 0, 1, 1, False)
    batches = [plan.batch(i).copy() for i in range(plan.num_batches)]
    seen = np.concatenate(batches)
    assert len(seen) == count and np.array_equal(np.sort(seen[:, 0]), np.arange(count))
    for index in (plan.num_batches - 1, 0, BLOCK_ROWS // 7, 5, BLOCK_ROWS // 7 + 1, 2 * BLOCK_ROWS // 7):
        assert plan.batch(index).tolist() == batches[index].tolist()
    assert plan.batch(plan.num_batches).shape == (0, 2)  # past the end: no rows, as a slice gave


def test_planning_ten_million_samples_holds_no_array_of_them():
    """A 10M-file dataset's epoch, both shuffles on: planning it and taking its first, middle and
    last batches allocate what one block of rows takes to compute (~6 MiB of uint64 temporaries
    for BLOCK_ROWS positions, whatever the epoch's length), where the whole order took ~300 MB."""
    config = load_config(["scale=tiny", "dataset.format=npz", "storage.root=/nonexistent",
                          "dataset.num_files_train=10000000", "dataset.num_samples_per_file=1",
                          "dataset.record_length_bytes_stdev=0"])
    plan_files = plan_dataset(config, "npz").train
    tracemalloc.start()
    try:
        plan = plan_epoch(plan_files, reader(batch_size=8), 1, 2, 1, False)
        rows = [plan.batch(i).copy() for i in (0, plan.num_batches // 2, plan.num_batches - 1)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.num_samples == 5_000_000 and [len(r) for r in rows] == [8, 8, 8]
    assert peak < 16 << 20, f"{peak / 2**20:.1f} MiB"
    assert all(0 <= f < 10_000_000 for r in rows for f in r[:, 0])
