"""The checkpoint formats' containers, byte for byte against the frameworks' own.

Each test saves a small real state with the framework (torch.save to a path, DCP's dcp.save,
TensorFlow's Checkpoint), describes it with dlio_ckpt-describe-model's readers, plans the described
model (schema -> ModelPlan: names, element types, shapes, non-tensor entries) and writes the same
state with the emulation's writer; then the two containers are compared by independent readers:
the zip listing (record names, sizes, offsets, padding), DCP's unpickled `.metadata`, TensorFlow's
index (names, shapes, dtypes), and the total length of every file.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import pytest
import yaml

from dlio_ckpt.describe.readers import read_tensors
from dlio_ckpt.describe.section import model_section
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.plan.layouts import get_layout
from dlio_ckpt.plan.model import build_model_plan
from dlio_ckpt.schema import ModelConfig
from dlio_ckpt.typed import build

REPO = Path(__file__).resolve().parents[1]


def plan_of(checkpoint: Path, world: int = 1, layout: str = ""):
    """The described checkpoint as the emulation plans it: every tensor and entry, in order (under
    `layout`, in its file's order: TensorFlow's SaveV2 takes model.write_order's)."""
    section = {k: v for k, v in model_section(read_tensors(checkpoint), "m").items() if k != "_notes"}
    defaults = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())["model"]
    config = build(ModelConfig, {**defaults, **section}, "model.")
    config.validate("model.")
    plan = build_model_plan(config, world)
    if layout:
        ((_, tensors),) = get_layout(layout).rank_files(plan, 0, plan.rank_tensors(0), "")
        return tensors
    return plan.rank_tensors(0)


class File:
    """A plain file as the engine's traced handle looks to a format: write, writev, tell, its path."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._f = open(path, "wb")

    def write(self, data) -> int:
        return self._f.write(data)

    def writev(self, views) -> int:
        return sum(self._f.write(v) for v in views)

    def tell(self) -> int:
        return self._f.tell()

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self._f.close()


def zeros(tensor):
    yield memoryview(bytes(tensor.nbytes))


def _listing(path: Path) -> list[tuple]:
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None  # every record's CRC holds
        return [(i.filename, i.file_size, i.header_offset, i.extra) for i in archive.infolist()]


def small_training_state(torch):
    """A module's state dict (conv, BatchNorm with its int64 counter, linear) and SGD's momentum
    after one step, under the keys PyTorch's ImageNet example saves."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 6 * 6, 4))
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_torch_save_container_is_the_programs_byte_for_byte(tmp_path):
    torch = pytest.importorskip("torch")
    from dlio_ckpt.checkpoint.formats import get_format

    model, optimizer = small_training_state(torch)
    (tmp_path / "real").mkdir()
    (tmp_path / "emulated").mkdir()
    real = tmp_path / "real" / "checkpoint_1.pt"
    torch.save({"epoch": 1, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}, real)

    tensors = plan_of(real)
    emulated = tmp_path / "emulated" / "checkpoint_1.pt"
    fmt = get_format("torch")
    handle = File(emulated)
    fmt.write_prepared(handle, fmt.prepare(tensors, zeros))
    handle.close()

    # the zip: the same records under the file's name, of the same sizes, at the same offsets
    assert _listing(emulated) == _listing(real)
    assert _listing(real)[0][0] == "checkpoint_1/data.pkl"
    assert emulated.stat().st_size == real.stat().st_size
    # torch.load reads the same nested state: keys, shapes, dtypes, the module versions
    a, b = torch.load(real, weights_only=True), torch.load(emulated, weights_only=True)
    assert set(a) == set(b) and a["epoch"] == b["epoch"]
    assert [(k, v.shape, v.dtype) for k, v in a["state_dict"].items()] == [(k, v.shape, v.dtype) for k, v in b["state_dict"].items()]
    assert type(b["state_dict"]).__name__ == "OrderedDict" and b["state_dict"]._metadata == a["state_dict"]._metadata
    assert ({i: {k: (v.shape, v.dtype) for k, v in s.items()} for i, s in a["optimizer"]["state"].items()}
            == {i: {k: (v.shape, v.dtype) for k, v in s.items()} for i, s in b["optimizer"]["state"].items()})
    assert b["optimizer"]["param_groups"] == a["optimizer"]["param_groups"]


def test_archive_name_gives_the_programs_zip_under_another_file_name(tmp_path):
    """checkpoint.archive_name: the raw layout's rank_00000.pt holding checkpoint_1.pt's container."""
    torch = pytest.importorskip("torch")
    import dataclasses

    from dlio_ckpt.checkpoint.formats import get_format

    model, optimizer = small_training_state(torch)
    real = tmp_path / "checkpoint_1.pt"
    torch.save({"epoch": 1, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}, real)
    fmt = dataclasses.replace(get_format("torch"), archive_name="checkpoint_1")
    handle = File(tmp_path / "rank_00000.pt")
    fmt.write_prepared(handle, fmt.prepare(plan_of(real), zeros))
    handle.close()
    assert _listing(tmp_path / "rank_00000.pt") == _listing(real)
    assert (tmp_path / "rank_00000.pt").stat().st_size == real.stat().st_size


