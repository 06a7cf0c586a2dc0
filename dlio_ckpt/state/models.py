"""The update models (`checkpoint.update=`): how a rank's state changes between checkpoints.

A model either computes a file's bytes from the step alone (`random`: `stored` is False), or keeps
them in a ScratchStore that `fill` writes at step 0 and `update` carries from step a to step b
(`stored` is True). Updates are applied per checkpoint interval: the change from a to b is drawn
once, with its size folded over the steps of (a, b] (a probability, a sum of learning rates), so a
run resumed from a checkpoint reproduces the same bytes only if it checkpoints at the same steps.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from dlio_ckpt.checkpoint.fileio import tensor_key
from dlio_ckpt.content import ByteSource
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.registry import Registry
from dlio_ckpt.state.filestate import FileState, make_finite
from dlio_ckpt.state.units import move_units, rewrite_units

UPDATE_MODELS = Registry(
    key="checkpoint.update",
    noun="update model",
    entries={
        "random": "dlio_ckpt.state.models:RandomModel",
        "sparse": "dlio_ckpt.state.models:SparseModel",
        "sgd": "dlio_ckpt.state.models:SgdModel",
        "trace": "dlio_ckpt.state.models:TraceModel",
    },
)

FILL_CHUNK_BYTES = 4 << 20
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


def change_probability(fraction: float, steps: int) -> float:
    """The chance that a unit changing with `fraction` per step changed at least once in `steps`."""
    return 1.0 - (1.0 - fraction) ** steps


class RandomModel:
    """`random`: every byte changes at every step (today's contents, the worst case)."""

    stored = False

    def __init__(self, cfg, seed: int, source: ByteSource) -> None:
        self._source = source

    def view(self, fs: FileState, step: int) -> SourceView:
        return SourceView(fs, self._source, step)


class SparseModel:
    """`sparse`: each update unit changes with update_fraction per step; update_moves of the
    units trade places at each update (embedding rows reordered)."""

    stored = True

    def __init__(self, cfg, seed: int, source: ByteSource) -> None:
        self._cfg = cfg
        self._source = source

    def fill(self, fs: FileState) -> None:
        fill_from_source(fs, self._source)

    def update(self, fs: FileState, a: int, b: int) -> None:
        unit = self._cfg.update_chunk_bytes
        if self._cfg.update_moves > 0:
            move_units(fs, unit, self._cfg.update_moves, fs.rng(a, b, MOVES), self._cfg.state_dir)
        rewrite_units(fs, 0, fs.size, unit, change_probability(self._cfg.update_fraction, b - a),
                      fs.rng(a, b, CHANGES), self._source)


class SgdModel:
    """`sgd` (not built yet)."""

    stored = True

    def __init__(self, cfg, seed: int, source: ByteSource) -> None:
        raise NotImplementedError("checkpoint.update=sgd is not implemented yet")


class TraceModel:
    """`trace` (not built yet)."""

    stored = True

    def __init__(self, cfg, seed: int, source: ByteSource) -> None:
        raise NotImplementedError("checkpoint.update=trace is not implemented yet")

