"""checkpoint.durability: a format named after a framework issues that framework's calls, nothing else.

The torch format is compared with a real torch.save of the same tensors in this very test: the
kernel's count of this thread's write system calls (/proc/thread-self/io, `syscw`) around each,
the bytes on disk, and what torch.load reads back. `durability=commit` keeps the project's commit
protocol (fsyncs, manifest, checksums as the bytes pass).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import xxhash

from ckpt_util import make_ctx
from conftest import BIN, cli_env, load_summary
from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.checkpoint.fileio import write_file
from dlio_ckpt.checkpoint.formats import get_format
from dlio_ckpt.config.load import load_config
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME
from dlio_ckpt.plan.durability import resolve_durability
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.storage.events import EventRecorder, JobClock, OPS
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.traced import TracedStorage

FRAMEWORK = ["checkpoint.durability=framework"]  # ckpt_util's helpers ask for commit
THREAD_IO = Path("/proc/thread-self/io")

# Records below 1 KiB (buffered by the C++ stream), between 1 KiB and the 8 KiB buffer, and above it.
# Element types as a framework records them (model.layer_dtypes): bfloat16, an int64 step counter.
TENSORS = (TensorSpec("embed.weight", 40_000, 4, "model"), TensorSpec("norm.weight", 7, 4, "model"),
           TensorSpec("head.bias", 300, 2, "model", "bfloat16"), TensorSpec("layer.0", 256, 4, "model"),
           TensorSpec("layer.1", 3_000, 2, "model"), TensorSpec("step", 1, 8, "optimizer", "int64"),
           TensorSpec("exp_avg", 50_000, 4, "optimizer"), TensorSpec("scale", 2_048, 1, "optimizer"))


def thread_io() -> dict[str, int]:
    """This thread's I/O counters from the kernel: `syscw` counts write, writev and pwrite calls."""
    return {key: int(value) for key, value in (line.split(": ") for line in THREAD_IO.read_text().splitlines())}


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {t.name: rng.integers(0, 256, t.nbytes, dtype=np.uint8).view(t.dtype) for t in TENSORS}


def torch_state(torch, values: dict[str, np.ndarray]) -> dict:
    """The tensors a program holds: `values` with each tensor's framework type (bfloat16 from its bits)."""
    types = {t.name: t.framework_dtype for t in TENSORS}
    return {name: torch.from_numpy(array).view(getattr(torch, types[name])) for name, array in values.items()}


def traced(tmp_path: Path) -> TracedStorage:
    return TracedStorage(PosixStorage(), EventRecorder(rank=0, clock=JobClock.start()))


def ops_on(storage: TracedStorage, path: str) -> list[str]:
    events = storage.recorder.array()
    paths = storage.recorder.paths
    return [OPS[e["op"]] for e in events if paths[e["file"]] == path]


@pytest.mark.skipif(not THREAD_IO.exists(), reason="the kernel offers no per-thread I/O counters (/proc/thread-self/io)")
def test_torch_format_issues_torch_saves_calls_and_bytes(tmp_path):
    torch = pytest.importorskip("torch")
    values = arrays()
    # the real thing: torch.save into a path (named `archive`, the name torch gives a stream's archive)
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "archive.pt"
    state = torch_state(torch, values)
    before = thread_io()
    torch.save(state, str(real))
    after = thread_io()
    real_calls, real_bytes = after["syscw"] - before["syscw"], after["wchar"] - before["wchar"]
    # the emulation: the same tensors through the traced storage, as checkpoint.durability=framework writes them
    (tmp_path / "emulated").mkdir()
    emulated = str(tmp_path / "emulated" / "archive.pt")
    storage = traced(tmp_path)
    chunks = lambda tensor: iter([memoryview(values[tensor.name].view(np.uint8))])
    fmt = get_format("torch")
    before = thread_io()
    done = write_file(storage, emulated, TENSORS, fmt, chunks, fsync=False, checksum="none", chunk_bytes=1 << 16)
    after = thread_io()
    # one writev per record of 1 KiB or more (5 tensors; the pickle is smaller), one write at the end
    assert real_calls == sum(t.nbytes >= 1024 for t in TENSORS) + 1 == 6
    ops = ops_on(storage, emulated)
    assert ops.count("write") == real_calls == after["syscw"] - before["syscw"]
    assert ops == ["open"] + ["write"] * real_calls + ["close"]  # no fsync, no read-back, no rename
    assert done.bytes_written == real_bytes == real.stat().st_size == after["wchar"] - before["wchar"]
    assert Path(emulated).read_bytes() == real.read_bytes()  # byte for byte torch.save's file
    loaded = torch.load(emulated, weights_only=True)
    assert set(loaded) == set(values)
    for tensor in TENSORS:  # each with the type the framework records, bit for bit
        value = loaded[tensor.name]
        assert value.dtype == getattr(torch, tensor.framework_dtype)
        assert value.view(torch.uint8).numpy().tobytes() == values[tensor.name].tobytes()
    assert str(loaded["head.bias"].dtype) == "torch.bfloat16" and loaded["step"].dtype == torch.int64
    assert done.checksum == "" and done.verify_s == 0.0 and done.fsync_s == 0.0
    assert 0.0 < done.write_calls_s < done.write_s  # the rest is torch building its container


