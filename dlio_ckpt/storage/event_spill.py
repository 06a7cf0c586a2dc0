"""Where a rank's recorder puts its events and paths once it has held a block of them.

A run of 10 million files records ~50 million events (38 bytes each) and 10 million paths: held
until the end, they made a rank's memory grow ~0.4 KiB a file. The recorder instead writes each
block of converted events, and the paths it has added since the last block, to three unlinked
temporary files (`tempfile.TemporaryFile`: nothing is left behind whatever way the run ends),
and reads them back a block at a time for the end-of-run figures and the event file
(`EventRecorder.blocks`, `save`). These files are the emulator's own bookkeeping, not the
emulated program's I/O: they are written with plain file calls, never through the traced storage.

Each block written is remembered by its row count and its earliest start (16 bytes per block of
at least SPILL_ROWS events: 6 KiB for 50 million events): the overlap-free time of a run's calls
(metrics/timing.UnionLength) needs to know how early a later block's calls can start.
"""

from __future__ import annotations

import os
import tempfile
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator

import numpy as np


@dataclass
class EventSpill:
    """The spilled events (EVENT_DTYPE rows back to back) and path table (UTF-8 bytes back to
    back, and each path's end as int64) of one recorder; the caller serialises writes."""

    dtype: np.dtype
    folder: Path | None = None
    # per block written: its rows and its earliest start (16 bytes a block of >= SPILL_ROWS events)
    block_rows: array = field(default_factory=lambda: array("q"))
    block_starts: array = field(default_factory=lambda: array("d"))
    rows: int = 0
    paths: int = 0
    path_bytes: int = 0
    _files: tuple[IO[bytes], IO[bytes], IO[bytes]] | None = None

    def _open(self) -> tuple[IO[bytes], IO[bytes], IO[bytes]]:
        if self._files is None:
            # the run folder where it exists here (a rank on another host may not see it), else /tmp
            folder = self.folder if self.folder is not None and os.path.isdir(self.folder) else None
            self._files = tuple(tempfile.TemporaryFile(dir=folder, prefix=".dlio_ckpt-events-")
                                for _ in range(3))  # type: ignore[assignment]
        return self._files  # type: ignore[return-value]

    def write_rows(self, rows: np.ndarray) -> None:
        """One block of converted events, appended."""
        if not len(rows):
            return
        events, _, _ = self._open()
        events.write(memoryview(np.ascontiguousarray(rows)).cast("B"))
        self.block_rows.append(len(rows))
        self.block_starts.append(float(rows["start"].min()))
        self.rows += len(rows)

    def write_paths(self, paths: list[str]) -> None:
        """Paths the recorder added, in index order, appended to the path table."""
        if not paths:
            return
        _, path_bytes, path_ends = self._open()
        encoded = [path.encode("utf-8", "surrogatepass") for path in paths]
        ends = self.path_bytes + np.cumsum([len(item) for item in encoded], dtype=np.int64)
        path_bytes.write(b"".join(encoded))
        path_ends.write(ends.tobytes())
        self.paths += len(paths)
        self.path_bytes = int(ends[-1])

    def read_blocks(self) -> Iterator[np.ndarray]:
        """The spilled events, one written block at a time (a fresh array each)."""
        if self._files is None:
            return
        events = self._files[0]
        events.flush()
        offset = 0
        for count in self.block_rows:
            nbytes = count * self.dtype.itemsize
            yield np.frombuffer(bytearray(os.pread(events.fileno(), nbytes, offset)), self.dtype)
            offset += nbytes

    def byte_blocks(self, which: int, block: int) -> Iterator[bytes]:
        """The path bytes (1) or the path ends (2) as written, `block` bytes at a time."""
        if self._files is None:
            return
        source = self._files[which]
        source.flush()
        size, offset = os.fstat(source.fileno()).st_size, 0
        while offset < size:
            chunk = os.pread(source.fileno(), min(block, size - offset), offset)
            offset += len(chunk)
            yield chunk

    def read_paths(self, first: int = 0) -> list[str]:
        """The spilled paths from index `first` on, decoded (for tests and small tables)."""
        if self._files is None or first >= self.paths:
            return []
        ends = np.frombuffer(b"".join(self.byte_blocks(2, 1 << 20)), np.int64)
        blob = b"".join(self.byte_blocks(1, 1 << 20))
        starts = [0, *ends[:-1].tolist()]
        return [blob[a:b].decode("utf-8", "surrogatepass") for a, b in zip(starts[first:], ends[first:].tolist())]

    def drop_rows(self) -> None:
        """Forget the spilled events (a worker's recorder, once it sent them); the paths stay."""
        if self._files is not None:
            self._files[0].seek(0)
            self._files[0].truncate()
        self.block_rows, self.block_starts, self.rows = array("q"), array("d"), 0

    def close(self) -> None:
        if self._files is not None:
            for handle in self._files:
                handle.close()
            self._files = None
