"""The array Merkle tree of Tan et al. (ICPP'23) over one file's logical bytes, and its labels.

A file of `size` bytes is cut into n = ceil(size / chunk) leaves (the last one may be short). The
tree is an array of 2n-1 nodes: node v has children 2v+1 and 2v+2; the leaves are the nodes
n-1 .. 2n-2. A parent's digest is the hash of its two children's 16-byte digests.

Leaf order: file leaf j is placed so that the tree's left-to-right (in-order) leaf order is the
file order. When n is not a power of two the leaves lie on two levels, and the deeper ones come
first: leaf j is node 2^d-1+j for the m = 2n-2^d leaves of the deepest level d, and node n-1+(j-m)
for the others. So every node covers ONE contiguous byte range of the file, a region is just a
node id, and a reader computes its bytes from (n, chunk, size) alone (node_spans).

Labels (per node, numpy arrays over the whole tree, no per-leaf Python work beyond the hash call):
- FIXED: the leaf has the same digest as the same leaf in the file's previous checkpoint (nothing
  written; the restore already holds it).
- FIRST: the digest was never seen in the chain (bytes written). Ties inside one checkpoint go to
  the lowest leaf; the other copies become SHIFT references to it.
- SHIFT: the digest is in the first-occurrence table (seen earlier in this checkpoint or an
  earlier one of the chain, elsewhere): written as a (current node, previous node) reference.
- MIXED (internal nodes only): children that could not be merged; each child is its own region.
Bottom-up merge: FIRST+FIRST -> FIRST, FIXED+FIXED -> FIXED, SHIFT+SHIFT -> SHIFT when the
parent's digest is in the table, anything else -> MIXED. A region root is a FIRST or SHIFT node
whose parent is MIXED (or the root itself).

The first-occurrence table holds only digests of FIRST nodes, i.e. nodes whose bytes lie, whole
and contiguous, inside a region some container of the chain wrote. A reference therefore always
resolves to bytes in one container, without following chains of references (the paper's table also
keeps new digests of MIXED nodes; those could only be restored by recursion).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from dlio_ckpt.state.base import FileView

FIXED, FIRST, SHIFT, MIXED = 0, 1, 2, 3
DIGEST_BYTES = 16
HASH_IDS = {"xxh3_128": 1, "blake3": 2}
CACHE_BYTES = 256 << 10  # fits a core's L2 (512 KiB on this machine's EPYC; 1-2 MiB on newer cores)


def leaf_hash(name: str) -> Callable[[memoryview], bytes]:
    """The 16-byte digest function of one chunk (and of a pair of child digests)."""
    if name == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128_digest
    if name == "blake3":
        import blake3

        return lambda data: blake3.blake3(data).digest(DIGEST_BYTES)
    raise ValueError(f"checkpoint.incremental.hash: unknown hash {name!r} (xxh3_128 or blake3)")


def streaming_hash(name: str):
    """A new incremental hasher of the same 16-byte digest as leaf_hash(name) (for leaves hashed
    in cache-sized parts)."""
    if name == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128
    import blake3

    return blake3.blake3


def leaf_count(size: int, chunk_bytes: int) -> int:
    return -(-size // chunk_bytes)


def _deep_level(n: int) -> int:
    """d: the level of the deepest leaves (root at level 0)."""
    return max(0, (n - 1).bit_length()) if n > 1 else 0


def leaf_nodes(n: int) -> np.ndarray:
    """Node id of every file leaf, in file order."""
    if n == 0:
        return np.zeros(0, np.int64)
    full = 1 << _deep_level(n)
    deep = 2 * n - full
    j = np.arange(n, dtype=np.int64)
    return np.where(j < deep, full - 1 + j, n - 1 + (j - deep))


def node_leaves(nodes: np.ndarray, n: int) -> np.ndarray:
    """File leaf index of leaf nodes (the inverse of leaf_nodes)."""
    nodes = np.asarray(nodes, np.int64)
    full = 1 << _deep_level(n)
    deep = 2 * n - full
    return np.where(nodes >= full - 1, nodes - (full - 1), deep + nodes - (n - 1))


def node_spans(nodes: np.ndarray, n: int, size: int, chunk_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Byte range [lo, hi) of the file that each node covers (its leftmost to rightmost leaf)."""
    left = np.asarray(nodes, np.int64).copy()
    right = left.copy()
    while True:
        inner = left < n - 1
        if not inner.any():
            break
        left[inner] = 2 * left[inner] + 1
    while True:
        inner = right < n - 1
        if not inner.any():
            break
        right[inner] = 2 * right[inner] + 2
    lo = node_leaves(left, n) * chunk_bytes
    hi = np.minimum((node_leaves(right, n) + 1) * chunk_bytes, size)
    return lo, hi


