"""KeyedPermutation: a seeded shuffle of [0, n) evaluated at any positions, without an array of n.

An epoch's read order was a numpy shuffle of every sample: 4 bytes a sample held, ~31 while it
was made, ~300 MB for ten million. A keyed bijection gives the same kind of order a block at a
time: position i of the shuffled sequence is `permutation(i)`, computed when asked for.

The bijection is a Feistel network over a mixed radix (Black and Rogaway's FE2, "Ciphers with
arbitrary finite domains", 2002): x in [0, a*b) splits into (x // b, x % b); each round maps
(L, R) in Z_p x Z_q to (R, (L + F(R)) mod p), which is invertible whatever F is, and swaps the
radices, so an even number of rounds maps Z_a x Z_b onto itself. F is splitmix64's finaliser of
R plus the round's key (keys drawn from numpy's SeedSequence of the seed), a full-avalanche mix.
With a = ceil(sqrt(n)) and b = ceil(n / a), a*b - n < a, so the values that land outside [0, n)
are rare (under 1 / sqrt(n)) and are walked on through the network until they land inside
(cycle walking): still a bijection of [0, n). Six rounds: well past the three or four a Feistel
network needs to look random (Luby-Rackoff) with a mix this strong, at ~60 numpy operations a
block (about 60 ms for a million positions here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

ROUNDS = 6  # even: the radices come back to (a, b)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32)


def _round_value(values: np.ndarray, key: np.uint64, radix: np.uint64) -> np.ndarray:
    """F: splitmix64's finaliser of values + key (uint64, wrapping; every input bit moves every
    output bit), brought into [0, radix) by its high 32 bits times the radix (Lemire's
    multiply-shift: a multiplication where a modulo is a division, several times slower in numpy;
    radices stay below 2^32, so it cannot overflow)."""
    z = values + key
    z ^= z >> _S30
    z *= _MUL1
    z ^= z >> _S27
    z *= _MUL2
    z >>= _S32  # the finaliser's last xor-shift only mixed the high half into the low: dropped with it
    z *= radix
    z >>= _S32
    return z


class KeyedPermutation:
    """The permutation of [0, n) that `key` (non-negative integers, numpy's seed form) chooses."""

    __slots__ = ("n", "_a", "_b", "_keys")

    def __init__(self, n: int, key: Sequence[int]) -> None:
        if n < 0:
            raise ValueError(f"a permutation of {n} items")
        self.n = n
        self._a = max(1, math.isqrt(max(n - 1, 0)) + 1)  # ceil(sqrt(n)), at least 1
        self._b = max(1, -(-n // self._a))
        self._keys = tuple(np.random.SeedSequence(list(key)).generate_state(ROUNDS, np.uint64))

    def _network(self, x: np.ndarray) -> np.ndarray:
        """The bijection of [0, a*b) (uint64 in, uint64 out)."""
        p, q = np.uint64(self._a), np.uint64(self._b)
        left, right = np.divmod(x, q)
        for key in self._keys:
            mixed = _round_value(right, key, p)
            mixed += left  # below 2p: (L + F) mod p is the smaller of it and it - p (which wraps above it when it < p)
            np.minimum(mixed, mixed - p, out=mixed)
            left, right = right, mixed
            p, q = q, p
        left *= q
        left += right
        return left

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The values at `positions` (each in [0, n)), as int64."""
        x = self._network(np.asarray(positions, dtype=np.uint64))
        outside = np.flatnonzero(x >= self.n)
        while len(outside):  # cycle walking: on through the network until inside [0, n)
            walked = self._network(x[outside])
            x[outside] = walked
            outside = outside[walked >= self.n]
        return x.astype(np.int64)