def test_torch_save_to_a_stream_keeps_its_own_name(tmp_path):
    """Without a path (an object upload), the container is torch.save's into a stream: `archive/`."""
    torch = pytest.importorskip("torch")
    from dlio_ckpt.checkpoint.formats import get_format

    model, _ = small_training_state(torch)
    real = tmp_path / "w.pt"
    torch.save({"state_dict": model.state_dict()}, real)
    fmt = get_format("torch")

    class Stream(File):
        path = ""

    handle = Stream(tmp_path / "stream.pt")
    handle.path = ""
    fmt.write_prepared(handle, fmt.prepare(plan_of(real), zeros))
    handle.close()
    names = [row[0] for row in _listing(tmp_path / "stream.pt")]
    assert names[0] == "archive/data.pkl" and all(n.startswith("archive/") for n in names)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_metadata_and_files_are_the_programs(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    from dlio_ckpt.checkpoint.formats import get_format

    model, optimizer = small_training_state(torch)
    optim = optimizer.state_dict()
    names = [name for name, _ in model.named_parameters()]  # DCP's tutorial state: optimizer state by FQN
    state = {"app": {"model": model.state_dict(),
                     "optim": {"state": {names[i]: s for i, s in optim["state"].items()},
                               "param_groups": [{**g, "params": names} for g in optim["param_groups"]]}}}
    real = tmp_path / "real" / "epoch_1"
    dcp.save(state, checkpoint_id=str(real))  # no process group: one rank

    tensors = plan_of(real)
    emulated = tmp_path / "emulated" / "epoch_1"
    emulated.mkdir(parents=True)
    fmt = get_format("torch", "pytorch_dcp")
    handle = File(emulated / "__0_0.distcp")
    records = fmt.write_prepared(handle, fmt.prepare(tensors, zeros))
    handle.close()
    # the real program's checkpoint_id (a path of the same length: the folder is recorded)
    content = fmt.coordinator_content([{"path": "__0_0.distcp", "records": records}],
                                      {"__0_0.distcp": tensors}, str(real))
    (emulated / ".metadata").write_bytes(content)

    assert (emulated / "__0_0.distcp").stat().st_size == (real / "__0_0.distcp").stat().st_size
    want, got = FileSystemReader(str(real)).read_metadata(), FileSystemReader(str(emulated)).read_metadata()
    assert got.planner_data == want.planner_data  # each key's path: ('app', 'model', '0.weight'), (.., 'param_groups', 0, 'lr')
    assert set(got.state_dict_metadata) == set(want.state_dict_metadata)
    for fqn, entry in want.state_dict_metadata.items():
        assert got.state_dict_metadata[fqn] == entry  # shapes, dtypes, chunks
    assert ({(k.fqn, tuple(k.offset or ())): v.length for k, v in got.storage_data.items()}
            == {(k.fqn, tuple(k.offset or ())): v.length for k, v in want.storage_data.items()})
    assert len(content) == (real / ".metadata").stat().st_size


def test_tensorflow_index_is_the_programs(tmp_path):
    tf = pytest.importorskip("tensorflow")
    from dlio_ckpt.checkpoint.formats import get_format

    dense = tf.Variable(tf.random.normal([3, 3, 3, 8]))
    bias = tf.Variable(tf.zeros([8]))
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(step=step, net=tf.train.Checkpoint(kernel=dense, bias=bias))
    real = tf.train.CheckpointManager(checkpoint, str(tmp_path / "real"), max_to_keep=3).save()

    tensors = plan_of(Path(real), layout="tensorflow")
    folder = tmp_path / "emulated"
    folder.mkdir()
    fmt = get_format("tensorflow")
    data = str(folder / "ckpt-1.data-00000-of-00001")
    staged = fmt.write_paths(data, 0, tensors, zeros)
    assert staged.data.endswith("_temp/part-00000-of-00001.data-00000-of-00001")
    fmt.merge([data])

    want, got = dict(tf.train.list_variables(real)), dict(tf.train.list_variables(str(folder / "ckpt-1")))
    assert got == want  # names and shapes: step [], net/kernel [3, 3, 3, 8], the object graph
    reader = tf.train.load_checkpoint(str(folder / "ckpt-1"))
    assert reader.get_variable_to_dtype_map() == tf.train.load_checkpoint(real).get_variable_to_dtype_map()
    data = ".data-00000-of-00001"
    assert os.path.getsize(str(folder / "ckpt-1") + data) == os.path.getsize(real + data)
    # The index records each tensor's offset in the data file as a varint (none for offset 0), and
    # TensorFlow writes the tensors in its object graph's order (step, save_counter, net/...), which
    # the index's offsets record: describe-model reads it (model.write_order) and the tensorflow
    # layout hands SaveV2 the tensors in it, so every offset is the program's and the index is as
    # long (it was 2 B of 369 off in the described order). The entries' CRC32Cs are fixed32s.
    order = read_tensors(real).write_order
    assert order[:2] == ("step/.ATTRIBUTES/VARIABLE_VALUE", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    assert read_tensors(str(folder / "ckpt-1")).write_order == order
    assert os.path.getsize(str(folder / "ckpt-1") + ".index") == os.path.getsize(real + ".index")


def test_a_shape_that_does_not_hold_its_count_is_refused():
    defaults = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())["model"]
    with pytest.raises(ConfigError, match=r"layer_shapes\[1\]: shape \[3\] holds 3 elements, but layer_parameters\[1\] is 4"):
        build(ModelConfig, {**defaults, "kind": "explicit", "layer_parameters": [6, 4], "layer_shapes": [[2, 3], [3]]},
              "model.").validate("model.")
    config = build(ModelConfig, {**defaults, "kind": "explicit", "layer_parameters": [6], "layer_shapes": []}, "model.")
    config.validate("model.")  # no shapes: flat tensors
    assert build_model_plan(config, 1).rank_tensors(0)[0].dims == (6,)


def test_write_order_orders_the_tensorflow_file_and_names_only_the_models_names():
    """model.write_order hands SaveV2 the tensors in the program's order (names not listed after,
    in their places); a name that is none of the model's is refused in one line."""
    defaults = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())["model"]
    model = {**defaults, "kind": "explicit", "layer_parameters": [6, 4], "layer_names": ["a", "b"],
             "optimization_groups": [2], "optimization_group_names": ["opt"], "optimizer_states": 1, "extra_state": [{"name": "graph", "bytes": 9}]}
    config = build(ModelConfig, {**model, "write_order": ["opt", "b"]}, "model.")
    config.validate("model.")
    plan = build_model_plan(config, 1)
    assert [t.name for t in plan.rank_tensors(0)] == ["a", "b", "opt", "graph"]  # the state dict's order
    ((_, tensors),) = get_layout("tensorflow").rank_files(plan, 0, plan.rank_tensors(0), "")
    assert [t.name for t in tensors] == ["opt", "b", "a", "graph"]
    with pytest.raises(ConfigError, match=r"model.write_order: 'c' is not a name of layer_names"):
        build(ModelConfig, {**model, "write_order": ["a", "c"]}, "model.").validate("model.")
    with pytest.raises(ConfigError, match=r"model.write_order: a name is given twice"):
        build(ModelConfig, {**model, "write_order": ["a", "a"]}, "model.").validate("model.")


