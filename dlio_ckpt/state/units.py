"""Chunk-granular changes to a stored state: which update units change, new contents, moves.

The `sparse` model (and the uint8 tensors under `sgd` and `trace`) change whole units of
`checkpoint.update_chunk_bytes`. Which units change is drawn as a Bernoulli process with geometric
gaps (work in proportion to the changes, not to the units), processed block by block: a block is
read once, its changed units get fresh bytes from the ByteSource pool at a seeded position, the
float elements they touch are made finite, and it is written back. Memory: one block and one
batch of unit indices, whatever the state's size.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from dlio_ckpt.content import ByteSource
from dlio_ckpt.state.filestate import FileState
from dlio_ckpt.state.store import ScratchStore

BLOCK_BYTES = 1 << 20  # read-modify-write granularity (rounded to whole units)
_BATCH = 1 << 16  # unit indices drawn at a time
_MARGIN = 7  # bytes read either side of a block, so float elements cut by its edges are whole
_FIRST = np.zeros(1, dtype=np.int64)  # "the block's first unit"


def changed_units(rng: np.random.Generator, count: int, probability: float) -> Iterator[np.ndarray]:
    """Sorted indices of the units (of `count`) that change, each with `probability`, in batches."""
    if count <= 0 or probability <= 0:
        return
    if probability >= 1:
        for first in range(0, count, _BATCH):
            yield np.arange(first, min(count, first + _BATCH), dtype=np.int64)
        return
    position = -1
    while True:
        picks = position + np.cumsum(rng.geometric(probability, size=_BATCH))
        inside = picks[picks < count]
        if len(inside):
            yield inside
        if len(inside) < _BATCH:
            return
        position = int(picks[-1])


def _by_block(batches: Iterator[np.ndarray], per_block: int) -> Iterator[tuple[int, np.ndarray]]:
    """(block number, unit indices in it) from sorted batches of unit indices."""
    pending = np.empty(0, dtype=np.int64)
    for batch in batches:
        indices = np.concatenate([pending, batch])
        cuts = np.flatnonzero(np.diff(indices // per_block)) + 1
        groups = np.split(indices, cuts)
        for group in groups[:-1]:
            yield int(group[0] // per_block), group
        pending = groups[-1]
    if len(pending):
        yield int(pending[0] // per_block), pending


def rewrite_units(fs: FileState, lo: int, hi: int, unit: int, probability: float, rng: np.random.Generator,
                  source: ByteSource) -> int:
    """Give each unit of file bytes [lo, hi) (the last one may be partial) fresh contents with
    `probability`; return how many changed."""
    count = -(-(hi - lo) // unit)
    changed = 0
    if unit > BLOCK_BYTES:  # a changed unit is rewritten a block at a time: memory stays one block
        for units in changed_units(rng, count, probability):
            for index in units.tolist():
                unit_lo = lo + index * unit
                unit_hi = min(hi, unit_lo + unit)
                for at in range(unit_lo, unit_hi, BLOCK_BYTES):
                    _rewrite_block(fs, at, min(unit_hi, at + BLOCK_BYTES), BLOCK_BYTES, _FIRST, rng, source)
            changed += len(units)
        return changed
    per_block = BLOCK_BYTES // unit
    for block, units in _by_block(changed_units(rng, count, probability), per_block):
        block_lo = lo + block * per_block * unit
        _rewrite_block(fs, block_lo, min(hi, block_lo + per_block * unit), unit, units - block * per_block, rng, source)
        changed += len(units)
    return changed


def _rewrite_block(fs: FileState, block_lo: int, block_hi: int, unit: int, local: np.ndarray,
                   rng: np.random.Generator, source: ByteSource) -> None:
    """Replace the units `local` (sorted, counted from block_lo; the last may be partial) of file
    bytes [block_lo, block_hi) with pool bytes from a seeded position, their floats made finite."""
    read_lo, read_hi = max(0, block_lo - _MARGIN), min(fs.size, block_hi + _MARGIN)
    raw = np.frombuffer(fs.store.read_at(read_lo, read_hi - read_lo), dtype=np.uint8).copy()
    touched = np.zeros(len(raw), dtype=bool)
    fresh = source.array(int(rng.integers(0, 1 << 62)), block_hi - block_lo)
    whole = (block_hi - block_lo) // unit
    inner = slice(block_lo - read_lo, block_lo - read_lo + whole * unit)
    full = local[local < whole]
    raw[inner].reshape(whole, unit)[full] = fresh[: whole * unit].reshape(whole, unit)[full]
    touched[inner].reshape(whole, unit)[full] = True
    if local[-1] == whole:  # the range's last, partial unit
        tail = slice(inner.stop, block_hi - read_lo)
        raw[tail] = fresh[whole * unit :]
        touched[tail] = True
    fs.make_finite_range(raw, read_lo, touched)
    fs.store.write_at(read_lo, raw)


def movable_units(fs: FileState, unit: int) -> list[np.ndarray]:
    """Groups of whole units that may trade places without breaking a float element: each unit
    lies inside one tensor, and a group shares the dtype and the element phase."""
    groups: dict[tuple[int, int], list[np.ndarray]] = {}
    for i, tensor in enumerate(fs.pf.tensors):
        start, end = int(fs.starts[i]), int(fs.starts[i + 1])
        first, last = -(-start // unit), end // unit
        if last > first:
            key = (tensor.dtype_bytes, (-start) % tensor.dtype_bytes)
            groups.setdefault(key, []).append(np.arange(first, last, dtype=np.int64))
    return [np.concatenate(parts) for _, parts in sorted(groups.items())]


def move_units(fs: FileState, unit: int, fraction: float, rng: np.random.Generator, folder: str) -> int:
    """Move `fraction` of each group of movable units one place round a random cycle (every
    chosen unit lands where another chosen one was); return how many moved."""
    store = fs.store
    moved = 0
    for candidates in movable_units(fs, unit):
        count = int(round(fraction * len(candidates)))
        if count < 2:
            continue
        chosen = candidates[rng.choice(len(candidates), count, replace=False)]
        with ScratchStore(count * unit, folder) as held:
            for i, where in enumerate(chosen.tolist()):
                _copy(store, where * unit, held, i * unit, unit)
            for i, where in enumerate(np.roll(chosen, 1).tolist()):
                _copy(held, i * unit, store, where * unit, unit)
        moved += count
    return moved


def _copy(source, source_at: int, target, target_at: int, nbytes: int) -> None:
    """Copy between stores a block at a time (a unit may be larger than memory should hold)."""
    for done in range(0, nbytes, BLOCK_BYTES):
        target.write_at(target_at + done, source.read_at(source_at + done, min(BLOCK_BYTES, nbytes - done)))