def node_heights(n: int) -> np.ndarray:
    """Height of every node (leaves 0): nodes with equal digests have equal heights."""
    total = max(0, 2 * n - 1)
    height = np.zeros(total, np.int8)
    d = _deep_level(n)
    for level in range(d - 1, -1, -1):
        first, stop = (1 << level) - 1, min((1 << (level + 1)) - 1, n - 1)
        if first >= stop:
            continue
        v = np.arange(first, stop)
        height[v] = 1 + np.maximum(height[2 * v + 1], height[2 * v + 2])
    return height


def aligned_batches(view: FileView, chunk_bytes: int, batch_bytes: int) -> Iterator[memoryview]:
    """The view's bytes in pieces that hold whole leaves (the last may end with a short one),
    whatever piece sizes the view's stream gives; copies only leaves that straddle two pieces."""
    carry = bytearray(chunk_bytes)
    filled = 0
    for piece in view.stream(batch_bytes):
        piece = memoryview(piece).cast("B")
        if filled:
            take = min(chunk_bytes - filled, len(piece))
            carry[filled : filled + take] = piece[:take]
            filled += take
            piece = piece[take:]
            if filled < chunk_bytes:
                continue
            yield memoryview(carry)
            filled = 0
        whole = len(piece) - len(piece) % chunk_bytes
        if whole:
            yield piece[:whole]
        rest = len(piece) - whole
        if rest:
            carry[:rest] = piece[whole:]
            filled = rest
    if filled:
        yield memoryview(carry)[:filled]


def hash_leaves(view: FileView, chunk_bytes: int, hash_name: str, batch_bytes: int = 8 << 20) -> tuple[np.ndarray, str]:
    """One pass over the view: every leaf's digest ((n, 16) uint8, file order) and the xxh3_128
    hex digest of all the bytes (the state digest). Both hashes read each piece of at most
    CACHE_BYTES in turn, so the second finds it in the core's cache (a 4 MiB leaf hashed whole,
    then again, would read memory twice: half the speed)."""
    import xxhash

    digest = leaf_hash(hash_name)
    state = xxhash.xxh3_128()
    update = state.update
    n = leaf_count(view.size, chunk_bytes)
    out = bytearray(n * DIGEST_BYTES)
    at = 0
    batch_bytes = max(chunk_bytes, batch_bytes - batch_bytes % chunk_bytes)
    new_hasher = streaming_hash(hash_name)
    group = max(chunk_bytes, CACHE_BYTES - CACHE_BYTES % chunk_bytes)  # whole leaves, about CACHE_BYTES
    for batch in aligned_batches(view, chunk_bytes, batch_bytes):
        parts: list[bytes] = []
        if chunk_bytes <= CACHE_BYTES:
            for at_group in range(0, len(batch), group):
                piece = batch[at_group : at_group + group]
                update(piece)
                parts += [digest(piece[at : at + chunk_bytes]) for at in range(0, len(piece), chunk_bytes)]
        else:
            for at_leaf in range(0, len(batch), chunk_bytes):
                leaf = batch[at_leaf : at_leaf + chunk_bytes]
                hasher = new_hasher()
                for at_part in range(0, len(leaf), CACHE_BYTES):
                    part = leaf[at_part : at_part + CACHE_BYTES]
                    update(part)
                    hasher.update(part)
                parts.append(hasher.digest()[:DIGEST_BYTES])
        joined = b"".join(parts)
        out[at : at + len(joined)] = joined
        at += len(joined)
    if at != len(out):
        raise EOFError(f"state view gave {at // DIGEST_BYTES} of {n} leaves ({view.size} bytes)")
    return np.frombuffer(out, np.uint8).reshape(n, DIGEST_BYTES), state.hexdigest()