def test_a_handle_without_writev_gets_the_two_writes_libstdcxx_makes_without_it(tmp_path):
    from dlio_ckpt.checkpoint.filebuf import FilebufStream

    calls = []

    class Plain:
        def write(self, data):
            calls.append(bytes(data))
            return len(data)

    stream = FilebufStream(Plain())
    stream.write(b"h" * 100)  # buffered
    stream.write(b"d" * 5000)  # at least 1 KiB: the buffer, then the data
    stream.write(b"t" * 10)
    stream.flush()
    assert calls == [b"h" * 100, b"d" * 5000, b"t" * 10]


def test_framework_durability_writes_no_manifest_fsync_or_checksum(tmp_path):
    torch = pytest.importorskip("torch")
    ctx = make_ctx(tmp_path, [*FRAMEWORK, "checkpoint.format=torch", "checkpoint.layout=deepspeed", "checkpoint.keep_last=1"])
    engine = make_checkpoint_engine(ctx)
    assert engine.durability.mode == "framework" and not engine.data_fsync
    engine.save(1, 1)
    engine.save(2, 1)
    engine.finish()
    root = Path(engine.root)
    assert sorted(p.name for p in root.iterdir()) == ["global_step2", "latest"]  # keep_last=1 deleted step 1
    assert (root / "latest").read_text() == "global_step2"
    (pf,) = engine.plan.files_by_rank[0]
    folder = root / "global_step2"
    assert sorted(p.name for p in folder.iterdir()) == [pf.path_for(2)]  # no manifest
    loaded = torch.load(folder / pf.path_for(2), weights_only=True)
    assert {name: value.numel() for name, value in loaded.items()} == {t.name: t.numel for t in pf.tensors}
    counts = {op: n for (phase, op), n in ctx.recorder.op_counts.items() if phase == "checkpoint"}
    # one writev per tensor record of 1 KiB or more and the final write (the pickle, under 1 KiB here, is buffered)
    data_writes = sum(1 for t in pf.tensors if t.nbytes >= 1024) + 1
    assert counts.get("write") == 2 * (data_writes + 1)  # + DeepSpeed's `latest`, written in place
    assert "fsync" not in counts and "rename" not in counts and "read" not in counts
    record = engine.records[-1]
    assert record.fsync_s == 0.0 and record.verify_s == 0.0 and 0.0 < record.write_calls_s < record.write_s


def test_commit_durability_keeps_fsyncs_manifest_and_checksums_as_bytes_pass(tmp_path):
    pytest.importorskip("torch")
    ctx = make_ctx(tmp_path, ["checkpoint.format=torch", "checkpoint.layout=deepspeed"])
    engine = make_checkpoint_engine(ctx)
    assert engine.durability.mode == "commit" and engine.data_fsync
    engine.save(1, 1)
    engine.finish()
    folder = Path(engine.root) / "global_step1"
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    (entry,) = manifest["files"]
    assert entry["checksum"] == xxhash.xxh3_128((folder / entry["path"]).read_bytes()).hexdigest()
    counts = {op: n for (phase, op), n in ctx.recorder.op_counts.items() if phase == "checkpoint"}
    assert counts["fsync"] >= 2  # the data file and the manifest (staged: fsync, rename, folder fsync)
    assert "read" not in counts  # torch.save only appends: hashed as the bytes passed, no read-back
    assert engine.records[-1].fsync_s > 0
    assert engine.restore().verified


