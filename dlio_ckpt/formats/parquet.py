"""Parquet: samples as rows of fixed-size numeric columns, written by pyarrow (optional extra).

MLPerf Storage v3.0's flux dataset is Parquet (configs/dlio/workload/flux_datagen.yaml): 288 rows
per file, each row five float32 columns (t5_encodings 524,328 values, clip_encodings 409, mean
8,232, logvar 8,232, timestamp 7: 2,164,832 bytes a row), uncompressed, 48 rows per row group.
`dataset.parquet_columns` lists the columns as `name:dtype:count`; a row holds exactly the
sample's bytes, so where the drawn sample size differs from the columns' total (a scale cap, a
spread) each column's count is scaled in proportion, the largest column taking the rest (bytes
short of a whole value are dropped). Empty: one uint8 column `data` of the sample's size.

Reading follows DLIO's ParquetReader (mlcommons/DLIO_local_changes, as docs/PARQUET_FORMATS.md
of mlcommons/storage describes it): the footer is read when the file is opened; a sample costs
the read of its whole row group (every column chunk, one read each), and each reader keeps the
last 4 row groups it read (`row_group_cache_size` default), so the next samples from them cost
no I/O. The footer and the chunk offsets come from pyarrow's own parse of the file.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlio_ckpt.content import ByteSource
from dlio_ckpt.formats.base import FileSpec, FormatOptions, Opener, Scratch
from dlio_ckpt.formats.streams import buffered, read_span
from dlio_ckpt.optional import require

ROW_GROUP_CACHE = 4  # DLIO ParquetReader row_group_cache_size default


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str
    count: int

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize


def parse_columns(entries: tuple[str, ...] | list[str]) -> tuple[Column, ...]:
    """`name:dtype:count` strings -> Columns; raises ValueError naming the bad entry. Pure."""
    columns = []
    for entry in entries:
        parts = str(entry).split(":")
        if len(parts) != 3 or not parts[0]:
            raise ValueError(f"'{entry}' is not name:dtype:count (e.g. t5_encodings:float32:524328)")
        name, dtype, count = parts
        try:
            kind = np.dtype(dtype)
        except TypeError:
            raise ValueError(f"'{entry}': '{dtype}' is not a numpy dtype (e.g. float32, uint8)") from None
        if kind.kind not in "biuf":
            raise ValueError(f"'{entry}': '{dtype}' is not a numeric dtype")
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"'{entry}': the count must be a whole number >= 1")
        columns.append(Column(name, kind.name, int(count)))
    if len({c.name for c in columns}) != len(columns):
        raise ValueError("column names repeat")
    return tuple(columns)


def row_layout(columns: tuple[Column, ...], sample_bytes: int) -> tuple[Column, ...]:
    """The columns of one row of `sample_bytes`: as listed where their total is the sample size,
    else each count scaled in proportion, the largest column taking what is left. Pure."""
    if not columns:
        return (Column("data", "uint8", sample_bytes),)
    total = sum(c.count * c.itemsize for c in columns)
    if total == sample_bytes:
        return columns
    scaled = [max(1, c.count * sample_bytes // total) for c in columns]
    largest = max(range(len(columns)), key=lambda i: columns[i].count * columns[i].itemsize)
    others = sum(n * c.itemsize for i, (n, c) in enumerate(zip(scaled, columns)) if i != largest)
    scaled[largest] = max(1, (sample_bytes - others) // columns[largest].itemsize)
    return tuple(Column(c.name, c.dtype, n) for c, n in zip(columns, scaled))


class ParquetFormat:
    name = "parquet"
    extension = "parquet"
    companion_suffixes: tuple[str, ...] = ()
    sequential = False
    write_needs: frozenset[str] = frozenset()
    compressions: tuple[str, ...] = ("none",)
    requires = "pyarrow"

    def write(self, open_output: Opener, spec: FileSpec, source: ByteSource, options: FormatOptions) -> None:
        pa = require("pyarrow")
        pq = require("pyarrow.parquet")
        layout = row_layout(parse_columns(options.parquet_columns), spec.sample_bytes)
        schema = pa.schema([(c.name, pa.list_(pa.from_numpy_dtype(np.dtype(c.dtype)), c.count)) for c in layout])
        per_group = options.row_group_size or spec.num_samples
        with buffered(open_output(""), options) as out:
            writer = pq.ParquetWriter(out, schema, compression="none", use_dictionary=False, write_statistics=False)
            try:
                for first in range(0, spec.num_samples, per_group):
                    rows = range(first, min(first + per_group, spec.num_samples))
                    writer.write_table(self._rows(pa, schema, layout, spec, source, rows), row_group_size=len(rows))
            finally:
                writer.close()

    @staticmethod
    def _rows(pa: Any, schema: Any, layout: tuple[Column, ...], spec: FileSpec, source: ByteSource, rows: range) -> Any:
        """A table of `rows`: each row's columns cut from the sample's seeded bytes, in order."""
        row_bytes = sum(c.count * c.itemsize for c in layout)
        block = np.stack([source.array(spec.sample_key(row), row_bytes) for row in rows])
        arrays, at = [], 0
        for column in layout:
            width = column.count * column.itemsize
            values = np.ascontiguousarray(block[:, at : at + width]).view(column.dtype).reshape(-1)
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(values), column.count))
            at += width
        return pa.Table.from_arrays(arrays, schema=schema)

    def open(self, open_input: Opener, spec: FileSpec, options: FormatOptions,
             scratch: Scratch | None = None) -> "ParquetSampleReader":
        return ParquetSampleReader(open_input(""), spec, options, scratch)


class ParquetSampleReader:
    """One open Parquet file: the footer read at open, a row group per sample not cached."""

    def __init__(self, handle: Any, spec: FileSpec, options: FormatOptions, scratch: Scratch | None) -> None:
        pq = require("pyarrow.parquet")
        self._handle = handle
        self._spec = spec
        self._transfer = options.transfer_size
        self._scratch = scratch or Scratch()
        self._file = pq.ParquetFile(handle)  # pyarrow reads the footer through the (traced) handle
        meta = self._file.metadata
        self._first_rows: list[int] = []
        self._chunks: list[list[tuple[int, int]]] = []
        first = 0
        for group in range(meta.num_row_groups):
            row_group = meta.row_group(group)
            self._first_rows.append(first)
            first += row_group.num_rows
            chunks = []
            for column in range(row_group.num_columns):
                chunk = row_group.column(column)
                start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
                chunks.append((start, chunk.total_compressed_size))
            self._chunks.append(chunks)
        self._cached: OrderedDict[int, None] = OrderedDict()

    def _group(self, sample: int) -> int:
        group = 0
        while group + 1 < len(self._first_rows) and self._first_rows[group + 1] <= sample:
            group += 1
        return group

    def read(self, sample: int) -> int:
        """The sample's row group read whole (each column chunk), unless one of the last 4 read."""
        group = self._group(sample)
        if group in self._cached:
            self._cached.move_to_end(group)
        else:
            for offset, size in self._chunks[group]:
                read_span(self._handle, self._scratch.view(size), offset, self._transfer)
            self._cached[group] = None
            if len(self._cached) > ROW_GROUP_CACHE:
                self._cached.popitem(last=False)
        return self._spec.sample_bytes

    def fetch(self, sample: int) -> memoryview:
        """The sample's row (its columns' bytes in order), decoded by pyarrow: for verification."""
        group = self._group(sample)
        table = self._file.read_row_group(group)
        row = sample - self._first_rows[group]
        sizes = [table.schema.field(i).type.list_size for i in range(table.num_columns)]
        parts = [np.asarray(table.column(i).combine_chunks().values[row * n : (row + 1) * n]).tobytes()
                 for i, n in enumerate(sizes)]
        return memoryview(b"".join(parts))

    def close(self) -> None:
        self._handle.close()
