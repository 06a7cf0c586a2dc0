"""What the files a log names still tell, when they are still on disk (read-only, one file each).

A Darshan log has no file contents and, for files it saw only through fopen (torch.save: libtorch
fopen()s the file, then writev()s on the descriptor, which neither darshan-runtime's POSIX nor its
STDIO module counts), no sizes either. When the run's files are still where the log says, one
look at them gives what the counters cannot: the dataset format from the file's magic bytes, the
samples per file and the payload of one sample (npz: the `x` array's rows; TFRecord: its records
and the Example's `image` feature; HDF5: dataset `x`), and a checkpoint's size and tensor list
(dlio_ckpt-describe-model's readers). Every figure found here is marked "measured on disk".
"""

from __future__ import annotations

import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlio_ckpt.describe.readers import read_tensors
from dlio_ckpt.describe.section import model_section, section_bytes, to_yaml
from dlio_ckpt.errors import UserError
from dlio_ckpt.formats.tfrecord import masked_crc

EXTENSIONS = {".npz": "npz", ".npy": "npy", ".tfrecord": "tfrecord", ".tfrecords": "tfrecord", ".h5": "hdf5",
              ".hdf5": "hdf5", ".hdf": "hdf5", ".bin": "raw", ".raw": "raw", ".dat": "raw"}
MAX_TFRECORDS = 1_000_000  # records walked in one file before giving up (a bound, not a guess)


@dataclass(frozen=True)
class Samples:
    per_file: int
    record_bytes: int
    how: str  # the sentence the YAML comment carries


def file_size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def sniff_format(path: str) -> str | None:
    """The dataset format from the file's first bytes; None when absent or not recognised."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head.startswith(b"PK\x03\x04"):
        return "npz"
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "hdf5"
    if len(head) >= 12:
        length = struct.unpack("<Q", head[:8])[0]
        size = file_size(path) or 0
        if 0 < length and 16 + length <= size:
            try:
                if masked_crc(head[:8]) == struct.unpack("<I", head[8:12])[0]:
                    return "tfrecord"
            except ImportError:
                return None
    return None


def samples(path: str, fmt: str) -> Samples | None:
    """Samples per file and one sample's payload bytes, read from one dataset file."""
    try:
        if fmt == "npz":
            with zipfile.ZipFile(path) as z, z.open("x.npy") as member:
                version = np.lib.format.read_magic(member)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read_header(member)
            return _rows(shape, dtype, f"{Path(path).name}: npz member x.npy {tuple(shape)} {dtype}")
        if fmt == "npy":
            arr = np.load(path, mmap_mode="r")
            return _rows(arr.shape, arr.dtype, f"{Path(path).name}: npy {arr.shape} {arr.dtype}")
        if fmt == "hdf5":
            import h5py
            with h5py.File(path, "r") as h:
                name = "x" if "x" in h else next(iter(h))
                return _rows(h[name].shape, h[name].dtype, f"{Path(path).name}: HDF5 dataset {name} {h[name].shape}")
        if fmt == "tfrecord":
            return _tfrecord(path)
    except (OSError, KeyError, ValueError, StopIteration, zipfile.BadZipFile):
        return None
    return None


def _rows(shape, dtype, how: str) -> Samples:
    shape = tuple(int(d) for d in shape) or (1,)
    per_sample = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize if len(shape) > 1 else np.dtype(dtype).itemsize
    return Samples(shape[0], per_sample, how)


def _tfrecord(path: str) -> Samples | None:
    """Records in the file, and the mean length of the `image` bytes feature of its first record."""
    count, first = 0, None
    with open(path, "rb") as f:
        while count < MAX_TFRECORDS:
            header = f.read(12)
            if len(header) < 12:
                break
            length = struct.unpack("<Q", header[:8])[0]
            data = f.read(length)
            f.read(4)
            if first is None:
                first = data
            count += 1
    if not count or first is None:
        return None
    image = _image_feature(first)
    return Samples(count, image if image is not None else len(first),
                   f"{Path(path).name}: {count} TFRecord records" + ("" if image is not None else
                   " (no `image` bytes feature: the whole serialized record is taken as the sample)"))


def _image_feature(example: bytes) -> int | None:
    """The length of the `image` bytes feature in a serialized tf.train.Example (protobuf walked by hand)."""
    at = example.find(b"image")
    if at < 0:
        return None
    i = at + len(b"image")
    try:  # Feature {bytes_list (1) {value (1): bytes}}: tag, length, tag, length, tag, length
        for _ in range(3):
            i += 1
            length, i = _varint(example, i)
        return length
    except IndexError:
        return None


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def checkpoint_model(path: str) -> tuple[str, int] | None:
    """The `model:` YAML of a checkpoint still on disk (describe-model's readers), and the bytes its
    tensors hold; None when it is gone or its library (torch, TensorFlow) is missing."""
    if not os.path.exists(path) and not os.path.exists(path + ".index"):  # a TensorFlow ckpt-N prefix
        return None
    try:
        listing = read_tensors(path)
    except (UserError, OSError, ValueError, RuntimeError):
        return None
    if not listing.tensors:
        return None
    section = model_section(listing, Path(path).stem)
    size = file_size(path) if os.path.isfile(path) else None
    return to_yaml(listing, section, size), section_bytes(section)
