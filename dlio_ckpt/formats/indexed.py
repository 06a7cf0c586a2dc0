"""Indexed binary (Megatron/DLIO style): samples back to back in the data file, plus an index.

The index companion (suffix ".idx") is what a Megatron-style loader opens first: a 24-byte
header (magic b"DLIOIDX\\0", uint64 version, uint64 count) then `count` uint64 offsets and
`count` uint64 sizes, little endian, so numpy.fromfile / np.frombuffer read it directly. The
reader loads the index once per file and then reads each sample at its recorded offset, which
is the access pattern (one small index read, then random reads) being emulated. The index is
written whole; it holds 16 bytes per sample, bounded by the sample count, not the data size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlio_ckpt.content import ByteSource
from dlio_ckpt.formats.base import FileSpec, FormatOptions, Opener, Scratch
from dlio_ckpt.formats.streams import buffered, read_span, write_samples

MAGIC = b"DLIOIDX\0"
VERSION = 1
INDEX_SUFFIX = ".idx"
HEADER = np.dtype([("magic", "S8"), ("version", "<u8"), ("count", "<u8")])


def index_bytes(offsets: np.ndarray, sizes: np.ndarray) -> bytes:
    header = np.array([(MAGIC, VERSION, len(offsets))], dtype=HEADER)
    return header.tobytes() + offsets.astype("<u8").tobytes() + sizes.astype("<u8").tobytes()


def parse_index(raw: bytes, path: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, sizes) from an index file's bytes, after checking its header and length."""
    if len(raw) < HEADER.itemsize:
        raise ValueError(f"{path}: index is {len(raw)} bytes, shorter than its header")
    header = np.frombuffer(raw, dtype=HEADER, count=1)[0]
    count = int(header["count"])
    if header["magic"] != MAGIC.rstrip(b"\0") or int(header["version"]) != VERSION:
        raise ValueError(f"{path}: not a version {VERSION} DLIO index (magic {header['magic']!r}, version {header['version']})")
    if len(raw) != HEADER.itemsize + 16 * count:
        raise ValueError(f"{path}: index of {count} entries should be {HEADER.itemsize + 16 * count} bytes, is {len(raw)}")
    arrays = np.frombuffer(raw, dtype="<u8", offset=HEADER.itemsize)
    return arrays[:count].astype(np.int64), arrays[count:].astype(np.int64)


class IndexedReader:
    def __init__(self, data: Any, offsets: np.ndarray, sizes: np.ndarray, options: FormatOptions,
                 scratch: Scratch | None = None) -> None:
        self._data = data
        self._offsets = offsets
        self._sizes = sizes
        self._transfer = options.transfer_size
        self._scratch = scratch or Scratch()

    def fetch(self, sample: int) -> memoryview:
        """The sample's bytes; valid until the next read of this thread."""
        view = self._scratch.view(int(self._sizes[sample]))
        read_span(self._data, view, int(self._offsets[sample]), self._transfer)
        return view

    def read(self, sample: int) -> int:
        return len(self.fetch(sample))

    def close(self) -> None:
        self._data.close()


class IndexedBinaryFormat:
    name = "indexed_binary"
    extension = "bin"
    companion_suffixes: tuple[str, ...] = (INDEX_SUFFIX,)
    sequential = False
    write_needs: frozenset[str] = frozenset()
    compressions: tuple[str, ...] = ("none",)  # dataset.compression values it offers

    def write(self, open_output: Opener, spec: FileSpec, source: ByteSource, options: FormatOptions) -> None:
        with buffered(open_output(""), options) as out:
            write_samples(out, spec, source, options)
        sizes = np.full(spec.num_samples, spec.sample_bytes, dtype=np.int64)
        offsets = np.arange(spec.num_samples, dtype=np.int64) * spec.sample_bytes
        with buffered(open_output(INDEX_SUFFIX), options) as index:
            index.write(index_bytes(offsets, sizes))

    def open(self, open_input: Opener, spec: FileSpec, options: FormatOptions,
             scratch: Scratch | None = None) -> IndexedReader:
        index = open_input(INDEX_SUFFIX)
        try:
            offsets, sizes = parse_index(index.read_at(0, index.size()), getattr(index, "path", spec.path + INDEX_SUFFIX))
        finally:
            index.close()
        if len(offsets) != spec.num_samples or (len(sizes) and int(sizes.max()) != spec.sample_bytes):
            raise ValueError(f"{spec.path}{INDEX_SUFFIX}: index describes {len(offsets)} samples, the plan says {spec.num_samples} of {spec.sample_bytes} bytes")
        return IndexedReader(open_input(""), offsets, sizes, options, scratch)
