"""Stream helpers shared by the offset-addressed formats (raw, npy, indexed binary, TFRecord).

Those formats are raw samples plus a header or an index, so they share how samples are written
(coalesced, streamed from the ByteSource) and read (at an offset, in transfer_size pieces).
"""

from __future__ import annotations

import io
from contextlib import contextmanager
from typing import Any, Iterator

from dlio_ckpt.content import ByteSource
from dlio_ckpt.formats.base import FileSpec, FormatOptions, Scratch


@contextmanager
def buffered(handle: Any, options: FormatOptions) -> Iterator[io.BufferedWriter]:
    """Coalesce small writes (headers, small samples) into write_chunk_bytes system calls.

    Writes at least as large as the buffer pass straight through without a copy. The buffer is
    detached, never closed, on the way out: the engine owns the file, and closing a
    BufferedWriter would close the file under it.
    """
    writer = io.BufferedWriter(handle, buffer_size=max(options.write_chunk_bytes, io.DEFAULT_BUFFER_SIZE))
    try:
        yield writer
    finally:
        writer.detach()  # flushes


def write_straight(handle: Any, spec: FileSpec, source: ByteSource, options: FormatOptions) -> bool:
    """What `buffered` and `write_samples` issue for a file of one sample that is one run of the
    pool (no lap), larger than the buffer: each write_chunk_bytes chunk, then the rest, here written
    from the pool itself. The BufferedWriter issues the same calls but first copies every chunk into
    its buffer (CPython keeps a write of exactly its buffer's size for the next flush): at tmpfs
    speed, 2 GiB/s, that copy of every byte held generation to 0.86 of fio (benchmarks/README.md,
    "Generation at GiB/s"). False, and nothing written, for any other file."""
    chunk = options.write_chunk_bytes
    if spec.num_samples != 1 or chunk < io.DEFAULT_BUFFER_SIZE or spec.sample_bytes > source.window:
        return False
    for piece in source.chunks(spec.sample_key(0), spec.sample_bytes, chunk):
        handle.write(piece)
    return True


def write_in_one(handle: Any, spec: FileSpec, source: ByteSource, options: FormatOptions) -> bool:
    """What `buffered` and `write_samples` issue for a file that fits the buffer, without them:
    the whole file in one write (none for an empty file), as the BufferedWriter flushes it when
    detached. The writer, its context manager and the samples' generator cost more than the
    file's own open, write and close when files are small (4 KiB: benchmarks/README.md, "Memory
    in the file count"). False, and nothing written, where the file is larger than the buffer."""
    total = spec.payload_bytes
    if total > max(options.write_chunk_bytes, io.DEFAULT_BUFFER_SIZE):
        return False
    if spec.num_samples == 1 and 0 < total <= min(options.write_chunk_bytes, source.window):
        handle.write(source.piece(spec.sample_key(0), total))  # the one sample's one chunk
    elif total:
        chunk, key, size = options.write_chunk_bytes, spec.sample_key, spec.sample_bytes
        pieces = [piece for sample in range(spec.num_samples) for piece in source.chunks(key(sample), size, chunk)]
        handle.write(pieces[0] if len(pieces) == 1 else b"".join(pieces))
    return True


def read_span(handle: Any, buffer: memoryview, offset: int, transfer_size: int, size: int | None = None) -> None:
    """Fill `buffer` from `offset`, in transfer_size pieces when > 0 (one call per piece); with
    `size`, read that many bytes through `buffer` as a window that each call overwrites.

    A short read means the file is shorter than its plan says: that is corruption or a truncated
    file, never something to paper over, so it raises.
    """
    window = size is not None
    size = len(buffer) if size is None else size
    step = transfer_size if transfer_size > 0 else size
    done = 0
    while done < size:
        start = 0 if window else done
        piece = buffer[start : start + min(step, size - done)]
        got = handle.read_at_into(piece, offset + done)
        if got <= 0:
            path = getattr(handle, "path", "?")
            raise EOFError(f"{path}: wanted {size} bytes at offset {offset}, the file ended after {done}")
        done += got


class OffsetReader:
    """Reads fixed-size samples at computable offsets into one reusable buffer."""

    def __init__(self, handle: Any, sample_bytes: int, first: int, stride: int, options: FormatOptions,
                 scratch: Scratch | None = None) -> None:
        self._handle = handle
        self._sample_bytes = sample_bytes
        self._first = first
        self._stride = stride
        self._transfer = options.transfer_size
        self._scratch = scratch or Scratch()

    def fetch(self, sample: int) -> memoryview:
        """The sample's bytes; valid until the next read of this thread."""
        buffer = self._scratch.view(self._sample_bytes)
        read_span(self._handle, buffer, self._first + sample * self._stride, self._transfer)
        return buffer

    def read(self, sample: int) -> int:
        """Read one sample in transfer_size calls, as fetch does, into one transfer-sized window.

        The storage sees the same calls (offsets, sizes, order) as with fetch; only the payload,
        which nothing looks at, is not kept whole: a sample-sized buffer made every read a trip to
        main memory, where fio (and the storage's own figure) reuse a buffer that stays in the CPU
        cache (benchmarks/read_vs_fio.py: about 0.6 of fio from the page cache)."""
        size = self._sample_bytes
        if not 0 < self._transfer < size:
            return len(self.fetch(sample))
        read_span(self._handle, self._scratch.view(self._transfer), self._first + sample * self._stride, self._transfer, size)
        return size

    def close(self) -> None:
        self._handle.close()


def write_samples(out: Any, spec: FileSpec, source: ByteSource, options: FormatOptions) -> None:
    """Every sample of the file, in order, straight from the source's chunks."""
    for sample in range(spec.num_samples):
        for chunk in source.chunks(spec.sample_key(sample), spec.sample_bytes, options.write_chunk_bytes):
            out.write(chunk)
