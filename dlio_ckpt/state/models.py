"""The update models (`checkpoint.update=`): how a rank's state changes between checkpoints.

A model either computes a file's bytes from the step alone (`random`: `stored` is False), or keeps
them in a ScratchStore that `fill` writes at step 0 and `update` carries from step a to step b
(`stored` is True). The state evolves per training step, as a real one does: the bytes at step s
are a function of the seed and s alone (each step's changes are seeded by the step; the float
models have a closed form T(s)), never of the steps the state was advanced through, so a run
resumed from a checkpoint, or checkpointing on another schedule, holds the same bytes at every
step as an uninterrupted one, and the delta between two checkpoints grows with the steps between
them. An update is applied in one pass per checkpoint, not per step: `update(a, b)` adds
T(b) - T(a) to what the state holds (exact: the state restored from an exact checkpoint lands on
T(b) bit for bit, and one restored from a lossy chain keeps its error, as training would).
"""

from __future__ import annotations

import zlib
from typing import Iterator

import numpy as np

from dlio_ckpt.content import ByteSource, tensor_key
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.registry import Registry
from dlio_ckpt.state.filestate import FileState, float_dtype, make_finite
from dlio_ckpt.state.mlp_trace import MlpTrace
from dlio_ckpt.state.trajectory import Trajectory
from dlio_ckpt.state.units import move_units, rewrite_units
from dlio_ckpt.state.values import CHUNK_VALUES, INIT_STD, NoiseWalk, ValuePool, walk_size

UPDATE_MODELS = Registry(
    key="checkpoint.update",
    noun="update model",
    entries={
        "random": "dlio_ckpt.state.models:RandomModel",
        "sparse": "dlio_ckpt.state.models:SparseModel",
        "sgd": "dlio_ckpt.state.models:SgdModel",
        "trace": "dlio_ckpt.state.models:TraceModel",
        "files": "dlio_ckpt.state.models:FilesModel",
    },
)

FILL_CHUNK_BYTES = 4 << 20
_UINT_OF = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}
FLOAT16_MAX = float(np.finfo(np.float16).max)
_MASK64 = (1 << 64) - 1
# Draw purposes (part of every seed, so each kind of draw has its own stream).
MOVES, CHANGES, FLOATS = 1, 2, 3


class SourceView:
    """A file's bytes under `random` at one step: each tensor is its ByteSource item, exactly
    what the checkpoint engine writes (`source.chunks(tensor_key(owner, name, step), ...)`)."""

    def __init__(self, fs: FileState, source: ByteSource, step: int) -> None:
        self._fs = fs
        self._source = source
        self._step = step
        self._buffer = bytearray()

    @property
    def size(self) -> int:
        return self._fs.size

    def tensor_chunks(self, tensor: TensorSpec, chunk_bytes: int) -> Iterator[memoryview]:
        return self._source.chunks(tensor_key(self._fs.pf.owner, tensor.name, self._step), tensor.nbytes, chunk_bytes)

    def stream(self, chunk_bytes: int) -> Iterator[memoryview]:
        for tensor in self._fs.pf.tensors:
            yield from self.tensor_chunks(tensor, chunk_bytes)

    def _pieces(self, offset: int, nbytes: int) -> Iterator[memoryview]:
        end = min(offset + nbytes, self.size)
        for i in self._fs.overlapping(offset, end):
            start = int(self._fs.starts[i])
            lo, hi = max(offset, start) - start, min(end, int(self._fs.starts[i + 1])) - start
            at = 0
            for piece in self.tensor_chunks(self._fs.pf.tensors[i], self._source.window):
                if at + len(piece) > lo and at < hi:
                    yield piece[max(lo - at, 0) : hi - at]
                at += len(piece)
                if at >= hi:
                    break

    def read_at(self, offset: int, nbytes: int) -> memoryview:
        pieces = list(self._pieces(offset, nbytes))
        if len(pieces) == 1:
            return pieces[0]
        total = sum(len(p) for p in pieces)
        if len(self._buffer) < total:
            self._buffer = bytearray(total)
        out = memoryview(self._buffer)[:total]
        at = 0
        for piece in pieces:
            out[at : at + len(piece)] = piece
            at += len(piece)
        return out


