"""Varied sample sizes computed a block of files at a time (plan/file_sizes.py, issue 26 item 3):
file i's size follows from (seed, split, i // BLOCK) alone, so a plan holds nothing per file, any
block equals the same files' sizes asked for one at a time, and the distribution is the normal the
config names (mean, stdev, clipped at the minimum, whole bytes)."""

from __future__ import annotations

import pickle
from statistics import NormalDist
import tracemalloc

import numpy as np
import pytest

from dlio_ckpt.config.load import load_config
from dlio_ckpt.plan.dataset import dataset_fingerprint, plan_dataset
from dlio_ckpt.plan.file_sizes import BLOCK, KeyedSizes


def _rule(count: int, key=(7, 0), block: int = 0, mean: int = 1_000_000, stdev: int = 100_000,
          minimum: int = 1) -> np.ndarray:
    """Block `block` as the rule says, written out independently: numpy's normal seeded with
    [seed, split, block], BLOCK values, clipped, truncated."""
    draw = np.random.default_rng([*key, block]).normal(mean, stdev, BLOCK)
    return np.maximum(draw, minimum).astype(np.int64)[:max(0, min(BLOCK, count - block * BLOCK))]


def test_the_sizes_are_the_per_block_draw_and_any_block_equals_its_files_asked_alone():
    count = 3 * BLOCK + 17
    sizes = KeyedSizes(count=count, mean=1_000_000, stdev=100_000, minimum=1, key=(7, 0))
    whole = np.concatenate([_rule(count, block=b) for b in range(4)])
    assert len(whole) == count and np.array_equal(sizes.between(0, count), whole)
    alone = [KeyedSizes(count=count, mean=1_000_000, stdev=100_000, minimum=1, key=(7, 0))[i]
             for i in (0, 1023, 1024, 2500, count - 1)]  # each from a fresh object: nothing drawn before it
    assert alone == [int(whole[i]) for i in (0, 1023, 1024, 2500, count - 1)]
    for lo, hi in ((0, 5), (1000, 1100), (BLOCK, 2 * BLOCK), (2047, 3090), (count - 20, count + 5)):
        assert np.array_equal(sizes.between(lo, hi), whole[lo:hi])
        assert sizes.between(lo, hi).tolist() == [sizes[i] for i in range(lo, min(hi, count))]
    longer = KeyedSizes(count=count + 5000, mean=1_000_000, stdev=100_000, minimum=1, key=(7, 0))
    assert np.array_equal(longer.between(0, count), whole)  # a file's size does not depend on the count
    other = KeyedSizes(count=count, mean=1_000_000, stdev=100_000, minimum=1, key=(7, 1))  # the eval split
    assert not np.array_equal(other.between(0, BLOCK), whole[:BLOCK])
    assert sizes.sum() == int(whole.sum())
    assert pickle.loads(pickle.dumps(sizes)).between(0, count).tolist() == whole.tolist()
    with pytest.raises(IndexError):
        sizes[count]


def test_the_distribution_is_the_configured_normal_clipped_at_the_minimum():
    n = 100_000
    plain = KeyedSizes(count=n, mean=1_000_000, stdev=100_000, minimum=1, key=(3, 0)).between(0, n)
    # mean within 4 standard errors (100,000 / sqrt(n) = 316 B); stdev within 1 % (its error is ~0.22 %)
    assert abs(plain.mean() - 1_000_000) < 4 * 316 and abs(plain.std() / 100_000 - 1) < 0.01
    clipped = KeyedSizes(count=n, mean=1000, stdev=1000, minimum=500, key=(3, 0)).between(0, n)
    assert clipped.min() == 500 and clipped.dtype == np.int64
    normal = NormalDist(1000, 1000)
    below = normal.cdf(501)  # clipped to 500: drawn below 500, or in [500, 501) and truncated
    assert abs(float((clipped == 500).mean()) - below) < 4 * (below * (1 - below) / n) ** 0.5
    above = clipped[clipped > 500]  # the part above the minimum is the normal's, truncated to whole bytes
    median = normal.inv_cdf(1 - (1 - below) / 2)  # 1,397.9: the normal's median above 501
    assert abs(np.median(above) + 0.5 - median) < 15  # its standard error here is ~5 B


def _config(*overrides: str):
    return load_config(["scale=tiny", "dataset.format=npz", "storage.root=/nonexistent",
                        "dataset.record_length_bytes=1MiB", "dataset.record_length_bytes_min=1KiB", *overrides])


def test_a_plan_of_ten_million_varied_files_holds_one_block():
    config = _config("dataset.num_files_train=10000000", "dataset.record_length_bytes_stdev=100KiB")
    tracemalloc.start()
    try:
        plan = plan_dataset(config, "npz")
        last, first = plan.train[9_999_999], plan.train[0]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024  # a block's draw (8 KiB of floats, 8 KiB of sizes) and small objects, not 80 MB
    rule = dict(mean=1 << 20, stdev=100 << 10, minimum=1 << 10, key=(config.dataset.seed, 0))
    assert last.sample_bytes == _rule(10_000_000, block=9_999_999 // BLOCK, **rule)[9_999_999 % BLOCK]
    assert first.sample_bytes == _rule(10_000_000, block=0, **rule)[0]


def test_only_datasets_of_varied_sizes_change_folder():
    """Fixed-size datasets keep the folder (fingerprint) versions before keyed sizes gave them
    (the digests that commit's plan/dataset.py computed for these two configs); varied ones get a
    new one, since their files' sizes changed."""
    assert dataset_fingerprint(_config("dataset.record_length_bytes_stdev=0")) == "5d8645783c3ae477"
    assert dataset_fingerprint(_config("dataset.record_length_bytes_stdev=100KiB")) not in ("32dfb99ee7b53f83", "5d8645783c3ae477")
