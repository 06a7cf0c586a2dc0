"""Framework checkpoint formats read back by the frameworks themselves: TensorFlow and torch.save.

A format named after a framework is only worth its name if that framework loads what we wrote, bit
for bit; these tests load every file with TensorFlow's or torch's own reader and compare each
tensor's bytes with the ByteSource's, then check restore verification and the I/O accounting.
"""

from __future__ import annotations

import io
import struct

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import xxhash

from ckpt_util import make_ctx
from conftest import BIN, REPO, cli_env
from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.content import tensor_key
from dlio_ckpt.checkpoint.formats import TensorflowFormat
from dlio_ckpt.config.load import load_config
from dlio_ckpt.content import ByteSource
from dlio_ckpt.engine.ownership import OWNER_MARKER
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME, build_checkpoint_plan
from dlio_ckpt.plan.layouts import writing_ranks
from dlio_ckpt.plan.model import build_model_plan
from dlio_ckpt.storage.events import OP_CODE

# float16 layers (model_dtype_bytes 2) beside the uint8 model blob and the float32 optimizer state
MIXED = ["model.optimization_groups=[100000,5000]", "model.layer_parameters=[3000,70001]"]
TF_FLAGS = ["checkpoint.layout=tensorflow", "checkpoint.format=tensorflow"]


def expected_bytes(source: ByteSource, owner: int, name: str, step: int, nbytes: int) -> bytes:
    return b"".join(bytes(c) for c in source.chunks(tensor_key(owner, name, step), nbytes))


def files_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def check_manifest_matches_disk(folder: Path) -> dict:
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    for entry in manifest["files"]:
        path = folder / entry["path"]
        assert entry["size"] == path.stat().st_size
        assert entry["checksum"] == xxhash.xxh3_128(path.read_bytes()).hexdigest()
    return manifest


# TensorFlow -------------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["sharded", "async"])
def test_tensorflow_bundle_reads_back_exactly(tmp_path, strategy):
    tf = pytest.importorskip("tensorflow")
    ctx = make_ctx(tmp_path, [*TF_FLAGS, *MIXED, f"checkpoint.strategy={strategy}"])
    engine = make_checkpoint_engine(ctx)
    engine.save(3, 1)
    engine.save(7, 1)
    engine.finish()
    root = Path(engine.root)
    # exactly TF's names: no staging folder left, the index merged by MergeV2Checkpoints
    assert set(files_under(root)) == set(engine.plan.file_names(3)) | set(engine.plan.file_names(7))
    prefix = str(root / "ckpt-7" / "ckpt-7")
    assert tf.train.latest_checkpoint(str(root)) == prefix  # the `checkpoint` tag points at it
    (pf,) = engine.plan.files_by_rank[0]
    dtypes = {t.dtype for t in pf.tensors}
    assert dtypes == {"uint8", "float16", "float32"}
    listed = dict(tf.train.list_variables(prefix))
    # one rank's bundle (one shard): the names as given, no rank scope
    assert listed == {TensorflowFormat.variable_name(0, t, 1): [t.numel] for t in pf.tensors}
    assert listed == {t.name: [t.numel] for t in pf.tensors}
    reader = tf.train.load_checkpoint(prefix)
    for tensor in pf.tensors:
        value = reader.get_tensor(TensorflowFormat.variable_name(0, tensor, 1))
        assert value.dtype == np.dtype(tensor.dtype)
        assert value.tobytes() == expected_bytes(engine.source, 0, tensor.name, 7, tensor.nbytes)
    # the data file holds exactly the payload; the manifest lists it and the index under TF's names
    assert (root / "ckpt-7" / pf.path_for(7)).stat().st_size == pf.payload_bytes == engine.plan.encoded_bytes()
    manifest = check_manifest_matches_disk(root / "ckpt-7")
    assert sorted(e["path"] for e in manifest["files"]) == ["ckpt-7.data-00000-of-00001", "ckpt-7.index"]
    # what TF wrote is traced: one write per staged file, fsyncs of the data file and the index
    events = ctx.recorder.array()
    paths = np.array(ctx.recorder.paths)
    writes = events[events["op"] == OP_CODE["write"]]
    written = {}
    for event in writes:
        written[paths[event["file"]]] = written.get(paths[event["file"]], 0) + int(event["length"])
    staged_data = str(root / "ckpt-7" / "ckpt-7_temp" / "part-00000-of-00001.data-00000-of-00001")
    assert written[staged_data] == pf.payload_bytes
    fsynced = {paths[e["file"]] for e in events[events["op"] == OP_CODE["fsync"]]}
    assert staged_data in fsynced and prefix + ".index" in fsynced
    restored = engine.restore()
    assert restored.verified and restored.checkpoint_step == 7 and restored.files == 2


