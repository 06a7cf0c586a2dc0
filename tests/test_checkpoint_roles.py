"""The checkpoint engine's parts (dlio_ckpt/checkpoint/, one section per module), each on its
own, without MPI: real files in a temporary folder, bytes read back, exact counts and order of
what each part did.

The engine as a whole, with every strategy, layout and format, is tested in
test_checkpoint_engine.py and test_commit_durability.py; these pin each part's own contract.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import xxhash

from dlio_ckpt.checkpoint.encoded import Payload
from dlio_ckpt.checkpoint.folders import CheckpointFolders
from dlio_ckpt.checkpoint.formats import get_format
from dlio_ckpt.checkpoint.manifest import encode_manifest
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
