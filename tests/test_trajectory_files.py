"""`checkpoint.update=files`: a real training run's saved states replayed as the state's evolution
(state/trajectory.py, FilesModel), and `sgd` calibrated against such trajectories (issue 23)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import load_summary
from dlio_ckpt.config.load import load_config
from dlio_ckpt.content import ByteSource
from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.rank_state import RankState
from test_failures_restart import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from sgd_calibration import lc_ratio  # noqa: E402  LC-Checkpoint's ratio over a chain, as the calibration measures it

SOURCE = ByteSource(seed=5, pool_bytes=1 << 20)


def train(folder: Path, optimizer: str = "sgd", steps: int = 30, every: int = 1, suffix: str = ".pt",
          width: int = 64) -> dict[int, np.ndarray]:
    """A tiny MLP (32-width-width-10) learning a random teacher's labels on Gaussian inputs; its state saved every
    `every` steps into `folder`. Returns step -> the flattened float parameters, read here from
    the model itself (not from the files)."""
    torch = pytest.importorskip("torch")  # here, not at collection: every pytest worker would import it
    torch.manual_seed(0)
    torch.set_num_threads(1)  # tiny products: threads only contend on a shared machine
    model = torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 10))
    teacher = torch.nn.Linear(32, 10)
    opt = (torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=1e-3))
    folder.mkdir(parents=True, exist_ok=True)
    truth = {}
    for step in range(steps + 1):
        if step:
            x = torch.randn(64, 32)
            loss = torch.nn.functional.cross_entropy(model(x), teacher(x).argmax(1).detach())
            opt.zero_grad()
            loss.backward()
            opt.step()
        if step % every == 0:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            truth[step] = torch.cat([v.flatten() for v in state.values()]).numpy().copy()
            if suffix == ".pt":
                torch.save(state, folder / f"step_{step:04d}.pt")
            else:
                np.savez(folder / f"ckpt-{step}.npz", **{k: v.numpy() for k, v in state.items()})
    return truth


def files_state(folder: Path, files, layout=None, **changes) -> RankState:
    cfg = dataclasses.replace(load_config([]).checkpoint, update="files", update_files=str(folder), **changes)
    return RankState(files, cfg, 7, SOURCE, layout=layout)


def floats(state: RankState, pf: PlannedFile, dtype=np.float32) -> np.ndarray:
    return np.frombuffer(b"".join(bytes(p) for p in state.view(pf).stream(1 << 16)), dtype)


@pytest.mark.parametrize("suffix", [".pt", ".npz"])
def test_the_state_replays_the_saved_trajectory_sharded_as_the_layout(tmp_path, suffix):
    truth = train(tmp_path / "run", every=5, suffix=suffix)
    size = len(truth[0])  # 7,002 parameters
    half = size // 2
    shards = (PlannedFile("model/{step}.bin", 0, (TensorSpec("w", half, 4, "model"),)),
              PlannedFile("model/{step}.bin", 1, (TensorSpec("w", size - half, 4, "model"),)))
    layout = ((shards[0],), (shards[1],))
    rank0 = files_state(tmp_path / "run", (shards[0],), layout)
    rank1 = files_state(tmp_path / "run", (shards[1],), layout)
    for step, saved in ((0, 0), (5, 5), (7, 5), (20, 20), (29, 25), (40, 30)):  # between saves: the last one
        rank0.advance(step)
        rank1.advance(step)
        assert np.array_equal(np.concatenate([floats(rank0, shards[0]), floats(rank1, shards[1])]), truth[saved]), step
    direct = files_state(tmp_path / "run", (shards[1],), layout)
    direct.advance(40)  # straight there: the same bytes (the state at a step depends on the step alone)
    assert direct.digest(shards[1]) == rank1.digest(shards[1])


def test_a_larger_layout_goes_round_the_trajectory_and_float16_rounds_it(tmp_path):
    truth = train(tmp_path / "run", steps=10, every=10)
    size = len(truth[10])
    pf = PlannedFile("big/{step}.bin", 0, (TensorSpec("h", 3 * size, 2, "model"), TensorSpec("b", 100, 1, "model")))
    state = files_state(tmp_path / "run", (pf,))
    state.advance(10)
    values = floats(state, pf, np.uint8)[: 3 * size * 2].view(np.float16).astype(np.float32)
    assert np.array_equal(values[:size], truth[10].astype(np.float16).astype(np.float32))  # the first lap: the values
    ratio = values[size : 2 * size] / truth[10].astype(np.float16).astype(np.float32)
    assert 2**-0.5 <= np.median(ratio) < 2**0.5 and not np.allclose(ratio, 1)  # the next lap scaled, not a copy


def test_bad_trajectory_folders_are_refused_in_one_line(workdir):
    empty = workdir / "empty"
    empty.mkdir()
    twice = workdir / "twice"
    twice.mkdir()
    np.save(twice / "step_3.npy", np.zeros(4, np.float32))
    np.save(twice / "state-03.npy", np.zeros(4, np.float32))
    for folder, words in ((workdir / "missing", "is not a folder"), (empty, "holds no saved state"),
                          (twice, "are both step 3")):
        done = run(workdir, "bad", ["checkpoint.update=files", f"checkpoint.update_files={folder}"])
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_a_user_trajectory_runs_end_to_end_with_failures_and_lossy_checkpoints(workdir):
    train(workdir / "traj", steps=40, every=4, suffix=".npz")
    common = ["checkpoint.update=files", f"checkpoint.update_files={workdir / 'traj'}",
              "checkpoint.steps_between_checkpoints=4", "failures.at_steps=[10]", "train.epochs=1"]
    done = run(workdir, "run", common + ["checkpoint.encoding=incremental"])
    assert done.returncode == 0, done.stderr
    summary = load_summary(workdir / "run")
    assert summary["resume"]["deterministic"] is True and summary["resume"]["states_checked"] >= 4
    # float tensors only (the explicit model's blob is bytes, which lossy stores as they are)
    lossy = run(workdir, "lossy", common[:-2] + ["checkpoint.encoding=lossy", "model.model_size_bytes=0",
                                                 "model.layer_parameters=[65536,65536]", "train.epochs=1"])
    assert lossy.returncode == 0, lossy.stderr
    rows = load_summary(workdir / "lossy")["checkpoint"]["per_checkpoint"]
    ratios = [r["compression_ratio"] for r in rows[1:]]  # deltas (the first is the chain's full state)
    assert len(ratios) == 3 and all(r > 2 for r in ratios), ratios


def test_sgd_compresses_as_real_trajectories_do(tmp_path):
    """The calibration (docs/checkpointing.md): at the same checkpoint interval, LC-Checkpoint's
    ratio on `sgd` lies between those of real torch runs trained with Adam and with SGD+momentum
    (before the calibration `sgd` sat at Huffman's ceiling, 30-31x, above both)."""
    interval, checkpoints = 10, 4
    real = {}
    for optimizer in ("adam", "sgd"):
        truth = train(tmp_path / optimizer, optimizer, steps=interval * checkpoints, every=interval, width=128)
        real[optimizer] = lc_ratio([truth[s] for s in range(0, interval * checkpoints + 1, interval)], bits=3)
    size = 1 << 17
    pf = PlannedFile("w/{step}.bin", 0, (TensorSpec("w", size, 4, "model"),))
    cfg = dataclasses.replace(load_config([]).checkpoint, update="sgd")
    state = RankState((pf,), cfg, 7, SOURCE)
    chain = []
    for index in range(checkpoints + 1):
        state.advance(index * interval)
        chain.append(floats(state, pf).copy())
    emulated = lc_ratio(chain, bits=3)
    assert real["adam"] < emulated < real["sgd"], (real, emulated)
    assert emulated < 25  # not Huffman's ceiling


SAVED = {step: np.random.default_rng(step).standard_normal(300).astype(np.float32) for step in (0, 2)}


def test_npy_states_replay(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    for step, values in SAVED.items():
        np.save(folder / f"state_{step}.npy", values)
    pf = PlannedFile("m/{step}.bin", 0, (TensorSpec("w", 300, 4, "model"),))
    state = files_state(folder, (pf,))
    state.advance(1)
    assert np.array_equal(floats(state, pf), SAVED[0])
    state.advance(3)
    assert np.array_equal(floats(state, pf), SAVED[2])


def test_safetensors_states_keep_their_floats(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    saved = SAVED
    other = tmp_path / "st"
    other.mkdir()
    for step, values in saved.items():
        safetensors.save_file({"b": values[200:], "a": values[:200], "count": np.arange(3)}, str(other / f"s{step}.safetensors"))
    from dlio_ckpt.state.trajectory import load_state

    assert sorted(load_state(other / "s2.safetensors").tolist()) == sorted(saved[2].tolist())  # the ints are not parameters
