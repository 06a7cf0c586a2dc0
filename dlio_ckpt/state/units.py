"""Chunk-granular changes to a stored state: which update units change, new contents, moves.

The `sparse` model (and the uint8 tensors under `sgd` and `trace`) change whole units of
`checkpoint.update_chunk_bytes` (rows of an embedding table). Which units change at each training
step is drawn as a Bernoulli process with geometric gaps, seeded by the step (work in proportion to
the changes, not to the units); an update over the steps (a, b] gathers every step's changes and
keeps each unit's last one, so the state at a step is the same whatever steps it went through. The
changes are processed block by block: a block is read once, its changed units get pool bytes at a
position hashed from (unit, step of the change), the float elements they touch are made finite,
and it is written back. Memory: one block plus the indices of the interval's changes.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from dlio_ckpt.content import ByteSource
from dlio_ckpt.state.filestate import FileState
from dlio_ckpt.state.store import ScratchStore
from dlio_ckpt.state.values import mix64

BLOCK_BYTES = 1 << 20  # read-modify-write granularity (rounded to whole units)
_BATCH = 1 << 16  # unit indices drawn at a time
_MARGIN = 7  # bytes read either side of a block, so float elements cut by its edges are whole
_FIRST = np.zeros(1, dtype=np.int64)  # "the block's first unit"


def changed_units(rng: np.random.Generator, count: int, probability: float) -> Iterator[np.ndarray]:
    """Sorted indices of the units (of `count`) that change, each with `probability`, in batches
    (each about the expected count: a step that changes few units draws few numbers)."""
    if count <= 0 or probability <= 0:
        return
    if probability >= 1:
        for first in range(0, count, _BATCH):
            yield np.arange(first, min(count, first + _BATCH), dtype=np.int64)
        return
    expected = count * probability
    batch = int(min(_BATCH, expected + 6 * expected**0.5 + 16))
    position = -1
    while True:
        picks = position + np.cumsum(rng.geometric(probability, size=batch))
        inside = picks[picks < count]
        if len(inside):
            yield inside
        if len(inside) < batch:
            return
        position = int(picks[-1])


def step_changes(fs: FileState, count: int, fraction: float, a: int, b: int, purpose: int) -> tuple[np.ndarray, np.ndarray]:
    """The units (of `count`) that changed in the steps (a, b], sorted, and the last step each
    changed at. Each step t draws its own changes (seeded by t alone), so the set is the same
    whatever steps the state was advanced through: the state at a step does not depend on the
    checkpoint schedule."""
    units, steps = [], []
    for t in range(a + 1, b + 1):
        for batch in changed_units(fs.rng(t - 1, t, purpose), count, fraction):
            units.append(batch)
            steps.append(np.full(len(batch), t, dtype=np.int64))
    if not units:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    units, steps = np.concatenate(units), np.concatenate(steps)
    if b - a > 1:
        order = np.lexsort((steps, units))
        units, steps = units[order], steps[order]
        last = np.ones(len(units), dtype=bool)
        last[:-1] = units[1:] != units[:-1]
        units, steps = units[last], steps[last]
    return units, steps


def unit_keys(fs: FileState, lo: int, units: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """The pool position key of each unit's contents after its change at `steps`: a function of
    (seed, file, range, unit, step) alone."""
    return mix64(fs.seed & ((1 << 64) - 1), fs.pf.owner, fs.file_key, lo, units, steps)


def rewrite_units(fs: FileState, lo: int, hi: int, unit: int, fraction: float, a: int, b: int, purpose: int,
                  source: ByteSource) -> int:
    """Every unit of file bytes [lo, hi) (the last one may be partial) that changed in the steps
    (a, b] (each with `fraction` per step) gets the contents of its last change; return how many
    changed. A unit's contents after a change at step t depend on (unit, t) alone."""
    count = -(-(hi - lo) // unit)
    units, steps = step_changes(fs, count, fraction, a, b, purpose)
    if not len(units):
        return 0
    keys = unit_keys(fs, lo, units, steps)
    if unit > BLOCK_BYTES:  # a changed unit is rewritten a block at a time: memory stays one block
        for index, key in zip(units.tolist(), keys.tolist()):
            unit_lo = lo + index * unit
            unit_hi = min(hi, unit_lo + unit)
            for part, at in enumerate(range(unit_lo, unit_hi, BLOCK_BYTES)):
                block_hi = min(unit_hi, at + BLOCK_BYTES)
                fresh = source.array(int(mix64(key, part)), block_hi - at)
                _rewrite_block(fs, at, block_hi, BLOCK_BYTES, _FIRST, fresh[None, :])
        return len(units)
    per_block = BLOCK_BYTES // unit
    blocks = units // per_block
    cuts = np.flatnonzero(np.diff(blocks)) + 1
    for group, group_keys in zip(np.split(units, cuts), np.split(keys, cuts)):
        block = int(group[0] // per_block)
        block_lo = lo + block * per_block * unit
        _rewrite_block(fs, block_lo, min(hi, block_lo + per_block * unit), unit, group - block * per_block,
                       source.rows(group_keys, unit))
    return len(units)


def _rewrite_block(fs: FileState, block_lo: int, block_hi: int, unit: int, local: np.ndarray, fresh: np.ndarray) -> None:
    """Replace the units `local` (sorted, counted from block_lo; the last may be partial) of file
    bytes [block_lo, block_hi) with the rows of `fresh`, their floats made finite."""
    read_lo, read_hi = max(0, block_lo - _MARGIN), min(fs.size, block_hi + _MARGIN)
    raw = np.frombuffer(fs.store.read_at(read_lo, read_hi - read_lo), dtype=np.uint8).copy()
    touched = np.zeros(len(raw), dtype=bool)
    whole = (block_hi - block_lo) // unit
    inner = slice(block_lo - read_lo, block_lo - read_lo + whole * unit)
    full = local < whole
    if full.any():
        raw[inner].reshape(whole, unit)[local[full]] = fresh[full]
        touched[inner].reshape(whole, unit)[local[full]] = True
    if local[-1] == whole:  # the range's last, partial unit
        tail = slice(inner.stop, block_hi - read_lo)
        raw[tail] = fresh[-1, : tail.stop - tail.start]
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
