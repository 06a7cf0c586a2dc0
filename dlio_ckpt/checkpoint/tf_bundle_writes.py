"""The write calls TensorFlow makes for the files of a tensor bundle, from their sizes and entries.

TensorFlow's SaveV2 and MergeV2Checkpoints open and write their files themselves, so the traced
storage never sees their calls; the engine records them from what this module works out. Each
call is one `WritableFile::Append`, which TF's POSIX file turns into one `fwrite`: what
darshan-runtime's STDIO module counts (strace sees fewer `write` syscalls, because glibc's stdio
buffer joins the small ones). MergeV2Checkpoints also reads each staged index back (`table_reads`:
TF's table reader, preads that darshan-runtime's POSIX module counts), which the engine records
likewise. Pure functions of a file's size or an index's entries, so that the emulation reads
nothing back itself (a read the program does not make); measured with TF 2.21 under an fwrite
interposer, and checked against darshan-runtime and TF's own files by tests/test_tf_bundle_writes.py.

- A data file (`.data-0000k-of-0000K`): BundleWriter appends every tensor through
  `tsl::BufferedWritableFile` with an 8 MiB buffer, which fills the buffer to the brim and
  flushes it whole, and flushes the rest at close. So the calls are the file in 8 MiB pieces and
  its remainder, whatever the sizes of the tensors appended (3, 7 and 20 MiB tensors make
  8+8+8+6 MiB, not the 3, 7, 8, 8, 4 MiB that TF's older FileOutputBuffer would have written).
- An index (`.index`, staged or merged): a leveldb table written by TableBuilder straight to the
  file: per block (the data blocks, then the metaindex block, then the index block) one call for
  its contents and one for its 5-byte trailer, then one for the 48-byte footer. Where its data
  blocks end (TableBuilder cuts them at 256 KiB) follows from its keys and the sizes of their
  values (`table_writes`), which the format knows: the tensors' names and BundleEntryProtos.
"""

from __future__ import annotations

DATA_BUFFER_BYTES = 8 << 20  # BundleWriter's BufferedWritableFile (tensor_bundle.cc: 8 << 20)
BLOCK_TRAILER_BYTES = 5  # a block's compression type (1 byte) and masked CRC32C (4 bytes)
FOOTER_BYTES = 48  # two BlockHandles padded to 40 bytes, then the 8-byte magic number
BLOCK_BYTES = 256 << 10  # TF's table Options: block_size 262144
RESTART_INTERVAL = 16  # and block_restart_interval


def data_file_writes(size: int, buffer_bytes: int = DATA_BUFFER_BYTES) -> list[tuple[int, int]]:
    """(offset, length) of each write call of a bundle's data file of `size` bytes: full buffers,
    then the remainder; none for an empty file (the buffer is flushed only when it holds bytes)."""
    return [(offset, min(buffer_bytes, size - offset)) for offset in range(0, size, buffer_bytes)]


