"""NumPy .npy: one (num_samples, sample_bytes) uint8 array, header then the rows.

Written as numpy's own header followed by the source's chunks, so the file never exists in
memory; read by parsing the header once and then reading just sample i at its offset, which is
what a memory-mapped .npy loader does on first touch of a row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib import format as npformat

from dlio_ckpt.content import ByteSource
from dlio_ckpt.formats.base import FileSpec, FormatOptions, Opener, Scratch
from dlio_ckpt.formats.streams import OffsetReader, buffered, write_samples

_HEADER_READERS = {(1, 0): npformat.read_array_header_1_0, (2, 0): npformat.read_array_header_2_0}


def write_header(out: Any, spec: FileSpec) -> None:
    """numpy's header for the array the samples form (version 1.0 fits any 2-D uint8 shape)."""
    header = {"descr": npformat.dtype_to_descr(np.dtype(np.uint8)), "fortran_order": False, "shape": (spec.num_samples, spec.sample_bytes)}
    npformat.write_array_header_1_0(out, header)


def data_offset(handle: Any, spec: FileSpec) -> int:
    """Parse and check the header; return where row 0 starts."""
    handle.seek(0)
    version = npformat.read_magic(handle)
    if version not in _HEADER_READERS:
        raise ValueError(f"{getattr(handle, 'path', '?')}: unsupported .npy version {version}")
    shape, fortran, dtype = _HEADER_READERS[version](handle)
    expected = (spec.num_samples, spec.sample_bytes)
    if shape != expected or fortran or dtype != np.uint8:
        raise ValueError(f"{getattr(handle, 'path', '?')}: .npy holds {dtype}{shape} (fortran={fortran}), the plan says uint8{expected}")
    return handle.tell()


class NpyFormat:
    name = "npy"
    extension = "npy"
    companion_suffixes: tuple[str, ...] = ()
    sequential = False
    write_needs: frozenset[str] = frozenset()
    compressions: tuple[str, ...] = ("none",)  # dataset.compression values it offers

    def write(self, open_output: Opener, spec: FileSpec, source: ByteSource, options: FormatOptions) -> None:
        with buffered(open_output(""), options) as out:
            write_header(out, spec)
            write_samples(out, spec, source, options)

    def open(self, open_input: Opener, spec: FileSpec, options: FormatOptions,
             scratch: Scratch | None = None) -> OffsetReader:
        handle = open_input("")
        try:
            first = data_offset(handle, spec)
        except BaseException:
            handle.close()
            raise
        return OffsetReader(handle, spec.sample_bytes, first, spec.sample_bytes, options, scratch)
