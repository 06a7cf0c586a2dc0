"""`checkpoint.codecs=[toyxor]`: a bytes codec that XORs every byte with 0x5A (its own inverse)."""

from __future__ import annotations

from dlio_ckpt.codec.base import Stream

KEY = 0x5A
TABLE = bytes(b ^ KEY for b in range(256))


class XorCodec:
    name = "toyxor"
    kind = "bytes"

    def compressor(self) -> Stream:
        return Stream(lambda data: bytes(data).translate(TABLE), bytes)

    decompressor = compressor


CODEC = XorCodec()
