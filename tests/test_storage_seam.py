"""The storage seam: the POSIX commit primitive, capability checks in the loader, and whether the
formats' declared needs are true (an append-only handle is enough for every format that says so)."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pytest

from dlio_ckpt.checkpoint.formats import get_format as get_checkpoint_format
from dlio_ckpt.cli import main as cli_main
from dlio_ckpt.config.load import load_config, validate_command_line
from dlio_ckpt.config.needs import check_storage_needs
from dlio_ckpt.content import ByteSource
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.formats import FileSpec, FormatOptions, get_format, names
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.storage import BACKENDS
from dlio_ckpt.storage.base import Capabilities, StorageBackend, StorageFile
from dlio_ckpt.storage.posix import PosixStorage

NO_CAPABILITIES = Capabilities(**{f.name: False for f in fields(Capabilities)})
OBJECT_STORE = Capabilities(**{f.name: f.name in ("ranged_read", "listing") for f in fields(Capabilities)})


@dataclass(frozen=True)
class FakeStorage:
    """A backend that can do nothing; only its name and capabilities are ever used here."""

    root: str
    name = "fake"
    capabilities = NO_CAPABILITIES

    @classmethod
    def from_config(cls, config, root: str) -> "FakeStorage":
        return cls(root)

    def check(self) -> None:
        pass


@pytest.fixture
def fake_backend(monkeypatch):
    monkeypatch.setitem(BACKENDS.entries, "fake", f"{__name__}:FakeStorage")


# -- POSIX commit primitive ----------------------------------------------------------------------

def test_posix_meets_the_protocol():
    storage = PosixStorage()
    assert isinstance(storage, StorageBackend)
    assert all(getattr(storage.capabilities, f.name) for f in fields(Capabilities) if f.name != "direct_io")


def test_staged_file_appears_only_when_closed(tmp_path):
    storage = PosixStorage()
    target = tmp_path / "shard.bin"
    handle = storage.open_staged(str(target))
    assert isinstance(handle, StorageFile)
    handle.write(b"x" * 10_000)
    handle.fsync()
    assert not target.exists()
    (temporary,) = tmp_path.iterdir()
    assert temporary.name.startswith("shard.bin.tmp-") and str(os.getpid()) in temporary.name
    handle.close()
    assert [p.name for p in tmp_path.iterdir()] == ["shard.bin"] and target.read_bytes() == b"x" * 10_000


def test_staged_file_replaces_the_old_one_only_on_close(tmp_path):
    storage = PosixStorage()
    target = tmp_path / "manifest.json"
    target.write_bytes(b"old")
    handle = storage.open_staged(str(target))
    handle.write(b"new content")
    assert target.read_bytes() == b"old"
    handle.close()
    assert target.read_bytes() == b"new content"


def test_abort_and_a_dropped_handle_publish_nothing(tmp_path):
    storage = PosixStorage()
    aborted = storage.open_staged(str(tmp_path / "a"))
    aborted.write(b"partial")
    aborted.abort()
    aborted.abort()  # harmless twice
    dropped = storage.open_staged(str(tmp_path / "b"))
    dropped.write(b"partial")
    del dropped
    assert list(tmp_path.iterdir()) == []


def test_two_writers_of_one_name_never_share_a_temporary_file(tmp_path):
    storage = PosixStorage()
    first = storage.open_staged(str(tmp_path / "same"))
    second = storage.open_staged(str(tmp_path / "same"))
    first.write(b"1" * 100)
    second.write(b"2" * 50)
    assert len(list(tmp_path.iterdir())) == 2
    first.close()
    second.close()
    assert (tmp_path / "same").read_bytes() == b"2" * 50 and len(list(tmp_path.iterdir())) == 1


def test_write_atomic_read_whole_and_folder_queries(tmp_path):
    storage = PosixStorage()
    path = str(tmp_path / "sub" / "m.json")
    storage.makedirs(os.path.dirname(path))
    storage.write_atomic(path, b"{}")
    assert storage.read_whole(path) == b"{}" and storage.file_size(path) == 2
    assert storage.isdir(str(tmp_path / "sub")) and not storage.isdir(path)
    assert storage.listdir(str(tmp_path)) == ["sub"] and storage.listdir(str(tmp_path / "none")) == []
    assert storage.free_bytes(str(tmp_path / "not" / "yet")) > 0


def test_check_names_an_unusable_root(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not a folder"):
        PosixStorage(root=str(tmp_path / "file" / "below")).check()
    PosixStorage(root=str(tmp_path / "new" / "folder")).check()


# -- capabilities in the loader -------------------------------------------------------------------

TINY = ["dataset.num_files_train=2", "dataset.record_length_bytes=4KiB", "reader.batch_size=1"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["dataset.format=hdf5"], "dataset.format=hdf5 (writing the dataset) needs seekable writes"),
        (["dataset.format=npy", "checkpoint.enabled=true", "checkpoint.format=tensorflow", "checkpoint.layout=tensorflow"],
         "checkpoint.format=tensorflow needs atomic rename and files a library can open by path"),
        (["dataset.format=tfrecord", "reader.name=tensorflow"], "reader.name=tensorflow (tf.data opens the files by path) needs files"),
        (["dataset.format=raw", "storage.direct_io=true"], "storage.direct_io=true needs O_DIRECT"),
        (["dataset.format=raw", "storage.drop_caches=true"], "storage.drop_caches=true"),
    ],
)
def test_an_object_store_refuses_what_it_cannot_serve(overrides, message):
    config = load_config(TINY + overrides)
    with pytest.raises(ConfigError, match="which storage.backend=s3 does not offer") as caught:
        check_storage_needs(config, "s3", OBJECT_STORE)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["dataset.format=npy", "checkpoint.enabled=true", "checkpoint.format=raw"],
        ["dataset.format=tfrecord", "checkpoint.enabled=true", "checkpoint.format=torch"],
        ["dataset.format=indexed_binary", "checkpoint.enabled=true", "checkpoint.format=npy"],
        ["dataset.format=npz", "checkpoint.enabled=true", "checkpoint.format=npz"],  # zipfile streams on an upload
        ["dataset.format=hdf5", "generate.enabled=false"],  # reading an existing HDF5 dataset needs ranged reads only
    ],
)
def test_an_object_store_serves_append_only_formats(overrides):
    check_storage_needs(load_config(TINY + overrides), "s3", OBJECT_STORE)


@pytest.mark.parametrize("fmt", ["npz", "hdf5", "npy", "tfrecord"])
def test_posix_serves_everything(fmt, tmp_path):
    config = load_config(TINY + [f"dataset.format={fmt}", "checkpoint.enabled=true", "checkpoint.format=hdf5",
                                 "storage.drop_caches=true"])
    check_storage_needs(config, "posix", PosixStorage.capabilities)


def test_a_registered_backend_without_capabilities_is_refused_before_anything_is_written(fake_backend, tmp_path, monkeypatch, capsys):
    with pytest.raises(ConfigError, match="dataset.format=raw .* needs ranged reads, which storage.backend=fake"):
        validate_command_line(TINY + ["storage.backend=fake", "dataset.format=raw"], multirun=False)
    monkeypatch.chdir(tmp_path)
    root, run = tmp_path / "data", tmp_path / "run"
    with pytest.raises(SystemExit) as exited:
        cli_main(TINY + ["storage.backend=fake", "dataset.format=hdf5", f"storage.root={root}", f"hydra.run.dir={run}"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "dataset.format=hdf5 (writing the dataset) needs seekable writes" in error
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_backend_gets_a_close_match():
    with pytest.raises(ConfigError, match="storage.backend: unknown backend 'posx' \\(did you mean 'posix'\\?\\)"):
        load_config(["storage.backend=posx"])


# -- declared needs are true ---------------------------------------------------------------------

class AppendOnly(io.RawIOBase):
    """What an object-store upload offers: sequential writes, no seeking back."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return len(self.data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = {io.SEEK_SET: offset, io.SEEK_CUR: len(self.data) + offset, io.SEEK_END: len(self.data) + offset}[whence]
        if target != len(self.data):
            raise OSError("append-only handle: cannot seek back")
        return target

    def write(self, data) -> int:
        self.data += bytes(data)
        return len(memoryview(data).cast("B"))