def build_tree(leaf_digests: np.ndarray, hash_name: str, heights: np.ndarray) -> np.ndarray:
    """Digests of all 2n-1 nodes ((2n-1, 16) uint8, node order), parents from their children."""
    n = len(leaf_digests)
    digests = np.zeros((max(0, 2 * n - 1), DIGEST_BYTES), np.uint8)
    if n == 0:
        return digests
    digests[leaf_nodes(n)] = leaf_digests
    digest = leaf_hash(hash_name)
    for h in range(1, int(heights.max()) + 1):
        v = np.flatnonzero(heights == h)
        pairs = np.concatenate([digests[2 * v + 1], digests[2 * v + 2]], axis=1).tobytes()
        joined = b"".join([digest(pairs[o : o + 2 * DIGEST_BYTES]) for o in range(0, len(pairs), 2 * DIGEST_BYTES)])
        digests[v] = np.frombuffer(joined, np.uint8).reshape(len(v), DIGEST_BYTES)
    return digests


def _keys(digests: np.ndarray) -> np.ndarray:
    """(k, 2) uint64 view of (k, 16) digests, for vectorised comparisons and sorted look-ups."""
    return np.ascontiguousarray(digests).view(np.uint64).reshape(-1, 2)


class FirstOccurrences:
    """The map digest -> (node, checkpoint index) of the first occurrence in a chain: sorted
    arrays, looked up with searchsorted. A look-up matches the full 128 bits; in the (2^-64-rare)
    case of two table digests sharing their first 64 bits a match may be missed, which only
    writes bytes that could have been a reference."""

    def __init__(self) -> None:
        self.hi = np.zeros(0, np.uint64)
        self.lo = np.zeros(0, np.uint64)
        self.node = np.zeros(0, np.int64)
        self.index = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.hi)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found, node, index) for (k, 2) uint64 keys; node/index are -1 where not found."""
        return _lookup(self.hi, self.lo, self.node, self.index, keys)

    def add(self, keys: np.ndarray, nodes: np.ndarray, index: int) -> None:
        """Insert new digests (sorted, then merged in: linear in the table's size)."""
        order = np.lexsort((keys[:, 1], keys[:, 0]))
        keys = keys[order]
        at = np.searchsorted(self.hi, keys[:, 0], "left")
        self.hi = np.insert(self.hi, at, keys[:, 0])
        self.lo = np.insert(self.lo, at, keys[:, 1])
        self.node = np.insert(self.node, at, np.asarray(nodes, np.int64)[order])
        self.index = np.insert(self.index, at, index)


def _lookup(hi, lo, node, index, keys):
    k = len(keys)
    if k == 0 or len(hi) == 0:
        none = np.full(k, -1, np.int64)
        return np.zeros(k, bool), none, none.copy()
    pos = np.minimum(np.searchsorted(hi, keys[:, 0], "left"), len(hi) - 1)
    found = (hi[pos] == keys[:, 0]) & (lo[pos] == keys[:, 1])
    return found, np.where(found, node[pos], -1), np.where(found, index[pos], -1)


@dataclass
class Labelling:
    """What one checkpoint of one file writes: its region roots and per-leaf counts."""

    labels: np.ndarray  # per node: FIXED / FIRST / SHIFT / MIXED
    first_roots: np.ndarray  # FIRST region roots, in file order
    shift_roots: np.ndarray  # SHIFT region roots (current nodes), grouped by ref_index then file order
    shift_ref_node: np.ndarray  # the node each SHIFT root copies
    shift_ref_index: np.ndarray  # the checkpoint that node's bytes were written in
    fixed_leaves: int
    first_leaves: int
    shift_leaves: int
    changed_leaves: int  # leaves whose digest differs from the same leaf last time (all, without one)
    last_leaf_changed: bool  # (the last leaf may be short: the baselines count its real size)


def label_tree(digests: np.ndarray, previous: np.ndarray | None, table: FirstOccurrences, index: int, heights: np.ndarray) -> Labelling:
    """Label every node of checkpoint `index` against the previous checkpoint's leaf digests
    ((n, 16), file order; None for a full checkpoint) and the chain's table, then add this
    checkpoint's FIRST nodes to the table. Vectorised: one pass over the leaves, then one per
    tree height."""
    total = len(digests)
    n = (total + 1) // 2
    keys = _keys(digests)
    labels = np.full(total, MIXED, np.int8)
    ref_node = np.full(total, -1, np.int64)
    ref_index = np.full(total, -1, np.int64)
    leaves = leaf_nodes(n)
    _label_leaves(keys, leaves, previous, table, index, labels, ref_node, ref_index)
    _merge_up(keys, heights, table, index, labels, ref_node, ref_index)
    first_roots, shift_roots = _region_roots(labels, ref_index, n)
    all_first = np.flatnonzero(labels == FIRST)
    table.add(keys[all_first], all_first, index)
    leaf_labels = labels[leaves]
    return Labelling(
        labels=labels,
        first_roots=first_roots,
        shift_roots=shift_roots,
        shift_ref_node=ref_node[shift_roots],
        shift_ref_index=ref_index[shift_roots],
        fixed_leaves=int((leaf_labels == FIXED).sum()),
        first_leaves=int((leaf_labels == FIRST).sum()),
        shift_leaves=int((leaf_labels == SHIFT).sum()),
        changed_leaves=int((leaf_labels != FIXED).sum()),
        last_leaf_changed=bool(n and leaf_labels[-1] != FIXED),
    )


def _label_leaves(keys, leaves, previous, table, index, labels, ref_node, ref_index) -> None:
    """FIXED where the leaf equals last time's, SHIFT where the table knows the digest, FIRST for
    the rest, except later copies of a new digest inside this checkpoint: SHIFT to the lowest."""
    leaf_keys = keys[leaves]
    if previous is not None:
        fixed = (leaf_keys == _keys(previous)).all(axis=1)
        labels[leaves[fixed]] = FIXED
    else:
        fixed = np.zeros(len(leaves), bool)
    moving = np.flatnonzero(~fixed)
    found, node, at = table.lookup(leaf_keys[moving])
    shifted = leaves[moving[found]]
    labels[shifted], ref_node[shifted], ref_index[shifted] = SHIFT, node[found], at[found]
    new = moving[~found]  # file leaf indices, ascending
    if not len(new):
        return
    new_keys = leaf_keys[new]
    order = np.lexsort((new, new_keys[:, 1], new_keys[:, 0]))  # by digest, then lowest leaf first
    sorted_keys = new_keys[order]
    starts = np.ones(len(order), bool)
    starts[1:] = (sorted_keys[1:] != sorted_keys[:-1]).any(axis=1)
    group_first = new[order][np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))]
    nodes = leaves[new[order]]
    labels[nodes[starts]] = FIRST
    copies = nodes[~starts]
    labels[copies], ref_node[copies], ref_index[copies] = SHIFT, leaves[group_first[~starts]], index


