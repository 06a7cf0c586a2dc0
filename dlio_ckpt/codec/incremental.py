"""Merkle-tree incremental checkpoints (Tan et al., ICPP'23): `checkpoint.encoding=incremental`.

Each file's checkpoint is a container holding only what the chain does not have yet: FIRST
regions (node id + raw bytes) and SHIFT references (current node, previous node) grouped by the
checkpoint they point into; FIXED chunks cost nothing (merkle.py has the tree and the labels).

Two passes over the state, memory bounded by a few chunks plus per-node arrays (16-byte digests):
the hash pass computes the tree, the labels and therefore the container's exact size; the emit
pass (EncodedFile.chunks) reads only the FIRST regions back with view.read_at.

Container (little-endian; docs/checkpointing.md "Incremental checkpoints (Merkle tree)"):
    header, 32 bytes: magic b"MK", version u8, hash id u8 (1 xxh3_128, 2 blake3),
        ref id u32 (the previous checkpoint FIXED chunks come from; its own id for a full one),
        checkpoint id u32, chunk size u32, data length u64 (logical bytes),
        FIRST region count u32, SHIFT pair count u32
    FIRST region node ids: u32 each, in file order
    SHIFT groups: group count u32, then (checkpoint id u32, pair count u32) per group, ascending
    SHIFT pairs: (current node u32, previous node u32), in group order
    data: the FIRST regions' bytes, back to back, in the order of their node ids
"""

from __future__ import annotations

import copy
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from dlio_ckpt.codec import merkle
from dlio_ckpt.codec.base import ChainLink, EncodedFile
from dlio_ckpt.state.base import FileView, MutableFileView

MAGIC = b"MK"
VERSION = 1
HEADER = struct.Struct("<2sBBIIIQII")
assert HEADER.size == 32
MAX_NODES = (1 << 32) - 1
DEFAULT_LEAF_BYTES = 64 << 10  # where every element changes (random, sgd, trace): few leaves, little metadata
MIN_AUTO_LEAF_BYTES = 256  # below this a leaf's digest and tree node (32 bytes) cost more than they save


def choose_leaf_bytes(configured: int, update: str, unit_bytes: int) -> int:
    """The Merkle leaf size: `configured` when set (> 0); else the update unit under `sparse` (a
    leaf per embedding row: a changed row rewrites its own bytes, not a 64 KiB leaf around it),
    at least MIN_AUTO_LEAF_BYTES; else DEFAULT_LEAF_BYTES."""
    if configured > 0:
        return configured
    if update == "sparse":
        return max(unit_bytes, MIN_AUTO_LEAF_BYTES)
    return DEFAULT_LEAF_BYTES
COPY_BYTES = 4 << 20  # the decoder's largest single read


@dataclass
class _Chain:
    """What the encoder remembers of one file between checkpoints."""

    size: int
    indices: list[int]
    previous: np.ndarray  # the last checkpoint's leaf digests ((n, 16), file order): FIXED is 'same as there'
    table: merkle.FirstOccurrences = field(default_factory=merkle.FirstOccurrences)


