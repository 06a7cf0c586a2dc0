"""The write calls TensorFlow makes for the files of a tensor bundle, from their sizes and bytes.

TensorFlow's SaveV2 and MergeV2Checkpoints open and write their files themselves, so the traced
storage never sees their calls; the engine records them from what this module works out. Each
call is one `WritableFile::Append`, which TF's POSIX file turns into one `fwrite`: what
darshan-runtime's STDIO module counts (strace sees fewer `write` syscalls, because glibc's stdio
buffer joins the small ones). Pure functions of a size or a file's bytes; measured with TF 2.21
under an fwrite interposer, and checked against darshan-runtime by tests/test_tf_bundle_writes.py.

- A data file (`.data-0000k-of-0000K`): BundleWriter appends every tensor through
  `tsl::BufferedWritableFile` with an 8 MiB buffer, which fills the buffer to the brim and
  flushes it whole, and flushes the rest at close. So the calls are the file in 8 MiB pieces and
  its remainder, whatever the sizes of the tensors appended (3, 7 and 20 MiB tensors make
  8+8+8+6 MiB, not the 3, 7, 8, 8, 4 MiB that TF's older FileOutputBuffer would have written).
- An index (`.index`, staged or merged): a leveldb table written by TableBuilder straight to the
  file: per block (the data blocks, then the metaindex block, then the index block) one call for
  its contents and one for its 5-byte trailer, then one for the 48-byte footer. Where its data
  blocks end (TableBuilder cuts them at 256 KiB) is read from the table itself: the footer names
  the index block, whose entries name every data block.
"""

from __future__ import annotations

import struct

DATA_BUFFER_BYTES = 8 << 20  # BundleWriter's BufferedWritableFile (tensor_bundle.cc: 8 << 20)
BLOCK_TRAILER_BYTES = 5  # a block's compression type (1 byte) and masked CRC32C (4 bytes)
FOOTER_BYTES = 48  # two BlockHandles padded to 40 bytes, then the 8-byte magic number
TABLE_MAGIC = 0xDB4775248B80FB57  # leveldb's kTableMagicNumber, which TF's table keeps


def data_file_writes(size: int, buffer_bytes: int = DATA_BUFFER_BYTES) -> list[tuple[int, int]]:
    """(offset, length) of each write call of a bundle's data file of `size` bytes: full buffers,
    then the remainder; none for an empty file (the buffer is flushed only when it holds bytes)."""
    return [(offset, min(buffer_bytes, size - offset)) for offset in range(0, size, buffer_bytes)]


def table_writes(table: bytes | memoryview) -> list[tuple[int, int]]:
    """(offset, length) of each write call TableBuilder made to produce `table` (an index file's
    bytes), in file order. They cover the file exactly; ValueError names what does not fit."""
    data = memoryview(table)
    if len(data) < FOOTER_BYTES:
        raise ValueError(f"not a TensorFlow table: {len(data)} bytes, shorter than its {FOOTER_BYTES}-byte footer")
    footer = data[len(data) - FOOTER_BYTES:]
    if struct.unpack("<Q", footer[40:])[0] != TABLE_MAGIC:
        raise ValueError("not a TensorFlow table: its last 8 bytes are not the table magic number")
    metaindex, at = _handle(footer, 0)
    index, _ = _handle(footer, at)
    blocks = [*_data_blocks(data, index), metaindex, index]
    writes, expected = [], 0
    for offset, length in blocks:
        if offset != expected:
            raise ValueError(f"not a TensorFlow table: a block at byte {offset}, expected at {expected}")
        writes += [(offset, length), (offset + length, BLOCK_TRAILER_BYTES)]
        expected = offset + length + BLOCK_TRAILER_BYTES
    if expected != len(data) - FOOTER_BYTES:
        raise ValueError(f"not a TensorFlow table: its blocks end at byte {expected}, its footer starts at "
                         f"{len(data) - FOOTER_BYTES}")
    return writes + [(expected, FOOTER_BYTES)]


def _data_blocks(data: memoryview, index: tuple[int, int]) -> list[tuple[int, int]]:
    """The BlockHandle of every data block, from the index block's entries (prefix-compressed
    key, value = the block's handle), which end where its restart array begins."""
    offset, length = index
    if offset + length + BLOCK_TRAILER_BYTES > len(data) or length < 4:
        raise ValueError(f"not a TensorFlow table: its index block ({offset}, {length}) lies outside the file")
    if data[offset + length] != 0:
        raise ValueError("not a TensorFlow table written uncompressed: its index block is compressed")
    block = data[offset:offset + length]
    restarts = struct.unpack("<I", block[length - 4:])[0]
    end = length - 4 * (restarts + 1)
    if end < 0:
        raise ValueError(f"not a TensorFlow table: its index block has {restarts} restarts in {length} bytes")
    handles, at = [], 0
    while at < end:
        _, at = _varint(block, at)  # bytes shared with the previous key
        unshared, at = _varint(block, at)
        value_length, at = _varint(block, at)
        value_at = at + unshared
        handle, value_end = _handle(block, value_at)
        if value_end != value_at + value_length:
            raise ValueError("not a TensorFlow table: an index entry's value is not one block handle")
        handles.append(handle)
        at = value_end
    return handles


def _handle(data: memoryview, at: int) -> tuple[tuple[int, int], int]:
    """A BlockHandle (varint64 offset, varint64 size) at `at`, and where it ends."""
    offset, at = _varint(data, at)
    length, at = _varint(data, at)
    return (offset, length), at


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    """A little-endian base-128 varint at `at`, and where it ends."""
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("not a TensorFlow table: a varint runs past its block")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
