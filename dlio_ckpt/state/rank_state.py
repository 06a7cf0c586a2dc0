"""RankState: one rank's evolving model state over the checkpoint files it owns.

The checkpoint engine advances it to each checkpoint's step, then reads every file's logical bytes
(its tensors back to back) through `view` or `tensor_chunks`; a restore puts the bytes it rebuilt
back with `load`. The update model (`checkpoint.update`, state/models.py) decides how the bytes
change; stored models keep each file in a ScratchStore (state/store.py) under
`checkpoint.state_dir`, so no file is ever whole in memory. Under `random` nothing is stored: the
bytes are the ByteSource's, exactly as the engine wrote them before there was a state.
"""

from __future__ import annotations

from typing import Iterator

from dlio_ckpt.content import ByteSource
from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.base import FileView
from dlio_ckpt.state.filestate import FileState
from dlio_ckpt.state.models import UPDATE_MODELS
from dlio_ckpt.state.store import MEMORY_LIMIT_BYTES, ScratchStore

COPY_CHUNK_BYTES = 4 << 20


class RankState:
    """The state of `files` (one rank's PlannedFiles) at training step `step`."""

    def __init__(self, files: tuple[PlannedFile, ...], cfg, seed: int, source: ByteSource,
                 layout: tuple[tuple[PlannedFile, ...], ...] | None = None) -> None:
        """`layout`: every rank's files (the plan's files_by_rank), which places this rank's
        float elements in the model's global order (`files` replays a trajectory by it); None:
        this rank's files alone."""
        self.cfg = cfg
        self.step = 0
        self.model = UPDATE_MODELS.load(cfg.update)(cfg, seed, source)
        self._files = {(pf.owner, pf.relpath): FileState(pf, seed) for pf in files}
        offset = 0
        for pf in (pf for rank_files in (layout or (files,)) for pf in rank_files):
            fs = self._files.get((pf.owner, pf.relpath))
            if fs is not None:
                fs.float_offset = offset
            offset += sum(t.numel for t in pf.tensors if t.dtype_bytes > 1)
        self._memory_left = MEMORY_LIMIT_BYTES  # for all files together: many small files must not add up
        self._active: FileState | None = None  # the file read last: the only store keeping a read buffer

    def _state(self, pf: PlannedFile) -> FileState:
        fs = self._files.get((pf.owner, pf.relpath))
        if fs is None:
            raise KeyError(f"{pf.relpath} (rank {pf.owner}) is not a file of this state")
        return fs

    def _ready(self, fs: FileState) -> FileState:
        """`fs` with its bytes at self.step: a stored model fills a file at step 0 on first use
        (and carries it to self.step in one update if a restore moved the state on without it).
        The file used before it gives up its read buffer."""
        if self._active is not fs and self._active is not None and self._active.store is not None:
            self._active.store.release_buffer()
        self._active = fs
        if self.model.stored and fs.store is None:
            fs.store = self._new_store(fs.size)
            self.model.fill(fs)
            fs.step = 0
        if self.model.stored and fs.step > self.step:
            raise ValueError(f"{fs.pf.relpath} was loaded at step {fs.step}, after the state's step {self.step}: "
                             "load every file of a rank at the same step")
        if self.model.stored and fs.step != self.step:
            self.model.update(fs, fs.step, self.step)
            fs.step = self.step
        return fs

    def advance(self, step: int) -> None:
        """Apply the update model from self.step to `step` (no-op when equal)."""
        if step < self.step:
            raise ValueError(f"the state is at step {self.step}; it cannot go back to {step} (a restore uses load)")
        if step == self.step:
            return
        for fs in self._files.values():
            if self.model.stored:
                self._ready(fs)
                self.model.update(fs, fs.step, step)
            elif fs.store is not None:  # bytes a restore loaded: `random` forgets them at the next step
                self._drop_store(fs)
            fs.step = step
        self.step = step

    def view(self, pf: PlannedFile) -> FileView:
        """The file's logical bytes now (valid until the next advance or load)."""
        fs = self._ready(self._state(pf))
        return fs.store if fs.store is not None else self.model.view(fs, self.step)

    def tensor_chunks(self, pf: PlannedFile, tensor: TensorSpec, chunk_bytes: int) -> Iterator[memoryview]:
        """One tensor's bytes now, in pieces of at most `chunk_bytes` (each valid until the next)."""
        fs = self._ready(self._state(pf))
        if fs.store is None:
            yield from self.model.view(fs, self.step).tensor_chunks(tensor, chunk_bytes)
            return
        start = fs.start_of(tensor)
        for at in range(start, start + tensor.nbytes, chunk_bytes):
            yield fs.store.read_at(at, min(chunk_bytes, start + tensor.nbytes - at))

    def load(self, pf: PlannedFile, view: FileView, step: int) -> None:
        """A restore: the file's state becomes `view`'s bytes, at `step` (load every file of the
        rank at the same step)."""
        fs = self._state(pf)
        if view.size != fs.size:
            raise ValueError(f"restoring {pf.relpath}: {view.size} bytes, the state holds {fs.size}")
        if fs.store is None:
            fs.store = self._new_store(fs.size)
        at = 0
        for piece in view.stream(COPY_CHUNK_BYTES):
            fs.store.write_at(at, piece)
            at += len(piece)
        fs.step = step
        fs.exact = False  # restored bytes: the next update checks them against the closed form
        self.step = step

    def digest(self, pf: PlannedFile) -> str:
        """xxh3_128 (hex) of the file's logical bytes now."""
        import xxhash

        hasher = xxhash.xxh3_128()
        for piece in self.view(pf).stream(COPY_CHUNK_BYTES):
            hasher.update(piece)
        return hasher.hexdigest()

    def close(self) -> None:
        for fs in self._files.values():
            if fs.store is not None:
                self._drop_store(fs)

    def _new_store(self, size: int) -> ScratchStore:
        """A store in memory while the rank's stores together stay within MEMORY_LIMIT_BYTES,
        else an unlinked file in checkpoint.state_dir."""
        store = ScratchStore(size, self.cfg.state_dir, memory_limit=self._memory_left)
        if store.in_memory:
            self._memory_left -= size
        return store

    def _drop_store(self, fs: FileState) -> None:
        if fs.store.in_memory:
            self._memory_left += fs.size
        fs.store.close()
        fs.store = None
