"""Checkpoint format specs (`checkpoint.format=`): what a plan and the loader know of a format.

A spec is pure: the file extension, the bytes a file of given tensors takes where that is
predictable, whether the writer only appends (then the engine checksums bytes as they pass),
the storage capabilities the writer needs (storage/base.py; the loader refuses a format whose
needs the backend lacks), the optional library it imports, and the layout whose names a
framework insists on. The writer of each format lives in checkpoint/formats.py as a subclass of
CheckpointFormatSpec (`writer` names it, `get_format` builds it from the spec), so plans never
import the checkpoint engine.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.registry import Registry, import_target


def npy_header(numel: int, dtype: str) -> bytes:
    """numpy's .npy header (version 1.0) of a flat array of `numel` elements."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": (numel,)})
    return buffer.getvalue()


def archive_stem(path: str) -> str:
    """The folder name torch.save(obj, path) gives its zip: the file's name without its last
    extension (PyTorchStreamWriter's constructor); checkpoint.archive_name takes the same."""
    name = path.rsplit("/", 1)[-1]
    return name[: name.rfind(".")] if "." in name else name


@dataclass(frozen=True)
class CheckpointFormatSpec:
    """One checkpoint format as plans and the loader see it (the writer subclasses this)."""

    name: str
    extension: str
    sequential: bool  # the writer only appends: checksummed as bytes pass, no read-back
    writer: str  # "module:Class" of the writer in checkpoint/formats.py
    size_rule: str = "unknown"  # "payload" (data only), "npy" (one .npy header + data), "unknown"
    requires: str | None = None  # optional library the writer imports
    write_needs: frozenset[str] = frozenset()  # storage capabilities beyond appending through a handle
    writes_paths: bool = False  # the framework opens and names its own files (by path)
    needs_layout: str | None = None  # the layout whose names the framework insists on
    # checkpoint.durability=framework: whether the framework fsyncs each data file (torch.save and
    # TensorFlow never do); None: the format has no framework of its own, checkpoint.fsync decides
    framework_fsync: bool | None = None
    # how the writer hands bytes to the storage, said in the summary beside the serialization share:
    # "zero-copy writev" (torch.save: one writev per record from the tensor's memory), "zero-copy
    # write" (the state's chunks written as they are), "copying" (the library copies every tensor)
    writer_kind: str = "zero-copy write"
    # the file's payload is one byte stream after a header whose size encoded_size predicts (raw:
    # none, npy: numpy's): where a codec's container or an evolving state can be found again
    one_stream: bool = False

    def encoded_size(self, tensors: tuple[TensorSpec, ...]) -> int | None:
        """Bytes of a file holding `tensors`, where the format makes that predictable."""
        total = sum(t.nbytes for t in tensors)
        if self.size_rule == "payload":
            return total
        if self.size_rule == "npy":
            return len(npy_header(total, "uint8")) + total
        return None


_WRITERS = "dlio_ckpt.checkpoint.formats"

# Tensors back to back: one contiguous stream per file, what O_DIRECT writes best.
RAW = CheckpointFormatSpec("raw", "bin", sequential=True, writer=f"{_WRITERS}:RawFormat", size_rule="payload",
                           one_stream=True)
# One .npy array per file: the file's tensors as one flat uint8 vector after a numpy header.
NPY = CheckpointFormatSpec("npy", "npy", sequential=True, writer=f"{_WRITERS}:NpyFormat", size_rule="npy",
                           one_stream=True)
# An uncompressed .npz, one member per tensor; zipfile streams (data descriptors) where the handle cannot seek.
NPZ = CheckpointFormatSpec("npz", "npz", sequential=False, writer=f"{_WRITERS}:NpzFormat", writer_kind="copying")
# One HDF5 dataset per tensor; HDF5 rewrites its metadata in place.
HDF5 = CheckpointFormatSpec("hdf5", "h5", sequential=False, writer=f"{_WRITERS}:Hdf5Format", requires="h5py",
                            write_needs=frozenset({"seekable_write"}), writer_kind="copying")
# torch.save of a dict of tensors with torch.save's own system calls (a std::ofstream: one writev per
# record of 1 KiB or more, no fsync, no seek): appends only, holds one file's tensors in memory.
TORCH = CheckpointFormatSpec("torch", "pt", sequential=True, writer=f"{_WRITERS}:TorchFormat", requires="torch",
                             framework_fsync=False, writer_kind="zero-copy writev")
# A real TensorFlow tensor bundle, written by TensorFlow itself: it opens, writes and renames files by path.
TENSORFLOW = CheckpointFormatSpec("tensorflow", "data", sequential=False, writer=f"{_WRITERS}:TensorflowFormat",
                                  size_rule="payload", requires="tensorflow",
                                  write_needs=frozenset({"local_paths", "atomic_rename"}), writes_paths=True,
                                  needs_layout="tensorflow", framework_fsync=False, writer_kind="copying")


CHECKPOINT_FORMATS = Registry(
    key="checkpoint.format",
    noun="format",
    entries={
        "raw": "dlio_ckpt.plan.checkpoint_formats:RAW",
        "npy": "dlio_ckpt.plan.checkpoint_formats:NPY",
        "npz": "dlio_ckpt.plan.checkpoint_formats:NPZ",
        "hdf5": "dlio_ckpt.plan.checkpoint_formats:HDF5",
        "torch": "dlio_ckpt.plan.checkpoint_formats:TORCH",
        "tensorflow": "dlio_ckpt.plan.checkpoint_formats:TENSORFLOW",
    },
    group="dlio_ckpt.checkpoint_formats",
)


# A framework that writes a format its own way under its own layout: (format, layout) -> the spec.
# torch under pytorch_dcp is DCP's FileSystemWriter: a torch.save per tensor through a Python
# BufferedWriter, zero copy for tensors larger than its buffer.
TORCH_DCP = CheckpointFormatSpec("torch", "distcp", sequential=True, writer=f"{_WRITERS}:DcpTorchFormat",
                                 requires="torch", framework_fsync=False, writer_kind="zero-copy write")
_UNDER_LAYOUT = {("torch", "pytorch_dcp"): "dlio_ckpt.plan.checkpoint_formats:TORCH_DCP"}


def format_spec(name: str, layout: str | None = None) -> CheckpointFormatSpec:
    """The spec of checkpoint format `name` (ConfigError with a close match when unknown); given
    `layout`, the spec its framework writes under that layout, where that differs."""
    spec = CHECKPOINT_FORMATS.load(name)
    under = _UNDER_LAYOUT.get((spec.name, layout))
    return CHECKPOINT_FORMATS.load(name) if under is None else _load(under)


def _load(target: str) -> CheckpointFormatSpec:
    return import_target(target)
