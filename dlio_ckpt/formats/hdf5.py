"""HDF5: dataset "x" (num_samples, sample_bytes) uint8 and "y" int64 labels, through h5py.

h5py works on the file object the engine hands over (its Python file-object driver), so every
byte HDF5 moves goes through the storage layer and is traced.

Chunking (dataset.chunking) aims at chunks of about chunk_size_bytes: several whole rows when
samples are small, a row split into pieces when they are large. Compression (gzip at a level, or
lzf) needs chunks, so it turns them on. Small samples are written in slabs of whole rows (about
write_chunk_bytes, whole chunks when chunked); large ones piece by piece as the source yields
them, with a chunk cache that holds the chunks being filled, so a compressed chunk is
compressed once, when it is complete, not once per piece. Memory stays bounded by the larger of
write_chunk_bytes and the chunk size, never the file size.
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np

from dlio_ckpt.content import ByteSource
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.formats.base import FileSpec, FormatOptions, Opener, Scratch
from dlio_ckpt.formats.npz import labels

_CACHE_FLOOR = 1 << 20  # h5py's default chunk cache


def chunk_shape(spec: FileSpec, options: FormatOptions) -> tuple[int, int] | None:
    """None (contiguous) unless chunking or compression asks for chunks."""
    if not options.chunking and options.compression == "none":
        return None
    target = max(options.chunk_size_bytes, 1)
    if spec.sample_bytes >= target:
        return (1, target)
    return (min(max(target // spec.sample_bytes, 1), spec.num_samples), spec.sample_bytes)


def compression_args(options: FormatOptions) -> dict[str, Any]:
    if options.compression == "none":
        return {}
    if options.compression == "gzip":
        return {"compression": "gzip", "compression_opts": options.compression_level}
    if options.compression == "lzf":
        return {"compression": "lzf"}
    raise ConfigError(f"dataset.compression: '{options.compression}' is not available for hdf5; choose none, gzip or lzf")


def _cache_bytes(chunks: tuple[int, int] | None) -> int:
    """Room for two chunks: pieces fill a row's chunks in order, so at most the chunk a piece
    ended in is still incomplete when the next piece arrives (slabs write whole chunks)."""
    if chunks is None:
        return _CACHE_FLOOR
    return max(_CACHE_FLOOR, 2 * chunks[0] * chunks[1])


def slab_rows(spec: FileSpec, options: FormatOptions, chunks: tuple[int, int] | None) -> int:
    """Rows per write: small samples go in slabs of about write_chunk_bytes (whole chunks
    when chunked), so one HDF5 write moves many rows; large samples go a piece at a time."""
    rows = max(options.write_chunk_bytes // spec.sample_bytes, 1)
    if chunks is not None and chunks[1] == spec.sample_bytes:
        rows = max(rows // chunks[0], 1) * chunks[0]
    return min(rows, spec.num_samples)


def _write_slabs(x: h5py.Dataset, spec: FileSpec, source: ByteSource, options: FormatOptions, rows: int) -> None:
    slab = np.empty((rows, spec.sample_bytes), dtype=np.uint8)
    for first in range(0, spec.num_samples, rows):
        count = min(rows, spec.num_samples - first)
        for row in range(count):
            slab[row] = source.array(spec.sample_key(first + row), spec.sample_bytes)
        x[first : first + count] = slab[:count]


def _write_rows(x: h5py.Dataset, spec: FileSpec, source: ByteSource, options: FormatOptions) -> None:
    for sample in range(spec.num_samples):
        start = 0
        for chunk in source.chunks(spec.sample_key(sample), spec.sample_bytes, options.write_chunk_bytes):
            piece = np.frombuffer(chunk, dtype=np.uint8)
            x[sample, start : start + len(piece)] = piece
            start += len(piece)


class Hdf5Reader:
    """One h5py.File per open file; a sample read reads only that row's chunks."""

    def __init__(self, handle: Any, spec: FileSpec) -> None:
        self._handle = handle
        self._file = h5py.File(handle, "r")
        self._x = self._file["x"]
        if self._x.shape != (spec.num_samples, spec.sample_bytes):
            shape = self._x.shape
            self._file.close()
            raise ValueError(f"{getattr(handle, 'path', '?')}: x has shape {shape}, the plan says {(spec.num_samples, spec.sample_bytes)}")
        self._row = np.empty((1, spec.sample_bytes), dtype=np.uint8)

    def fetch(self, sample: int) -> memoryview:
        self._x.read_direct(self._row, source_sel=np.s_[sample : sample + 1])
        return memoryview(self._row[0])

    def read(self, sample: int) -> int:
        return len(self.fetch(sample))

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            self._handle.close()


class Hdf5Format:
    name = "hdf5"
    extension = "h5"
    companion_suffixes: tuple[str, ...] = ()
    sequential = False
    write_needs: frozenset[str] = frozenset({"seekable_write"})  # HDF5 rewrites its superblock and metadata
    compressions: tuple[str, ...] = ("none", "gzip", "lzf")  # dataset.compression values it offers

    def write(self, open_output: Opener, spec: FileSpec, source: ByteSource, options: FormatOptions) -> None:
        chunks = chunk_shape(spec, options)
        extra = compression_args(options)
        with h5py.File(open_output(""), "w", rdcc_nbytes=_cache_bytes(chunks)) as h5:
            x = h5.create_dataset("x", shape=(spec.num_samples, spec.sample_bytes), dtype=np.uint8, chunks=chunks, **extra)
            rows = slab_rows(spec, options, chunks)
            if rows > 1:
                _write_slabs(x, spec, source, options, rows)
            else:
                _write_rows(x, spec, source, options)
            h5.create_dataset("y", data=labels(spec))

    def open(self, open_input: Opener, spec: FileSpec, options: FormatOptions,
             scratch: Scratch | None = None) -> Hdf5Reader:
        handle = open_input("")
        try:
            return Hdf5Reader(handle, spec)
        except BaseException:
            handle.close()
            raise