@pytest.mark.parametrize("overrides, why", [
    ([], ""),
    (["checkpoint.durability=commit"], ""),
    (["failures.at_steps=[3]"], "failures restore"),
    (["mode=restore", "checkpoint.restore_from=/nowhere"], "mode=restore"),
    (["mode=checkpoint"], "mode=checkpoint (MLPerf Storage)"),
    (["checkpoint.restore=true"], "checkpoint.restore=true"),
    (["checkpoint.encoding=incremental"], "checkpoint.encoding=incremental"),
])
def test_runs_that_read_checkpoints_back_use_commit_and_say_why(overrides, why):
    durability = resolve_durability(load_config(["checkpoint.enabled=true", *overrides]))
    assert durability.mode == ("framework" if overrides == [] else "commit")
    assert durability.reason.startswith(why) if why else durability.reason == ""


def test_the_summary_says_which_protocol_and_writer_ran_and_the_serialization_share(workdir):
    pytest.importorskip("torch")
    from conftest import run_cli

    run = workdir / "run"
    done = run_cli(["workload=resnet", "scale=tiny", "progress=false", "model.kind=explicit", "model.model_size_bytes=1MiB",
                    "checkpoint.enabled=true", "checkpoint.format=torch", "checkpoint.layout=deepspeed",
                    "train.epochs=1", "checkpoint.steps_between_checkpoints=8", f"storage.root={workdir / 'store'}",
                    f"hydra.run.dir={run}"],
                   workdir / "cwd")
    assert done.returncode == 0, done.stderr[-2000:]
    ckpt = load_summary(run)["checkpoint"]
    assert (ckpt["durability"], ckpt["durability_reason"], ckpt["writer"], ckpt["data_fsync"]) == \
        ("framework", "", "zero-copy writev", False)
    assert 0.0 < ckpt["serialization_share"] < 1.0
    for row in ckpt["per_checkpoint"]:
        assert row["fsync_s"] == 0.0 and row["verify_s_max"] == 0.0
        assert row["write_calls_s"] + row["serialize_s"] == pytest.approx(row["write_s_max"])  # one rank
    assert "durability         framework; writer: zero-copy writev, data files not fsynced; serialization" in done.stdout


def test_a_framework_format_without_its_library_is_refused_before_anything_is_written(workdir):
    """torch hidden from the run (an import hook raising ImportError, as a missing package does)."""
    hide = workdir / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, Hide())\n")
    env = cli_env()
    env["PYTHONPATH"] = str(hide)
    store, run = workdir / "store", workdir / "run"
    done = subprocess.run([str(BIN / "dlio_ckpt"), "workload=resnet", "scale=tiny", "model.kind=explicit",
                           "model.model_size_bytes=1MiB", "checkpoint.enabled=true", "checkpoint.format=torch",
                           f"storage.root={store}", f"hydra.run.dir={run}"], cwd=workdir / "cwd", env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "torch is needed for the torch.save checkpoint format" in line and "pip install torch" in line
    assert not store.exists() and not run.exists()


# -- PyTorch DCP ---------------------------------------------------------------------------------

@pytest.mark.parametrize("zero_stage", [0, 1])
def test_dcp_layout_gives_each_replicated_tensor_to_the_rank_dcps_planner_picks(zero_stage):
    """Every rank's save plan through torch's own DefaultSavePlanner functions and dedup, against
    the layout's pure assignment: the same whole tensors on the same ranks, with no ZeRO setting."""
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
    from torch.distributed.checkpoint.default_planner import create_default_local_save_plan

    from dlio_ckpt.plan.checkpoint import build_checkpoint_plan
    from dlio_ckpt.plan.layouts import _held_by

    config = load_config(["checkpoint.enabled=true", "checkpoint.layout=pytorch_dcp", "checkpoint.format=torch",
                          "model.kind=explicit", "model.model_size_bytes=3000", "model.layer_parameters=[900,2000,300,4000,50]",
                          "model.optimization_groups=[700,5000]", f"model.parallelism.zero_stage={zero_stage}"])
    plan = build_checkpoint_plan(config, 3)
    plans = [create_default_local_save_plan({t.name: torch.empty(t.numel, dtype=getattr(torch, t.dtype))
                                             for t in _held_by(plan.model, rank)}, rank == 0) for rank in range(3)]
    kept = [sorted(item.index.fqn for item in p.items) for p in dedup_save_plans(plans)]
    ours = [sorted(t.name for pf in plan.files_by_rank[rank] for t in pf.tensors) for rank in range(3)]
    assert ours == kept
    assert all(ours) and sum(plan.per_rank_bytes()) == plan.model.total_bytes  # every byte once, every rank writes
    if zero_stage == 0:
        assert not any(name.endswith(".part0") for names in ours for name in names)  # whole tensors


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.skipif(not THREAD_IO.exists(), reason="the kernel offers no per-thread I/O counters (/proc/thread-self/io)")
def test_dcp_layout_writes_what_dcp_save_writes(tmp_path):
    """torch.distributed.checkpoint.save (one process, FileSystemWriter's defaults) against the
    emulation of the same tensors: the write calls, the `.distcp` bytes, and the fsyncs and the
    rename that DCP's source issues (sync_files=True: each file; `.metadata` through `.tmp`)."""
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    from dlio_ckpt.checkpoint.fileio import write_framework_metadata

    values = arrays()
    state = torch_state(torch, values)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "warm")))  # imports, first-call set-up
    before = thread_io()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "real")))
    after = thread_io()
    real_calls = after["syscw"] - before["syscw"]
    (tmp_path / "emulated").mkdir()
    storage = traced(tmp_path)
    data = str(tmp_path / "emulated" / "__0_0.distcp")
    fmt = get_format("torch", "pytorch_dcp")
    before = thread_io()
    write_file(storage, data, TENSORS, fmt, lambda t: iter([memoryview(values[t.name].view(np.uint8))]),
               fsync=True, checksum="none", chunk_bytes=1 << 16)
    write_framework_metadata(storage, str(tmp_path / "emulated" / ".metadata"), b"m" * 1000, "renamed_fsync")
    after = thread_io()
    assert after["syscw"] - before["syscw"] == real_calls
    assert Path(data).read_bytes() == (tmp_path / "real" / "__0_0.distcp").read_bytes()
    assert ops_on(storage, data).count("fsync") == 1
    meta = ops_on(storage, str(tmp_path / "emulated" / ".metadata.tmp"))
    assert meta == ["open", "write", "fsync", "close", "rename"]
    assert sorted(p.name for p in (tmp_path / "emulated").iterdir()) == [".metadata", "__0_0.distcp"]


