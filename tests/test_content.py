"""Synthetic contents: deterministic, independent of chunking, and not deduplicable by blocks."""

from __future__ import annotations

import numpy as np

from dlio_ckpt.content import ByteSource, tensor_key
from dlio_ckpt.formats.base import FileSpec


def collect(source: ByteSource, key: int, nbytes: int, chunk: int) -> np.ndarray:
    return np.concatenate([np.frombuffer(piece, np.uint8) for piece in source.chunks(key, nbytes, chunk)])


def test_an_item_longer_than_the_pool_repeats_no_block():
    source = ByteSource(seed=1, pool_bytes=1 << 20)
    data = collect(source, 5, 6 << 20, 300_000)  # six laps of the pool
    blocks = data.reshape(-1, 4096)
    assert len(np.unique(blocks, axis=0)) == len(blocks)


def test_items_do_not_share_blocks():
    source = ByteSource(seed=1, pool_bytes=1 << 20)
    a = collect(source, 1, 1 << 20, 1 << 20).reshape(-1, 4096)
    b = collect(source, 2, 1 << 20, 1 << 20).reshape(-1, 4096)
    assert len(np.unique(np.concatenate([a, b]), axis=0)) == len(a) + len(b)


def test_contents_do_not_depend_on_the_chunk_size_and_are_reproducible():
    source = ByteSource(seed=9, pool_bytes=1 << 20)
    reference = collect(source, 3, 3_000_001, 1 << 20)
    assert np.array_equal(reference, collect(source, 3, 3_000_001, 4097))
    assert np.array_equal(reference, collect(ByteSource(seed=9, pool_bytes=1 << 20), 3, 3_000_001, 65536))
    assert np.array_equal(reference, source.array(3, 3_000_001))
    assert not np.array_equal(reference, collect(ByteSource(seed=10, pool_bytes=1 << 20), 3, 3_000_001, 65536))


def test_zeros_for_comparison():
    data = collect(ByteSource(seed=1, pool_bytes=1 << 20, zeros=True), 4, 9 << 20, 8 << 20)
    assert len(data) == 9 << 20 and not data.any()


def test_the_pool_holds_the_bytes_of_numpys_full_range_uint8_draw():
    """The pool's contents since the first release: a faster draw must not change them (datasets
    and checkpoints written earlier are verified against them)."""
    from dlio_ckpt.content import random_bytes

    for seed, nbytes in ((0, 1), (7, 13), (12345, (1 << 20) + 5)):
        expected = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
        assert np.array_equal(random_bytes(seed, nbytes), expected)
    source = ByteSource(seed=3, pool_bytes=1 << 20)
    expected = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
    assert np.array_equal(source.array(0, 0), expected[:0])
    assert np.array_equal(source._pool, np.concatenate([expected, expected]))


def test_the_files_and_samples_of_a_dataset_do_not_share_blocks():
    """Sample keys are a file index shifted left plus the sample number; every sample of 1,000
    files of 8 samples starts somewhere else in the pool, and no 4 KiB block repeats between the
    one-sample files of a dataset (the old start, an odd multiplier modulo the pool's power-of-two
    size, gave every one-sample file one of two contents)."""
    source = ByteSource(seed=1)
    keys = [FileSpec(index, "f", 8, 4096).sample_key(sample) for index in range(1000) for sample in range(8)]
    starts = [source._start(key) for key in keys]
    assert len(set(starts)) >= len(keys) - 2  # a birthday pair or two among 8,000 draws from 2^25
    assert all(start % 2 for start in starts)  # never on a block boundary
    blocks = np.stack([source.array(FileSpec(index, "f", 1, 4096).sample_key(0), 4096) for index in range(2000)])
    assert len(np.unique(blocks, axis=0)) == len(blocks)


def test_checkpoint_tensors_of_ranks_and_steps_do_not_share_blocks():
    source = ByteSource(seed=1)
    pieces = np.stack([source.array(tensor_key(rank, name, step), 4096)
                       for rank in range(4) for name in ("a.weight", "a.bias", "b.weight") for step in range(0, 400, 100)])
    assert len(np.unique(pieces, axis=0)) == len(pieces)