def fill_from_source(fs: FileState, source: ByteSource, skip_floats: bool = False) -> None:
    """Write the file's `random` bytes of step 0 into its store, floats made finite (or left
    alone when `skip_floats`: a model that fills them itself)."""
    for i, tensor in enumerate(fs.pf.tensors):
        if skip_floats and tensor.dtype_bytes > 1:
            continue
        at = int(fs.starts[i])
        for piece in source.chunks(tensor_key(fs.pf.owner, tensor.name, 0), tensor.nbytes, FILL_CHUNK_BYTES):
            raw = np.frombuffer(piece, dtype=np.uint8).copy()
            make_finite(raw, tensor.dtype_bytes)
            fs.store.write_at(at, raw)
            at += len(raw)


class RandomModel:
    """`random`: every byte changes at every step (today's contents, the worst case)."""

    stored = False

    def __init__(self, cfg, seed: int, source: ByteSource) -> None:
        self._source = source

    def view(self, fs: FileState, step: int) -> SourceView:
        return SourceView(fs, self._source, step)


class SparseModel:
    """`sparse`: each update unit (an embedding row of update_chunk_bytes) changes with
    update_fraction per training step; update_moves of the units trade places at each step
    (embedding rows reordered)."""

    stored = True

    def __init__(self, cfg, seed: int, source: ByteSource) -> None:
        self._cfg = cfg
        self._source = source

    def fill(self, fs: FileState) -> None:
        fill_from_source(fs, self._source)

    def update(self, fs: FileState, a: int, b: int) -> None:
        unit, fraction = self._cfg.update_chunk_bytes, self._cfg.update_fraction
        if self._cfg.update_moves <= 0:  # changes only: the interval's in one pass (each unit's last)
            rewrite_units(fs, 0, fs.size, unit, fraction, a, b, CHANGES, self._source)
            return
        for t in range(a + 1, b + 1):  # moves reorder the units: each step's moves, then its changes, in order
            move_units(fs, unit, self._cfg.update_moves, fs.rng(t - 1, t, MOVES), self._cfg.state_dir)
            rewrite_units(fs, 0, fs.size, unit, fraction, t - 1, t, CHANGES, self._source)


def float_chunks(fs: FileState) -> Iterator[tuple[int, int, int, TensorSpec]]:
    """(file offset, first element, element count, tensor) of every float tensor, in pieces of at
    most CHUNK_VALUES elements."""
    for i, tensor in enumerate(fs.pf.tensors):
        if tensor.dtype_bytes > 1:
            for first in range(0, tensor.numel, CHUNK_VALUES):
                yield int(fs.starts[i]) + first * tensor.dtype_bytes, first, min(CHUNK_VALUES, tensor.numel - first), tensor


def write_floats(fs: FileState, at: int, tensor: TensorSpec, values: np.ndarray) -> None:
    """Store `values` as the tensor's dtype, kept inside its finite range."""
    dtype = float_dtype(tensor.dtype_bytes)
    if dtype == np.float16:
        np.clip(values, -FLOAT16_MAX, FLOAT16_MAX, out=values)
    fs.store.write_at(at, values.astype(dtype, copy=False))


def change_byte_tensors(fs: FileState, cfg, source: ByteSource, a: int, b: int) -> None:
    """uint8 tensors under the float models change as under `sparse` (whole units, update_fraction)."""
    for i, tensor in enumerate(fs.pf.tensors):
        if tensor.dtype_bytes == 1:
            rewrite_units(fs, int(fs.starts[i]), int(fs.starts[i + 1]), cfg.update_chunk_bytes, cfg.update_fraction,
                          a, b, CHANGES | (i + 1) << 8, source)


def as_stored(values: np.ndarray, tensor: TensorSpec) -> np.ndarray:
    """`values` as the tensor's dtype would hold them (float16 kept inside its finite range)."""
    dtype = float_dtype(tensor.dtype_bytes)
    if dtype == np.float16:
        values = np.clip(values, -FLOAT16_MAX, FLOAT16_MAX)
    return values.astype(dtype, copy=False)