def test_dcp_checkpoint_under_framework_durability(tmp_path):
    pytest.importorskip("torch")
    ctx = make_ctx(tmp_path, [*FRAMEWORK, "checkpoint.format=torch", "checkpoint.layout=pytorch_dcp"])
    engine = make_checkpoint_engine(ctx)
    assert engine.data_fsync  # DCP fsyncs its files whatever checkpoint.fsync says
    engine.save(1, 1)
    engine.finish()
    folder = Path(engine.root) / "step_00000001"
    assert sorted(p.name for p in folder.iterdir()) == [".metadata", "__0_0.distcp"]
    counts = {op: n for (phase, op), n in ctx.recorder.op_counts.items() if phase == "checkpoint"}
    assert counts["fsync"] == 2 and counts["rename"] == 1 and "read" not in counts
    (pf,) = engine.plan.files_by_rank[0]
    # one torch.save container per tensor (all larger than the buffer here): the buffer flushed
    # before its bytes, its bytes from its memory, the rest flushed after it; then `.metadata`
    block = os.stat(folder).st_blksize
    assert all(t.nbytes > block for t in pf.tensors)
    assert counts["write"] == 3 * len(pf.tensors) + 1
    # DCP's own reader reads it back, bit for bit, through the coordinator's pickled Metadata
    import torch
    import torch.distributed.checkpoint as dcp
    from dlio_ckpt.checkpoint.fileio import tensor_key

    state = {t.name: torch.zeros(t.numel, dtype=getattr(torch, t.framework_dtype)) for t in pf.tensors}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
        dcp.load(state, checkpoint_id=str(folder))
    for t in pf.tensors:
        expected = b"".join(bytes(c) for c in engine.source.chunks(tensor_key(0, t.name, 1), t.nbytes))
        assert state[t.name].view(torch.uint8).numpy().tobytes() == expected


# -- per-tensor element types (model.layer_dtypes) -----------------------------------------------

