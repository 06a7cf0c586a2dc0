"""The checkpoint engine's parts (dlio_ckpt/checkpoint/, one section per module), each on its
own, without MPI: real files in a temporary folder, bytes read back, exact counts and order of
what each part did.

The engine as a whole, with every strategy, layout and format, is tested in
test_checkpoint_engine.py and test_commit_durability.py; these pin each part's own contract.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
import xxhash

from syscall_order import record_calls

from dlio_ckpt.checkpoint.commit import Committer
from dlio_ckpt.checkpoint.encoded import Payload
from dlio_ckpt.checkpoint.folders import CheckpointFolders
from dlio_ckpt.checkpoint.formats import get_format
from dlio_ckpt.checkpoint.manifest import encode_manifest, parse_manifest
from dlio_ckpt.checkpoint.metadata import (CheckpointIdentity, content_digest, coordinator_content, manifest_fields,
                                           metadata_entry, without_records)
from dlio_ckpt.checkpoint.publish import Publisher
from dlio_ckpt.checkpoint.restore import CheckpointReader
from dlio_ckpt.checkpoint.restore_plan import candidates, chain_length, planned_file, reads_entry, same_file, state_key
from dlio_ckpt.checkpoint.retention import Retention, doomed, kept_steps
from dlio_ckpt.checkpoint.write_plan import plan_write
from dlio_ckpt.checkpoint.writer import CheckpointWriter
from dlio_ckpt.errors import RunFailure
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME, PlannedFile
from dlio_ckpt.plan.layouts import get_layout
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.storage.events import OPS, EventRecorder, JobClock
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.traced import TracedStorage
from dlio_ckpt.world import World

RAW = get_layout("raw")


def traced(root: Path) -> TracedStorage:
    """A POSIX backend rooted at `root`, every operation recorded (phase "checkpoint")."""
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    return TracedStorage(PosixStorage(direct_io=False, root=str(root)), recorder, "checkpoint")


def calls(storage: TracedStorage, since: int = 0) -> list[tuple[str, str]]:
    """(operation, path) of every event recorded, in order."""
    recorder = storage.recorder
    return [(OPS[e["op"]], recorder.paths[e["file"]]) for e in recorder.array()[since:]]


def manifest_bytes(step: int, index: int, files: list[tuple[str, bytes]], chain: list[list[int]] | None = None) -> bytes:
    """A valid manifest (xxh3_128) of `files` (name, contents), written independently of the engine."""
    entries = [{"path": name, "size": len(data), "checksum": xxhash.xxh3_128(data).hexdigest(), "owner": 0, "writer": 0}
               for name, data in files]
    fields = {"index": index, "step": step, "epoch": 1, "run_id": "r", "strategy": "sharded", "layout": "raw",
              "format": "raw", "checksum": "xxh3_128", "world_size": 1,
              "data_bytes": sum(len(d) for _, d in files), "files": entries, "written_at": 1.0}
    if chain:
        fields.update(encoding="incremental", chain=chain)
    return encode_manifest(fields)


def committed(root: Path, step: int, index: int = 0, chain: list[list[int]] | None = None,
              data: bytes = b"0123456789") -> Path:
    """A complete raw checkpoint folder of one file, its manifest written last."""
    folder = root / RAW.folder(step)
    folder.mkdir(parents=True)
    (folder / "rank_00000.raw").write_bytes(data)
    (folder / MANIFEST_NAME).write_bytes(manifest_bytes(step, index, [("rank_00000.raw", data)], chain))
    return folder


# folders.py ---------------------------------------------------------------------------------------
def test_listing_names_only_checkpoint_folders_oldest_first_with_whether_each_is_complete(tmp_path):
    committed(tmp_path, 12)
    (tmp_path / RAW.folder(3)).mkdir()  # torn: data, no manifest
    (tmp_path / "notes").mkdir()
    (tmp_path / RAW.folder(7)).write_bytes(b"a file named like a checkpoint")
    folders = CheckpointFolders(str(tmp_path), RAW, traced(tmp_path))
    assert folders.listing() == [(3, "step_00000003", False), (12, "step_00000012", True)]
    assert folders.path(12) == str(tmp_path / "step_00000012")


def test_a_flat_checkpoint_is_removed_file_by_file_as_checkpoint_manager_removes_it(tmp_path):
    """TensorFlow's own layout (durability=framework): checkpoints lie side by side in the root.
    Removing checkpoint 1 unlinks its index, then its data files (TF's remove_checkpoint), and a
    staging folder a failed save left; never ckpt-10's files, the state file, or a link's target."""
    tf_layout = get_layout("tensorflow")
    elsewhere = tmp_path / "elsewhere"
    root = tmp_path / "root"
    for folder in (root / "ckpt-1_temp", elsewhere):
        folder.mkdir(parents=True)
    names = ["ckpt-1.index", "ckpt-1.data-00000-of-00002", "ckpt-1.data-00001-of-00002", "ckpt-10.index",
             "ckpt-10.data-00000-of-00001", "checkpoint", "ckpt-1_temp/part-00000-of-00001.index"]
    for name in names:
        (root / name).write_bytes(b"x")
    (elsewhere / "kept").write_bytes(b"y")
    os.symlink(elsewhere / "kept", root / "ckpt-1.data-00002-of-00002")  # a link named like its data: not ours
    storage = traced(tmp_path)
    folders = CheckpointFolders(str(root), tf_layout, storage, flat=True)
    assert folders.path(1) == str(root)
    folders.remove(1)
    assert sorted(os.listdir(root)) == ["checkpoint", "ckpt-1.data-00002-of-00002", "ckpt-10.data-00000-of-00001",
                                        "ckpt-10.index"]
    assert (elsewhere / "kept").read_bytes() == b"y"
    unlinked = [os.path.basename(path) for op, path in calls(storage) if op == "unlink"]
    assert unlinked[:3] == ["ckpt-1.index", "ckpt-1.data-00000-of-00002", "ckpt-1.data-00001-of-00002"]
    # a failed save's leftovers go the same way (no manifest in the framework's layout)
    (root / "ckpt-2.index").write_bytes(b"x")
    folders.discard_failed(2)
    assert not (root / "ckpt-2.index").exists() and (root / "checkpoint").exists()


def test_own_refuses_a_link_and_a_name_that_leaves_the_root(tmp_path):
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "step_00000001").mkdir()
    os.symlink(elsewhere, root / "step_00000002")
    folders = CheckpointFolders(str(root), RAW, traced(tmp_path))
    assert folders.own("step_00000001") == str(root / "step_00000001")
    assert folders.own("step_00000002") is None
    assert folders.own("../elsewhere") is None


def test_read_manifest_says_why_a_checkpoint_is_rejected(tmp_path):
    good = committed(tmp_path, 1)
    torn = tmp_path / RAW.folder(2)
    torn.mkdir()
    damaged = committed(tmp_path, 3)
    raw = bytearray((damaged / MANIFEST_NAME).read_bytes())
    raw[raw.index(b'"epoch": 1') + 9] = ord("2")  # still JSON, no longer what its digest covers
    (damaged / MANIFEST_NAME).write_bytes(bytes(raw))
    folders = CheckpointFolders(str(tmp_path), RAW, traced(tmp_path))
    manifest = folders.read_manifest(str(good), 1)
    assert manifest["files"][0]["size"] == 10 and manifest["step"] == 1
    assert folders.read_manifest(str(torn), 2).startswith("torn: no manifest")
    assert folders.read_manifest(str(damaged), 3) == \
        "manifest altered or damaged: its manifest_sha256 does not match its contents"
    assert folders.read_manifest(str(good), 5) == "manifest is for step 1, not for this folder's step 5"


def test_discard_failed_removes_only_an_uncommitted_folder_and_its_tag_temporary(tmp_path):
    deepspeed = get_layout("deepspeed")
    kept = tmp_path / "global_step1"
    kept.mkdir()
    (kept / "x.pt").write_bytes(b"x")
    (kept / MANIFEST_NAME).write_bytes(b"{}")
    failed = tmp_path / "global_step2"
    (failed / "sub").mkdir(parents=True)
    (failed / "sub" / "y.pt").write_bytes(b"y")
    (tmp_path / "latest.tmp.123").write_bytes(b"global_step2")
    (tmp_path / "latest").write_bytes(b"global_step1")
    folders = CheckpointFolders(str(tmp_path), deepspeed, traced(tmp_path))
    folders.discard_failed(1)  # committed: stays
    folders.discard_failed(2)
    assert sorted(os.listdir(tmp_path)) == ["global_step1", "latest"]
    assert sorted(os.listdir(kept)) == [MANIFEST_NAME, "x.pt"]


# retention.py ----------------------------------------------------------------------------------
def test_doomed_keeps_the_newest_complete_ones_and_the_steps_their_chains_need():
    found = [(1, "a", True), (2, "b", False), (3, "c", True), (4, "d", True), (5, "e", False)]
    assert doomed(found, 2, set()) == ["a", "b"]
    assert doomed(found, 2, {1}) == ["b"]
    assert doomed(found, 3, set()) == []
    assert kept_steps(found, 2) == [3, 4]
    assert kept_steps(found, 3) == []


def test_retention_deletes_old_folders_but_not_a_chain_link_nor_through_a_link(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "keep.bin").write_bytes(b"not ours")
    os.symlink(outside, root / RAW.folder(0))
    committed(root, 1, index=0)
    committed(root, 2, index=1)
    committed(root, 3, index=2)
    committed(root, 4, index=3, chain=[[0, 1], [3, 4]])  # an encoded checkpoint built on step 1's
    (root / RAW.folder(2) / MANIFEST_NAME).unlink()  # step 2 torn
    storage = traced(tmp_path)
    retention = Retention(CheckpointFolders(str(root), RAW, storage), keep_last=2)
    assert retention.chain_steps([3, 4]) == {1, 4}
    assert retention.apply() == ["step_00000002"]
    assert sorted(os.listdir(root)) == ["step_00000000", "step_00000001", "step_00000003", "step_00000004"]
    assert (outside / "keep.bin").read_bytes() == b"not ours"
    unlinked = [path for op, path in calls(storage) if op == "unlink"]
    assert unlinked == [str(root / "step_00000002" / "rank_00000.raw")]
    assert retention.apply() == []


def test_framework_retention_rotates_the_checkpoints_written_without_reading_manifests(tmp_path):
    storage = traced(tmp_path)
    retention = Retention(CheckpointFolders(str(tmp_path), RAW, storage), keep_last=2)
    for step in (10, 20, 30):
        (tmp_path / RAW.folder(step)).mkdir()
        (tmp_path / RAW.folder(step) / "rank_00000.raw").write_bytes(b"abc")
        retention.framework_written(step)
    assert sorted(os.listdir(tmp_path)) == ["step_00000020", "step_00000030"]
    assert [op for op, _ in calls(storage)] == ["unlink"]


# write_plan.py ---------------------------------------------------------------------------------
def test_write_plan_names_every_path_and_each_folder_before_its_first_file():
    files = (PlannedFile("a/x_{step}.bin", 0, ()), PlannedFile("a/y.bin", 1, ()),
             PlannedFile("b/z.bin", 1, ()), PlannedFile("top.bin", 2, ()))
    plan = plan_write("/ck/step_7", 7, files)
    assert [f.relpath for f in plan.files] == ["a/x_7.bin", "a/y.bin", "b/z.bin", "top.bin"]
    assert plan.paths == ("/ck/step_7/a/x_7.bin", "/ck/step_7/a/y.bin", "/ck/step_7/b/z.bin", "/ck/step_7/top.bin")
    assert [f.makes_folder for f in plan.files] == ["/ck/step_7/a", None, "/ck/step_7/b", "/ck/step_7"]
    assert [f.planned for f in plan.files] == list(files) and plan.step == 7
    assert plan_write("/ck/step_7", 7, ()).files == ()


# writer.py -------------------------------------------------------------------------------------
def _tensors(count: int) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(f"t{i}", 1000 + i, 4, "model") for i in range(count))


def _payload_of(contents: dict[str, bytes], fail_on: str | None = None):
    """Each tensor's bytes from `contents` (by tensor name), in 1,000-byte chunks; ENOSPC at `fail_on`."""
    def payload_for(pf: PlannedFile) -> Payload:
        def chunks(tensor: TensorSpec):
            data = memoryview(contents[tensor.name])
            for at in range(0, len(data), 1000):
                if tensor.name == fail_on and at:
                    raise OSError(errno.ENOSPC, "No space left on device")
                yield data[at:at + 1000]
        return Payload(pf.tensors, chunks)
    return payload_for


def test_writer_writes_each_file_whole_fsynced_and_describes_it_for_the_manifest(tmp_path):
    tensors = _tensors(3)
    rng = np.random.default_rng(5)
    contents = {t.name: rng.integers(0, 256, t.nbytes, dtype=np.uint8).tobytes() for t in tensors}
    files = (PlannedFile("sub/rank_00002.raw", 2, tensors[:2]), PlannedFile("rank_00003.raw", 3, tensors[2:]))
    storage = traced(tmp_path)
    writer = CheckpointWriter(storage, get_format("raw", "raw"), rank=1, data_fsync=True, checksum="xxh3_128",
                              chunk_bytes=1 << 16, framework_writes=False)
    folder = tmp_path / "step_00000004"
    entries = writer.write(plan_write(str(folder), 4, files), _payload_of(contents))
    first = contents["t0"] + contents["t1"]
    assert (folder / "sub" / "rank_00002.raw").read_bytes() == first
    assert (folder / "rank_00003.raw").read_bytes() == contents["t2"]
    assert [(e.path, e.size, e.owner, e.writer) for e in entries] == \
        [("sub/rank_00002.raw", len(first), 2, 1), ("rank_00003.raw", 4008, 3, 1)]
    assert entries[0].checksum == xxhash.xxh3_128(first).hexdigest()
    assert entries[1].checksum == xxhash.xxh3_128(contents["t2"]).hexdigest()
    assert [e.bytes_written for e in entries] == [len(first), 4008]
    counts = storage.recorder.op_counts
    assert counts[("checkpoint", "fsync")] == 2 and counts[("checkpoint", "open")] == 2
    assert counts[("checkpoint", "write")] == 4 + 5 + 5  # 4000, 4004 and 4008 bytes, one write per 1,000-byte chunk


def test_writer_without_fsync_issues_none(tmp_path):
    tensors = _tensors(1)
    storage = traced(tmp_path)
    writer = CheckpointWriter(storage, get_format("raw", "raw"), 0, False, "none", 1 << 16, False)
    entries = writer.write(plan_write(str(tmp_path / "s"), 1, (PlannedFile("r.raw", 0, tensors),)),
                           _payload_of({"t0": bytes(4000)}))
    assert entries[0].checksum == "" and entries[0].size == 4000
    assert ("checkpoint", "fsync") not in storage.recorder.op_counts


def test_a_failed_write_removes_every_file_started_and_names_the_file(tmp_path):
    tensors = _tensors(2)
    contents = {t.name: bytes(t.nbytes) for t in tensors}
    files = (PlannedFile("rank_00000.raw", 0, tensors[:1]), PlannedFile("rank_00001.raw", 1, tensors[1:]))
    writer = CheckpointWriter(traced(tmp_path), get_format("raw", "raw"), 0, True, "xxh3_128", 1 << 16, False)
    folder = tmp_path / "step_00000001"
    with pytest.raises(RunFailure) as failure:
        writer.write(plan_write(str(folder), 1, files), _payload_of(contents, fail_on="t1"))
    assert str(failure.value).startswith(f"{folder / 'rank_00001.raw'}: No space left on device (")
    assert os.listdir(folder) == []


# metadata.py -----------------------------------------------------------------------------------
IDENTITY = CheckpointIdentity(run_id="run-1", strategy="sharded", layout="raw", format="raw", checksum="xxh3_128",
                              world_size=2)


def test_manifest_fields_in_their_written_order_with_the_chain_and_resume_point():
    files = [{"path": "a", "size": 5, "checksum": "c1", "owner": 0, "writer": 0,
              "encoding": {"chain": [0, 2], "key": "a"}},
             {"path": "b", "size": 7, "checksum": "c2", "owner": 1, "writer": 1}]
    fields = manifest_fields(IDENTITY, 2, 30, 1, files, "incremental", {0: 10, 1: 20, 2: 30}, {"sample": 4}, 123.5)
    assert list(fields) == ["encoding", "chain", "resume", "index", "step", "epoch", "run_id", "strategy", "layout",
                            "format", "checksum", "world_size", "data_bytes", "files", "written_at"]
    assert fields["chain"] == [[0, 10], [2, 30]] and fields["encoding"] == "incremental"
    assert fields["resume"] == {"sample": 4} and fields["data_bytes"] == 12 and fields["files"] is files
    plain = manifest_fields(IDENTITY, 0, 10, 1, files[1:], "full", {}, None, 1.0)
    assert "chain" not in plain and "encoding" not in plain and "resume" not in plain
    assert (plain["run_id"], plain["world_size"], plain["written_at"]) == ("run-1", 2, 1.0)


def test_coordinator_content_lists_every_file_and_every_planned_tensor():
    tensors = _tensors(2)
    plan = [(PlannedFile("rank_00000.raw", 0, tensors[:1]),), (PlannedFile("rank_{step}.raw", 1, tensors[1:]),)]
    files = [{"path": "rank_00000.raw", "owner": 0, "size": 4000, "checksum": "x", "writer": 0, "records": [[1]]}]
    content = json.loads(coordinator_content(get_format("raw", "raw"), "raw", plan, 9, files, "/unused"))
    assert content == {"step": 9, "layout": "raw", "files": [{"path": "rank_00000.raw", "owner": 0, "size": 4000}],
                       "tensors": {"rank_00000.raw": [["t0", 1000, "float32"]], "rank_9.raw": [["t1", 1001, "float32"]]}}
    assert without_records(files) == [{"path": "rank_00000.raw", "owner": 0, "size": 4000, "checksum": "x", "writer": 0}]


def test_metadata_entry_checksums_the_content_as_restore_will():
    assert metadata_entry(".metadata", b"abc", "xxh3_128") == \
        {"path": ".metadata", "size": 3, "checksum": xxhash.xxh3_128(b"abc").hexdigest(), "owner": 0, "writer": 0}
    assert content_digest(b"abc", "none") == ""


# publish.py ------------------------------------------------------------------------------------
def _publisher(tmp_path: Path, layout=RAW, fsync: bool = True) -> tuple[Publisher, TracedStorage, Path]:
    storage = traced(tmp_path)
    root = tmp_path / "ckpt"
    publisher = Publisher(CheckpointFolders(str(root), layout, storage), storage, get_format("raw", "raw"),
                          [(PlannedFile("rank_00000.raw", 0, _tensors(1)),)], 1, fsync, "xxh3_128", 1 << 16, False,
                          str(tmp_path))
    return publisher, storage, root


def test_publish_fsyncs_every_folder_entry_then_renames_the_manifest_into_place(tmp_path, monkeypatch):
    publisher, storage, root = _publisher(tmp_path)
    folder = root / "step_00000007"
    (folder / "a").mkdir(parents=True)
    syscalls = record_calls(monkeypatch)
    assert publisher.sync_file_folders(7, ["a/x.raw", "y.raw"]) == 2
    publisher.publish_manifest(7, b'{"m": 1}')
    assert (folder / MANIFEST_NAME).read_bytes() == b'{"m": 1}'
    ordered = [(c[0], c[2] if c[0] == "rename" else c[1]) for c in syscalls if c[0] in ("fsync", "rename")]
    staged = ordered[4][1]
    # each rank's file folders; rank 0: the folders above the checkpoint folder up to storage.root,
    # the manifest's data under its temporary name, the rename, then the checkpoint folder
    assert staged.startswith(str(folder / MANIFEST_NAME) + ".tmp")
    assert ordered == [("fsync", str(folder / "a")), ("fsync", str(folder)), ("fsync", str(root)),
                       ("fsync", str(tmp_path)), ("fsync", staged), ("rename", str(folder / MANIFEST_NAME)),
                       ("fsync", str(folder))]
    assert [op for op, _ in calls(storage)] == ["fsync"] * 4 + ["open", "write", "fsync", "close"]


def test_publish_without_fsync_syncs_no_folder(tmp_path, monkeypatch):
    publisher, _, root = _publisher(tmp_path, fsync=False)
    (root / "step_00000001").mkdir(parents=True)
    syscalls = record_calls(monkeypatch)
    assert publisher.sync_file_folders(1, ["rank_00000.raw"]) == 0
    publisher.publish_manifest(1, b"{}")
    assert [c[1] for c in syscalls if c[0] == "fsync" and c[2]] == [str(root / "step_00000001")]  # write_atomic's own


def test_coordinator_files_are_written_whole_and_listed_after_the_data_files(tmp_path):
    publisher, _, root = _publisher(tmp_path, layout=get_layout("pytorch_dcp"))
    (root / "step_00000003").mkdir(parents=True)
    files = [{"path": "rank_00000.raw", "size": 4000, "checksum": "c", "owner": 0, "writer": 0, "records": [["t0", 0, 4000]]}]
    metadata, listed = publisher.coordinator_files(3, files)
    written = (root / "step_00000003" / ".metadata").read_bytes()
    assert metadata == len(written) and json.loads(written)["files"] == [{"path": "rank_00000.raw", "owner": 0, "size": 4000}]
    assert listed == [{"path": "rank_00000.raw", "size": 4000, "checksum": "c", "owner": 0, "writer": 0},
                      {"path": ".metadata", "size": len(written), "checksum": xxhash.xxh3_128(written).hexdigest(),
                       "owner": 0, "writer": 0}]


def test_tag_and_framework_metadata_are_written_as_the_framework_writes_them(tmp_path):
    publisher, storage, root = _publisher(tmp_path, layout=get_layout("deepspeed"))
    (root / "global_step5").mkdir(parents=True)
    assert publisher.write_tag(5) == len("global_step5")
    assert (root / "latest").read_text() == "global_step5"
    (root / "latest").unlink()
    assert publisher.framework_metadata(5, []) == len("global_step5")  # deepspeed: no coordinator file, its tag
    assert (root / "latest").read_text() == "global_step5"
    assert _publisher(tmp_path / "raw")[0].write_tag(5) == 0


# commit.py -------------------------------------------------------------------------------------
def _committer(tmp_path: Path, keep_last: int = 0, commit_durability: bool = True, resume=None, layout=RAW):
    storage = traced(tmp_path)
    root = tmp_path / "ckpt"
    folders = CheckpointFolders(str(root), layout, storage)
    tensors = _tensors(1)
    plan = [(PlannedFile("rank_00000.raw", 0, tensors),)]
    publisher = Publisher(folders, storage, get_format("raw", "raw"), plan, 1, True, "xxh3_128", 1 << 16, False,
                          str(tmp_path))
    identity = CheckpointIdentity("run-1", "sharded", layout.name, "raw", "xxh3_128", 1)
    committer = Committer(World.serial(), folders, publisher, Retention(folders, keep_last), identity,
                          commit_durability, "full", resume if resume is not None else {}, {})
    writer = CheckpointWriter(storage, get_format("raw", "raw"), 0, True, "xxh3_128", 1 << 16, False)

    def save(step: int, index: int, data: bytes, error=None, settled=None):
        entries = writer.write(plan_write(folders.path(step), step, plan[0]), _payload_of({"t0": data}))
        return committer.commit(index, step, 1, entries, error,
                                lambda i, ok: settled.append((i, ok)) if settled is not None else None)

    return save, folders, storage


def test_commit_writes_a_manifest_restore_accepts_and_settles_the_encoder(tmp_path):
    resume = {4: {"epoch": 1, "sample": 32}}
    save, folders, storage = _committer(tmp_path, resume=resume)
    data = bytes(range(256)) * 15 + bytes(160)
    settled: list = []
    metadata, seconds = save(4, 0, data, settled=settled)
    raw = (Path(folders.path(4)) / MANIFEST_NAME).read_bytes()
    assert metadata == len(raw) and seconds >= 0 and settled == [(0, True)]
    manifest = parse_manifest(raw, folders.path(4), 4)
    assert manifest["resume"] == {"epoch": 1, "sample": 32} and resume == {}
    assert manifest["files"] == [{"path": "rank_00000.raw", "size": 4000, "checksum": xxhash.xxh3_128(data).hexdigest(),
                                  "owner": 0, "writer": 0}]
    assert (manifest["run_id"], manifest["strategy"], manifest["data_bytes"]) == ("run-1", "sharded", 4000)


def test_a_rank_failure_leaves_nothing_committed_and_says_why(tmp_path):
    save, folders, _ = _committer(tmp_path)
    settled: list = []
    with pytest.raises(RunFailure) as failure:
        save(2, 0, bytes(4000), error=OSError(errno.EIO, "Input/output error"), settled=settled)
    assert str(failure.value) == "checkpoint step_00000002 not committed: Input/output error"
    assert failure.value.known_everywhere and settled == [(0, False)]
    assert folders.listing() == []


def test_retention_runs_after_the_commit_and_never_undoes_it(tmp_path):
    save, folders, _ = _committer(tmp_path, keep_last=2)
    for index, step in enumerate((1, 2, 3)):
        save(step, index, bytes([step]) * 4000)
    assert folders.listing() == [(2, "step_00000002", True), (3, "step_00000003", True)]
    save_dcp, dcp_folders, _ = _committer(tmp_path / "tag", layout=get_layout("deepspeed"))
    metadata, _ = save_dcp(7, 0, bytes(4000))
    manifest = (Path(dcp_folders.path(7)) / MANIFEST_NAME).read_bytes()
    assert metadata == len(manifest) + len("global_step7")
    assert (tmp_path / "tag" / "ckpt" / "latest").read_text() == "global_step7"


def test_framework_durability_writes_no_manifest_and_rotates(tmp_path):
    save, folders, _ = _committer(tmp_path, keep_last=1, commit_durability=False)
    assert save(1, 0, bytes(4000))[0] == 0
    save(2, 1, bytes(4000))
    assert folders.listing() == [(2, "step_00000002", False)]


# restore_plan.py and restore.py ----------------------------------------------------------------
def test_restore_plan_chooses_candidates_readers_and_planned_files():
    listing = [(1, "a", True), (2, "b", False), (3, "c", True)]
    assert candidates(listing, None) == [3, 2, 1] and candidates(listing, 1) == [1] and candidates(listing, 9) == []
    entry = {"path": "p", "owner": 3, "writer": 0}
    assert [r for r in range(2) if reads_entry(entry, r, 2, load_state=True)] == [1]
    assert [r for r in range(2) if reads_entry(entry, r, 2, load_state=False)] == [0]
    plan = [(PlannedFile("rank_{step}.raw", 0, ()),), (PlannedFile("rank_1.raw", 1, ()),)]
    assert planned_file(plan, 0, "rank_5.raw", 5) is plan[0][0]
    assert planned_file(plan, 0, "rank_{step}.raw", None) is plan[0][0]
    assert planned_file(plan, 2, "x", None) == "written by rank 2, outside this run's 2 ranks"
    assert planned_file(plan, 1, "rank_9.raw", 9).startswith("not a file of this run's plan for rank 1")
    encoded = {"files": [{"owner": 1, "encoding": {"key": "k"}}, {"owner": 0, "encoding": {"key": "k"}}]}
    assert same_file(encoded, "k", 0) is encoded["files"][1] and same_file(encoded, "j", 0) is None
    assert chain_length({"encoding": {"chain": [0, 1, 2]}}) == 3 and chain_length({}) == 1
    assert state_key({"path": "p", "encoding": {"key": "k"}}) == "k" and state_key({"path": "p"}) == "p"


def test_reader_restores_the_newest_intact_checkpoint_and_names_what_it_skipped(tmp_path, capsys):
    save, folders, storage = _committer(tmp_path)
    for index, step in enumerate((1, 2, 3)):
        save(step, index, bytes([step]) * 4000)
    newest = Path(folders.path(3)) / "rank_00000.raw"
    newest.write_bytes(bytes([3]) * 3999 + b"\x00")  # same size, one byte changed
    (Path(folders.path(4))).mkdir()  # torn: never committed
    reader = CheckpointReader(World.serial(), folders, storage.with_phase("restore"),
                              [(PlannedFile("rank_00000.raw", 0, _tensors(1)),)], "raw", 1024, str(tmp_path),
                              state=lambda: pytest.fail("a restore check loads no state"))
    before = len(storage.recorder.array())
    record = reader.restore()
    assert (record.checkpoint_step, record.checkpoint_index, record.files, record.bytes) == (2, 1, 1, 4000)
    assert record.skipped == ["step_00000004: torn: no manifest (data written but never committed; a rank may have "
                              "died mid-write)",
                              "step_00000003: rank_00000.raw: xxh3_128 checksum mismatch (corrupted contents)"]
    assert record.message.startswith("restored step_00000002 (step 2) verified: xxh3_128 and size of 1 file; "
                                     "skipped newer step_00000004: torn")
    assert capsys.readouterr().err == f"dlio_ckpt: checkpoint restore: {record.message}\n"
    read = [(op, path) for op, path in calls(storage, before) if op == "read"]
    assert {path for _, path in read} == {str(newest), str(Path(folders.path(2)) / "rank_00000.raw"),
                                           str(Path(folders.path(3)) / MANIFEST_NAME),
                                           str(Path(folders.path(2)) / MANIFEST_NAME)}
    assert reader.restore(step=1).checkpoint_step == 1
    assert reader.restore(step=7) is None


def test_reader_with_nothing_complete_says_so(tmp_path, capsys):
    save, folders, storage = _committer(tmp_path)
    save(1, 0, bytes(4000))
    (Path(folders.path(1)) / "rank_00000.raw").write_bytes(bytes(10))
    reader = CheckpointReader(World.serial(), folders, storage, [], "raw", 1024, str(tmp_path), state=lambda: None)
    record = reader.restore(warn_if_none=False)
    assert record.checkpoint_index == -1 and record.bytes == 0 and capsys.readouterr().err == ""
    assert record.message == (f"no complete checkpoint to restore in {folders.root}: step_00000001: rank_00000.raw: "
                              "size 10 bytes, manifest says 4000 (truncated or torn)")