def test_tensorflow_numbers_shards_densely_when_a_rank_writes_nothing(tmp_path):
    """ZeRO-0 with pipeline 2 x data 2: only DP rank 0 of each stage (ranks 0 and 2) holds state;
    MergeV2Checkpoints numbers shards 0..K-1, so the plan must too, or TF cannot open the bundle."""
    tf = pytest.importorskip("tensorflow")
    from dlio_ckpt.checkpoint.engine import CheckpointEngineImpl
    from dlio_ckpt.checkpoint.strategies import SingleWriterStrategy

    ctx = make_ctx(tmp_path, [*TF_FLAGS, *MIXED, "model.parallelism.pipeline=2", "model.parallelism.zero_stage=0",
                              "checkpoint.strategy=single_writer"])
    plan = build_checkpoint_plan(ctx.config, 4)
    assert [[f.relpath for f in files] for files in plan.files_by_rank] == [
        ["ckpt-{step}.data-00000-of-00002"], [], ["ckpt-{step}.data-00001-of-00002"], []]
    engine = CheckpointEngineImpl(ctx, SingleWriterStrategy, plan=plan)  # serial: rank 0 writes all
    engine.save(2, 1)
    engine.finish()
    prefix = str(Path(engine.root) / "ckpt-2" / "ckpt-2")
    reader = tf.train.load_checkpoint(prefix)
    for owner in (0, 2):
        for tensor in plan.files_by_rank[owner][0].tensors:
            value = reader.get_tensor(TensorflowFormat.variable_name(owner, tensor))
            assert value.tobytes() == expected_bytes(engine.source, owner, tensor.name, 2, tensor.nbytes)
    assert engine.restore().verified


@pytest.mark.parametrize("zero,tp,pp,dp,world", [(0, 1, 2, 2, 4), (1, 2, 1, 4, 8), (2, 1, 1, 3, 3),
                                                 (3, 2, 2, 2, 8), (3, 1, 1, 8, 5), (1, 1, 2, 4, 6)])
def test_writing_ranks_agrees_with_rank_tensors(zero, tp, pp, dp, world):
    # tiny optimizer groups leave some ZeRO partitions empty, so some ranks really write nothing
    config = load_config(["model.kind=explicit", "model.model_size_bytes=5", "model.layer_parameters=[3,1]",
                          "model.optimization_groups=[2]", f"model.parallelism.zero_stage={zero}",
                          f"model.parallelism.tensor={tp}", f"model.parallelism.pipeline={pp}",
                          f"model.parallelism.data={dp}"])
    model = build_model_plan(config.model, world)
    assert list(writing_ranks(model)) == [bool(model.rank_tensors(r)) for r in range(world)]


def test_tensorflow_format_needs_the_tensorflow_layout(tmp_path):
    pytest.importorskip("tensorflow")
    with pytest.raises(ConfigError, match="checkpoint.layout=tensorflow"):  # the loader refuses the pair
        make_checkpoint_engine(make_ctx(tmp_path, ["checkpoint.format=tensorflow", "checkpoint.layout=deepspeed"]))


def _staged_index_bytes(tf, plan, scratch: Path) -> int:
    """Bytes of the per-rank indexes SaveV2 writes and MergeV2Checkpoints deletes, measured by
    saving zeros of the same names, dtypes and shapes (an index's size does not depend on values)."""
    total = 0
    for files in plan.files_by_rank:
        for k, pf in enumerate(files):
            prefix = str(scratch / f"probe-{pf.owner}-{k}")
            tf.raw_ops.SaveV2(prefix=prefix, tensor_names=[TensorflowFormat.variable_name(pf.owner, t) for t in pf.tensors],
                              shape_and_slices=[""] * len(pf.tensors),
                              tensors=[tf.zeros([t.numel], dtype=tf.as_dtype(t.dtype)) for t in pf.tensors])
            total += Path(prefix + ".index").stat().st_size
    return total