def test_explicit_layers_keep_their_element_types_through_the_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    ctx = make_ctx(tmp_path, [*FRAMEWORK, "checkpoint.format=torch", "model.model_size_bytes=0",
                              "model.optimization_groups=[]", "model.layer_parameters=[5000,1,300,70]",
                              "model.layer_dtypes=[bfloat16,int64,float32,bool]"])
    engine = make_checkpoint_engine(ctx)
    engine.save(1, 1)
    (pf,) = engine.plan.files_by_rank[0]
    assert [t.nbytes for t in pf.tensors] == [10_000, 8, 1_200, 70]  # each type's own size
    loaded = torch.load(Path(engine.root) / "step_00000001" / pf.path_for(1), weights_only=True)
    assert [str(loaded[f"layers.{i}"].dtype) for i in range(4)] == ["torch.bfloat16", "torch.int64", "torch.float32",
                                                                    "torch.bool"]
    assert engine.plan.total_bytes == 11_278


@pytest.mark.parametrize("dtypes, message", [
    ("[bf16,int64]", "model.layer_dtypes: unknown element type 'bf16'; choose from float16, bfloat16"),
    ("[int64]", "model.layer_dtypes: 1 types for 2 layer_parameters; give one per layer"),
])
def test_layer_dtypes_are_checked(dtypes, message):
    from dlio_ckpt.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_config(["model.kind=explicit", "model.layer_parameters=[10,20]", f"model.layer_dtypes={dtypes}"])
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


# -- TensorFlow ----------------------------------------------------------------------------------

def test_tensorflow_under_framework_durability_renames_and_never_fsyncs(tmp_path):
    tf = pytest.importorskip("tensorflow")
    ctx = make_ctx(tmp_path, [*FRAMEWORK, "checkpoint.format=tensorflow", "checkpoint.layout=tensorflow"])
    engine = make_checkpoint_engine(ctx)
    engine.save(3, 1)
    engine.finish()
    root = Path(engine.root)
    # CheckpointManager's directory: the checkpoint's files beside its `checkpoint` state, no folder of
    # its own, numbered by the manager's save counter (the run's first save at step 3: ckpt-1)
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".dlio_ckpt")) == \
        ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    assert tf.train.latest_checkpoint(str(root)) == str(root / "ckpt-1")  # the `checkpoint` tag
    assert engine.records[-1].folder == "ckpt-1"
    reader = tf.train.load_checkpoint(str(root / "ckpt-1"))
    (pf,) = engine.plan.files_by_rank[0]
    assert {name for name in reader.get_variable_to_shape_map()} >= {t.name for t in pf.tensors}  # one shard: own names
    counts = {op: n for (phase, op), n in ctx.recorder.op_counts.items() if phase == "checkpoint"}
    # no fsync, no checksum read-back: the only reads are MergeV2Checkpoints' of the staged index
    # (footer, index block, data block: TF's table reader, as darshan-runtime counts them)
    assert "fsync" not in counts and counts["read"] == 3
    assert ops_on(ctx.storage, str(root / "ckpt-1_temp" / "part-00000-of-00001.index")) == \
        ["stat", "open", *["write"] * 7, "close", "open", "read", "read", "read", "close", "unlink"]
    # MergeV2Checkpoints renames the data file; CheckpointManager writes the tag twice, each through a temporary name
    assert counts["rename"] == 3
    assert ops_on(ctx.storage, str(root / "checkpoint.tmp")) == ["open", "write", "close", "rename"] * 2
    assert engine.records[-1].write_calls_s is None  # TF's own calls: the split is unknown


def test_dcp_metadata_records_tensor_parallel_shards_as_chunks_of_one_tensor():
    torch = pytest.importorskip("torch")
    import pickle

    fmt = get_format("torch", "pytorch_dcp")
    shard = TensorSpec("layers.0", 6, 2, "model", "bfloat16")
    other = TensorSpec("layers.0", 4, 2, "model", "bfloat16")
    files = [{"path": "__0_0.distcp", "records": [["layers.0", 0, 900]]},
             {"path": "__1_0.distcp", "records": [["layers.0", 0, 880]]}]
    metadata = pickle.loads(fmt.coordinator_content(files, {"__0_0.distcp": (shard,), "__1_0.distcp": (other,)}, "/ck"))
    stored = metadata.state_dict_metadata["layers.0"]
    assert stored.size == torch.Size([10]) and stored.properties.dtype == torch.bfloat16
    assert [(c.offsets[0], c.sizes[0]) for c in stored.chunks] == [(0, 6), (6, 4)]
    assert sorted((i.offset[0], info.relative_path, info.length) for i, info in metadata.storage_data.items()) == \
        [(0, "__0_0.distcp", 900), (6, "__1_0.distcp", 880)]


