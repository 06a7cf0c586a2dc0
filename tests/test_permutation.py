"""KeyedPermutation (plan/permutation.py): a bijection of [0, n), chosen by its key, that shuffles."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from dlio_ckpt.plan.permutation import KeyedPermutation


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 7, 12, 16, 17, 101, 1000, 4097, 65537, 99991])
def test_every_value_exactly_once(n):
    """Squares, primes and sizes just past a square (where a*b - n is largest and cycle walking
    works most): a bijection of [0, n)."""
    for key in ([42, 1, 0], [7, 3, 5]):
        values = KeyedPermutation(n, key)(np.arange(n))
        assert values.dtype == np.int64
        assert np.array_equal(np.sort(values), np.arange(n))


def test_any_positions_in_any_order_give_the_same_values():
    """Evaluated a block at a time, reversed or one by one: the values of the whole evaluation."""
    permutation = KeyedPermutation(10_007, [42, 2, 3])
    whole = permutation(np.arange(10_007))
    blocks = np.concatenate([permutation(np.arange(lo, min(lo + 1000, 10_007))) for lo in range(0, 10_007, 1000)])
    assert np.array_equal(blocks, whole)
    assert np.array_equal(permutation(np.arange(10_006, -1, -1)), whole[::-1])
    assert [int(permutation(np.array([i]))[0]) for i in (0, 5000, 10_006)] == [whole[0], whole[5000], whole[10_006]]


def test_the_key_decides_the_order():
    n = 1000
    first = KeyedPermutation(n, [42, 1, 0])(np.arange(n))
    assert np.array_equal(first, KeyedPermutation(n, [42, 1, 0])(np.arange(n)))  # deterministic
    others = [KeyedPermutation(n, key)(np.arange(n)) for key in ([43, 1, 0], [42, 2, 0], [42, 1, 1])]
    for other in others:  # another seed, epoch or stream: another order, agreeing about as often as chance
        assert np.count_nonzero(other == first) < 10


def test_it_shuffles_positions_across_the_whole_range():
    """Not the identity, a rotation or a stride: position deciles against value deciles are
    spread evenly (chi-square over the 10 x 10 grid, 81 degrees of freedom: 150 is p ~ 1e-6),
    positions and values uncorrelated, few fixed points, and the steps between neighbours' values
    almost all different."""
    n = 10_000
    for seed in range(5):
        values = KeyedPermutation(n, [seed, 1, 1])(np.arange(n))
        grid = np.zeros((10, 10))
        np.add.at(grid, (np.arange(n) * 10 // n, values * 10 // n), 1)
        assert ((grid - n / 100) ** 2 / (n / 100)).sum() < 150
        assert abs(np.corrcoef(np.arange(n), values)[0, 1]) < 0.05
        assert np.count_nonzero(values == np.arange(n)) < 10
        assert len(np.unique(np.diff(values))) > n // 2


def test_small_ranges_reach_every_order():
    """Over many keys, every one of the 24 orders of 4 items appears, none far from its share."""
    seen = collections.Counter(tuple(KeyedPermutation(4, [seed, 1, 0])(np.arange(4)).tolist()) for seed in range(2400))
    assert len(seen) == 24
    assert min(seen.values()) > 50 and max(seen.values()) < 150