@pytest.mark.slow
@pytest.mark.mpi
def test_tensorflow_checkpoint_under_mpirun(tmp_path, tensorflow_without_keras):
    tf = pytest.importorskip("tensorflow")
    args = ["workload=llama3_8b", "scale=tiny", *TF_FLAGS]
    result = subprocess.run(
        [str(BIN / "mpirun"), "-n", "2", str(BIN / "dlio_ckpt"), *args, "checkpoint.drop_caches=false",
         "checkpoint.restore=true", "progress=false", f"storage.root={tmp_path}", f"hydra.run.dir={tmp_path}/run"],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["checkpoint"]["restore_verified"] is True
    plan = build_checkpoint_plan(load_config(args), 2)
    assert [len(files) for files in plan.files_by_rank] == [1, 1]
    (root,) = (tmp_path / "checkpoints").iterdir()
    steps = sorted(int(p.name.split("-")[1]) for p in root.iterdir() if p.is_dir())
    assert len(steps) == summary["checkpoint"]["writes"] == 2
    planned = {TensorflowFormat.variable_name(pf.owner, t): [t.numel] for files in plan.files_by_rank
               for pf in files for t in pf.tensors}
    config = load_config(args)
    source = ByteSource(seed=config.seed * 7919 + 17, pool_bytes=config.generate.pool_bytes)  # the engine's
    for step in steps:
        prefix = str(root / f"ckpt-{step}" / f"ckpt-{step}")
        assert dict(tf.train.list_variables(prefix)) == planned
        reader = tf.train.load_checkpoint(prefix)
        for files in plan.files_by_rank:  # one tensor of each rank's shard, bit for bit
            tensor = files[0].tensors[-1]
            value = reader.get_tensor(TensorflowFormat.variable_name(files[0].owner, tensor))
            assert value.tobytes() == expected_bytes(source, files[0].owner, tensor.name, step, tensor.nbytes)
        check_manifest_matches_disk(root / f"ckpt-{step}")
    assert tf.train.latest_checkpoint(str(root)).endswith(f"ckpt-{steps[-1]}/ckpt-{steps[-1]}")
    # the run's ownership marker (engine/ownership.py) is written untraced: not the program's I/O
    on_disk = {name: size for name, size in files_under(root).items() if name != OWNER_MARKER}
    assert not any("_temp" in name for name in on_disk)  # MergeV2Checkpoints removed the staging
    # Every byte written is accounted for: the files on disk, plus what was written and then
    # replaced or deleted: each earlier `checkpoint` tag, and each checkpoint's staged indexes.
    # (The tag lists the kept checkpoints with the times TF's reader reads back from the last one.)
    state = tf.train.get_checkpoint_state(str(root))
    saves = list(zip(steps, state.all_model_checkpoint_timestamps))
    keep = config.checkpoint.keep_last
    earlier_tags = sum(len(plan.layout.tag_texts(step, saves[:i + 1], keep, state.last_preserved_timestamp)[-1])
                       for i, step in enumerate(steps[:-1]))
    (tmp_path / "probe").mkdir()
    staged = _staged_index_bytes(tf, plan, tmp_path / "probe")
    assert summary["io"]["bytes_written"] == sum(on_disk.values()) + earlier_tags + len(steps) * staged


# torch.save ------------------------------------------------------------------------------------

def distcp_containers(data: bytes) -> list[bytes]:
    """The zip containers of a DCP `.distcp` file, in order: each ends with its end-of-central-
    directory record, whose central directory offset and size place it right after the directory
    (a look-alike signature inside tensor bytes does not)."""
    containers, start, at = [], 0, 0
    while start < len(data):
        at = data.index(b"PK\x05\x06", at)
        size, offset = struct.unpack_from("<II", data, at + 12)
        if start + offset + size not in (at, at - 76):  # directory, then (zip64: 56 + 20 bytes of records) this record
            at += 4
            continue
        containers.append(data[start : at + 22])
        start = at = at + 22
    return containers


@pytest.mark.parametrize("layout", ["deepspeed", "pytorch_dcp"])
def test_torch_save_files_load_back_exactly(tmp_path, layout):
    torch = pytest.importorskip("torch")
    ctx = make_ctx(tmp_path, ["checkpoint.format=torch", f"checkpoint.layout={layout}", *MIXED])
    engine = make_checkpoint_engine(ctx)
    engine.save(4, 1)
    engine.finish()
    folder = Path(engine.root) / engine.layout.folder(4)
    planned = engine.plan.files_by_rank[0]
    assert len(planned) >= 1
    seen_dtypes = set()
    for pf in planned:
        if layout == "pytorch_dcp":  # DCP's .distcp: one torch.save container per tensor, back to back
            containers = distcp_containers((folder / pf.path_for(4)).read_bytes())
            state = {t.name: torch.load(io.BytesIO(c), weights_only=True) for t, c in zip(pf.tensors, containers)}
            assert len(containers) == len(pf.tensors)
        else:
            state = torch.load(folder / pf.path_for(4), weights_only=True)
        assert list(state) == [t.name for t in pf.tensors]
        for tensor in pf.tensors:
            value = state[tensor.name]
            assert value.shape == (tensor.numel,) and str(value.dtype) == f"torch.{tensor.dtype}"
            assert value.numpy().tobytes() == expected_bytes(engine.source, 0, tensor.name, 4, tensor.nbytes)
            seen_dtypes.add(tensor.dtype)
    assert seen_dtypes == {"uint8", "float16", "float32"}
    check_manifest_matches_disk(folder)
    restored = engine.restore()
    assert restored.verified and restored.checkpoint_step == 4
