"""The dataset format interface: turn samples into byte streams and back, never opening paths.

The engine opens files (through the storage layer, so every byte is traced) and hands a format
`open_output(suffix)` / `open_input(suffix)` callables; a format that needs a companion file (an
index) asks for it by suffix. A format still depends on what the handles can do: `write_needs`
names the storage capabilities (storage/base.py) its writer uses beyond appending (npz and HDF5
seek back to patch headers), and a format that reads samples by index (`sequential` False) needs
ranged reads. The loader refuses a format whose needs the chosen backend lacks.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from dlio_ckpt.content import ByteSource

Opener = Callable[[str], Any]  # suffix ("" for the main file) -> file-like object


@dataclass(frozen=True)
class FileSpec:
    """One dataset file as the DatasetPlan describes it."""

    index: int  # global file index (train files first, then eval files)
    path: str  # the main file's full path; companions add a suffix
    num_samples: int
    sample_bytes: int  # bytes of each sample's payload in this file

    @property
    def payload_bytes(self) -> int:
        return self.num_samples * self.sample_bytes

    def sample_key(self, sample: int) -> int:
        """The ByteSource key of one sample: unique over the dataset."""
        return (self.index << 24) + sample

    def label(self, sample: int) -> int:
        """A class id in [0, 128) derived from the sample key: deterministic, one byte in any encoding."""
        return self.sample_key(sample) % 128


@dataclass(frozen=True)
class FormatOptions:
    compression: str = "none"
    compression_level: int = 4
    chunking: bool = False
    chunk_size_bytes: int = 1 << 20
    write_chunk_bytes: int = 4 << 20
    transfer_size: int = 0  # bytes per read call when reading; 0 = whole sample
    parquet_columns: tuple[str, ...] = ()  # parquet: name:dtype:count per column (formats/parquet.py)
    row_group_size: int = 0  # parquet: rows per row group; 0 = one row group per file
    npz_reads: str = "np_load"  # np_load: np.load(path)'s buffered reads and seeks; zip_pread: one pread per zipfile read


class Scratch:
    """A reusable read buffer, one per reading thread.

    Opening a file must not cost a fresh sample-sized allocation (zero-filling a 32 MiB buffer
    per file open took most of a read benchmark's time); readers of one thread take their read
    buffer from here at read time, so a returned view is valid until that thread's next read.
    """

    def __init__(self) -> None:
        self._buffer: mmap.mmap | None = None

    def view(self, size: int) -> memoryview:
        # Anonymous memory is page aligned: O_DIRECT reads go straight into it (storage/posix.py).
        if self._buffer is None or len(self._buffer) < size:
            self._buffer = mmap.mmap(-1, max(size, 1))
        return memoryview(self._buffer)[:size]


class SampleReader(Protocol):
    def read(self, sample: int) -> int:
        """Read one sample; return the payload bytes it holds."""

    def fetch(self, sample: int) -> memoryview:
        """Read one sample and return its payload (valid until the next call), for verification."""

    def close(self) -> None: ...


class DatasetFormat(Protocol):
    name: str
    extension: str
    companion_suffixes: tuple[str, ...]
    sequential: bool  # True: samples come in file order (TFRecord); False: any order by index
    write_needs: frozenset[str]  # storage capabilities the writer needs (e.g. "seekable_write"); empty: appends only
    compressions: tuple[str, ...]  # dataset.compression values it offers ("none" always)

    def write(self, open_output: Opener, spec: FileSpec, source: ByteSource, options: FormatOptions) -> None: ...

    def open(self, open_input: Opener, spec: FileSpec, options: FormatOptions, scratch: Scratch | None = None) -> SampleReader: ...
