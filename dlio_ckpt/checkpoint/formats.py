"""Checkpoint file formats (`checkpoint.format=`): how one file's tensors become bytes.

A format writes to a file-like object the engine opened through the traced storage, pulling each
tensor's contents chunk by chunk, so no format ever needs a whole shard in memory (torch.save is
the exception: it serialises whole tensors, so it holds one file's tensors at a time).

`sequential` says whether the format only appends; the engine then checksums bytes as they pass.
Formats that seek back (zip headers, HDF5 metadata) are checksummed by reading the file back after
its fsync, outside the timed write.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from dlio_ckpt.errors import ConfigError, close_match
from dlio_ckpt.plan.model import TensorSpec

Chunks = Callable[[TensorSpec], Iterator[memoryview]]


def _npy_header(numel: int, dtype: str) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": (numel,)}
    )
    return buffer.getvalue()


@dataclass(frozen=True)
class RawFormat:
    """Tensors back to back: one contiguous stream per file, what O_DIRECT writes best."""

    name: str = "raw"
    extension: str = "bin"
    sequential: bool = True
    requires: str | None = None

    def write(self, handle: Any, tensors: tuple[TensorSpec, ...], chunks: Chunks) -> None:
        for tensor in tensors:
            for piece in chunks(tensor):
                handle.write(piece)

    def encoded_size(self, tensors: tuple[TensorSpec, ...]) -> int | None:
        return sum(t.nbytes for t in tensors)


@dataclass(frozen=True)
class NpyFormat:
    """One .npy array per file: the file's tensors as one flat uint8 vector after a numpy header."""

    name: str = "npy"
    extension: str = "npy"
    sequential: bool = True
    requires: str | None = None

    def write(self, handle: Any, tensors: tuple[TensorSpec, ...], chunks: Chunks) -> None:
        handle.write(_npy_header(sum(t.nbytes for t in tensors), "uint8"))
        for tensor in tensors:
            for piece in chunks(tensor):
                handle.write(piece)

    def encoded_size(self, tensors: tuple[TensorSpec, ...]) -> int | None:
        total = sum(t.nbytes for t in tensors)
        return len(_npy_header(total, "uint8")) + total


class _ZipSink(io.RawIOBase):
    """zipfile writes through this so its header rewrites stay visible to the tracer."""

    def __init__(self, handle: Any) -> None:
        super().__init__()
        self._h = handle

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data) -> int:
        return self._h.write(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._h.seek(offset, whence)

    def tell(self) -> int:
        return self._h.tell()

    def flush(self) -> None:
        self._h.flush()


@dataclass(frozen=True)
class NpzFormat:
    """An uncompressed .npz (zip of .npy), one member per tensor, streamed member by member."""

    name: str = "npz"
    extension: str = "npz"
    sequential: bool = False
    requires: str | None = None

    def write(self, handle: Any, tensors: tuple[TensorSpec, ...], chunks: Chunks) -> None:
        with zipfile.ZipFile(_ZipSink(handle), "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            for tensor in tensors:
                with archive.open(f"{tensor.name}.npy", "w", force_zip64=True) as member:
                    member.write(_npy_header(tensor.numel, tensor.dtype))
                    for piece in chunks(tensor):
                        member.write(piece)

    def encoded_size(self, tensors: tuple[TensorSpec, ...]) -> int | None:
        return None


@dataclass(frozen=True)
class Hdf5Format:
    """One HDF5 dataset per tensor (h5py over the traced file object), filled chunk by chunk."""

    name: str = "hdf5"
    extension: str = "h5"
    sequential: bool = False
    requires: str | None = "h5py"

    def write(self, handle: Any, tensors: tuple[TensorSpec, ...], chunks: Chunks) -> None:
        import h5py

        with h5py.File(handle, "w") as h5:
            for tensor in tensors:
                dset = h5.create_dataset(tensor.name, shape=(tensor.numel,), dtype=tensor.dtype)
                position = 0
                for piece in chunks(tensor):
                    values = np.frombuffer(piece, dtype=tensor.dtype)
                    dset[position : position + len(values)] = values
                    position += len(values)

    def encoded_size(self, tensors: tuple[TensorSpec, ...]) -> int | None:
        return None


@dataclass(frozen=True)
class TorchFormat:
    """torch.save of a dict of tensors (needs torch; holds one file's tensors in memory)."""

    name: str = "torch"
    extension: str = "pt"
    sequential: bool = False
    requires: str | None = "torch"

    def write(self, handle: Any, tensors: tuple[TensorSpec, ...], chunks: Chunks) -> None:
        import torch

        state = {}
        for tensor in tensors:
            data = np.empty(tensor.nbytes, dtype=np.uint8)
            position = 0
            for piece in chunks(tensor):
                data[position : position + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
                position += len(piece)
            state[tensor.name] = torch.from_numpy(data.view(tensor.dtype))
        torch.save(state, handle)

    def encoded_size(self, tensors: tuple[TensorSpec, ...]) -> int | None:
        return None


FORMATS: dict[str, type] = {
    "raw": RawFormat,
    "npy": NpyFormat,
    "npz": NpzFormat,
    "hdf5": Hdf5Format,
    "torch": TorchFormat,
}


def get_format(name: str):
    if name not in FORMATS:
        raise ConfigError(
            f"checkpoint.format: unknown format '{name}'{close_match(name, FORMATS)}; choose one of: {', '.join(FORMATS)}"
        )
    fmt = FORMATS[name]()
    if fmt.requires:
        from dlio_ckpt.optional import require

        require(fmt.requires)
    return fmt