def test_dcp_writer_imports_dcps_modules_before_the_first_save():
    """A DCP program imports torch.distributed.checkpoint at its start; the emulation must too (when
    its checkpoint engine is made, before training), not inside the first save, where the import
    took ~1 s of a tiny run's first dcp save (realapps/ddp_dcp: 1.15 s against 0.06 s for the second)."""
    pytest.importorskip("torch")
    probe = ("import sys\n"
             "from dlio_ckpt.checkpoint.formats import get_format\n"
             "get_format('torch', 'pytorch_dcp')\n"
             "print(sorted(m for m in ('torch.distributed.checkpoint.filesystem', 'torch.distributed.checkpoint.metadata')"
             " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['torch.distributed.checkpoint.filesystem', 'torch.distributed.checkpoint.metadata']"


def test_tensorflow_state_file_lists_the_kept_checkpoints_as_checkpoint_manager_does(tmp_path, monkeypatch):
    """CheckpointManager(max_to_keep=2) writes its `checkpoint` state twice per save: every tracked
    checkpoint with its time, then, after deleting the oldest past max_to_keep, the kept ones. TF's
    own reader finds the kept checkpoints on disk, their times in order, and the manager's start."""
    tf = pytest.importorskip("tensorflow")
    from dlio_ckpt.checkpoint import publish

    written = []
    real_write = publish.write_framework_metadata

    def capture(storage, path, content, how):
        if os.path.basename(path) == "checkpoint":
            written.append(bytes(content).decode())
        return real_write(storage, path, content, how)

    monkeypatch.setattr(publish, "write_framework_metadata", capture)
    ctx = make_ctx(tmp_path, [*FRAMEWORK, "checkpoint.format=tensorflow", "checkpoint.layout=tensorflow",
                              "checkpoint.keep_last=2"])
    engine = make_checkpoint_engine(ctx)
    for step in (1, 2, 3, 4):
        engine.save(step, 1)
    engine.finish()
    root = Path(engine.root)
    # the manager's directory: the kept checkpoints' files side by side, the older ones deleted as
    # TF's remove_checkpoint deletes them (the index, then the data files)
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".dlio_ckpt")) == \
        ["checkpoint", "ckpt-3.data-00000-of-00001", "ckpt-3.index", "ckpt-4.data-00000-of-00001", "ckpt-4.index"]
    for gone in (1, 2):
        assert ops_on(ctx.storage, str(root / f"ckpt-{gone}.index"))[-1] == "unlink"
        assert ops_on(ctx.storage, str(root / f"ckpt-{gone}.data-00000-of-00001"))[-1] == "unlink"
    state = tf.train.get_checkpoint_state(str(root))
    assert state.model_checkpoint_path == str(root / "ckpt-4")
    assert list(state.all_model_checkpoint_paths) == [str(root / f"ckpt-{s}") for s in (3, 4)]
    times = list(state.all_model_checkpoint_timestamps)
    assert len(times) == 2 and state.last_preserved_timestamp < times[0] < times[1]
    assert len(written) == 8  # two writes per save
    tracked = [text.count("all_model_checkpoint_paths") for text in written]
    assert tracked == [1, 1, 2, 2, 3, 2, 3, 2]  # before and after each sweep
    assert written[4].count("all_model_checkpoint_timestamps") == 3 and 'all_model_checkpoint_paths: "ckpt-1"\n' in written[4]
    assert '"ckpt-1"' not in written[5]


def test_tensorflow_checkpoints_numbered_by_the_step_as_save_checkpoint_number_step(tmp_path):
    """checkpoint.flat_numbers=step: `manager.save(checkpoint_number=step)`, the other way TF programs
    number their checkpoints; the kept ones are found by TF's reader under those names, the older
    one deleted (the default numbers them 1, 2, 3: the test above)."""
    tf = pytest.importorskip("tensorflow")
    ctx = make_ctx(tmp_path, [*FRAMEWORK, "checkpoint.format=tensorflow", "checkpoint.layout=tensorflow",
                              "checkpoint.keep_last=2", "checkpoint.flat_numbers=step"])
    engine = make_checkpoint_engine(ctx)
    for step in (32, 64, 96):
        engine.save(step, step // 32)
    engine.finish()
    root = Path(engine.root)
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".dlio_ckpt")) == \
        ["checkpoint", "ckpt-64.data-00000-of-00001", "ckpt-64.index", "ckpt-96.data-00000-of-00001", "ckpt-96.index"]
    assert ops_on(ctx.storage, str(root / "ckpt-32.index"))[-1] == "unlink"
    state = tf.train.get_checkpoint_state(str(root))
    assert list(state.all_model_checkpoint_paths) == [str(root / "ckpt-64"), str(root / "ckpt-96")]
    assert [record.folder for record in engine.records] == ["ckpt-32", "ckpt-64", "ckpt-96"]


