"""checkpoint.layout=flat: a program saving each checkpoint straight into one folder, as a plain
PyTorch loop's torch.save(state, f"checkpoint_{epoch}.pt") does: the files land in the run's
checkpoint folder under their own names, no folder is made for a checkpoint (the program makes
none), and what needs a folder per checkpoint (a manifest, retention) is refused in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt_util import make_ctx
from conftest import run_cli
from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.checkpoint.write_plan import plan_write
from dlio_ckpt.config.load import load_config
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.plan.checkpoint import PlannedFile, build_checkpoint_plan
from dlio_ckpt.plan.layouts import get_layout
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.storage.posix import PosixStorage

FLAT = ["checkpoint.durability=framework", "checkpoint.layout=flat", "checkpoint.keep_last=0"]


def test_one_rank_names_its_file_after_the_step_and_no_folder():
    config = load_config(["model.kind=explicit", "model.layer_parameters=[100,20]", *FLAT, "checkpoint.format=npy"])
    plan = build_checkpoint_plan(config, 1)
    assert plan.layout.folder(8) == "" and plan.layout.parse_step("checkpoint_8.npy") is None
    assert plan.files_summary(8)[0] == ["checkpoint_8.npy"]
    two = build_checkpoint_plan(config, 2)
    assert two.files_summary(3)[0] == ["checkpoint_3_rank00000.npy"]  # DP rank 0 writes the replicated state
    assert get_layout("raw").folder_per_checkpoint and not get_layout("flat").folder_per_checkpoint


def test_the_write_plan_makes_no_folder_that_exists_and_every_other_once():
    tensors = (TensorSpec("w", 4, 4, "model"),)
    files = (PlannedFile("checkpoint_{step}.pt", 0, tensors), PlannedFile("sub/x_{step}.pt", 0, tensors))
    flat = plan_write("/ck/run-1/", 5, files, folder_exists=True)
    assert [f.path for f in flat.files] == ["/ck/run-1/checkpoint_5.pt", "/ck/run-1/sub/x_5.pt"]
    assert [f.makes_folder for f in flat.files] == [None, "/ck/run-1/sub"]
    foldered = plan_write("/ck/run-1/step_5", 5, files[:1])
    assert foldered.files[0].makes_folder == "/ck/run-1/step_5"


def test_torch_saves_land_in_the_run_folder_without_a_mkdir(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    made: list[str] = []
    real_makedirs = PosixStorage.makedirs
    monkeypatch.setattr(PosixStorage, "makedirs", lambda self, path: (made.append(path), real_makedirs(self, path))[1])
    ctx = make_ctx(tmp_path, [*FLAT, "checkpoint.format=torch"])
    engine = make_checkpoint_engine(ctx)
    assert made == [engine.root]  # the program's checkpoint directory, made when it starts, not in a save
    made.clear()
    engine.save(4, 1)  # (step, epoch)
    engine.save(8, 2)
    engine.finish()
    root = Path(engine.root)
    assert made == []
    # numbered by the save (from 1), as a loop saving each epoch names checkpoint_<epoch>.pt
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_1.pt", "checkpoint_2.pt"]
    loaded = torch.load(root / "checkpoint_2.pt", weights_only=True)
    (pf,) = engine.plan.files_by_rank[0]
    assert sum(v.numel() for v in loaded.values()) == sum(t.numel for t in pf.tensors)
    counts = {op: n for (phase, op), n in ctx.recorder.op_counts.items() if phase == "checkpoint"}
    assert counts["open"] == 2 and "fsync" not in counts and "rename" not in counts and "read" not in counts


def test_flat_numbers_step_names_each_save_by_its_step(tmp_path):
    """A loop that saves torch.save(state, f"checkpoint_{step}.pt"): the names carry the step; numpy
    reads both files back whole."""
    import numpy as np

    ctx = make_ctx(tmp_path, [*FLAT, "checkpoint.format=npy", "checkpoint.flat_numbers=step"])
    engine = make_checkpoint_engine(ctx)
    engine.save(4, 1)
    engine.save(8, 2)
    engine.finish()
    root = Path(engine.root)
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_4.npy", "checkpoint_8.npy"]
    (pf,) = engine.plan.files_by_rank[0]
    assert all(np.load(root / name).nbytes == sum(t.nbytes for t in pf.tensors) for name in ("checkpoint_4.npy", "checkpoint_8.npy"))


@pytest.mark.parametrize("overrides, says", [
    (["checkpoint.keep_last=2"], "keeps every file"),
    (["checkpoint.durability=commit"], "checkpoint.durability=commit"),
    (["failures.at_steps=[3]"], "failures restore"),
])
def test_what_needs_a_folder_per_checkpoint_is_refused(tmp_path, overrides, says):
    ctx = make_ctx(tmp_path, [*FLAT, "checkpoint.format=raw", *overrides])
    with pytest.raises(ConfigError, match=says):
        make_checkpoint_engine(ctx)


def test_the_cli_refuses_it_in_one_line_with_nothing_written(tmp_path):
    done = run_cli(["workload=unet3d", "checkpoint.enabled=true", "checkpoint.layout=flat", "checkpoint.keep_last=3", "scale=tiny",
                    f"storage.root={tmp_path / 'store'}", f"hydra.run.dir={tmp_path / 'run'}", "progress=false"],
                   cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("dlio_ckpt: error: checkpoint.layout=flat keeps every file, as a "
                                                    "program saving checkpoint_<n>.pt into one folder does: set "
                                                    "checkpoint.keep_last=0")
    assert not (tmp_path / "store" / "checkpoints").exists() or not os.listdir(tmp_path / "store" / "checkpoints")


def test_plan_mode_names_the_files_a_run_writes():
    from dlio_ckpt.engine.plan_mode import build_plan_report

    config = load_config(["model.kind=explicit", "model.layer_parameters=[100,20]", *FLAT, "checkpoint.format=npy",
                          "checkpoint.steps_between_checkpoints=8"])
    report = build_plan_report(config)["checkpoint"]
    assert report["file_names"] == ["checkpoint_1.npy"]  # the first save, numbered as the engine numbers it
