"""What encoders and formats read a rank's state through, whatever holds it.

A checkpoint file's logical contents are its tensors back to back (PlannedFile order). The live
state (state/rank_state.py), an async staging buffer and a restore's rebuilt state all offer the
same random-access view, so the codecs (codec/) never know where the bytes live and never need a
whole shard in memory.
"""

from __future__ import annotations

from typing import Iterator, Protocol


class FileView(Protocol):
    """Random access to one checkpoint file's logical bytes (its tensors concatenated)."""

    @property
    def size(self) -> int: ...

    def read_at(self, offset: int, nbytes: int) -> memoryview:
        """`nbytes` bytes at `offset` (fewer only at the end). The view may be reused by the next
        call: copy what must outlive it."""
        ...

    def stream(self, chunk_bytes: int) -> Iterator[memoryview]:
        """The whole file in order, in pieces of at most `chunk_bytes` (each valid until the next)."""
        ...


class MutableFileView(FileView, Protocol):
    """A FileView that can be written: scratch stores, a restore's rebuilt state."""

    def write_at(self, offset: int, data) -> None: ...


def stream_by_reads(view: FileView, chunk_bytes: int) -> Iterator[memoryview]:
    """`stream` for views that only implement `read_at`."""
    offset = 0
    while offset < view.size:
        piece = view.read_at(offset, min(chunk_bytes, view.size - offset))
        if not len(piece):
            raise EOFError(f"state view ended at {offset} of {view.size} bytes")
        yield piece
        offset += len(piece)


class BytesView:
    """A (Mutable)FileView over bytes in memory (tests, staging buffers, small states); writable
    when built over a writable buffer (a bytearray, a numpy array)."""

    def __init__(self, data) -> None:
        self._data = memoryview(data).cast("B")

    @property
    def size(self) -> int:
        return len(self._data)

    def read_at(self, offset: int, nbytes: int) -> memoryview:
        return self._data[offset : offset + nbytes]

    def stream(self, chunk_bytes: int) -> Iterator[memoryview]:
        for at in range(0, len(self._data), chunk_bytes):
            yield self._data[at : at + chunk_bytes]

    def write_at(self, offset: int, data) -> None:
        data = memoryview(data).cast("B")
        if offset + len(data) > len(self._data):
            raise ValueError(f"write of {len(data)} bytes at {offset} past the end ({len(self._data)} bytes)")
        self._data[offset : offset + len(data)] = data