def test_tensorflow_files_are_recorded_call_by_call_as_darshan_runtime_counts_tfs_fwrites(tmp_path):
    """One write event per fwrite TF makes (tests/test_tf_bundle_writes.py checks those against
    darshan-runtime): the data file in 8 MiB buffers sharing the SaveV2 call's span one after the
    other, each index (staged and merged) as its table's block and trailer writes, then the footer:
    7 calls for a one-block index, where one event per file was recorded before."""
    pytest.importorskip("tensorflow")
    ctx = make_ctx(tmp_path, [*FRAMEWORK, "checkpoint.format=tensorflow", "checkpoint.layout=tensorflow",
                              "model.kind=explicit", "model.layer_parameters=[3000000,200]"])
    engine = make_checkpoint_engine(ctx)
    engine.save(3, 1)
    engine.finish()
    folder = Path(engine.root)  # TF's checkpoint directory: the files lie in it
    events, paths = ctx.recorder.array(), ctx.recorder.paths
    writes: dict[str, list] = {}
    for e in events[events["op"] == OPS.index("write")]:
        writes.setdefault(os.path.basename(paths[e["file"]]), []).append((int(e["offset"]), int(e["length"]),
                                                                         float(e["start"]), float(e["end"])))
    data_size = (folder / "ckpt-1.data-00000-of-00001").stat().st_size
    index_size = (folder / "ckpt-1.index").stat().st_size
    assert 8 * 2**20 < data_size < 16 * 2**20
    data = writes.pop("part-00000-of-00001.data-00000-of-00001")
    assert [(o, n) for o, n, _, _ in data] == [(0, 8 * 2**20), (8 * 2**20, data_size - 8 * 2**20)]
    assert data[0][2] < data[0][3] == data[1][2] < data[1][3]  # the call's span, shared in turn
    staged, merged = writes.pop("part-00000-of-00001.index"), writes.pop("ckpt-1.index")
    for calls in (staged, merged):
        assert len(calls) == 7 and calls[-1][1] == 48  # block + trailer three times (data, metaindex, index), footer
        assert [o for o, _, _, _ in calls] == [sum(n for _, n, _, _ in calls[:i]) for i in range(7)]  # in file order
        assert [n for _, n, _, _ in calls][1::2] == [5, 5, 5]  # the blocks' trailers
    assert sum(n for _, n, _, _ in merged) == index_size
    assert all(start == end for _, _, start, end in staged)  # written at SaveV2's end
    assert {name: len(calls) for name, calls in writes.items()} == {"checkpoint.tmp": 2}  # the manager's state, twice
    # each file TF fopens, once: the staged data and index, the staged index again when the merge
    # reads it, the merged index (6 a save with the state file's 2, as darshan-runtime counts them)
    opens: dict[str, int] = {}
    for e in events[events["op"] == OPS.index("open")]:
        name = os.path.basename(paths[e["file"]])
        opens[name] = opens.get(name, 0) + 1
    assert {name: n for name, n in opens.items() if "part-" in name or name.startswith("ckpt-")} == {
        "part-00000-of-00001.data-00000-of-00001": 1, "part-00000-of-00001.index": 2, "ckpt-1.index": 1}
    closes = events[events["op"] == OPS.index("close")]
    assert len(closes) == len(events[events["op"] == OPS.index("open")])
    # the merge reads the staged index back as TF's table reader does: footer, index block, data
    # block (each with its trailer), the blocks the staged index's writes made, at the merge's start
    reads = [(int(e["offset"]), int(e["length"])) for e in events[events["op"] == OPS.index("read")]]
    assert [paths[e["file"]] for e in events[events["op"] == OPS.index("read")]] == \
        [str(folder / "ckpt-1_temp" / "part-00000-of-00001.index")] * 3
    (o, n, _, _), (_, t, _, _) = staged[0], staged[1]  # the data block and its trailer
    assert reads == [(staged[-1][0], 48), (staged[4][0], staged[4][1] + 5), (o, n + t)]
