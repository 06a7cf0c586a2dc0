"""The system calls of a C++ std::ofstream (libstdc++'s basic_filebuf), over a traced handle.

torch.save(obj, path) writes through PyTorchStreamWriter into a std::ofstream, so what the storage
sees is libstdc++'s buffering, not torch's record structure: a write of fewer bytes than
min(1 KiB, the room left in the 8 KiB buffer) is copied into the buffer; a larger one goes out at
once in one writev() of (what the buffer holds, the new bytes), the new bytes straight from the
caller's memory (for torch.save, a tensor's storage: zero copy); closing the stream writes what is
left with one write(). That is libstdc++'s basic_filebuf::xsputn and __basic_file::xsputn_2
(`__chunk = 1 << 10`, BUFSIZ = 8192 with one byte kept for overflow). strace of torch.save shows
exactly this: one writev per tensor record of 1 KiB or more, one write at the end, no fsync, no
seek (tests/test_framework_io.py compares the counts with a real torch.save).

torch.save given a file object instead of a path hands the same pieces to its `write` (memoryviews
of torch's own buffers) and calls `flush` when it is done, so the stream here gets exactly what the
std::ofstream got. The handle's `writev(views)` is one system call (PosixFile.writev); a handle
without it (an object upload) gets the two writes libstdc++ itself makes where writev is missing.
"""

from __future__ import annotations

import io
from typing import Any

FILEBUF_BYTES = 8192  # BUFSIZ: libstdc++'s basic_filebuf buffer
FILEBUF_ROOM = FILEBUF_BYTES - 1  # the put area (one byte is kept for overflow's character)
DIRECT_WRITE_BYTES = 1 << 10  # xsputn's __chunk: writes of at least this many bytes bypass the buffer


class FilebufStream(io.RawIOBase):
    """A write-only stream issuing libstdc++ basic_filebuf's calls on `handle` (see the module)."""

    def __init__(self, handle: Any) -> None:
        super().__init__()
        self._h = handle
        self._buffer = bytearray(FILEBUF_BYTES)
        self._fill = 0
        self._writev = getattr(handle, "writev", None)
        # write(2) at the descriptor's offset where the handle offers it (POSIX), as the stream issues
        self._write = getattr(handle, "write_stream", handle.write)

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        # torch's zip writer calls this for every piece of every record (~600 times for a
        # 112-tensor state dict), most of them a few bytes: the buffered case comes first and makes
        # no view, so the emulated save spends about what the ofstream does on them
        size = data.nbytes if type(data) is memoryview else memoryview(data).nbytes
        fill = self._fill
        if size < DIRECT_WRITE_BYTES and size < FILEBUF_ROOM - fill:
            self._buffer[fill : fill + size] = data
            self._fill = fill + size
            return size
        view = memoryview(data).cast("B")
        pending = memoryview(self._buffer)[:fill]
        if self._writev is not None:
            self._writev([pending, view])
        else:  # libstdc++ without writev: the buffer, then the new bytes
            if fill:
                self._write(pending)
            self._write(view)
        self._fill = 0
        return size

    def flush(self) -> None:
        """The ofstream's close: what the buffer holds, in one write()."""
        if self._fill:
            self._write(memoryview(self._buffer)[: self._fill])
            self._fill = 0

    def close(self) -> None:
        """Dropped without torch's final flush (a failed save): nothing more is written."""
        self._fill = 0
        super().close()

    def tell(self) -> int:
        return self._h.tell() + self._fill