@pytest.mark.parametrize("name", names())
def test_dataset_formats_that_need_no_seekable_write_write_through_an_append_only_handle(name, tmp_path):
    fmt = get_format(name)
    samples = 1 if name == "jpeg" else 3  # a JPEG file is one image
    spec = FileSpec(index=3, path=str(tmp_path / f"f.{fmt.extension}"), num_samples=samples, sample_bytes=5000)
    outputs: dict[str, AppendOnly] = {}

    def open_output(suffix: str) -> AppendOnly:
        return outputs.setdefault(suffix, AppendOnly())

    options = FormatOptions(write_chunk_bytes=4096)
    source = ByteSource(seed=1)
    if "seekable_write" in fmt.write_needs:
        with pytest.raises(Exception):  # the need is real: the writer seeks back
            fmt.write(open_output, spec, source, options)
        return
    fmt.write(open_output, spec, source, options)
    for suffix, sink in outputs.items():
        Path(spec.path + suffix).write_bytes(sink.data)
    storage = PosixStorage()
    reader = fmt.open(lambda suffix: storage.open_read(spec.path + suffix), spec, options)
    try:
        for sample in range(spec.num_samples):
            # a JPEG's sample is the whole file (its seeded bytes ride in comment segments)
            want = outputs[""].data if name == "jpeg" else source.array(spec.sample_key(sample), spec.sample_bytes).tobytes()
            assert bytes(reader.fetch(sample)) == want
    finally:
        reader.close()


