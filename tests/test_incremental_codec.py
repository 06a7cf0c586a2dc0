"""The Merkle-tree incremental codec (codec/merkle.py, codec/incremental.py) on in-memory states:
restores are compared byte for byte with the state, container sizes with the bytes streamed, and
leaf counts with the changes made."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest
import xxhash

from dlio_ckpt.codec import merkle
from dlio_ckpt.codec.base import ChainLink
from dlio_ckpt.codec.incremental import HEADER, IncrementalDecoder, IncrementalEncoder
from dlio_ckpt.state.base import BytesView

C = 4096  # leaf size in these tests
EMPTY_METADATA = HEADER.size + 4  # header + SHIFT group count


class Chain:
    """Encodes successive checkpoints of one file and restores any of them from the containers."""

    def __init__(self, encoder: IncrementalEncoder, key: str = "model.pt") -> None:
        self.encoder = encoder
        self.key = key
        self.containers: dict[int, bytes] = {}
        self.results = {}

    def checkpoint(self, index: int, state: bytearray, piece_bytes: int = 16 << 10):
        encoded = self.encoder.encode(index, self.key, BytesView(state))
        pieces = [bytes(p) for p in encoded.chunks(piece_bytes)]
        assert all(len(p) <= piece_bytes for p in pieces)
        blob = b"".join(pieces)
        assert len(blob) == encoded.nbytes == encoded.stats["bytes_written"]
        self.containers[index] = blob
        self.results[index] = encoded
        return encoded

    def links(self, indices) -> list[ChainLink]:
        def reader(blob):
            return lambda offset, n: memoryview(blob)[offset : offset + n]

        return [ChainLink(i, len(self.containers[i]), reader(self.containers[i])) for i in indices]

    def restore(self, index: int, size: int, indices=None) -> bytearray:
        out = bytearray(b"\xee" * size)
        IncrementalDecoder().rebuild(self.links(indices or self.results[index].chain), BytesView(out))
        return out


def random_state(nbytes: int, seed: int = 0) -> bytearray:
    return bytearray(np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes())


def fresh(nbytes: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()


def test_tree_layout_covers_contiguous_file_ranges():
    for n in range(1, 40):
        nodes = merkle.leaf_nodes(n)
        assert sorted(nodes.tolist()) == list(range(n - 1, 2 * n - 1))
        assert (merkle.node_leaves(nodes, n) == np.arange(n)).all()
        lo, hi = merkle.node_spans(np.arange(2 * n - 1), n, n * C - 7, C)
        inner = np.arange(n - 1)
        assert (lo[inner] == lo[2 * inner + 1]).all() and (hi[2 * inner + 1] == lo[2 * inner + 2]).all()
        assert (hi[inner] == hi[2 * inner + 2]).all()
        assert lo[0] == 0 and hi[0] == n * C - 7


def test_sparse_changes_write_only_changed_chunks_and_restore_bit_exact():
    state = random_state(64 * C + 1000)
    chain = Chain(IncrementalEncoder(C))
    first = chain.checkpoint(0, state)
    assert first.chain == (0,) and first.stats["first_leaves"] == 65 and first.stats["full"]
    assert first.state_digest == xxhash.xxh3_128_hexdigest(bytes(state))
    size = len(state)
    assert first.stats["baseline_full_bytes"] == size
    assert first.stats["baseline_changed_chunks_bytes"] == size + 9  # every leaf + a 65-bit bitmap
    assert first.stats["baseline_chunk_list_bytes"] == size + 65 * 4
    originals = {}
    for index, changed in enumerate([[3], [10, 11, 40], [64]], start=1):
        for leaf in changed:
            end = min((leaf + 1) * C, len(state))
            state[leaf * C : end] = fresh(end - leaf * C, 100 * index + leaf)
        encoded = chain.checkpoint(index, state)
        stats = encoded.stats
        assert encoded.chain == tuple(range(index + 1))
        assert (stats["fixed_leaves"], stats["first_leaves"], stats["shift_leaves"]) == (65 - len(changed), len(changed), 0)
        data = sum(min((leaf + 1) * C, len(state)) - leaf * C for leaf in changed)
        assert encoded.nbytes == encoded.metadata_bytes + data
        assert encoded.state_digest == xxhash.xxh3_128_hexdigest(bytes(state))
        originals[index] = bytes(state)
    for index, expected in originals.items():
        assert chain.restore(index, len(state)) == expected


def test_moved_chunks_are_references_not_data():
    state = random_state(64 * C, seed=1)
    chain = Chain(IncrementalEncoder(C))
    chain.checkpoint(0, state)
    block_a, block_b = bytes(state[8 * C : 13 * C]), bytes(state[40 * C : 45 * C])  # unaligned 5-leaf blocks
    state[8 * C : 13 * C], state[40 * C : 45 * C] = block_b, block_a
    encoded = chain.checkpoint(1, state)
    assert (encoded.stats["fixed_leaves"], encoded.stats["first_leaves"], encoded.stats["shift_leaves"]) == (54, 0, 10)
    assert encoded.nbytes == encoded.metadata_bytes  # no chunk data at all
    assert encoded.stats["shift_regions"] < 10  # aligned pairs merged into one reference
    assert encoded.stats["baseline_chunk_list_bytes"] == 10 * C + 10 * 4
    assert chain.restore(1, len(state)) == state


def test_repeated_chunks_inside_one_checkpoint_are_written_once():
    block = fresh(C, 7)
    state = bytearray(block * 20 + fresh(3 * C, 8))
    chain = Chain(IncrementalEncoder(C))
    encoded = chain.checkpoint(0, state)
    assert encoded.stats["first_leaves"] == 4 and encoded.stats["shift_leaves"] == 19
    assert encoded.nbytes == encoded.metadata_bytes + 4 * C
    assert chain.restore(0, len(state)) == state
    # the copy that is written is the lowest leaf: its node id is the first FIRST region
    blob = chain.containers[0]
    n_first = HEADER.unpack_from(blob)[7]
    first_nodes = np.frombuffer(blob, "<u4", n_first, HEADER.size)
    assert merkle.node_leaves(first_nodes[:1], 23)[0] == 0


def test_full_every_starts_new_chains_that_restore_alone():
    state = random_state(16 * C, seed=2)
    chain = Chain(IncrementalEncoder(C, full_every=2))
    chains = []
    for index in range(5):
        state[index * C : index * C + 10] = b"x" * 10 if index % 2 else b"y" * 10
        encoded = chain.checkpoint(index, state)
        chains.append(encoded.chain)
        if index == 3:
            snapshot = bytes(state)
    assert chains == [(0,), (0, 1), (2,), (2, 3), (4,)]
    assert chain.results[2].nbytes == len(state) + chain.results[2].metadata_bytes
    del chain.containers[0], chain.containers[1]  # the old chain is gone; the new one is whole
    assert chain.restore(3, len(state)) == snapshot


def test_last_partial_chunk():
    state = random_state(10 * C + 123, seed=3)
    chain = Chain(IncrementalEncoder(C))
    chain.checkpoint(0, state)
    state[-50:] = b"z" * 50
    encoded = chain.checkpoint(1, state)
    assert encoded.stats["first_leaves"] == 1
    assert encoded.nbytes == encoded.metadata_bytes + 123
    assert encoded.stats["baseline_changed_chunks_bytes"] == 123 + 2  # the chunk and an 11-bit bitmap
    assert chain.restore(1, len(state)) == state


def test_unchanged_checkpoint_costs_only_the_header():
    state = random_state(33 * C, seed=4)
    chain = Chain(IncrementalEncoder(C))
    chain.checkpoint(0, state)
    encoded = chain.checkpoint(1, state)
    assert encoded.nbytes == encoded.metadata_bytes == EMPTY_METADATA
    assert encoded.stats["fixed_leaves"] == 33 and encoded.stats["baseline_changed_chunks_bytes"] == 5
    assert chain.restore(1, len(state)) == state


def test_reset_and_size_change_start_full_checkpoints():
    state = random_state(8 * C, seed=5)
    encoder = IncrementalEncoder(C)
    chain = Chain(encoder)
    chain.checkpoint(0, state)
    encoder.reset()
    assert chain.checkpoint(1, state).chain == (1,)
    assert chain.checkpoint(2, state + b"more").chain == (2,)


def test_blake3_and_odd_stream_pieces_give_the_same_leaves():
    state = random_state(9 * C + 5, seed=6)

    class OddPieces(BytesView):
        def stream(self, chunk_bytes):
            for at in range(0, self.size, 1000):
                yield self.read_at(at, 1000)

    whole, digest = merkle.hash_leaves(BytesView(state), C, "xxh3_128")
    odd, odd_digest = merkle.hash_leaves(OddPieces(state), C, "xxh3_128")
    assert (whole == odd).all() and digest == odd_digest == xxhash.xxh3_128_hexdigest(bytes(state))
    assert bytes(whole[9]) == xxhash.xxh3_128_digest(bytes(state[9 * C :]))
    chain = Chain(IncrementalEncoder(C, "blake3"))
    chain.checkpoint(0, state)
    state[C : 2 * C] = fresh(C, 9)
    assert chain.checkpoint(1, state).stats["first_leaves"] == 1
    assert chain.restore(1, len(state)) == state


@pytest.mark.parametrize("hash_name", ["xxh3_128", "blake3"])
def test_leaves_larger_than_the_cache_block_hash_as_one_piece(hash_name):
    leaf = 2 * merkle.CACHE_BYTES + 4096
    state = random_state(2 * leaf + 777, seed=13)
    digests, state_digest = merkle.hash_leaves(BytesView(state), leaf, hash_name, batch_bytes=leaf)
    whole = merkle.leaf_hash(hash_name)
    assert [bytes(d) for d in digests] == [whole(bytes(state[at : at + leaf])) for at in range(0, len(state), leaf)]
    assert state_digest == xxhash.xxh3_128_hexdigest(bytes(state))


def test_emit_pass_reads_only_first_regions_and_memory_stays_bounded():
    chunk = 64 << 10
    state = random_state(32 << 20, seed=10)

    class Counting(BytesView):
        reads = 0

        def read_at(self, offset, nbytes):
            piece = super().read_at(offset, nbytes)
            Counting.reads += len(piece)
            return piece

    chain = Chain(IncrementalEncoder(chunk))
    chain.checkpoint(0, state)
    for leaf in (5, 6, 7, 300):
        state[leaf * chunk : leaf * chunk + 1] = b"\x01" if state[leaf * chunk] != 1 else b"\x02"
    view = Counting(state)
    tracemalloc.start()
    encoded = chain.encoder.encode(1, chain.key, view)
    written = sum(len(p) for p in encoded.chunks(1 << 20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert written == encoded.nbytes == encoded.metadata_bytes + 4 * chunk
    assert Counting.reads == 4 * chunk
    assert peak < 3 << 20  # a 1 MiB write buffer and per-node arrays, never the 32 MiB state


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda b: b"XX" + b[2:], "magic"),
        (lambda b: b[:2] + b"\x09" + b[3:], "version"),
        (lambda b: b[:20], "shorter than its 32-byte header"),
        (lambda b: b[:-1], "container is"),
        (lambda b: b[: HEADER.size] + struct.pack("<I", 10**6) + b[HEADER.size + 4 :], "node id out of range"),
        (lambda b: b[:28] + struct.pack("<I", 10**8) + b[32:], "do not fit"),
    ],
)
def test_corrupted_container_is_rejected_naming_the_checkpoint(corrupt, message):
    state = random_state(8 * C, seed=11)
    chain = Chain(IncrementalEncoder(C))
    chain.checkpoint(0, state)
    state[:10] = b"0123456789"
    chain.checkpoint(1, state)
    chain.containers[1] = corrupt(chain.containers[1])
    with pytest.raises(ValueError, match=message) as error:
        chain.restore(1, len(state))
    assert str(error.value).startswith("checkpoint 1:")


def test_broken_chain_is_rejected():
    state = random_state(8 * C, seed=12)
    chain = Chain(IncrementalEncoder(C))
    for index in range(3):
        state[index * C] ^= 0xFF
        chain.checkpoint(index, state)
    with pytest.raises(ValueError, match="checkpoint 2: container refers to checkpoint 1"):
        chain.restore(2, len(state), indices=[0, 2])
    with pytest.raises(ValueError, match="checkpoint 1: .*chain base"):
        chain.restore(2, len(state), indices=[1, 2])
    # an incremental container that claims to be a chain base
    blob = bytearray(chain.containers[1])
    blob[4:8] = struct.pack("<I", 1)
    chain.containers[1] = bytes(blob)
    with pytest.raises(ValueError, match="checkpoint 1: a full checkpoint .* covers 4096 of the file's 32768 bytes"):
        chain.restore(2, len(state), indices=[1])
    # a SHIFT reference into a checkpoint missing from the links
    moved = bytes(state[:C])
    state[5 * C : 6 * C] = moved
    chain.checkpoint(3, state)
    with pytest.raises(ValueError, match="checkpoint 3: .*not in the chain"):
        IncrementalDecoder().rebuild(chain.links([3]), BytesView(bytearray(len(state))))


@pytest.mark.parametrize("seed", range(6))
def test_random_edits_over_a_chain_restore_bit_exact(seed):
    """Changed, moved (at any offset), duplicated and reverted blocks on tiny chunks: every
    checkpoint restores from its chain alone, and a revert to older contents writes no data."""
    rng = np.random.default_rng(seed)
    chunk = 64
    size = chunk * int(rng.integers(1, 300)) + int(rng.integers(0, chunk))
    state = random_state(size, seed=seed)
    chain = Chain(IncrementalEncoder(chunk, full_every=int(rng.integers(0, 5))), key=f"k{seed}")
    snapshots = {}
    for index in range(10):
        for _ in range(int(rng.integers(0, 4))):
            a, b = sorted(rng.integers(0, size + 1, 2).tolist())
            kind = rng.integers(0, 3)
            if kind == 0:
                state[a:b] = fresh(b - a, int(rng.integers(1 << 30)))
            else:
                length = b - a
                to = int(rng.integers(0, size - length + 1))
                block = bytes(state[a:b])
                if kind == 1:  # move: swap with what is there
                    state[a:b] = bytes(state[to : to + length]) if to + length <= a or to >= b else block
                state[to : to + length] = block
        reverted = index >= 3 and rng.random() < 0.3
        if reverted:
            state[:] = snapshots[index - 2]
        encoded = chain.checkpoint(index, state, piece_bytes=int(rng.choice([100, 4096])))
        snapshots[index] = bytes(state)
        if reverted and chain.results[index - 2].chain[0] == encoded.chain[0]:
            assert encoded.nbytes == encoded.metadata_bytes
    for index, expected in snapshots.items():
        assert chain.restore(index, size) == expected


def test_container_layout_as_documented():
    """Read a container with the layout docs/checkpointing.md gives (not the decoder): header
    fields, FIRST node ids and their bytes, SHIFT groups ascending by checkpoint."""
    state = random_state(16 * C, seed=14)
    chain = Chain(IncrementalEncoder(C))
    chain.checkpoint(0, state)
    old_leaf2 = bytes(state[2 * C : 3 * C])
    state[2 * C : 3 * C] = fresh(C, 15)  # FIRST in checkpoint 1
    chain.checkpoint(1, state)
    state[9 * C : 10 * C] = old_leaf2  # from checkpoint 0
    state[12 * C : 13 * C] = state[2 * C : 3 * C]  # from checkpoint 1
    state[14 * C : 15 * C] = fresh(C, 16)  # FIRST in checkpoint 2
    state[4 * C : 5 * C] = state[14 * C : 15 * C]  # a lower copy of it: that one is FIRST
    encoded = chain.checkpoint(2, state)
    blob = chain.containers[2]
    magic, version, hash_id, ref, index, chunk, length, n_first, n_shift = struct.unpack_from("<2sBBIIIQII", blob)
    assert (magic, version, hash_id, ref, index, chunk, length) == (b"MK", 1, 1, 1, 2, C, 16 * C)
    assert (n_first, n_shift) == (1, 3)
    first = np.frombuffer(blob, "<u4", n_first, 32)
    assert merkle.node_leaves(first, 16).tolist() == [4]
    at = 32 + 4 * n_first
    (n_groups,) = struct.unpack_from("<I", blob, at)
    groups = np.frombuffer(blob, "<u4", 2 * n_groups, at + 4).reshape(-1, 2).tolist()
    assert groups == [[0, 1], [1, 1], [2, 1]]
    pairs = np.frombuffer(blob, "<u4", 2 * n_shift, at + 4 + 8 * n_groups).reshape(-1, 2)
    assert merkle.node_leaves(pairs[:, 0], 16).tolist() == [9, 12, 14]
    assert merkle.node_leaves(pairs[:, 1], 16).tolist() == [2, 2, 4]
    data_at = at + 4 + 8 * n_groups + 8 * n_shift
    assert data_at == encoded.metadata_bytes and blob[data_at:] == state[4 * C : 5 * C]
    assert chain.restore(2, len(state)) == state


@pytest.mark.parametrize("size", [0, 1, C, C + 1])
def test_empty_and_single_leaf_files(size):
    state = random_state(size, seed=size)
    chain = Chain(IncrementalEncoder(C))
    assert chain.checkpoint(0, state).nbytes == EMPTY_METADATA + 4 * (size > 0) + size
    original = bytes(state)
    if size:
        state[-1] ^= 1
    encoded = chain.checkpoint(1, state)
    assert encoded.nbytes == EMPTY_METADATA + (4 + size - (size - 1) // C * C if size else 0)
    assert chain.restore(0, size) == original and chain.restore(1, size) == state
