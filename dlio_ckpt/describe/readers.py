"""The tensor list of a saved checkpoint (name, shape, dtype), read with the library that wrote it.

Why: the bytes a checkpoint costs are decided by its tensors, so the quickest faithful description
of a user's program is the list its own checkpoint holds. Each reader gets the list without loading
tensor data where the format allows (npz and safetensors headers, DCP's .metadata, TensorFlow's
index); torch.save files are opened with `mmap=True` so no tensor is read into memory.

A tensor belongs to the optimizer when a component of its name says so ("optimizer", "optim",
"opt_state"...); everything else is model state. Non-tensor entries (an epoch number, a learning
rate, DCP's pickled bytes items, TensorFlow's object graph) are listed as model.extra_state
entries: their plain value where YAML carries it, else the size of their serialized blob.
"""

from __future__ import annotations

import io
import json
import pickle
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
class Entry:
    """A non-tensor entry of the checkpoint (model.extra_state): its plain value, or, for a
    serialized blob (TensorFlow's object graph) or a value YAML cannot carry, its size."""

    name: str
    value: object = None
    blob: int = -1  # >= 0: an opaque blob of this many bytes


@dataclass(frozen=True)
class TensorList:
    path: str
    format: str
    tensors: tuple[Tensor, ...]
    other_entries: int  # non-tensor entries seen
    entries: tuple[Entry, ...] = ()  # those entries, as model.extra_state describes them
    # the names (tensors and entries) in the order the data file holds them, where the format
    # records it apart from the names' order (TensorFlow's index: each entry's shard and offset)
    write_order: tuple[str, ...] = ()


def _plain(value) -> bool:
    """Whether YAML carries `value` as the program holds it (tuples come back as lists: close)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _entry(name: str, value) -> Entry:
    if _plain(value):
        return Entry(name, value)
    return Entry(name, blob=len(pickle.dumps(value, protocol=2)))  # torch.save's pickle protocol


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
    tensors, entries, *order = reader(path)
    return TensorList(str(path), fmt, tuple(tensors), len(entries), tuple(entries), tuple(*order))


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
    entries: list[Entry] = []

    def holds_tensor(value) -> bool:
        if isinstance(value, torch.Tensor):
            return True
        if isinstance(value, dict):
            return any(holds_tensor(v) for v in value.values())
        return isinstance(value, (list, tuple)) and any(holds_tensor(v) for v in value)

    def walk(prefix: str, value) -> None:
        if isinstance(value, torch.Tensor):
            tensors.append(Tensor(prefix, tuple(value.shape), str(value.dtype).removeprefix("torch."), value.element_size()))
        elif not holds_tensor(value):  # a subtree with no tensor (the epoch, param_groups) is one entry
            entries.append(_entry(prefix or "state", value))
        elif isinstance(value, dict):  # a nesting level: '/' (the emulation nests the dict again)
            for key, item in value.items():
                walk(f"{prefix}/{key}" if prefix else str(key), item)
            versions = getattr(value, "_metadata", None)  # a module's state_dict(): its submodules' versions
            if prefix and isinstance(versions, dict):
                entries.append(_entry(f"{prefix}/_metadata", dict(versions)))
        else:
            for i, item in enumerate(value):
                walk(f"{prefix}/{i}" if prefix else str(i), item)

    walk("", obj)
    return tensors, entries


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
    return tensors, ()


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
    return tensors, ()


def _dcp(path: Path):
    try:
        import torch
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    except ImportError:
        raise MissingDependency(f"{path}: reading a DCP checkpoint needs PyTorch: pip install torch") from None
    metadata = FileSystemReader(str(path)).read_metadata()
    tensors, entries = [], []
    paths = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
    # in the program's state dict order, which planner_data keeps (the flattening's), not in
    # .metadata's (each rank's share in turn): DCP's planner splits replicated entries in that order
    order = {fqn: i for i, fqn in enumerate(paths)}
    listed = sorted(metadata.state_dict_metadata.items(), key=lambda item: order.get(item[0], len(order)))
    for fqn, entry in listed:
        # the key's path through the program's nested state dict (flatten_state_dict's mapping),
        # '/' between levels: DCP's flat key is the path joined with dots
        keys = paths.get(fqn)
        name = "/".join(str(key) for key in keys) if isinstance(keys, tuple) else fqn
        if isinstance(entry, TensorStorageMetadata):
            dtype = entry.properties.dtype
            element = torch.empty((), dtype=dtype).element_size()
            tensors.append(Tensor(name, tuple(entry.size), str(dtype).removeprefix("torch."), element))
        else:  # a bytes item: the planner's torch.save of the value, read back from its .distcp
            entries.append(_dcp_entry(path, fqn, name, metadata, torch))
    return tensors, entries


def _dcp_entry(path: Path, fqn: str, name: str, metadata, torch) -> Entry:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    info = (metadata.storage_data or {}).get(MetadataIndex(fqn))
    if info is None:
        return Entry(name, blob=0)
    with open(path / info.relative_path, "rb") as f:
        f.seek(info.offset)
        data = f.read(info.length)
    try:
        return _entry(name, torch.load(io.BytesIO(data), weights_only=True))
    except Exception:  # a value torch refuses to unpickle safely: its size still describes it
        return Entry(name, blob=len(data))


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
    tensors, entries = [], []
    for name in sorted(shapes):
        dtype = dtypes[name]
        if dtype == tf.string:  # the object graph and other serialized entries: blobs of their size
            entries.append(Entry(name, blob=len(reader.get_tensor(name))))
            continue
        tensors.append(Tensor(name, tuple(shapes[name]), dtype.name, dtype.size))
    return tensors, entries, _tensorflow_write_order(Path(prefix + ".index"))


def _tensorflow_write_order(index: Path) -> list[str]:
    """The bundle's keys in the order SaveV2 appended them to the data files: by (shard, offset)
    of each BundleEntryProto in the index, a leveldb table (TF writes its blocks uncompressed:
    footer -> index block -> data blocks -> entries of shared-prefix keys). The checkpoint's only
    record of the program's object-graph order, which sets the offsets the index stores as varints."""
    from tensorflow.core.protobuf import tensor_bundle_pb2

    table = index.read_bytes()
    footer = table[-48:]
    _, at = _varint(footer, 0)
    _, at = _varint(footer, at)
    offset, at = _varint(footer, at)
    size, _ = _varint(footer, at)
    placed = []
    for _, handle in _block(table, offset, size):
        block_offset, at = _varint(handle, 0)
        block_size, _ = _varint(handle, at)
        for key, value in _block(table, block_offset, block_size):
            if key:  # the empty key is the header
                entry = tensor_bundle_pb2.BundleEntryProto.FromString(value)
                placed.append((entry.shard_id, entry.offset, key.decode()))
    return [name for _, _, name in sorted(placed)]


def _block(table: bytes, offset: int, size: int) -> list[tuple[bytes, bytes]]:
    """The (key, value) entries of a leveldb table block (uncompressed: trailer type 0)."""
    if table[offset + size] != 0:
        raise UserError("a TensorFlow index with compressed blocks: its tensors' order cannot be read")
    block = table[offset:offset + size]
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end, at, key, out = len(block) - 4 - 4 * restarts, 0, b"", []
    while at < end:
        shared, at = _varint(block, at)
        unshared, at = _varint(block, at)
        length, at = _varint(block, at)
        key = key[:shared] + block[at:at + unshared]
        at += unshared
        out.append((key, block[at:at + length]))
        at += length
    return out


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at