@pytest.mark.parametrize("name", ["raw", "npy", "torch", "npz", "hdf5"])
def test_checkpoint_formats_that_need_no_seekable_write_write_through_an_append_only_handle(name):
    fmt = get_checkpoint_format(name)
    tensors = (TensorSpec(name="w", numel=3000, dtype_bytes=4, kind="model"),)

    def chunks(tensor):
        yield memoryview(np.arange(tensor.numel, dtype=tensor.dtype).view(np.uint8))

    sink = AppendOnly()
    if "seekable_write" in fmt.write_needs:
        with pytest.raises(Exception):
            fmt.write(sink, tensors, chunks)
        return
    fmt.write(sink, tensors, chunks)
    assert np.arange(3000, dtype="float32").tobytes() in bytes(sink.data) or name == "torch"
    if name == "npz":  # streamed with data descriptors: numpy still reads it
        with np.load(io.BytesIO(bytes(sink.data))) as archive:
            assert np.array_equal(archive["w"], np.arange(3000, dtype="float32"))
    if name == "torch":
        import torch

        state = torch.load(io.BytesIO(bytes(sink.data)))
        assert np.array_equal(state["w"].numpy(), np.arange(3000, dtype="float32"))


# -- a backend without fsync: durable when close() publishes -------------------------------------

@dataclass(frozen=True)
class PosixWithoutFsync(PosixStorage):
    """POSIX files, but declared like an object store: no fsync, durable once closed."""

    capabilities = Capabilities(**{f.name: f.name != "fsync" for f in fields(Capabilities)})


def test_a_checkpoint_write_on_a_backend_without_fsync_lasts_until_close(tmp_path):
    from dlio_ckpt.checkpoint.fileio import write_file
    from dlio_ckpt.storage.events import OP_CODE, EventRecorder, JobClock
    from dlio_ckpt.storage.traced import TracedStorage

    recorder = EventRecorder(rank=0, clock=JobClock.start())
    storage = TracedStorage(PosixWithoutFsync(), recorder).with_phase("checkpoint")
    tensors = (TensorSpec(name="w", numel=1 << 16, dtype_bytes=4, kind="model"),)

    def chunks(tensor):
        yield memoryview(np.ones(tensor.numel, dtype="float32").view(np.uint8))

    done = write_file(storage, str(tmp_path / "shard.npz"), tensors, get_checkpoint_format("npz"), chunks,
                      fsync=True, checksum="xxh3_128", chunk_bytes=1 << 16)
    events = recorder.array()
    opened = events[events["op"] == OP_CODE["open"]]["start"][0]
    closed = events[events["op"] == OP_CODE["close"]]["end"][0]
    assert done.write_s >= closed - opened  # the publish (close) is part of the write
    assert done.size == (tmp_path / "shard.npz").stat().st_size


@dataclass(frozen=True)
class BoundedRemoteStorage:
    """A backend with a known free space whose files are not on the local disk: the free-space
    check must ask it (not the local file system) whether the dataset is already there."""

    files: dict
    name = "remote"
    capabilities = OBJECT_STORE

    def free_bytes(self, path: str) -> int:
        return 0

    def read_whole(self, path: str) -> bytes:
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]


def test_the_free_space_check_reads_the_dataset_manifest_through_the_backend(tmp_path):
    import json

    from dlio_ckpt.config.space import check_free_space
    from dlio_ckpt.plan.dataset import plan_dataset

    config = load_config([f"storage.root={tmp_path / 'store'}", "workload=unet3d", "scale=tiny", "checkpoint.enabled=false"])
    plan = plan_dataset(config, get_format(config.dataset.format).extension)
    with pytest.raises(ConfigError, match="not generated yet"):
        check_free_space(config, 1, storage=BoundedRemoteStorage({}))
    generated = BoundedRemoteStorage({plan.manifest_path: json.dumps({"fingerprint": plan.fingerprint}).encode()})
    check_free_space(config, 1, storage=generated)  # nothing to write: fits in 0 bytes
    assert not (tmp_path / "store").exists()


def test_removing_a_folder_is_traced_as_one_unlink_per_file(tmp_path):
    from dlio_ckpt.storage.events import OPS, EventRecorder, JobClock
    from dlio_ckpt.storage.traced import TracedStorage

    recorder = EventRecorder(rank=0, clock=JobClock.start())
    storage = TracedStorage(PosixStorage(), recorder).with_phase("checkpoint")
    folder = tmp_path / "global_step1"
    (folder / "sub").mkdir(parents=True)
    files = [folder / "a.bin", folder / "sub" / "b.bin", folder / "sub" / "c.bin"]
    for file in files:
        file.write_bytes(b"x")
    assert storage.remove_tree(str(folder)) == sorted(map(str, files))
    assert not folder.exists()
    events = recorder.array()
    assert [OPS[op] for op in events["op"]] == ["unlink"] * 3
    assert sorted(recorder.paths[i] for i in events["file"]) == sorted(map(str, files))
