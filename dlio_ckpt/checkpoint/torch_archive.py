"""torch.save's zip container named after its file, as torch.save(obj, path) names it.

torch.save into a path names the zip's top folder after the file (`checkpoint_1.pt` holds
`checkpoint_1/data.pkl`, `checkpoint_1/data/0`, ...); into a stream, which is how the emulation
reaches the traced file, it names it `archive/`. The name is in every record's local header and
central-directory entry, and each local header pads its extra field so the record's data starts on
a 64-byte boundary, so the two files differ in size by a few bytes per record (590 B for a ResNet's
118 records). ArchiveNamed sits between torch's writer and the stream and gives the records the
path's name: it rewrites each local header (name, its length, the alignment padding recomputed for
the new position, as torch's getPadding does), then the central directory (names and the local
headers' new offsets) and the end records (the directory's size and offset). Every other write
(the records' data, straight from the tensors' memory, and their data descriptors) passes through
untouched, one write for one write, so the system calls keep torch's pattern.
"""

from __future__ import annotations

import io
import struct
from typing import Any

LOCAL = b"PK\x03\x04"
DESCRIPTOR = b"PK\x07\x08"
CENTRAL = b"PK\x01\x02"
END64 = b"PK\x06\x06"
LOCATOR64 = b"PK\x06\x07"
END = b"PK\x05\x06"
PADDING_ID = b"FB"  # the extra field torch pads with ('Z' bytes) to align a record's data
ZIP64_ID = 0x0001
STREAM_NAME = b"archive/"  # what torch names the folder of a zip written to a stream


class ArchiveNamed(io.RawIOBase):
    """A write-only stream renaming torch.save's records from `archive/` to `<stem>/` (see the module)."""

    def __init__(self, stream: Any, stem: str, alignment: int = 64) -> None:
        super().__init__()
        self._s = stream
        self._new = stem.encode() + b"/"
        self._alignment = alignment
        self._in = 0  # bytes torch wrote: its offsets
        self._out = 0  # bytes passed on: the file's offsets
        self._moved: dict[int, int] = {}  # a local header's offset in torch's bytes -> in the file
        self._state = "top"
        self._header = bytearray()
        self._name = b""
        self._body = 0
        self._central = (0, 0)  # the central directory's (offset, size) in the file
        self._end64 = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        state = self._state
        if state == "name":
            self._name = self._rename(bytes(view))
            self._state = "extra" if struct.unpack_from("<H", self._header, 28)[0] else "body"
            if self._state == "body":
                self._emit_header(b"")
        elif state == "extra":
            self._emit_header(bytes(view))
            self._state = "body"
        elif state == "body" and not (size in (16, 24) and view[:4] == DESCRIPTOR and self._described(view)):
            self._body += size
            self._pass(view)
        elif state == "body":  # the record's data descriptor (CRC and sizes: unchanged)
            self._pass(view)
            self._state = "top"
        elif size == 30 and view[:4] == LOCAL:
            self._moved[self._in] = self._out
            self._header = bytearray(view)
            self._body = 0
            self._state = "name"
        elif view[:4] == CENTRAL:
            table = self._central_directory(bytes(view))
            self._central = (self._out, len(table))
            self._pass(table)
        elif size == 56 and view[:4] == END64:
            self._end64 = self._out
            record = bytearray(view)
            struct.pack_into("<QQ", record, 40, self._central[1], self._central[0])
            self._pass(record)
        elif size == 20 and view[:4] == LOCATOR64:
            record = bytearray(view)
            struct.pack_into("<Q", record, 8, self._end64)
            self._pass(record)
        elif size >= 22 and view[:4] == END:
            record = bytearray(view)
            struct.pack_into("<II", record, 12, min(self._central[1], 0xFFFFFFFF), min(self._central[0], 0xFFFFFFFF))
            self._pass(record)
        else:
            self._pass(view)
        self._in += size
        return size

    def flush(self) -> None:
        self._s.flush()

    # one record's local header -------------------------------------------------------------------
    def _rename(self, name: bytes) -> bytes:
        return self._new + name[len(STREAM_NAME):] if name.startswith(STREAM_NAME) else name

    def _described(self, view: memoryview) -> bool:
        """Whether `view` is the data descriptor of the record's data so far (its size field)."""
        size = struct.unpack_from("<Q" if len(view) == 24 else "<I", view, 16 if len(view) == 24 else 12)[0]
        return size == self._body

    def _emit_header(self, extra: bytes) -> None:
        """The header, name and extra field, the padding recomputed so the data starts aligned."""
        kept, at = b"", 0
        while at + 4 <= len(extra):
            block_id, length = extra[at : at + 2], struct.unpack_from("<H", extra, at + 2)[0]
            if block_id != PADDING_ID:
                kept += extra[at : at + 4 + length]
            at += 4 + length
        if len(kept) < len(extra):  # torch padded it: pad again for the new position
            start = self._out + 30 + len(self._name) + len(kept) + 4
            pad = -start % self._alignment
            extra = kept + PADDING_ID + struct.pack("<H", pad) + b"Z" * pad
        struct.pack_into("<HH", self._header, 26, len(self._name), len(extra))
        self._pass(self._header)
        self._pass(self._name)
        if extra:
            self._pass(extra)

    # the central directory ------------------------------------------------------------------------
    def _central_directory(self, table: bytes) -> bytes:
        """Every entry renamed, its local header's offset moved to where it now is."""
        out, at = bytearray(), 0
        while at + 46 <= len(table) and table[at : at + 4] == CENTRAL:
            name_len, extra_len, comment_len = struct.unpack_from("<HHH", table, at + 28)
            fixed = bytearray(table[at : at + 46])
            name = table[at + 46 : at + 46 + name_len]
            extra = bytearray(table[at + 46 + name_len : at + 46 + name_len + extra_len])
            comment = table[at + 46 + name_len + extra_len : at + 46 + name_len + extra_len + comment_len]
            offset = struct.unpack_from("<I", fixed, 42)[0]
            if offset == 0xFFFFFFFF:
                self._move_zip64_offset(fixed, extra)
            else:
                struct.pack_into("<I", fixed, 42, self._moved.get(offset, offset))
            name = self._rename(name)
            struct.pack_into("<H", fixed, 28, len(name))
            out += fixed + name + extra + comment
            at += 46 + name_len + extra_len + comment_len
        return bytes(out + table[at:])

    def _move_zip64_offset(self, fixed: bytearray, extra: bytearray) -> None:
        """The local header's offset in the entry's zip64 extra block (after the sizes it holds)."""
        at = 0
        while at + 4 <= len(extra):
            block_id, length = struct.unpack_from("<HH", extra, at)
            if block_id == ZIP64_ID:
                field = at + 4
                field += 8 * sum(struct.unpack_from("<I", fixed, pos)[0] == 0xFFFFFFFF for pos in (24, 20))
                offset = struct.unpack_from("<Q", extra, field)[0]
                struct.pack_into("<Q", extra, field, self._moved.get(offset, offset))
                return
            at += 4 + length

    def _pass(self, data) -> None:
        self._s.write(data)
        self._out += len(data)