class IncrementalEncoder:
    """codec.base.Encoder for `checkpoint.encoding=incremental`: one chain per file key."""

    name = "incremental"

    def __init__(self, chunk_bytes: int, hash_name: str = "xxh3_128", full_every: int = 0) -> None:
        merkle.leaf_hash(hash_name)  # refuse an unknown name now
        if chunk_bytes < 1 or chunk_bytes >= 1 << 32:
            raise ValueError(f"checkpoint.incremental.chunk_bytes: must be 1 byte to 4GiB (got {chunk_bytes})")
        self.chunk_bytes = chunk_bytes
        self.hash_name = hash_name
        self.full_every = full_every
        self._chains: dict[str, _Chain] = {}  # what committed checkpoints left
        self._pending: dict[int, dict[str, _Chain]] = {}  # checkpoint index -> its files' chains, until settled

    def reset(self) -> None:
        self._chains.clear()
        self._pending.clear()

    def settle(self, index: int, committed: bool) -> None:
        """Checkpoint `index` was committed (its chains become the encoder's), or not (they and
        those of every later checkpoint, encoded from them, are dropped): the encoder then is
        exactly what it was before `index` was encoded."""
        for pending in sorted(self._pending):
            if committed and pending <= index:
                self._chains.update(self._pending.pop(pending))
            elif not committed and pending >= index:
                del self._pending[pending]

    def _latest(self, key: str) -> _Chain | None:
        """The chain the next checkpoint of `key` builds on: the newest one encoded (committed or
        still in flight: an async checkpoint is encoded before the previous one commits)."""
        for pending in sorted(self._pending, reverse=True):
            if key in self._pending[pending]:
                return self._pending[pending][key]
        return self._chains.get(key)

    def encode(self, index: int, key: str, view: FileView) -> EncodedFile:
        started = time.perf_counter()
        chunk = self.chunk_bytes
        size = view.size
        n = merkle.leaf_count(size, chunk)
        if 2 * n - 1 > MAX_NODES:
            raise ValueError(f"{key}: {size} bytes make {n} leaves of {chunk} bytes; raise checkpoint.incremental.chunk_bytes")
        base = self._latest(key)
        if base is not None and (base.size != size or (self.full_every and len(base.indices) >= self.full_every)):
            base = None
        leaf_digests, state_digest = merkle.hash_leaves(view, chunk, self.hash_name)
        heights = merkle.node_heights(n)
        digests = merkle.build_tree(leaf_digests, self.hash_name, heights)
        # A new chain state, never the base changed in place: the base stays what it was until
        # this checkpoint is committed (settle). The table's arrays are replaced, not written, by add().
        if base is None:
            chain = _Chain(size=size, indices=[], previous=leaf_digests)
            previous = None
        else:
            chain = _Chain(size=size, indices=list(base.indices), previous=base.previous, table=copy.copy(base.table))
            previous = base.previous
        ref = chain.indices[-1] if chain.indices else index
        labelling = merkle.label_tree(digests, previous, chain.table, index, heights)
        del digests
        chain.indices.append(index)
        chain.previous = leaf_digests
        self._pending.setdefault(index, {})[key] = chain

        lo, hi = merkle.node_spans(labelling.first_roots, n, size, chunk)
        metadata = _metadata(self.hash_name, ref, index, chunk, size, labelling)
        nbytes = len(metadata) + int((hi - lo).sum())
        stats = {
            "logical_bytes": size,
            "bytes_written": nbytes,
            "metadata_bytes": len(metadata),
            "dedup_ratio": size / nbytes,
            "chain_length": len(chain.indices),
            "full": previous is None,
            "hash": self.hash_name,
            "leaves": n,
            "leaf_bytes": chunk,
            "fixed_leaves": labelling.fixed_leaves,
            "first_leaves": labelling.first_leaves,
            "shift_leaves": labelling.shift_leaves,
            "first_regions": len(labelling.first_roots),
            "shift_regions": len(labelling.shift_roots),
            "table_entries": len(chain.table),  # first occurrences the chain remembers (32 bytes each)
            **_baselines(size, chunk, labelling),
        }
        return EncodedFile(
            nbytes=nbytes,
            chunks=lambda piece_bytes: _emit(view, metadata, lo, hi, piece_bytes),
            metadata_bytes=len(metadata),
            chain=tuple(chain.indices),
            state_digest=state_digest,
            stats=stats,
            encode_s=time.perf_counter() - started,
        )


