"""NumPy .npz: a zip holding "x" (num_samples, sample_bytes) uint8 and "y" int64 labels.

Written streaming: the "x.npy" member is opened for writing (zip64 forced, since its size is not
known to zipfile up front) and receives numpy's header and then the source's chunks, so the
file never exists in memory (deflate, when chosen, works chunk by chunk too).

Read as DLIO's NPZ reader does: the whole array is loaded when the file is opened and a sample
read is a slice of it. So an open file costs memory equal to its payload, and all of its I/O
happens in `open`, not in `read`; that is the behaviour being emulated.

How np.load reaches the file (`reader.npz_reads`): `np_load` (the default) is `np.load(path)`,
as training programs call it: Python's `open(path, "rb")`, a BufferedReader of st_blksize
(4 KiB) over the descriptor, so zipfile's small reads come in 4 KiB reads, its seeks are
lseeks, and the zip headers are read again when each member is opened (storage/streams.py makes
those very calls, traced). `zip_pread` hands np.load the unbuffered traced handle: each of
zipfile's reads is one pread of exactly what it asked for, no seek is a system call; fewer
bytes and calls than np.load issues, kept for comparison with earlier runs.
"""

from __future__ import annotations

import zipfile
from typing import Any

import numpy as np
from numpy.lib import format as npformat

from dlio_ckpt.content import ByteSource
from dlio_ckpt.formats.base import FileSpec, FormatOptions, Opener, Scratch
from dlio_ckpt.formats.npy import write_header
from dlio_ckpt.formats.streams import buffered, write_samples
from dlio_ckpt.storage.streams import open_buffered

_COMPRESSION = {"none": zipfile.ZIP_STORED, "gzip": zipfile.ZIP_DEFLATED}


def labels(spec: FileSpec) -> np.ndarray:
    """Class ids in [0, 128), derived from the sample keys (deterministic, never read back)."""
    return np.array([spec.label(i) for i in range(spec.num_samples)], dtype=np.int64)


NPZ_READS = ("np_load", "zip_pread")  # reader.npz_reads values (module doc)


class NpzReader:
    def __init__(self, handle: Any, spec: FileSpec, reads: str = "np_load") -> None:
        self._handle = handle
        source = open_buffered(handle) if reads == "np_load" else handle
        with np.load(source, allow_pickle=False) as archive:
            self.x = archive["x"]  # only x, as DLIO's NPZReader and a Dataset that takes its labels elsewhere:
            # loading "y" too cost 4 lseeks more per file than such a program makes (benchmark in docs/metrics.md)
        if self.x.shape != (spec.num_samples, spec.sample_bytes):
            raise ValueError(f"{getattr(handle, 'path', '?')}: x has shape {self.x.shape}, the plan says {(spec.num_samples, spec.sample_bytes)}")

    def fetch(self, sample: int) -> memoryview:
        return memoryview(self.x[sample])

    def read(self, sample: int) -> int:
        return self.x[sample].nbytes

    def close(self) -> None:
        self._handle.close()


class NpzFormat:
    name = "npz"
    extension = "npz"
    companion_suffixes: tuple[str, ...] = ()
    sequential = False
    write_needs: frozenset[str] = frozenset()  # zipfile streams (data descriptors) where the handle cannot seek
    compressions: tuple[str, ...] = ("none", "gzip")  # dataset.compression values it offers

    def write(self, open_output: Opener, spec: FileSpec, source: ByteSource, options: FormatOptions) -> None:
        if options.compression not in _COMPRESSION:
            raise ValueError(f"npz: compression '{options.compression}' is not supported (none or gzip)")
        method = _COMPRESSION[options.compression]
        level = options.compression_level if method == zipfile.ZIP_DEFLATED else None
        with buffered(open_output(""), options) as out, zipfile.ZipFile(out, "w", compression=method, compresslevel=level) as archive:
            with archive.open("x.npy", "w", force_zip64=True) as member:
                write_header(member, spec)
                write_samples(member, spec, source, options)
            with archive.open("y.npy", "w", force_zip64=True) as member:
                npformat.write_array(member, labels(spec), allow_pickle=False)

    def open(self, open_input: Opener, spec: FileSpec, options: FormatOptions,
             scratch: Scratch | None = None) -> NpzReader:
        handle = open_input("")
        try:
            return NpzReader(handle, spec, options.npz_reads)
        except BaseException:
            handle.close()
            raise
