"""`zstd`, a bytes codec: a container compressed as one zstd frame (level 3, zstd's default).

After a state codec it squeezes what that codec left (incremental's new leaves, lossy's raw full
checkpoints); alone (`checkpoint.codecs=[zstd]`) it compresses each file's plain bytes, as a
framework that zstd-compresses its checkpoints would.
"""

from __future__ import annotations

from dataclasses import dataclass

import zstandard

from dlio_ckpt.codec.base import Stream

LEVEL = 3


@dataclass(frozen=True)
class ZstdCodec:
    name: str = "zstd"
    kind: str = "bytes"

    def compressor(self) -> Stream:
        frame = zstandard.ZstdCompressor(level=LEVEL).compressobj()
        return Stream(frame.compress, frame.flush)

    def decompressor(self) -> Stream:
        frame = zstandard.ZstdDecompressor().decompressobj()
        return Stream(frame.decompress, bytes)


CODEC = ZstdCodec()