def _baselines(size: int, chunk: int, labelling: merkle.Labelling) -> dict[str, int]:
    """What the paper compares the tree with, from the same labels: the whole file; the leaves
    that differ from the same leaf last time plus a bitmap of all leaves; those leaves plus a u32
    id each."""
    n = merkle.leaf_count(size, chunk)
    short = n * chunk - size  # what the last leaf lacks of a whole chunk
    changed = labelling.changed_leaves * chunk - (short if labelling.last_leaf_changed else 0)
    return {
        "baseline_full_bytes": size,
        "baseline_changed_chunks_bytes": changed + -(-n // 8),
        "baseline_chunk_list_bytes": changed + 4 * labelling.changed_leaves,
    }


def _metadata(hash_name, ref, index, chunk, size, labelling) -> bytes:
    groups, counts = np.unique(labelling.shift_ref_index, return_counts=True)
    header = HEADER.pack(MAGIC, VERSION, merkle.HASH_IDS[hash_name], ref, index, chunk, size, len(labelling.first_roots), len(labelling.shift_roots))
    group_table = np.stack([groups, counts], axis=1).astype("<u4") if len(groups) else np.zeros((0, 2), "<u4")
    pairs = np.stack([labelling.shift_roots, labelling.shift_ref_node], axis=1).astype("<u4")
    return b"".join(
        [
            header,
            labelling.first_roots.astype("<u4").tobytes(),
            struct.pack("<I", len(groups)),
            group_table.tobytes(),
            pairs.tobytes(),
        ]
    )


def _emit(view: FileView, metadata: bytes, lo: np.ndarray, hi: np.ndarray, piece_bytes: int) -> Iterator[memoryview]:
    """The container in pieces of at most `piece_bytes`: the metadata, then each run of adjacent
    FIRST regions read with view.read_at. Small pieces are packed into one reused buffer (valid
    until the next piece) so storage sees large writes; large ones pass through uncopied."""
    packer = _Packer(piece_bytes)
    yield from packer.add(memoryview(metadata))
    for start, length, _ in _runs(lo, hi, lo):
        at, end = start, start + length
        while at < end:
            piece = view.read_at(at, min(piece_bytes, end - at))
            if not len(piece):
                raise EOFError(f"state view ended at {at} of {view.size} bytes while writing a checkpoint")
            yield from packer.add(memoryview(piece).cast("B"))
            at += len(piece)
    yield from packer.flush()


class _Packer:
    def __init__(self, piece_bytes: int) -> None:
        self.buffer = bytearray(piece_bytes)
        self.filled = 0

    def add(self, data: memoryview) -> Iterator[memoryview]:
        size = len(self.buffer)
        if not self.filled and len(data) >= size // 2:
            for at in range(0, len(data), size):
                yield data[at : at + size]
            return
        while len(data):
            take = min(size - self.filled, len(data))
            self.buffer[self.filled : self.filled + take] = data[:take]
            self.filled += take
            data = data[take:]
            if self.filled == size:
                yield memoryview(self.buffer)
                self.filled = 0

    def flush(self) -> Iterator[memoryview]:
        if self.filled:
            yield memoryview(self.buffer)[: self.filled]
            self.filled = 0


@dataclass
class _Container:
    """One parsed container: where its FIRST regions lie, file side and container side."""

    index: int
    ref: int
    lo: np.ndarray  # FIRST regions' file ranges, file order
    hi: np.ndarray
    offset: np.ndarray  # where each region's bytes start in the container
    groups: list[tuple[int, int]]  # (checkpoint id, pair count)
    pairs: np.ndarray  # (k, 2) current node, previous node


class IncrementalDecoder:
    """codec.base.Decoder for incremental containers: replays the chain base..target into `out`."""

    def rebuild(self, links: list[ChainLink], out: MutableFileView) -> None:
        if not links:
            raise ValueError("incremental restore: empty chain")
        size = out.size
        parsed: dict[int, _Container] = {}
        chunk = None
        for position, link in enumerate(links):
            c, link_chunk = _parse(link, size, links)
            if chunk is not None and link_chunk != chunk:
                raise ValueError(f"checkpoint {link.index}: chunk size {link_chunk} differs from the chain's {chunk}")
            chunk = link_chunk
            expected_ref = link.index if position == 0 else links[position - 1].index
            if c.ref != expected_ref:
                what = "a full checkpoint (chain base)" if position == 0 else f"checkpoint {expected_ref}"
                raise ValueError(f"checkpoint {link.index}: container refers to checkpoint {c.ref}, the chain has {what} there")
            if position == 0:
                _check_covers(c, size, chunk)
            parsed[link.index] = c
            _replay(link, c, parsed, {ln.index: ln for ln in links}, size, chunk, out)


def _parse(link: ChainLink, size: int, links: list[ChainLink]) -> tuple[_Container, int]:
    name = f"checkpoint {link.index}"
    if link.size < HEADER.size:
        raise ValueError(f"{name}: container of {link.size} bytes is shorter than its {HEADER.size}-byte header")
    head = _read(link, 0, HEADER.size)
    magic, version, hash_id, ref, index, chunk, data_len, n_first, n_shift = HEADER.unpack(head)
    if magic != MAGIC:
        raise ValueError(f"{name}: not an incremental container (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ValueError(f"{name}: container version {version}, this reader knows {VERSION}")
    if hash_id not in merkle.HASH_IDS.values():
        raise ValueError(f"{name}: unknown hash id {hash_id}")
    if index != link.index:
        raise ValueError(f"{name}: container says it is checkpoint {index}")
    if data_len != size:
        raise ValueError(f"{name}: container holds {data_len} logical bytes, the file has {size}")
    if chunk < 1:
        raise ValueError(f"{name}: chunk size 0")
    head_len = HEADER.size + 4 * n_first + 4
    if head_len > link.size:
        raise ValueError(f"{name}: {n_first} FIRST regions do not fit in a container of {link.size} bytes")
    n = merkle.leaf_count(size, chunk)
    total = max(0, 2 * n - 1)
    body = _read(link, HEADER.size, 4 * n_first + 4)
    first = np.frombuffer(body[: 4 * n_first], "<u4").astype(np.int64)
    (n_groups,) = struct.unpack_from("<I", body, 4 * n_first)
    meta_len = head_len + 8 * n_groups + 8 * n_shift
    if meta_len > link.size:
        raise ValueError(f"{name}: {n_groups} groups and {n_shift} SHIFT pairs do not fit in a container of {link.size} bytes")
    rest = np.frombuffer(_read(link, head_len, 8 * n_groups + 8 * n_shift), "<u4").astype(np.int64)
    group_table = rest[: 2 * n_groups].reshape(-1, 2)
    pairs = rest[2 * n_groups :].reshape(-1, 2)
    if len(first) and first.max() >= total or len(pairs) and pairs.max() >= total:
        raise ValueError(f"{name}: node id out of range (the tree of {size} bytes in {chunk}-byte chunks has {total} nodes)")
    present = {ln.index for ln in links}
    for ref_index, count in group_table.tolist():
        if ref_index not in present or ref_index > index:
            raise ValueError(f"{name}: SHIFT references point into checkpoint {ref_index}, which is not in the chain {sorted(present)}")
    if int(group_table[:, 1].sum()) != n_shift:
        raise ValueError(f"{name}: SHIFT groups hold {int(group_table[:, 1].sum())} pairs, the header says {n_shift}")
    if len(np.unique(group_table[:, 0])) != n_groups:
        raise ValueError(f"{name}: a checkpoint appears twice in the SHIFT groups")
    lo, hi = merkle.node_spans(first, n, size, chunk)
    if len(lo) > 1 and (lo[1:] < hi[:-1]).any():
        raise ValueError(f"{name}: FIRST regions overlap or are out of file order")
    lengths = hi - lo
    offset = meta_len + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    if meta_len + int(lengths.sum()) != link.size:
        raise ValueError(f"{name}: container is {link.size} bytes, its metadata and regions add up to {meta_len + int(lengths.sum())}")
    groups = [(int(g), int(c)) for g, c in group_table.tolist()]
    return _Container(index, ref, lo, hi, offset, groups, pairs), chunk


def _check_covers(c: _Container, size: int, chunk: int) -> None:
    """A chain base has nothing to keep from before: its regions and references cover every byte."""
    n = merkle.leaf_count(size, chunk)
    lo, hi = merkle.node_spans(c.pairs[:, 0], n, size, chunk)
    covered = int((c.hi - c.lo).sum() + (hi - lo).sum())
    if covered != size:
        raise ValueError(f"checkpoint {c.index}: a full checkpoint (chain base) covers {covered} of the file's {size} bytes")


def _replay(link, c: _Container, parsed, by_index, size, chunk, out: MutableFileView) -> None:
    """Apply one container to `out` (which holds the previous checkpoint): FIRST regions from
    this container, SHIFT pairs from the containers they point into (FIXED: nothing to do)."""
    n = merkle.leaf_count(size, chunk)
    for dst, length, src in _runs(c.lo, c.hi, c.offset):
        _copy(link, src, out, dst, length)
    at = 0
    for ref_index, count in c.groups:
        pairs = c.pairs[at : at + count]
        at += count
        source = parsed[ref_index]
        dst_lo, dst_hi = merkle.node_spans(pairs[:, 0], n, size, chunk)
        src_lo, src_hi = merkle.node_spans(pairs[:, 1], n, size, chunk)
        if ((dst_hi - dst_lo) != (src_hi - src_lo)).any():
            raise ValueError(f"checkpoint {c.index}: a SHIFT pair joins nodes of different sizes")
        region = np.searchsorted(source.lo, src_lo, "right") - 1
        inside = (region >= 0) & (src_hi <= source.hi[np.maximum(region, 0)])
        if not inside.all():
            bad = int(pairs[np.flatnonzero(~inside)[0], 1])
            raise ValueError(f"checkpoint {c.index}: SHIFT reference to node {bad} of checkpoint {ref_index}, which that container did not write")
        src_off = source.offset[region] + (src_lo - source.lo[region])
        for dst, length, src in _runs(dst_lo, dst_hi, src_off):
            _copy(by_index[ref_index], src, out, dst, length)


def _runs(lo: np.ndarray, hi: np.ndarray, src: np.ndarray) -> list[tuple[int, int, int]]:
    """(destination, length, source) copies, consecutive ones that continue each other on both
    sides joined (adjacent FIRST regions, a moved block referenced node by node): fewer reads."""
    if not len(lo):
        return []
    lengths = hi - lo
    joins = (lo[1:] == hi[:-1]) & (src[1:] == src[:-1] + lengths[:-1])
    starts = np.flatnonzero(np.r_[True, ~joins])
    ends = np.r_[starts[1:], len(lo)] - 1
    return list(zip(lo[starts].tolist(), (hi[ends] - lo[starts]).tolist(), src[starts].tolist()))


def _copy(link: ChainLink, src: int, out: MutableFileView, dst: int, length: int) -> None:
    done = 0
    while done < length:
        step = min(COPY_BYTES, length - done)
        out.write_at(dst + done, _read(link, src + done, step))
        done += step


def _read(link: ChainLink, offset: int, nbytes: int) -> memoryview:
    data = memoryview(link.read_at(offset, nbytes)).cast("B")
    if len(data) != nbytes:
        raise ValueError(f"checkpoint {link.index}: container ends at {offset + len(data)} bytes, {offset + nbytes} needed")
    return data


class IncrementalCodec:
    """The `incremental` state codec (codec_registry.py): its options are checkpoint.incremental.*;
    the leaf follows checkpoint.update where not set."""

    name = "incremental"
    kind = "state"
    ratio_name = "dedup_ratio"  # the summary's name for logical / written bytes: what was not rewritten

    @staticmethod
    def encoder(cfg, tensors_of) -> IncrementalEncoder:
        inc = cfg.incremental
        return IncrementalEncoder(choose_leaf_bytes(inc.chunk_bytes, cfg.update, cfg.update_chunk_bytes), inc.hash, inc.full_every)

    @staticmethod
    def decoder(tensors) -> IncrementalDecoder:
        return IncrementalDecoder()


CODEC = IncrementalCodec()