def carry_floats(fs: FileState, targets, a: int, b: int) -> None:
    """Carry the float chunks from T(a) to T(b) (`targets(fs, step)`: the closed form). A store
    known to hold T(a) exactly is overwritten with T(b); any other is carried element by element
    (add_difference), and is known exact again when every element held T(a)."""
    if fs.exact:
        for at, tensor, values in targets(fs, b):
            write_floats(fs, at, tensor, values)
        return
    exact = True
    for (at, tensor, before), (_, _, after) in zip(targets(fs, a), targets(fs, b)):
        exact &= add_difference(fs, at, tensor, before, after)
    fs.exact = exact


def add_difference(fs: FileState, at: int, tensor: TensorSpec, before: np.ndarray, after: np.ndarray) -> bool:
    """Carry the stored elements at `at` from T(a) to T(b): an element holding T(a) (bit for bit)
    becomes T(b); any other (a lossy restore's) gets T(b) - T(a) added in float64, where the
    difference and the sum of float16/float32 values are exact, so it keeps its offset. Returns
    whether every element held T(a)."""
    dtype = float_dtype(tensor.dtype_bytes)
    current = np.frombuffer(fs.store.read_at(at, len(before) * tensor.dtype_bytes), dtype=dtype)
    before, after = as_stored(before, tensor), as_stored(after, tensor)
    elsewhere = np.flatnonzero(current.view(_UINT_OF[dtype]) != before.view(_UINT_OF[dtype]))
    if len(elsewhere):
        moved = current[elsewhere].astype(np.float64) + after[elsewhere].astype(np.float64) - before[elsewhere].astype(np.float64)
        if dtype == np.float16:
            np.clip(moved, -FLOAT16_MAX, FLOAT16_MAX, out=moved)
        after = after.copy()
        after[elsewhere] = moved
    fs.store.write_at(at, after)
    return not len(elsewhere)


class SgdModel:
    """`sgd`: float weights start as N(0, 0.02) and take a Student-t (df NOISE_DF) step at every
    training step, of scale learning_rate * 0.02 * decay(t); the weights at step s are
    T(s) = w0 + learning_rate * 0.02 * W_s (values.NoiseWalk: every step's noise up to s, in closed
    form), so the delta over (a, b] is a random walk of b - a steps. uint8 tensors change as under
    `sparse`."""

    stored = True

    def __init__(self, cfg, seed: int, source: ByteSource) -> None:
        self._cfg = cfg
        self._source = source
        self._seed = seed
        self._pool = ValuePool(seed)
        self._walks: dict[int, NoiseWalk] = {}  # by size: a tiny file reads a tiny walk

    def _walk(self, fs: FileState) -> NoiseWalk:
        size = walk_size(max((count for _, _, count, _ in float_chunks(fs)), default=0))
        if size not in self._walks:
            self._walks[size] = NoiseWalk(self._seed, self._pool.noise, size)
        return self._walks[size]

    def _targets(self, fs: FileState, step: int) -> Iterator[tuple[int, TensorSpec, np.ndarray]]:
        """(file offset, tensor, T(step) as float32) of every float chunk. The chunk's start
        weights, walk window and factors come from draws seeded by the file alone (not the step)."""
        rng = fs.rng(0, 0, FLOATS)
        walker = self._walk(fs)
        walk = walker.at(step) if step else None
        rate = np.float32(self._cfg.learning_rate * INIT_STD)
        for at, _, count, tensor in float_chunks(fs):
            scale = INIT_STD * (1.0 + 0.01 * rng.standard_normal())  # no two chunks hold the same values
            values = ValuePool.window(self._pool.normal, rng, count) * np.float32(scale)
            start = int(rng.integers(0, walker.size))
            if step:
                values += walk[start : start + count] * rate
            yield at, tensor, values

    def fill(self, fs: FileState) -> None:
        fill_from_source(fs, self._source, skip_floats=True)
        for at, tensor, values in self._targets(fs, 0):
            write_floats(fs, at, tensor, values)
        fs.exact = True

    def update(self, fs: FileState, a: int, b: int) -> None:
        carry_floats(fs, self._targets, a, b)
        change_byte_tensors(fs, self._cfg, self._source, a, b)