def table_writes(entries: list[tuple[bytes, int]], block_bytes: int = BLOCK_BYTES,
                 restart_interval: int = RESTART_INTERVAL) -> list[tuple[int, int]]:
    """(offset, length) of each write call TableBuilder makes for a table of `entries` (key, length
    of its value), given in key order, as TF's table_builder.cc (leveldb's) cuts and writes it:

    - an entry takes varint32 (bytes shared with the previous key of its block, 0 at every 16th
      entry: a restart), varint32 (the rest of the key), varint32 (value length), then the rest of
      the key and the value; a block ends with a uint32 per restart and their count;
    - a data block is written once its entries and restarts reach `block_bytes` (and at the end);
      each written data block adds an index entry, keyed by the shortest key between its last key
      and the next block's first (the last block: the shortest key after its last), whose value is
      the block's handle (varint64 offset, varint64 size); every index entry is a restart;
    - then the empty metaindex block (8 bytes), the index block and the 48-byte footer.
    Every block is written as two calls: its contents, then its 5-byte trailer."""
    writes: list[tuple[int, int]] = []
    index: list[int] = []  # the index block's entries' sizes
    offset = 0

    def write_block(size: int) -> int:
        nonlocal offset
        writes.extend([(offset, size), (offset + size, BLOCK_TRAILER_BYTES)])
        at, offset = offset, offset + size + BLOCK_TRAILER_BYTES
        return at

    block, restarts, counter, previous, last = 0, 1, 0, b"", b""
    pending: tuple[int, int] | None = None  # the handle of a block written, waiting for its index key
    for key, value_length in entries:
        if pending is not None:
            index.append(_index_entry(_separator(last, key), pending))
            pending = None
        if counter < restart_interval:
            shared = _common_prefix(previous, key)
        else:
            restarts, counter, shared = restarts + 1, 0, 0
        block += (varint_size(shared) + varint_size(len(key) - shared) + varint_size(value_length)
                  + len(key) - shared + value_length)
        counter, previous, last = counter + 1, key, key
        if block + 4 * restarts + 4 >= block_bytes:
            size = block + 4 * restarts + 4
            pending = (write_block(size), size)
            block, restarts, counter, previous = 0, 1, 0, b""
    if block:
        size = block + 4 * restarts + 4
        pending = (write_block(size), size)
    if pending is not None:
        index.append(_index_entry(_successor(last), pending))
    write_block(8)  # the metaindex block: no entries, one restart
    write_block(sum(index) + 4 * max(len(index), 1) + 4)
    return writes + [(offset, FOOTER_BYTES)]


def table_reads(entries: list[tuple[bytes, int]], block_bytes: int = BLOCK_BYTES,
                restart_interval: int = RESTART_INTERVAL) -> list[tuple[int, int]]:
    """(offset, length) of each read call TF's table reader makes to read every entry of the table
    `table_writes` writes for `entries`, as MergeV2Checkpoints reads each staged index: the 48-byte
    footer, the index block with its trailer (Table::Open; TF sets no filter policy, so the
    metaindex block is never read), then each data block with its trailer, in key order, as its
    iterator reaches it. A one-block index is 3 preads (darshan-runtime's DXT of keras_tfdata.py's
    staged index of 2,131 B: 48 B at 2,083, 20 at 2,063, 2,050 at 0)."""
    writes = table_writes(entries, block_bytes, restart_interval)
    footer, blocks = writes[-1], list(zip(writes[:-1:2], writes[1:-1:2]))  # (contents, trailer) per block
    data, index = blocks[:-2], blocks[-1]  # the metaindex block, second to last, is not read

    def whole(block: tuple[tuple[int, int], tuple[int, int]]) -> tuple[int, int]:
        (offset, size), (_, trailer) = block
        return offset, size + trailer

    return [footer, whole(index), *(whole(block) for block in data)]


def _index_entry(key: bytes, handle: tuple[int, int]) -> int:
    value = varint_size(handle[0]) + varint_size(handle[1])
    return 1 + varint_size(len(key)) + varint_size(value) + len(key) + value


def _common_prefix(a: bytes, b: bytes) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _separator(start: bytes, limit: bytes) -> bytes:
    """The bytewise comparator's FindShortestSeparator: a short key >= start and < limit."""
    n = _common_prefix(start, limit)
    if n < min(len(start), len(limit)) and start[n] < 0xFF and start[n] + 1 < limit[n]:
        return start[:n] + bytes([start[n] + 1])
    return start


def _successor(key: bytes) -> bytes:
    """The bytewise comparator's FindShortSuccessor: a short key >= `key`."""
    for n, byte in enumerate(key):
        if byte != 0xFF:
            return key[:n] + bytes([byte + 1])
    return key


def varint_size(value: int) -> int:
    """Bytes of `value` as a base-128 varint (table entries, block handles, TF's string lengths)."""
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size
