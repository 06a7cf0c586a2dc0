"""TFRecord: one record per sample, each a serialized tf.train.Example {"image": bytes, "label": int64}.

Record framing: uint64 length, uint32 masked crc32c of the length bytes, the data, uint32 masked
crc32c of the data. The Example protobuf is written by hand (a handful of length-prefixed
fields) so that generation needs no TensorFlow and can stream the image bytes: every length is
known before the first byte is written, and the data CRC is computed incrementally.

Every record of a file has the same length (samples of one file are the same size, and labels
are class ids below 128, so the label is always a one-byte varint); record i therefore starts at
i * record_size, and the native reader reads a record without scanning the ones before it. The
reader checks the length field, its CRC, and the data CRC (crc32c runs at memory speed with the
C extension, far below the cost of the read it checks).
"""

from __future__ import annotations

import struct
from typing import Any

import crc32c

from dlio_ckpt.content import ByteSource
from dlio_ckpt.formats.base import FileSpec, FormatOptions, Opener, Scratch
from dlio_ckpt.formats.streams import buffered, read_span

HEADER_BYTES = 12  # uint64 length + uint32 masked crc of it
FOOTER_BYTES = 4  # uint32 masked crc of the data
_MASK_DELTA = 0xA282EAD8
_LEN = 0x0A  # field 1, wire type 2 (length-delimited): the tag of every nested field used here
_VALUE = 0x12  # field 2, wire type 2: a map entry's value
_INT64_LIST = 0x1A  # field 3, wire type 2: Feature.int64_list


def mask(crc: int) -> int:
    """TFRecord's CRC masking (a CRC of data that holds CRCs is otherwise weak)."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crc(data: Any) -> int:
    return mask(crc32c.crc32c(data))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(tag: int, body_len: int) -> bytes:
    """A length-delimited field's tag and length (the body follows)."""
    return bytes([tag]) + _varint(body_len)


def _entry(key: bytes, feature_len: int) -> tuple[bytes, int]:
    """Features.feature map entry prefix up to the Feature body, and the entry's body length."""
    key_part = _field(_LEN, len(key)) + key
    value_head = _field(_VALUE, feature_len)
    return key_part + value_head, len(key_part) + len(value_head) + feature_len


def example_parts(image_bytes: int, label: int) -> tuple[bytes, bytes]:
    """The serialized Example around the image bytes: (prefix, suffix); data = prefix+image+suffix."""
    if not 0 <= label < 128:
        raise ValueError("labels must be one-byte varints (0..127) so that records have equal length")
    # image: Feature{bytes_list: BytesList{value: [image]}}
    bytes_list_len = len(_field(_LEN, image_bytes)) + image_bytes
    image_feature_len = len(_field(_LEN, bytes_list_len)) + bytes_list_len
    image_head, image_entry_len = _entry(b"image", image_feature_len)
    # label: Feature{int64_list: Int64List{value: [label]}} (packed)
    int64_list = _field(_LEN, 1) + _varint(label)
    label_feature = _field(_INT64_LIST, len(int64_list)) + int64_list
    label_head, label_entry_len = _entry(b"label", len(label_feature))
    label_entry = _field(_LEN, label_entry_len) + label_head + label_feature
    features_len = len(_field(_LEN, image_entry_len)) + image_entry_len + len(label_entry)
    prefix = (
        _field(_LEN, features_len)  # Example.features
        + _field(_LEN, image_entry_len)  # Features.feature entry "image"
        + image_head
        + _field(_LEN, bytes_list_len)  # Feature.bytes_list
        + _field(_LEN, image_bytes)  # BytesList.value
    )
    return prefix, label_entry


def record_size(spec: FileSpec) -> int:
    prefix, suffix = example_parts(spec.sample_bytes, 0)
    return HEADER_BYTES + len(prefix) + spec.sample_bytes + len(suffix) + FOOTER_BYTES


def record_header(data_len: int) -> bytes:
    length = struct.pack("<Q", data_len)
    return length + struct.pack("<I", masked_crc(length))


class TFRecordReader:
    """Reads record i at its computed offset and verifies its framing."""

    def __init__(self, handle: Any, spec: FileSpec, options: FormatOptions, scratch: Scratch | None = None) -> None:
        self._handle = handle
        self._scratch = scratch or Scratch()
        prefix, suffix = example_parts(spec.sample_bytes, 0)
        self._data_len = len(prefix) + spec.sample_bytes + len(suffix)
        self._header = record_header(self._data_len)
        self._image_start = HEADER_BYTES + len(prefix)
        self._sample_bytes = spec.sample_bytes
        self._stride = HEADER_BYTES + self._data_len + FOOTER_BYTES
        self._transfer = options.transfer_size

    def fetch(self, sample: int) -> memoryview:
        """The sample's image bytes, after checking the record; valid until the next read of this thread."""
        offset = sample * self._stride
        buffer = self._scratch.view(self._stride)
        read_span(self._handle, buffer, offset, self._transfer)
        where = f"{getattr(self._handle, 'path', '?')}: record {sample} at offset {offset}"
        if buffer[:HEADER_BYTES] != self._header:
            raise ValueError(f"{where}: length field or its CRC does not match a {self._data_len}-byte record")
        data = buffer[HEADER_BYTES : HEADER_BYTES + self._data_len]
        (stored,) = struct.unpack_from("<I", buffer, HEADER_BYTES + self._data_len)
        if masked_crc(data) != stored:
            raise ValueError(f"{where}: data CRC mismatch")
        return buffer[self._image_start : self._image_start + self._sample_bytes]

    def read(self, sample: int) -> int:
        return len(self.fetch(sample))

    def close(self) -> None:
        self._handle.close()


class TFRecordFormat:
    name = "tfrecord"
    extension = "tfrecord"
    companion_suffixes: tuple[str, ...] = ()
    sequential = True
    write_needs: frozenset[str] = frozenset()
    compressions: tuple[str, ...] = ("none",)  # dataset.compression values it offers

    def write(self, open_output: Opener, spec: FileSpec, source: ByteSource, options: FormatOptions) -> None:
        with buffered(open_output(""), options) as out:
            for sample in range(spec.num_samples):
                prefix, suffix = example_parts(spec.sample_bytes, spec.label(sample))
                out.write(record_header(len(prefix) + spec.sample_bytes + len(suffix)) + prefix)
                crc = crc32c.crc32c(prefix)
                for chunk in source.chunks(spec.sample_key(sample), spec.sample_bytes, options.write_chunk_bytes):
                    out.write(chunk)
                    crc = crc32c.crc32c(chunk, value=crc)
                crc = crc32c.crc32c(suffix, value=crc)
                out.write(suffix + struct.pack("<I", mask(crc)))

    def open(self, open_input: Opener, spec: FileSpec, options: FormatOptions,
             scratch: Scratch | None = None) -> TFRecordReader:
        return TFRecordReader(open_input(""), spec, options, scratch)
