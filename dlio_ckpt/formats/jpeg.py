"""JPEG: one image per file, a real JPEG of exactly the drawn sample size.

MLPerf Storage's retinanet dataset is JPEG files (OpenImages), read whole by the PyTorch loader
(PIL opens the file; the model's transforms decode it). What storage sees is the file's size, so a
file here is exactly `sample_bytes` long (the plan's drawn size, header included) and still a valid
JPEG that PIL decodes: a tiny 8x8 image (a constant, encoded once by Pillow), with the sample's seeded random
bytes carried in COM (comment) segments between its JFIF header and its image data (a decoder
skips comments). At most 3 bytes that no segment can carry (a segment costs 4 bytes of marker and
length) follow the end-of-image marker, which decoders ignore.

The payload (what a reader's `fetch` returns) is the whole file: the loader reads every byte.
"""

from __future__ import annotations

from dlio_ckpt.content import ByteSource
from dlio_ckpt.formats.base import FileSpec, FormatOptions, Opener, Scratch
from dlio_ckpt.formats.streams import OffsetReader, buffered

COMMENT = b"\xff\xfe"
SEGMENT_DATA = 65533  # a segment's 2-byte length counts itself: at most 65535 - 2 bytes of data
SEGMENT_COST = 4  # marker + length


# An 8x8 grey JPEG (baseline, quality 50) as Pillow 13 encodes it: SOI, APP0 (JFIF), DQT, SOF0,
# DHT x2, SOS, one MCU, EOI. A constant, so writing needs no imaging library (tests decode with PIL).
TINY_JPEG = bytes.fromhex(
    "ffd8ffe000104a46494600010100000100010000ffdb004300100b0c0e0c0a100e0d0e1211101318281a181616183123"
    "251d283a333d3c3933383740485c4e404457453738506d51575f626768673e4d71797064785c656763ffc0000b080008"
    "000801011100ffc4001f0000010501010101010100000000000000000102030405060708090a0bffc400b51000020103"
    "03020403050504040000017d01020300041105122131410613516107227114328191a1082342b1c11552d1f024336272"
    "82090a161718191a25262728292a3435363738393a434445464748494a535455565758595a636465666768696a737475"
    "767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9"
    "cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffda0008010100003f002bffd9"
)
JPEG_MIN_BYTES = len(TINY_JPEG)


def split_after_header(jpeg: bytes) -> tuple[bytes, bytes]:
    """(SOI + APP0 header, the rest): where the comment segments go. Pure."""
    assert jpeg[:4] == b"\xff\xd8\xff\xe0", "a JFIF file starts with SOI + APP0"
    head = 4 + int.from_bytes(jpeg[4:6], "big")
    return jpeg[:head], jpeg[head:]


def comment_sizes(room: int) -> tuple[list[int], int]:
    """How `room` bytes between the header and the image data are filled: the data bytes of each
    COM segment, and the trailing bytes (0..3) left after the end-of-image marker. Pure."""
    sizes: list[int] = []
    while room >= SEGMENT_COST:
        data = min(room - SEGMENT_COST, SEGMENT_DATA)
        left = room - SEGMENT_COST - data
        if 0 < left < SEGMENT_COST:  # leave the next segment enough for its marker and length
            data -= SEGMENT_COST - left
        sizes.append(data)
        room -= SEGMENT_COST + data
    return sizes, room


class JpegFormat:
    name = "jpeg"
    extension = "jpeg"  # DLIO's jpeg generator names files <prefix>_<i>_of_<n>.jpeg
    companion_suffixes: tuple[str, ...] = ()
    sequential = False
    write_needs: frozenset[str] = frozenset()
    compressions: tuple[str, ...] = ("none",)
    min_sample_bytes = JPEG_MIN_BYTES  # the tiny JPEG itself

    def __init__(self) -> None:
        self._head, self._rest = split_after_header(TINY_JPEG)

    def write(self, open_output: Opener, spec: FileSpec, source: ByteSource, options: FormatOptions) -> None:
        if spec.num_samples != 1:
            raise ValueError(f"{spec.path}: a jpeg file holds one image; dataset.num_samples_per_file must be 1")
        if spec.sample_bytes < self.min_sample_bytes:
            raise ValueError(f"{spec.path}: a JPEG takes at least {self.min_sample_bytes} bytes; "
                             f"the plan drew {spec.sample_bytes} (raise dataset.record_length_bytes_min)")
        sizes, trailing = comment_sizes(spec.sample_bytes - self.min_sample_bytes)
        payload = source.chunks(spec.sample_key(0), sum(sizes) + trailing, options.write_chunk_bytes)
        pending = memoryview(b"")
        with buffered(open_output(""), options) as out:
            out.write(self._head)
            for size in sizes:
                out.write(COMMENT + (size + 2).to_bytes(2, "big"))
                while size:
                    if not pending:
                        pending = memoryview(next(payload)).cast("B")
                    piece = pending[:size]
                    out.write(piece)
                    pending, size = pending[len(piece):], size - len(piece)
            out.write(self._rest)
            while trailing:
                if not pending:
                    pending = memoryview(next(payload)).cast("B")
                piece = pending[:trailing]
                out.write(piece)
                pending, trailing = pending[len(piece):], trailing - len(piece)

    def open(self, open_input: Opener, spec: FileSpec, options: FormatOptions,
             scratch: Scratch | None = None) -> OffsetReader:
        # ASSUMPTION: the loader reads the whole file (PIL), in transfer_size pieces when set.
        return OffsetReader(open_input(""), spec.sample_bytes, 0, spec.sample_bytes, options, scratch)