def test_a_tensor_cut_into_parts_is_flat():
    """Tensor parallelism cuts a layer; its parts have no shape of their own, so they are flat."""
    defaults = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())["model"]
    config = build(ModelConfig, {**defaults, "kind": "explicit", "layer_parameters": [6, 1], "layer_shapes": [[2, 3], []],
                                 "parallelism": {**defaults["parallelism"], "tensor": 2}}, "model.")
    plan = build_model_plan(config, 2)
    assert [(t.numel, t.dims) for t in plan.rank_tensors(0)] == [(3, (3,)), (1, ())]
    assert [(t.numel, t.dims) for t in plan.rank_tensors(1)] == [(3, (3,))]


def test_an_archive_name_with_a_folder_is_refused():
    from dlio_ckpt.schema import CheckpointConfig

    defaults = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())["checkpoint"]
    with pytest.raises(ConfigError, match="archive_name: give the name of the program's checkpoint file"):
        build(CheckpointConfig, {**defaults, "archive_name": "ckpt/checkpoint_1"}, "checkpoint.").validate("checkpoint.")


def test_tensorflow_state_file_is_checkpoint_managers(tmp_path, monkeypatch):
    """Every write of CheckpointManager's `checkpoint` state (two per save, max_to_keep=2, four
    saves) against the tensorflow layout's, given the same save times: the same bytes, in the
    framework's flat directory (`ckpt-N`); in a folder per checkpoint (the commit protocol's) each
    path is `ckpt-N/ckpt-N`."""
    import re

    tf = pytest.importorskip("tensorflow")
    from tensorflow.python.checkpoint import checkpoint_management

    from dlio_ckpt.plan.layouts import get_layout

    real = []
    write = checkpoint_management.file_io.atomic_write_string_to_file

    def capture(filename, contents, overwrite=True):
        if os.path.basename(filename) == "checkpoint":
            real.append(contents)
        return write(filename, contents, overwrite)

    monkeypatch.setattr(checkpoint_management.file_io, "atomic_write_string_to_file", capture)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), max_to_keep=2)
    for _ in range(4):
        manager.save()
    assert len(real) == 8

    def numbers(text, field):
        return [float(v) for v in re.findall(rf"^{field}: (\S+)$", text, re.M)]

    (preserved,) = numbers(real[0], "last_preserved_timestamp")
    layout, saves, emulated = get_layout("tensorflow"), [], []
    for step in range(1, 5):
        saves.append((step, numbers(real[2 * step - 2], "all_model_checkpoint_timestamps")[-1]))
        emulated += layout.tag_texts(step, saves, 2, preserved, flat=True)
        foldered = layout.tag_texts(step, saves, 2, preserved)
        saves = saves[-2:]
    assert emulated == real
    assert [re.sub(r'"ckpt-(\d+)"', r'"ckpt-\1/ckpt-\1"', text) for text in real[-2:]] == foldered
