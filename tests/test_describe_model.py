"""dlio_ckpt-describe-model: a saved checkpoint's tensors -> an explicit model section that the
current schema accepts and whose bytes are exactly the tensors' bytes (checked by an independent
sum over the saved objects, and by dlio_ckpt's own plan of a workload holding the section)."""

from __future__ import annotations

import json
import struct
import subprocess

import numpy as np
import pytest
import yaml

from conftest import BIN, run_cli

from dlio_ckpt.describe.cli import main


def describe(capsys, *args) -> dict:
    main([str(a) for a in args])
    return yaml.safe_load(capsys.readouterr().out)["model"]


def declared_bytes(m: dict) -> int:
    sizes = {"float16": 2, "bfloat16": 2, "float32": 4, "int32": 4, "int64": 8}
    element = [sizes[d] for d in m["layer_dtypes"]] if m.get("layer_dtypes") else [m["model_dtype_bytes"]] * len(m["layer_parameters"])
    return (m["model_size_bytes"] + sum(n * e for n, e in zip(m["layer_parameters"], element))
            + m["optimizer_dtype_bytes"] * m["optimizer_states"] * sum(m["optimization_groups"]))


def test_torch_state_dict_with_batchnorm_and_momentum(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    optimizer.step()
    state = {"epoch": 1, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state, tmp_path / "ck.pt")
    floats = [t for t in model.state_dict().values() if t.dtype == torch.float32]
    momentum = [s["momentum_buffer"] for s in optimizer.state_dict()["state"].values()]

    m = describe(capsys, tmp_path / "ck.pt", "--name", "tiny_cnn")
    assert m["name"] == "tiny_cnn" and m["kind"] == "explicit"
    assert m["model_dtype_bytes"] == 4 and m["optimizer_dtype_bytes"] == 4
    tensors = list(model.state_dict().values())
    assert m["layer_parameters"] == [t.numel() for t in tensors]       # in the state dict's order, BatchNorm's
    assert m["layer_dtypes"] == [str(t.dtype).removeprefix("torch.") for t in tensors]  # int64 counter in place
    assert len(floats) == len(tensors) - 1 and m["layer_dtypes"].count("int64") == 1
    assert m["optimization_groups"] == [t.numel() for t in momentum]
    assert m["model_size_bytes"] == 0
    expected = sum(t.numel() * t.element_size() for t in model.state_dict().values()) + sum(t.numel() * 4 for t in momentum)
    assert declared_bytes(m) == expected
    # each tensor's key under its level of the saved dict ('/'), its shape, and the module's versions
    assert m["layer_names"] == [f"state_dict/{k}" for k in model.state_dict()]
    assert m["layer_shapes"] == [list(t.shape) for t in tensors]
    assert m["optimization_group_names"] == [f"optimizer/state/{i}/momentum_buffer" for i in range(len(momentum))]
    assert m["optimization_group_shapes"] == [list(t.shape) for t in momentum]
    entries = {e["name"]: e.get("value") for e in m["extra_state"]}
    assert entries["epoch"] == 1 and entries["state_dict/_metadata"] == dict(model.state_dict()._metadata)


def test_npz_and_safetensors_take_the_dominant_element_size(tmp_path, capsys):
    np.savez(tmp_path / "w.npz", a=np.zeros((10, 20), np.float16), b=np.zeros(7, np.int32), c=np.zeros((3, 3), np.float16))
    m = describe(capsys, tmp_path / "w.npz")
    assert (m["model_dtype_bytes"], m["layer_parameters"], m["model_size_bytes"]) == (2, [200, 7, 9], 0)
    assert m["layer_dtypes"] == ["float16", "int32", "float16"]
    assert m["optimization_groups"] == []

    header = {"embed.weight": {"dtype": "BF16", "shape": [16, 8], "data_offsets": [0, 256]},
              "optimizer.exp_avg": {"dtype": "F32", "shape": [16, 8], "data_offsets": [256, 768]},
              "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    (tmp_path / "w.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(768))
    m = describe(capsys, tmp_path / "w.safetensors")
    assert (m["model_dtype_bytes"], m["layer_parameters"]) == (2, [128])
    assert (m["optimizer_dtype_bytes"], m["optimization_groups"]) == (4, [128])
    assert declared_bytes(m) == 768


def test_the_section_plans_to_the_same_bytes(tmp_path, capsys, workdir):
    np.savez(tmp_path / "w.npz", w1=np.zeros((64, 32), np.float32), b1=np.zeros(64, np.float32), steps=np.zeros(1, np.int64))
    main([str(tmp_path / "w.npz"), "-o", str(tmp_path / "model.yaml")])
    section = (tmp_path / "model.yaml").read_text()
    workload = tmp_path / "mine.yaml"
    workload.write_text("# @package _global_\nworkload: mine\n" + section)
    done = run_cli([f"workload={workload}", "mode=plan", f"hydra.run.dir={workdir / 'run'}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads((workdir / "run" / "plan.json").read_text())
    assert plan["model"]["total_bytes"] == 64 * 32 * 4 + 64 * 4 + 8


@pytest.mark.parametrize("name, content, expected", [
    ("missing.pt", None, "no such file"),
    ("weights.xyz", b"not a checkpoint", "cannot tell its format"),
    ("bad.safetensors", b"\xff" * 16, "not a safetensors file"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, name, content, expected):
    if content is not None:
        (tmp_path / name).write_bytes(content)
    out = tmp_path / "out.yaml"
    done = subprocess.run([str(BIN / "dlio_ckpt-describe-model"), str(tmp_path / name), "-o", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert expected in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ([name] if content is not None else [])


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_folder_is_read_from_its_metadata(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    state = {"model": {"w": torch.zeros(16, 4), "b": torch.zeros(16, dtype=torch.bfloat16)},
             "optim": {"state": {"w": {"exp_avg": torch.zeros(16, 4)}}}}
    dcp.save(state, checkpoint_id=str(tmp_path / "epoch_1"))  # no process group: DCP saves as one rank
    m = describe(capsys, tmp_path / "epoch_1")
    assert (m["model_dtype_bytes"], m["layer_parameters"], m["model_size_bytes"]) == (4, [64, 16], 0)
    assert m["layer_dtypes"] == ["float32", "bfloat16"]
    assert (m["optimizer_dtype_bytes"], m["optimization_groups"]) == (4, [64])
