"""ReadPlan and DatasetPlan: pure functions, no MPI, no files."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from dlio_ckpt.config.load import load_config
from dlio_ckpt.formats.base import FileSpec
from dlio_ckpt.plan.dataset import plan_dataset
from dlio_ckpt.plan.read import check_world, dlio_steps_per_epoch, plan_epoch, transfer_end, transfer_requests
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


def _int64_plan(spec, read, rank, size, epoch):
    """plan_epoch as it was computed before its index arrays became int32 (prefix sums of every
    file's count, rng.permutation): the reference the plan must still equal, number for number."""
    order = np.arange(len(spec))
    np.random.default_rng([read.shuffle_seed, epoch, 0]).shuffle(order)
    counts = np.array([spec[int(i)].num_samples for i in order], dtype=np.int64)
    file_column = np.repeat(order, counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sample_column = np.arange(int(counts.sum())) - np.repeat(starts, counts)
    begin, end = rank_slices(len(file_column), size)[rank]
    share = np.stack([file_column[begin:end], sample_column[begin:end]], axis=1)
    return share[np.random.default_rng([read.shuffle_seed, epoch, rank + 1]).permutation(len(share))]


@pytest.mark.parametrize("counts,size", [((1,) * 101, 3), ((4,) * 37, 2), ((1, 5, 2, 0, 7, 3) * 9, 4)])
def test_the_int32_plan_is_the_int64_plan(counts, size):
    """Alike files (the column arithmetic) and files of differing sample counts (the prefix sums),
    several ranks and epochs: the same rows as the int64 computation, in 4-byte integers."""
    spec = tuple(FileSpec(index=i, path=f"/d/f{i}", num_samples=n, sample_bytes=10) for i, n in enumerate(counts))
    read = reader()
    for epoch in (1, 2):
        for rank in range(size):
            plan = plan_epoch(spec, read, rank, size, epoch, False)
            assert plan.samples.dtype == np.int32
            assert plan.samples.tolist() == _int64_plan(spec, read, rank, size, epoch).tolist()