def _merge_up(keys, heights, table, index, labels, ref_node, ref_index) -> None:
    """Internal nodes from their children, lowest first: FIRST+FIRST, FIXED+FIXED, and SHIFT+SHIFT
    whose own digest is known (in the table, or a FIRST node of this checkpoint: equal digests
    have equal heights, so those of the same height suffice); anything else stays MIXED."""
    for h in range(1, int(heights.max()) + 1 if len(heights) else 0):
        v = np.flatnonzero(heights == h)
        left, right = labels[2 * v + 1], labels[2 * v + 2]
        both_first = (left == FIRST) & (right == FIRST)
        labels[v[(left == FIXED) & (right == FIXED)]] = FIXED
        labels[v[both_first]] = FIRST
        candidates = v[(left == SHIFT) & (right == SHIFT)]
        if not len(candidates):
            continue
        wanted = keys[candidates]
        found, node, at = table.lookup(wanted)
        here = v[both_first]
        here_keys = keys[here]
        order = np.lexsort((here_keys[:, 1], here_keys[:, 0]))
        found_here, node_here, _ = _lookup(here_keys[order, 0], here_keys[order, 1], here[order], np.full(len(here), index, np.int64), wanted)
        from_here = ~found & found_here
        node = np.where(from_here, node_here, node)
        at = np.where(from_here, index, at)
        hit = found | found_here
        labels[candidates[hit]], ref_node[candidates[hit]], ref_index[candidates[hit]] = SHIFT, node[hit], at[hit]


def _region_roots(labels, ref_index, n) -> tuple[np.ndarray, np.ndarray]:
    """FIRST and SHIFT nodes whose parent is MIXED (or the root): FIRST ones in file order, SHIFT
    ones grouped by the checkpoint they point into, then in file order."""
    total = len(labels)
    parent_mixed = np.ones(total, bool)
    parent_mixed[1:] = labels[(np.arange(1, total) - 1) // 2] == MIXED
    roots = np.flatnonzero(parent_mixed & ((labels == FIRST) | (labels == SHIFT)))
    first_roots = roots[labels[roots] == FIRST]
    shift_roots = roots[labels[roots] == SHIFT]
    first_at, _ = node_spans(first_roots, n, n, 1)  # leaf index where each starts
    shift_at, _ = node_spans(shift_roots, n, n, 1)
    return first_roots[np.argsort(first_at, kind="stable")], shift_roots[np.lexsort((shift_at, ref_index[shift_roots]))]
