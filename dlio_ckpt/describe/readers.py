"""The tensor list of a saved checkpoint (name, shape, dtype), read with the library that wrote it.

Why: the bytes a checkpoint costs are decided by its tensors, so the quickest faithful description
of a user's program is the list its own checkpoint holds. Each reader gets the list without loading
tensor data where the format allows (npz and safetensors headers, DCP's .metadata, TensorFlow's
index); torch.save files are opened with `mmap=True` so no tensor is read into memory.

A tensor belongs to the optimizer when a component of its name says so ("optimizer", "optim",
"opt_state"...); everything else is model state. Non-tensor entries (an epoch number, a learning
rate, DCP's pickled bytes, TensorFlow's object graph) are counted, not described: they are small
and the schema has no place for them.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

from dlio_ckpt.errors import MissingDependency, UserError

FORMATS = ("torch", "npz", "safetensors", "dcp", "tensorflow")
# A Keras 3 optimizer tracks the model's weights as `_trainable_variables`, and a TensorFlow
# checkpoint names each variable by the first object-graph path that reaches it, so the weights
# of a tf.train.Checkpoint(optimizer=..., net=...) appear as optimizer/_trainable_variables/<i>.
_MODEL_REFERENCE = "/_trainable_variables/"
_OPTIMIZER_PART = re.compile(r"(^|[._/])(optim\w*|opt_state\w*)($|[._/])", re.IGNORECASE)
# safetensors' dtype codes (huggingface/safetensors, the format's README) and their element sizes
_SAFETENSORS_DTYPES = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1), "U8": ("uint8", 1),
    "U16": ("uint16", 2), "U32": ("uint32", 4), "U64": ("uint64", 8), "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
}


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str       # numpy-style name: float32, bfloat16, int64 ...
    itemsize: int    # bytes per element

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def role(self) -> str:
        if _MODEL_REFERENCE in self.name:
            return "model"
        return "optimizer" if _OPTIMIZER_PART.search(self.name) else "model"


@dataclass(frozen=True)
class TensorList:
    path: str
    format: str
    tensors: tuple[Tensor, ...]
    other_entries: int  # non-tensor entries seen (counted, not described)


def detect_format(path: Path) -> str:
    """The format of `path` from its name (and, for folders, the files in it)."""
    if path.is_dir():
        if (path / ".metadata").is_file():
            return "dcp"
        if (path / "checkpoint").is_file():
            return "tensorflow"
        raise UserError(f"{path}: a folder without .metadata (PyTorch DCP) or a 'checkpoint' file (TensorFlow); "
                        "name a checkpoint file, a DCP folder or a TensorFlow checkpoint prefix")
    if Path(str(path) + ".index").is_file():
        return "tensorflow"
    if not path.is_file():
        raise UserError(f"{path}: no such file, DCP folder or TensorFlow checkpoint prefix")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return "npz"
    if suffix == ".safetensors":
        return "safetensors"
    if suffix in (".pt", ".pth", ".bin", ".tar", ".ckpt") or zipfile.is_zipfile(path):
        return "torch"
    raise UserError(f"{path}: cannot tell its format from the name; pass --format ({', '.join(FORMATS)})")


def read_tensors(path: str | Path, fmt: str = "auto") -> TensorList:
    path = Path(path)
    fmt = detect_format(path) if fmt == "auto" else fmt
    reader = {"torch": _torch, "npz": _npz, "safetensors": _safetensors, "dcp": _dcp, "tensorflow": _tensorflow}.get(fmt)
    if reader is None:
        raise UserError(f"--format {fmt}: not a format this reads; use one of {', '.join(FORMATS)}")
    tensors, other = reader(path)
    return TensorList(str(path), fmt, tuple(tensors), other)


def _torch(path: Path):
    try:
        import torch
    except ImportError:
        raise MissingDependency(f"{path}: reading a torch.save file needs PyTorch: pip install torch") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # a pickle torch refuses or a damaged zip: name it, no traceback
        raise UserError(f"{path}: torch.load could not read it ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    tensors: list[Tensor] = []
    other = 0

    def walk(prefix: str, value) -> None:
        nonlocal other
        if isinstance(value, torch.Tensor):
            tensors.append(Tensor(prefix, tuple(value.shape), str(value.dtype).removeprefix("torch."), value.element_size()))
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(f"{prefix}.{i}" if prefix else str(i), item)
        else:
            other += 1

    walk("", obj)
    return tensors, other


def _npz(path: Path):
    from numpy.lib import format as npformat

    tensors = []
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                with archive.open(member) as f:
                    major, _ = npformat.read_magic(f)
                    read_header = npformat.read_array_header_1_0 if major == 1 else npformat.read_array_header_2_0
                    shape, _, dtype = read_header(f)
                tensors.append(Tensor(member.removesuffix(".npy"), tuple(shape), dtype.name, dtype.itemsize))
    except (zipfile.BadZipFile, ValueError) as exc:
        raise UserError(f"{path}: not a readable .npz archive ({exc})") from None
    return tensors, 0


def _safetensors(path: Path):
    """The header: 8-byte little-endian length, then JSON {name: {dtype, shape, data_offsets}}."""
    with open(path, "rb") as f:
        head = f.read(8)
        size = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < size <= 100 << 20:
            raise UserError(f"{path}: not a safetensors file (header length {size})")
        header = json.loads(f.read(size))
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in _SAFETENSORS_DTYPES:
            raise UserError(f"{path}: tensor {name} has dtype {entry['dtype']}, which this does not know")
        dtype, itemsize = _SAFETENSORS_DTYPES[entry["dtype"]]
        tensors.append(Tensor(name, tuple(entry["shape"]), dtype, itemsize))
    return tensors, 0


def _dcp(path: Path):
    try:
        import torch
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    except ImportError:
        raise MissingDependency(f"{path}: reading a DCP checkpoint needs PyTorch: pip install torch") from None
    metadata = FileSystemReader(str(path)).read_metadata()
    tensors, other = [], 0
    for name, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            dtype = entry.properties.dtype
            element = torch.empty((), dtype=dtype).element_size()
            tensors.append(Tensor(name, tuple(entry.size), str(dtype).removeprefix("torch."), element))
        else:
            other += 1
    return tensors, other


def _tensorflow(path: Path):
    try:
        import tensorflow as tf
    except ImportError:
        raise MissingDependency(f"{path}: reading a TensorFlow checkpoint needs TensorFlow: pip install tensorflow-cpu") from None
    prefix = tf.train.latest_checkpoint(str(path)) if path.is_dir() else str(path)
    if prefix is None:
        raise UserError(f"{path}: its 'checkpoint' file names no checkpoint")
    reader = tf.train.load_checkpoint(prefix)
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    tensors, other = [], 0
    for name in sorted(shapes):
        dtype = dtypes[name]
        if dtype == tf.string:  # the object graph and other serialized entries
            other += 1
            continue
        tensors.append(Tensor(name, tuple(shapes[name]), dtype.name, dtype.size))
    return tensors, other