class TraceModel:
    """`trace`: the float tensors hold the parameters of a tiny MLP after `step` real SGD steps
    (mlp_trace.py), tiled over each tensor, every tile times its own fixed scale (2^-0.5..2^0.5,
    so no two tiles are the same bytes); uint8 tensors change as under `sparse`."""

    stored = True

    def __init__(self, cfg, seed: int, source: ByteSource) -> None:
        self._cfg = cfg
        self._source = source
        self._trace = MlpTrace(seed)

    def fill(self, fs: FileState) -> None:
        fill_from_source(fs, self._source, skip_floats=True)
        for at, tensor, values in self._targets(fs, 0):
            write_floats(fs, at, tensor, values)
        fs.exact = True

    def update(self, fs: FileState, a: int, b: int) -> None:
        carry_floats(fs, self._targets, a, b)
        change_byte_tensors(fs, self._cfg, self._source, a, b)

    def _targets(self, fs: FileState, step: int) -> Iterator[tuple[int, TensorSpec, np.ndarray]]:
        """(file offset, tensor, the tiled parameters at `step` as float32) of every float chunk."""
        params = self._trace.params_at(step)
        period = len(params)
        for at, first, count, tensor in float_chunks(fs):
            key = zlib.crc32(f"{fs.pf.owner}/{fs.pf.relpath}/{tensor.name}".encode())
            values = np.empty(count, dtype=np.float32)
            done = 0
            while done < count:
                tile, position = divmod(first + done + key, period)
                take = min(period - position, count - done)
                np.multiply(params[position : position + take], np.float32(_tile_scale(key, tile)),
                            out=values[done : done + take])
                done += take
            yield at, tensor, values


class FilesModel:
    """`files`: the float tensors replay a user's training trajectory (checkpoint.update_files,
    state/trajectory.py). The layout's float elements, all ranks' files in rank order, are laid
    over the saved states' flattened floats: global float element g holds the saved value
    g mod M (M: the saved state's float count), so a layout of the user's model size holds exactly
    its values, sharded as the layout shards; beyond M it goes round again, each further lap times
    a fixed scale (_tile_scale: no two laps are the same bytes). uint8 tensors change as under
    `sparse`. An update adds T(b) - T(a) as the other float models do."""

    stored = True

    def __init__(self, cfg, seed: int, source: ByteSource) -> None:
        self._cfg = cfg
        self._source = source
        self._trajectory = Trajectory(cfg.update_files)

    def fill(self, fs: FileState) -> None:
        fill_from_source(fs, self._source, skip_floats=True)
        for at, tensor, values in self._targets(fs, 0):
            write_floats(fs, at, tensor, values)
        fs.exact = True

    def update(self, fs: FileState, a: int, b: int) -> None:
        if self._trajectory.saved_step(a) != self._trajectory.saved_step(b):  # between two saves nothing moves
            carry_floats(fs, self._targets, a, b)
        change_byte_tensors(fs, self._cfg, self._source, a, b)

    def _targets(self, fs: FileState, step: int) -> Iterator[tuple[int, TensorSpec, np.ndarray]]:
        params = self._trajectory.params_at(step)
        period = len(params)
        element = fs.float_offset  # the global index of the file's first float element
        for at, _, count, tensor in float_chunks(fs):
            values = np.empty(count, dtype=np.float32)
            done = 0
            while done < count:
                lap, position = divmod(element + done, period)
                take = min(period - position, count - done)
                scale = np.float32(_tile_scale(0x5EED, lap) if lap else 1.0)
                np.multiply(params[position : position + take], scale, out=values[done : done + take])
                done += take
            element += count
            yield at, tensor, values


def _tile_scale(key: int, tile: int) -> float:
    """A fixed scale in [2^-0.5, 2^0.5) per (tensor, tile), from a 64-bit mix of both (splitmix64):
    enough for no two tiles to hold the same bytes, too little to widen the deltas' spread."""
    z = (key * 0x9E3779B97F4A7C15 + tile * 0xBF58476D1CE4E5B9 + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return 2.0 ** (((z ^ (z >> 31)) >> 11) / (1 << 53) - 0.5)
