"""The advisor's calibration from summary.json files written here (issue 10's contract), its
scaling fits, and the command's bad-input answers (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dlio_ckpt.advisor.calibrate import calibrate, fit_curve, run_costs
from dlio_ckpt.errors import UserError

BIN = Path(sys.executable).parent


def write_run(folder: Path, world_size: int = 2, step_s: float = 0.5, local_s: float = 0.2, shared_s: float = 2.0,
              restore_local_s: float = 0.3, restore_shared_s: float = 2.5, mtbf_s: float = 600.0,
              levels: bool = True, checkpoints: bool = True, strategy: str = "sync", restarts: int = 2,
              step_s_mean: bool = True, nbytes: int = 1 << 20) -> Path:
    """A run folder holding a summary.json with the fields issue 10 adds (docs/summary-schema.md)."""
    folder.mkdir(parents=True, exist_ok=True)
    every = 4
    rows = []
    for index in range(1, 9 if checkpoints else 1):
        shared = levels and index % every == 0
        blocking = local_s * (1 + 0.1 * (index % 2)) if levels else shared_s
        rows.append({"index": index, "step": 10 * index, "encoding": "full", "level": "shared" if shared else ("local" if levels else None),
                     "logical_bytes": nbytes, "bytes_written": nbytes, "metadata_bytes": 0, "encode_s": 0.0,
                     "write_s_max": blocking, "blocking_s_max": blocking, "persist_s_max": blocking, "chain_length": 1})
    level_conf = ([{"name": "local", "path": "/dev/shm/ckpt", "every": 1, "write": "direct", "scope": "node"},
                   {"name": "shared", "path": "", "every": every, "write": "flush", "scope": "shared"}] if levels else [])
    level_rows = ([{"name": "local", "path": "/dev/shm/ckpt", "every": 1, "bytes": 1 << 20, "write_s_mean": local_s,
                    "flush_s_mean": None, "restore_s_mean": restore_local_s},
                   {"name": "shared", "path": "ckpt", "every": every, "bytes": 1 << 20, "write_s_mean": shared_s,
                    "flush_s_mean": shared_s, "restore_s_mean": restore_shared_s}] if levels else [])
    kinds = ["process", "node"]
    summary = {
        "schema_version": 2, "workload": "unet3d", "mode": "train", "world_size": world_size,
        "config": {"checkpoint": {"strategy": strategy, "encoding": "full", "steps_between_checkpoints": 10, "levels": level_conf},
                   "failures": {"mtbf_s": mtbf_s, "kind": "node", "at_steps": []}, "world": {"ranks_per_node": 1}},
        "train": {"steps": 100, "wall_s": 100 * step_s + 5.0, "checkpoint_s_in_loop": 5.0,
                  **({"step_s_mean": step_s} if step_s_mean else {})},
        "checkpoint": {"strategy": strategy, "per_checkpoint": rows, "levels": level_rows,
                       "restore_s": restore_shared_s, "restore_verified": True,
                       "policy": {"name": "fixed", "interval_steps": 10}},
        "failures": {"count": restarts, "lost_work_s": 3.0, "restart_s": restarts * 4.0,
                     "restarts": [{"step": 25 + 30 * i, "kind": kinds[i % 2], "restored_step": 20 + 30 * i,
                                   "level": "shared" if kinds[i % 2] == "node" else "local",
                                   "restore_s": restore_shared_s if kinds[i % 2] == "node" else restore_local_s}
                                  for i in range(restarts)]},
        "goodput": 0.9,
    }
    if not checkpoints:
        summary["checkpoint"] = {"strategy": strategy, "per_checkpoint": [], "levels": []}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def advise(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dlio_ckpt-advise"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def advise_here(args: list[str], cwd: Path, capsys, monkeypatch) -> tuple[int, str]:
    """The command in this process (no interpreter start-up): exit code and stderr."""
    from dlio_ckpt.advisor.cli import main

    monkeypatch.chdir(cwd)
    code = main(args)
    return code, capsys.readouterr().err


def test_levels_costs_and_restarts_come_from_the_summary(tmp_path):
    costs = run_costs(write_run(tmp_path / "run", local_s=0.2, shared_s=2.0, restore_local_s=0.3, restore_shared_s=2.5))
    local, shared = costs.levels
    assert (local.name, local.survives, local.flushed) == ("local", "process", False)
    assert (shared.name, shared.survives, shared.flushed) == ("shared", "node", True)
    assert local.blocking.count == 6 and local.blocking.mean == pytest.approx(0.2 * (1 + 0.1 * 4 / 6))  # 1..8 but 4, 8; odd ones 10 % slower
    assert shared.flush.mean == pytest.approx(2.0)
    assert local.restore.mean == pytest.approx(0.3) and shared.restore.mean == pytest.approx(2.5)
    assert costs.step_s == 0.5 and costs.interval_steps == 10
    assert costs.failure_kinds == ("process", "node") and costs.failure_steps == (25, 55)
    assert costs.restart_overhead_s == pytest.approx((8.0 - 0.3 - 2.5) / 2)


def test_missing_optional_fields_fall_back_and_say_so(tmp_path):
    costs = run_costs(write_run(tmp_path / "run", levels=False, step_s_mean=False, restarts=0, shared_s=3.0))
    (only,) = costs.levels
    assert only.blocking.mean == pytest.approx(3.0) and only.survives == "node"
    assert only.restore.mean == pytest.approx(2.5)  # checkpoint.restore_s
    assert costs.step_s == pytest.approx(0.5)  # (wall - checkpoint_s_in_loop) / steps
    assert any("iteration time from" in note for note in costs.notes)


def test_asynchronous_persist_becomes_the_flush_of_a_single_level(tmp_path):
    run = write_run(tmp_path / "run", levels=False, shared_s=0.5, strategy="async")
    summary = json.loads((run / "summary.json").read_text())
    for row in summary["checkpoint"]["per_checkpoint"]:
        row["persist_s_max"] = 2.0  # the background write ends 1.5 s after the stall
    (run / "summary.json").write_text(json.dumps(summary))
    (only,) = run_costs(run).levels
    assert only.blocking.mean == pytest.approx(0.5) and only.flush.mean == pytest.approx(1.5) and not only.flushed
    assert run_costs(run).variant == "async/full"


def test_power_law_recovered_and_flat_costs_stay_constant():
    sizes = [1, 2, 4, 8, 16]
    fit = fit_curve(sizes, [0.5 * n ** 0.7 for n in sizes])
    assert fit.model == "power" and fit.params == pytest.approx((0.5, 0.7)) and fit.rel_error < 1e-9
    assert fit(64) == pytest.approx(0.5 * 64 ** 0.7)
    flat = fit_curve(sizes, [2.0, 2.01, 1.99, 2.0, 2.0])
    assert flat.model == "constant" and flat(1000) == pytest.approx(2.0, rel=0.01)
    two = fit_curve([2, 4], [1.0, 2.0])
    assert two.rel_error is None and two(8) == pytest.approx(4.0)


def test_checkpoint_size_sweep_gets_a_fit_over_bytes_per_rank(tmp_path):
    for mib in (1, 2, 4, 8):
        nbytes = mib << 20
        write_run(tmp_path / "sweep" / str(mib), world_size=2, nbytes=nbytes, local_s=0.01 + nbytes / 2**30)
    calibration = calibrate(tmp_path / "sweep")
    fit = calibration.size_curves("sync/full:local+shared")["local.blocking_s at N=2"]
    assert fit.model == "linear" and fit.rel_error < 1e-9 and fit.x_name == "B"
    slower = 1 + 0.1 * 4 / 6  # the odd checkpoints of write_run are 10 % slower
    assert fit(3 << 19) == pytest.approx(slower * (0.01 + (3 << 20) / 2**30))  # 1.5 MiB a rank: 3 MiB a checkpoint
    _, info = calibration.system("sync/full:local+shared", None, None, None)
    assert "local.blocking_s at N=2" in info["size_fits"] and "fits" not in info  # one world size: no curve over ranks


def test_projection_scales_costs_and_mtbf(tmp_path):
    for n in (1, 2, 4):
        write_run(tmp_path / "sweep" / str(n), world_size=n, local_s=0.1 * n, shared_s=1.0 * n, mtbf_s=800.0 / n)
    calibration = calibrate(tmp_path / "sweep")
    system, info = calibration.system("sync/full:local+shared", 16, None, None)
    assert info["projected"] and "4x the largest measured (4)" in info["extrapolation"]
    shared = system.levels[1]
    assert shared.flush_s == pytest.approx(16.0, rel=1e-6)
    assert system.mtbf_s == pytest.approx(200.0 * 4 / 16)
    assert system.node_fraction == pytest.approx(0.5)


@pytest.mark.parametrize("case, expected", [
    ("empty", "holds no runs"),
    ("no_checkpoints", "wrote no checkpoints"),
    ("one_point", "needs runs at two or more world sizes"),
    ("no_mtbf", "pass --mtbf-s"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, case, expected, capsys, monkeypatch):
    folder = tmp_path / "in"
    folder.mkdir()
    extra = []
    if case == "no_checkpoints":
        write_run(folder / "0", checkpoints=False)
    elif case == "one_point":
        write_run(folder / "0", world_size=2)
        extra = ["--world-size", "64"]
    elif case == "no_mtbf":
        write_run(folder / "0", mtbf_s=0.0)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    code, stderr = advise_here([str(folder), *extra], cwd, capsys, monkeypatch)
    assert code == 2, stderr
    assert expected in stderr and len(stderr.strip().splitlines()) == 1
    assert list(cwd.iterdir()) == []


def test_console_script_answers_bad_input_in_one_line(tmp_path):
    done = advise(str(tmp_path / "missing"), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("dlio_ckpt-advise: error: ")
    assert "no such folder" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_calibrate_names_the_folder_without_runs(tmp_path):
    with pytest.raises(UserError, match="holds no runs"):
        calibrate(tmp_path)
    assert math.isfinite(fit_curve([3], [1.0])(10))
