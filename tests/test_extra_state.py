"""model.extra_state: the non-tensor entries a framework saves beside the tensors, byte for byte.

Each format is checked against the framework saving the same state in this test: torch.save's
pickle (the epoch, the optimizer's param_groups), DCP's bytes items (each torch.save'd into the
`.distcp`, described in `.metadata`, read back by dcp.load), TensorFlow's string entry (the object
graph, a blob of the given size). dlio_ckpt-describe-model's readers list the entries a saved
checkpoint holds, as the key takes them, and the YAML it prints loads back as the same values.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from ckpt_util import make_ctx
from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.checkpoint.fileio import write_file
from dlio_ckpt.checkpoint.formats import get_format
from dlio_ckpt.config.load import load_config
from dlio_ckpt.describe.readers import read_tensors
from dlio_ckpt.describe.section import model_section, to_yaml
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.storage.events import EventRecorder, JobClock
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.traced import TracedStorage

GROUPS = [{"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-05, "nesterov": False, "foreach": None, "params": [0, 1]}]
TENSORS = (TensorSpec("conv.weight", 3_000, 4, "model"), TensorSpec("bn.num_batches_tracked", 1, 8, "model", "int64"),
           TensorSpec("momentum.0", 3_000, 4, "optimizer"))
OBJECTS = (TensorSpec("epoch", 0, 1, "object", value="3"),
           TensorSpec("optimizer.param_groups", 0, 1, "object", value=json.dumps(GROUPS)))


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {t.name: rng.integers(0, 256, t.nbytes, dtype=np.uint8).view(t.dtype) for t in TENSORS}


def emulate(tmp_path: Path, layout: str, specs) -> bytes:
    values = arrays()
    storage = TracedStorage(PosixStorage(), EventRecorder(rank=0, clock=JobClock.start()))
    path = str(tmp_path / f"emulated_{layout}")
    write_file(storage, path, specs, get_format("torch", layout), lambda t: iter([memoryview(values[t.name].view(np.uint8))]),
               fsync=False, checksum="none", chunk_bytes=1 << 16)
    return Path(path).read_bytes()


def test_torch_save_pickles_the_entries_as_the_program_does(tmp_path):
    torch = pytest.importorskip("torch")
    values = arrays()
    state = {name: torch.from_numpy(array) for name, array in values.items()}
    state.update(epoch=3, **{"optimizer.param_groups": GROUPS})
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "emulated_raw"  # the emulated file's name: the zip's folder is named after it
    torch.save(state, real)
    assert emulate(tmp_path, "raw", TENSORS + OBJECTS) == real.read_bytes()
    # and describe-model lists them as the key takes them
    (tmp_path / "real.pt").write_bytes(real.read_bytes())
    listing = read_tensors(tmp_path / "real.pt")
    assert [(e.name, e.value, e.blob) for e in listing.entries] == [("epoch", 3, -1), ("optimizer.param_groups", GROUPS, -1)]
    yaml = to_yaml(listing, model_section(listing, "real"), None)
    assert "weight_decay\": 1.0e-05" in yaml  # YAML 1.1 reads 1e-05 as a string
    loaded = OmegaConf.to_container(OmegaConf.create(yaml))["model"]["extra_state"]
    assert loaded == [{"name": "epoch", "value": 3}, {"name": "optimizer.param_groups", "value": GROUPS}]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_writes_bytes_items_first_and_describes_them_in_the_metadata(tmp_path):
    torch = pytest.importorskip("torch")
    import pickle

    import torch.distributed.checkpoint as dcp

    values = arrays()
    state = {name: torch.from_numpy(array) for name, array in values.items()}
    state.update({"optim.lr": 0.1, "optim.params": ["conv.weight"]})
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "real")))
    objects = (TensorSpec("optim.lr", 0, 1, "object", value="0.1"),
               TensorSpec("optim.params", 0, 1, "object", value='["conv.weight"]'))
    emulated = emulate(tmp_path, "pytorch_dcp", TENSORS + objects)
    assert emulated == (tmp_path / "real" / "__0_0.distcp").read_bytes()
    # the coordinator's .metadata, from the writer's records, lets dcp.load read every entry back
    values_again = arrays()
    storage = TracedStorage(PosixStorage(), EventRecorder(rank=0, clock=JobClock.start()))
    folder = tmp_path / "ours"
    folder.mkdir()
    fmt = get_format("torch", "pytorch_dcp")
    done = write_file(storage, str(folder / "__0_0.distcp"), TENSORS + objects, fmt,
                      lambda t: iter([memoryview(values_again[t.name].view(np.uint8))]), fsync=False, checksum="none",
                      chunk_bytes=1 << 16)
    files = [{"path": "__0_0.distcp", "records": [list(r) for r in done.records]}]
    (folder / ".metadata").write_bytes(fmt.coordinator_content(files, {"__0_0.distcp": TENSORS + objects}, str(folder)))
    target = {t.name: torch.zeros(t.numel, dtype=getattr(torch, t.framework_dtype)) for t in TENSORS}
    target.update({"optim.lr": 0.0, "optim.params": []})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, checkpoint_id=str(folder))
    assert target["optim.lr"] == 0.1 and target["optim.params"] == ["conv.weight"]
    assert target["conv.weight"].numpy().tobytes() == values_again["conv.weight"].tobytes()
    metadata = pickle.loads((folder / ".metadata").read_bytes())
    real_metadata = pickle.loads((tmp_path / "real" / ".metadata").read_bytes())
    assert {k: type(v).__name__ for k, v in metadata.state_dict_metadata.items()} == \
        {k: type(v).__name__ for k, v in real_metadata.state_dict_metadata.items()}


def test_tensorflow_saves_a_blob_under_its_own_name(tmp_path):
    tf = pytest.importorskip("tensorflow")
    ctx = make_ctx(tmp_path, ["checkpoint.durability=framework", "checkpoint.format=tensorflow",
                              "checkpoint.layout=tensorflow",
                              "model.extra_state=[{name: _CHECKPOINTABLE_OBJECT_GRAPH, bytes: 4818}]"])
    engine = make_checkpoint_engine(ctx)
    engine.save(2, 1)
    engine.finish()
    (pf,) = engine.plan.files_by_rank[0]
    reader = tf.train.load_checkpoint(str(Path(engine.root) / "ckpt-1"))  # CheckpointManager's directory, its first save
    assert len(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")) == 4818
    # SaveV2 stores a string scalar as its bytes, a 4-byte CRC and a varint length (2 bytes for 4,818)
    data = Path(engine.root) / pf.path_for(1)
    assert data.stat().st_size == pf.payload_bytes + 4818 + 4 + 2


@pytest.mark.parametrize("overrides, message", [
    (["checkpoint.format=npz", "model.extra_state=[{name: epoch, value: 1}]"],
     "model.extra_state: non-tensor entries are written by checkpoint.format torch or tensorflow only (got 'npz')"),
    (["checkpoint.format=torch", "model.extra_state=[{name: g, value: 1, bytes: 10}]"],
     "model.extra_state[0].: give either value or bytes, not both"),
    (["checkpoint.format=torch", "model.extra_state=[{name: g, value: 1},{name: g, value: 2}]"],
     "model.extra_state: an entry name is given twice"),
    (["model.layer_names=[a]"], "model.layer_names: 1 names for 2 layer_parameters"),
    (["model.layer_names=[a,a]"], "model.layer_names: a name is given twice"),
    (["model.optimization_groups=[5]", "model.optimization_group_names=[g]"],
     "model.optimization_group_names: give one name per optimization_groups entry, with optimizer_states 1"),
])
def test_extra_state_and_names_are_checked(overrides, message):
    with pytest.raises(ConfigError) as caught:
        load_config(["model.kind=explicit", "model.layer_parameters=[10,20]", *overrides])
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_layer_and_group_names_are_the_checkpoints_keys(tmp_path):
    torch = pytest.importorskip("torch")
    ctx = make_ctx(tmp_path, ["checkpoint.durability=framework", "checkpoint.format=torch", "model.model_size_bytes=0",
                              "model.layer_parameters=[30,4]", "model.layer_names=[conv.weight,conv.bias]",
                              "model.optimizer_states=1", "model.optimization_groups=[30]",
                              "model.optimization_group_names=[optimizer.state.0.momentum_buffer]"])
    engine = make_checkpoint_engine(ctx)
    engine.save(1, 1)
    (pf,) = engine.plan.files_by_rank[0]
    loaded = torch.load(Path(engine.root) / "step_00000001" / pf.path_for(1), weights_only=True)
    assert list(loaded) == ["conv.weight", "conv.bias", "optimizer.state.0.momentum_buffer"]
