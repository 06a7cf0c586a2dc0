"""Checkpoint format writers (`checkpoint.format=`): how one file's tensors become bytes.

Each writer subclasses CheckpointFormatSpec (plan/checkpoint_formats.py: name, extension,
predictable size, `sequential`, `write_needs`, `requires`, what plans and the loader use) and is
built from its format's spec.

A format writes to a file-like object the engine opened through the traced storage, pulling each
tensor's contents chunk by chunk, so no format ever needs a whole shard in memory (torch.save and
TensorFlow's SaveV2 are the exceptions: they take whole tensors, so they hold one file's tensors at
a time).

`sequential` says whether the format only appends; the engine then checksums bytes as they pass.
Formats that seek back (zip headers, HDF5 metadata) are checksummed by reading the file back after
its fsync, outside the timed write.

A format whose framework must open and name its own files (TensorFlow's SaveV2 and
MergeV2Checkpoints take a path prefix, never a file object) says `writes_paths = True` and offers
`write_paths` (one rank's file, staged under the framework's temporary name) and `merge` (the
coordinator's step that gives the staged files their final names and writes the shared index).
The engine then records the writes the framework did on the rank's EventRecorder itself, fsyncs
the files and reads them back for the manifest's checksums through the traced storage.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os
import pathlib
import re
import sys
import zipfile
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterator

import numpy as np

from dlio_ckpt.checkpoint.framework_work import dcp_storage_setup
from dlio_ckpt.checkpoint.tf_bundle_writes import data_file_writes, table_reads, table_writes, varint_size
from dlio_ckpt.checkpoint.torch_stream import torch_stream
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.optional import require
from dlio_ckpt.plan.checkpoint_formats import CheckpointFormatSpec, archive_stem, format_spec, npy_header
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.registry import import_target

Chunks = Callable[[TensorSpec], Iterator[memoryview]]


def whole_tensor(tensor: TensorSpec, chunks: Chunks) -> np.ndarray:
    """One tensor assembled from its chunks, for libraries that only save whole tensors (read
    only: the frameworks read it). A tensor that comes as one writable piece is that piece's memory,
    not a copy: a program's tensors are in memory already, and copying pytorch_cnn's 9.8 MB state
    (fresh pages) was 5 of the 8-10 ms of CPU the emulation spent just before each save (the
    saving thread then waited longer for a core than torch.save's). The bytes may be unaligned
    for the element type (the pool's odd starts); torch and TensorFlow copy them as bytes."""
    pieces = list(chunks(tensor))
    if len(pieces) == 1 and len(pieces[0]) == tensor.nbytes and not memoryview(pieces[0]).readonly:
        return np.frombuffer(pieces[0], dtype=np.uint8).view(tensor.dtype)
    data = np.empty(tensor.nbytes, dtype=np.uint8)
    position = 0
    for piece in pieces:
        data[position : position + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
        position += len(piece)
    return data.view(tensor.dtype)


@dataclass(frozen=True)
class RawFormat(CheckpointFormatSpec):
    """Tensors back to back: one contiguous stream per file, what O_DIRECT writes best."""

    def write(self, handle: Any, tensors: tuple[TensorSpec, ...], chunks: Chunks) -> None:
        for tensor in tensors:
            for piece in chunks(tensor):
                handle.write(piece)


@dataclass(frozen=True)
class NpyFormat(CheckpointFormatSpec):
    """One .npy array per file: the file's tensors as one flat uint8 vector after a numpy header."""

    def write(self, handle: Any, tensors: tuple[TensorSpec, ...], chunks: Chunks) -> None:
        handle.write(npy_header(sum(t.nbytes for t in tensors), "uint8"))
        for tensor in tensors:
            for piece in chunks(tensor):
                handle.write(piece)


class _ZipSink(io.RawIOBase):
    """zipfile writes through this so its header rewrites stay visible to the tracer."""

    def __init__(self, handle: Any) -> None:
        super().__init__()
        self._h = handle

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._h.seekable()  # False (an object upload): zipfile streams instead of seeking back

    def write(self, data) -> int:
        return self._h.write(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        if not self.seekable():  # zipfile probes with a seek and streams when it fails
            raise io.UnsupportedOperation("append-only handle")
        return self._h.seek(offset, whence)

    def tell(self) -> int:
        return self._h.tell()

    def flush(self) -> None:
        self._h.flush()


@dataclass(frozen=True)
class NpzFormat(CheckpointFormatSpec):
    """An uncompressed .npz (zip of .npy), one member per tensor, streamed member by member."""

    def write(self, handle: Any, tensors: tuple[TensorSpec, ...], chunks: Chunks) -> None:
        with zipfile.ZipFile(_ZipSink(handle), "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            for tensor in tensors:
                with archive.open(f"{tensor.name}.npy", "w", force_zip64=True) as member:
                    member.write(npy_header(tensor.numel, tensor.dtype))
                    for piece in chunks(tensor):
                        member.write(piece)


@dataclass(frozen=True)
class Hdf5Format(CheckpointFormatSpec):
    """One HDF5 dataset per tensor (h5py over the traced file object), filled chunk by chunk."""

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


def torch_values(tensors: tuple[TensorSpec, ...], chunks: Chunks) -> Iterator[tuple[str, Any]]:
    """Each entry as the program holds it: a tensor of its recorded type and shape, or
    (model.extra_state) the entry's own value, which the format pickles as the program's."""
    import torch

    for tensor in tensors:
        if tensor.is_object:
            yield tensor.name, tensor.object_value()
            continue
        value = torch.from_numpy(whole_tensor(tensor, chunks))
        if tensor.framework_dtype != tensor.dtype:  # bfloat16: its 16-bit patterns, viewed as torch's type
            value = value.view(getattr(torch, tensor.framework_dtype))
        yield tensor.name, value.reshape(tensor.dims)


def _storage_alignment(torch: Any) -> int:
    """The alignment torch.save pads each record's data to (64 unless configured otherwise)."""
    alignment = getattr(torch.serialization, "_get_storage_alignment", None)
    return alignment() if alignment is not None else 64


def state_path(name: str) -> tuple[str | int, ...]:
    """The keys that reach a tensor in the program's nested state dict: a name's '/'-separated
    components (`state_dict/conv1.weight`: a model's state dict under 'state_dict', whose own keys
    hold dots), an all-digit component an integer key (the optimizer's state by parameter index,
    a list's index), as torch.save pickles them and DCP records them (docs/fidelity.md)."""
    # A key written in the program's code ('state_dict', 'momentum_buffer') is one shared string,
    # which pickle writes once and then refers back to (by the object's identity); a module path
    # ('layers.0.conv1.weight') is built for each dict that holds it, a new string every time
    return tuple(int(part) if part.isdigit() else part if "." in part else sys.intern(part)
                 for part in name.split("/"))


def _place(state: dict, name: str, value: Any) -> None:
    """Put `value` in the nested dict `state` at `name`'s path (state_path). An entry named
    `<path>/_metadata` is not a key but what a module's state_dict() carries: the dict at <path> is
    then an OrderedDict whose `_metadata` attribute (each submodule's version) torch.save pickles
    after its items."""
    *outer, last = state_path(name)
    parent = None
    for key in outer:
        parent, state = state, state.setdefault(key, {})
    if last == "_metadata" and parent is not None and isinstance(value, dict):
        ordered = collections.OrderedDict(state)
        ordered._metadata = collections.OrderedDict(value)
        parent[outer[-1]] = ordered  # replaces the plain dict in its place
        return
    state[last] = value


@dataclass(frozen=True)
class TorchFormat(CheckpointFormatSpec):
    """torch.save of a dict of tensors, issuing the system calls torch.save(state, path) issues.

    torch.save into a path writes through a C++ std::ofstream; given our FilebufStream (filebuf.py)
    instead, torch's own writer produces the same bytes (a valid torch.save file: torch.load reads
    it) and the stream issues the same calls: one writev per tensor record of 1 KiB or more, straight
    from the tensor's memory, and one write at the end. torch names the zip's folder `archive/` for
    a stream and after the file for a path; the records are renamed as a path's (below).

    `prepare` builds the state dict (one file's tensors in memory) before the file is opened: a
    training program has its tensors in memory already, so assembling them from the emulated state
    is not part of its save and not timed.

    The zip's folder is named as torch.save(state, path) names it, after the file
    (torch_archive.py), or `archive_name` (checkpoint.archive_name: the program's file's name).
    """

    archive_name: str = ""

    def prepare(self, tensors: tuple[TensorSpec, ...], chunks: Chunks) -> dict:
        import torch

        state: dict = {}
        for name, value in torch_values(tensors, chunks):
            _place(state, name, value)
        return state

    def write_prepared(self, handle: Any, state: dict) -> None:
        import torch

        path = getattr(handle, "path", "")  # torch.save(obj, path) names the zip's folder after the file
        name = self.archive_name or (archive_stem(path) if path else "")
        torch.save(state, torch_stream(handle, name, _storage_alignment(torch)))  # ends with its flush(): the ofstream's close

    def write(self, handle: Any, tensors: tuple[TensorSpec, ...], chunks: Chunks) -> None:
        self.write_prepared(handle, self.prepare(tensors, chunks))


class _RawHandle(io.RawIOBase):
    """A traced handle as the raw file under an io.BufferedWriter (what Python's open() builds)."""

    def __init__(self, handle: Any) -> None:
        super().__init__()
        self._h = handle
        self._write = getattr(handle, "write_stream", handle.write)  # write(2), as a file's raw layer issues

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return self._write(data)

    def tell(self) -> int:
        return self._h.tell()


@dataclass(frozen=True)
class DcpTorchFormat(TorchFormat):
    """torch.distributed.checkpoint's FileSystemWriter: the `torch` format under the pytorch_dcp layout.

    DCP opens each `.distcp` file with Python's open(path, "wb") (an io.BufferedWriter of the file's
    block size) and, for each tensor in its plan, runs torch.save(tensor, stream) (a whole zip
    container per tensor) and flushes the buffer (`_write_item` closes the NoCloseWriter around
    the stream, which flushes it); then it fsyncs the file (the layout's `data_fsync`). The same
    objects are used here, so the calls are CPython's BufferedWriter's: small pieces buffered, a
    tensor's bytes larger than the buffer written straight from its memory, one flush per tensor.
    """

    def prepare(self, tensors: tuple[TensorSpec, ...], chunks: Chunks) -> dict:
        """The flat state (DCP's planner flattens the nested dict: one item per name)."""
        return dict(torch_values(tensors, chunks))

    def preload(self) -> None:
        """Import DCP's modules now, before training starts its clock: a DCP program imports
        torch.distributed.checkpoint at its start, so the first save must not pay that import
        (measured: ~1 s of a tiny run's first save on two busy cores, the other rank waiting)."""
        import torch.distributed.checkpoint.filesystem  # noqa: F401
        import torch.distributed.checkpoint.metadata  # noqa: F401

    def storage_setup(self, checkpoint_id: str) -> None:
        """dcp.save's storage writer chosen for `checkpoint_id`, before planning (framework_work.py)."""
        dcp_storage_setup(checkpoint_id)

    def exchange_plans(self, world: Any, held: tuple[TensorSpec, ...]) -> None:
        """dcp.save's planning, which happens inside the save, before any write: every rank makes
        its local SavePlan (a WriteItem per tensor and bytes item it holds), the plans are gathered
        to the coordinator (pickled, as gather_object sends them), the coordinator runs the default
        planner's global step (dedup_save_plans over the replicas, the global Metadata) and the
        storage writer's prefixes, and scatters each rank its plan. The emulation knows the outcome
        ahead (layouts.dcp_assignment), so the global plans are dropped; what is emulated is the
        exchange and the coordinator's work, with DCP's own objects and sizes. (The write results'
        gather and the broadcast after `.metadata` are the engine's commit, as before.)"""
        import pickle

        import torch
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
        from torch.distributed.checkpoint.filesystem import _StoragePrefix
        from torch.distributed.checkpoint.planner import SavePlan
        from torch.distributed.checkpoint.planner_helpers import (_create_write_item_for_bytesio,
                                                                  _create_write_item_for_tensor)

        items = []
        for tensor in held:  # meta tensors: a plan needs sizes and types, never the data
            if tensor.is_object:
                items.append(_create_write_item_for_bytesio(tensor.name, None))
            else:
                meta = torch.empty(tensor.dims, dtype=getattr(torch, tensor.framework_dtype), device="meta")
                items.append(_create_write_item_for_tensor(tensor.name, meta))
        local = SavePlan(items, planner_data={t.name: (t.name,) for t in held})
        gathered = world.gather(pickle.dumps(local))
        plans = None
        if world.is_root:
            planner = DefaultSavePlanner()
            global_plans, _ = planner.create_global_plan([pickle.loads(data) for data in gathered])
            plans = [pickle.dumps(dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{i}_")))
                     for i, plan in enumerate(global_plans)]
        pickle.loads(world.scatter(plans))

    def write_prepared(self, handle: Any, state: dict) -> None:
        import torch

        raw = _RawHandle(handle)
        fileno = getattr(handle, "fileno", None)
        try:
            block = os.fstat(fileno()).st_blksize if fileno is not None else io.DEFAULT_BUFFER_SIZE
        except (OSError, io.UnsupportedOperation):
            block = io.DEFAULT_BUFFER_SIZE
        stream = io.BufferedWriter(raw, buffer_size=block if block > 1 else io.DEFAULT_BUFFER_SIZE)
        records = []
        # FileSystemWriter writes a file's bytes items first (each non-tensor entry torch.save'd into
        # a BytesIO by the planner's transform_object, then written as one piece), then its tensors
        leaves = list(state.items())
        objects = [(name, value) for name, value in leaves if not isinstance(value, torch.Tensor)]
        for name, value in objects + [(name, value) for name, value in leaves if isinstance(value, torch.Tensor)]:
            start = stream.tell()
            if isinstance(value, torch.Tensor):
                torch.save(value, stream)
            else:
                pickled = io.BytesIO()
                torch.save(value, pickled)
                stream.write(pickled.getbuffer())
            stream.flush()
            records.append((name, start, stream.tell() - start))
        stream.detach()  # the engine closes (and fsyncs) the file itself
        return tuple(records)

    def coordinator_content(self, files: list[dict], tensors: dict[str, tuple[TensorSpec, ...]], folder: str) -> bytes:
        """DCP's `.metadata`: the pickled Metadata FileSystemWriter.finish writes, from every
        rank's records (tensor, offset, length in its `.distcp`), so that
        torch.distributed.checkpoint.load reads the checkpoint back. `tensors`: each file's planned
        tensors by path; `folder`: the checkpoint's folder (DCP's checkpoint_id)."""
        import pickle
        import uuid

        import torch
        from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo
        from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                           MetadataIndex, StorageMeta, TensorProperties,
                                                           TensorStorageMetadata)

        # A name saved by several ranks (the tensor-parallel shards of one weight) is one tensor
        # of several chunks, one after another in rank order, as DCP records a sharded tensor.
        # In the order of each rank's plan (its entries as the state dict lists them, not as the
        # file holds them: bytes items first), rank after rank, as DCP's global metadata is built
        chunks: dict[str, list] = {}
        for entry in files:
            where = {name: (offset, length) for name, offset, length in entry.get("records", ())}
            for spec in tensors[entry["path"]]:
                if spec.name in where:
                    chunks.setdefault(spec.name, []).append((spec, entry["path"], *where[spec.name]))
        # Each flat key is one string object in the plan of the rank that writes it. With several
        # ranks the plans reach the coordinator pickled (gather_object), so every rank's keys are
        # its own copies: planner_data's keys are the last rank's (DCP merges the plans' mappings
        # with a ChainMap, whose keys come from the last map), and storage_data's are the copies in
        # the write results, gathered after the writes. Pickle writes a string object once, then
        # refers back to it, so which keys are one object is bytes of the .metadata.
        fqns = {name: _fqn(name) for name in chunks}
        single = len(files) <= 1  # one process: nothing is pickled on the way, every key one object
        last = files[-1]["path"] if files else ""

        def copy(key: str) -> str:
            return key if single else key.encode().decode()

        planner_keys = {name: fqn if single or parts[0][1] == last else copy(fqn)
                        for (name, parts), fqn in zip(chunks.items(), fqns.values())}
        state, storage = {}, {}
        for name, parts in chunks.items():
            fqn = fqns[name]
            spec, path, offset, length = parts[0]
            if spec.is_object:  # a bytes item: described by name only, its one piece where it was written
                state[fqn] = BytesStorageMetadata()
                storage[MetadataIndex(copy(fqn))] = _StorageInfo(path, offset, length)
                continue
            if len(parts) == 1:  # a whole tensor: its own shape, one chunk at the origin
                dims = spec.dims
                storage[MetadataIndex(copy(fqn), torch.Size([0] * len(dims)), 0)] = _StorageInfo(path, offset, length)
                pieces = [ChunkStorageMetadata(torch.Size([0] * len(dims)), torch.Size(dims))]
            else:  # tensor-parallel parts: flat chunks one after another
                at, pieces = 0, []
                for spec, path, offset, length in parts:
                    pieces.append(ChunkStorageMetadata(torch.Size([at]), torch.Size([spec.numel])))
                    storage[MetadataIndex(copy(fqn), torch.Size([at]), 0)] = _StorageInfo(path, offset, length)
                    at += spec.numel
                dims = (at,)
            dtype = getattr(torch, parts[0][0].framework_dtype)
            state[fqn] = TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(dims), pieces)
        # planner_data: each flat key's path through the nested state dict (flatten_state_dict's
        # mapping: the name's '/'-separated components, state_path)
        paths = {planner_keys[name]: state_path(name) for name in chunks}
        # FileSystemWriter keeps its checkpoint_id as a pathlib.Path, and pickles it so
        metadata = Metadata(state_dict_metadata=state, planner_data=paths, storage_data=storage,
                            storage_meta=StorageMeta(checkpoint_id=pathlib.Path(folder), save_id=str(uuid.uuid4())),
                            version=CURRENT_DCP_VERSION)
        return pickle.dumps(metadata)


def _fqn(name: str) -> str:
    """DCP's flat key of a nested entry: its path's keys joined with dots (flatten_state_dict)."""
    return ".".join(str(key) for key in state_path(name))


@dataclass(frozen=True)
class StagedFiles:
    """What a path-writing format wrote for one planned file, before the coordinator's merge."""

    data: str  # holds the tensor bytes; renamed to the planned name by `merge`
    others: tuple[str, ...]  # framework metadata written beside it (deleted or merged later)
    # the framework's write calls per file where known: (path, ((offset, length), ...)) pairs, worked
    # out when called, so that the engine does it after timing the framework's call, not inside it
    writes: Callable[[], tuple] = tuple


@dataclass(frozen=True)
class MergedFiles:
    """What the coordinator's merge did: renames (staged -> final), files it wrote and deleted."""

    renamed: tuple[tuple[str, str], ...]
    written: tuple[str, ...]  # the merged index, to be fsynced and listed in the manifest
    removed: tuple[str, ...]
    writes: Callable[[], tuple] = tuple  # as StagedFiles.writes
    # ((path, ((offset, length), ...)), ...): the read calls the merge made to each file it read
    # (TF's table reader on each staged index), worked out when called, as `writes`
    reads: Callable[[], tuple] = tuple


_TF_DATA = re.compile(r"^(?P<prefix>.+)\.data-(?P<shard>\d{5})-of-(?P<shards>\d{5})$")


@dataclass(frozen=True)
class TensorflowFormat(CheckpointFormatSpec):
    """A real TensorFlow checkpoint (tensor bundle: `.index` table + `.data` shards), written by TF.

    It is written the way TF's own MultiDeviceSaver shards a checkpoint, so the storage sees TF's
    real file operations: every rank saves its tensors with SaveV2 to a temporary prefix
    `<prefix>_temp/part-0000k-of-0000K` (one data file plus a small index), and after every rank
    is done the coordinator runs MergeV2Checkpoints, which renames the data files to
    `<prefix>.data-0000k-of-0000K`, merges the indexes into `<prefix>.index` and deletes the
    temporary folder. `tf.train.load_checkpoint(prefix)` then reads every tensor back bit for bit.

    SaveV2 takes whole tensors, so a rank holds one file's tensors in memory at a time (as
    torch.save does); the data files hold exactly the payload bytes, so only the index and the
    staged indexes add to it. Needs the `tensorflow` layout, whose names are TF's.
    """

    @staticmethod
    def variable_name(owner: int, tensor: TensorSpec, shards: int = 2) -> str:
        """Ranks hold tensors of the same name (optimizer states, ZeRO partitions); one bundle
        needs unique keys, so the owning rank leads the key, as a per-device scope would. A bundle
        of one shard (one rank's names, unique) keeps the names as given: the program's own keys."""
        return tensor.name if shards == 1 else f"rank_{owner:05d}/{tensor.name}"

    @staticmethod
    def _parse(data_path: str) -> re.Match:
        match = _TF_DATA.match(data_path)
        if match is None:
            raise ConfigError(f"checkpoint.format=tensorflow: '{os.path.basename(data_path)}' is not a TensorFlow "
                              "data file name; use checkpoint.layout=tensorflow")
        return match

    def staging_prefix(self, data_path: str) -> str:
        """TF's temporary per-shard prefix for the planned data file (MultiDeviceSaver's naming)."""
        m = self._parse(data_path)
        return f"{m['prefix']}_temp/part-{m['shard']}-of-{m['shards']}"

    def write_paths(self, data_path: str, owner: int, tensors: tuple[TensorSpec, ...], chunks: Chunks) -> StagedFiles:
        """SaveV2 this file's tensors under the staging prefix; the merge gives them `data_path`.
        Says the write calls TF made to the data file and the index (tf_bundle_writes.py)."""
        tf = require("tensorflow")
        prefix = self.staging_prefix(data_path)
        values = []
        for tensor in tensors:  # one numpy buffer at a time; TF keeps its own copy of each
            if tensor.is_object:  # model.extra_state: a string tensor (the object graph's serialized proto)
                values.append(_object_value(tf, tensor))
                continue
            value = tf.constant(whole_tensor(tensor, chunks).reshape(tensor.dims))  # the shape TF's index records
            if tensor.framework_dtype != tensor.dtype:  # bfloat16: its 16-bit patterns, as TF's type
                value = tf.bitcast(value, getattr(tf, tensor.framework_dtype))
            values.append(value)
        names = self._keys(owner, tensors, int(self._parse(data_path)["shards"]))
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(tensors), tensors=values)
        data, index = f"{prefix}.data-00000-of-00001", f"{prefix}.index"

        def writes() -> tuple:
            entries, size = _bundle_entries(tf, [(names, values)])
            return (data, tuple(data_file_writes(size))), (index, tuple(table_writes(entries)))

        return StagedFiles(data=data, others=(index,), writes=writes)

    def _keys(self, owner: int, tensors: tuple[TensorSpec, ...], shards: int) -> list[str]:
        """The bundle's keys of one rank's tensors, in SaveV2's order."""
        return [t.name if t.is_object else self.variable_name(owner, t, shards) for t in tensors]

    def merge(self, data_paths: list[str], tensors: dict | None = None) -> MergedFiles:
        """MergeV2Checkpoints the staged shards into `<prefix>.index` + `<prefix>.data-*` files.
        `tensors` (data path -> (owner, its tensors)) tells the merged index's write calls."""
        tf = require("tensorflow")
        parsed = sorted((self._parse(p) for p in data_paths), key=lambda m: int(m["shard"]))
        prefixes = {m["prefix"] for m in parsed}
        shards = [int(m["shard"]) for m in parsed]
        if len(prefixes) != 1 or shards != list(range(len(parsed))) or any(int(m["shards"]) != len(parsed) for m in parsed):
            raise ValueError(f"TensorFlow shards do not form one complete bundle: {sorted(data_paths)}")
        prefix = prefixes.pop()
        staged = [self.staging_prefix(m.string) for m in parsed]
        tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=staged, destination_prefix=prefix, delete_old_dirs=True)

        def bundle() -> list | None:
            if tensors is None or not all(m.string in tensors for m in parsed):
                return None
            return [(self._keys(owner, held, len(parsed)), [_object_value(tf, t) if t.is_object else t for t in held])
                    for owner, held in (tensors[m.string] for m in parsed)]

        def writes() -> tuple:
            shards = bundle()
            return () if shards is None else ((f"{prefix}.index", tuple(table_writes(_bundle_entries(tf, shards)[0]))),)

        def reads() -> tuple:  # each staged index is a bundle of its own shard, as SaveV2 wrote it
            shards = bundle()
            return () if shards is None else tuple((f"{s}.index", tuple(table_reads(_bundle_entries(tf, [shard])[0])))
                                                   for s, shard in zip(staged, shards))

        return MergedFiles(renamed=tuple((f"{s}.data-00000-of-00001", m.string) for s, m in zip(staged, parsed)),
                           written=(f"{prefix}.index",), removed=tuple(f"{s}.index" for s in staged), writes=writes,
                           reads=reads)


def _object_value(tf: Any, tensor: TensorSpec) -> Any:
    """A non-tensor entry as SaveV2 is given it: a TF constant of its value."""
    return tf.constant(tensor.object_value())


def _bundle_entries(tf: Any, shards: list[tuple[list[str], list]]) -> tuple[list[tuple[bytes, int]], int]:
    """The index entries (key, length of its serialized value), in key order, of a bundle of
    `shards` (per shard: its keys and its values, TF tensors or TensorSpecs, in the order SaveV2
    appended them), as BundleWriter and MergeV2Checkpoints write them: the header (a
    BundleHeaderProto) under the empty key, then a BundleEntryProto per tensor (its dtype, shape,
    shard, offset and size in its data file, and its masked CRC32C: a fixed32, 4 bytes whatever its
    value). Also the last shard's data file size."""
    from tensorflow.core.framework import versions_pb2
    from tensorflow.core.protobuf import tensor_bundle_pb2

    header = tensor_bundle_pb2.BundleHeaderProto(num_shards=len(shards), version=versions_pb2.VersionDef(producer=1))
    entries = [(b"", header.ByteSize())]
    offset = 0
    for shard, (names, values) in enumerate(shards):
        offset = 0
        for name, value in zip(names, values):
            dtype, shape, size = _stored(tf, value)
            entry = tensor_bundle_pb2.BundleEntryProto(dtype=dtype, shape=shape, shard_id=shard, offset=offset,
                                                       size=size, crc32c=1)
            entries.append((name.encode(), entry.ByteSize()))
            offset += size
    return sorted(entries), offset


def _stored(tf: Any, value: Any) -> tuple[int, Any, int]:
    """(dtype enum, TensorShapeProto, bytes in the data file) of a value SaveV2 is given: a
    TensorSpec's bytes as they are; a TF tensor's elements, a string tensor's as BundleWriter
    writes it (a varint length per element, a 4-byte CRC32C of the lengths, the elements' bytes)."""
    if isinstance(value, TensorSpec):
        return tf.as_dtype(value.framework_dtype).as_datatype_enum, tf.TensorShape(value.dims).as_proto(), value.nbytes
    if value.dtype == tf.string:
        items = tf.reshape(value, [-1]).numpy()
        size = sum(varint_size(len(item)) + len(item) for item in items) + 4
    else:
        size = value.dtype.size * value.shape.num_elements()
    return value.dtype.as_datatype_enum, value.shape.as_proto(), size


def get_format(name: str, layout: str | None = None):
    """The writer of checkpoint format `name` (its spec's `writer`; under `layout`, the one its
    framework uses there: torch under pytorch_dcp is DCP's writer), its optional library checked."""
    spec = format_spec(name, layout)
    fmt = import_target(spec.writer)(**{field.name: getattr(spec, field.name) for field in fields(spec)})
    if fmt.requires:
        require(fmt.requires)
    preload = getattr(fmt, "preload", None)
    if preload is not None:  # the framework's modules its program imports at start (not timed in a save)
        preload()
    return fmt
