"""dlio_ckpt-advise on a real run: a tiny two-level training run with injected node failures, then
the advice from its folder (the calibration must read what the run measured)."""

from __future__ import annotations

import json

import pytest

from conftest import load_summary, run_cli
from dlio_ckpt.advisor.cli import main

RUN = ["workload=unet3d", "scale=tiny", "dataset.num_files_train=32", "dataset.num_samples_per_file=1",
       "dataset.record_length_bytes=16KiB", "dataset.record_length_bytes_stdev=0", "dataset.record_length_bytes_min=1",
       "reader.batch_size=2", "train.epochs=2", "train.computation_time=0.005", "model.kind=explicit",
       "model.model_size_bytes=1MiB", "model.optimization_groups=[65536]", "model.layer_parameters=[]",
       "checkpoint.enabled=true", "checkpoint.steps_between_checkpoints=4", "checkpoint.keep_last=0",
       "failures.at_steps=[7,19]", "failures.kind=node", "world.ranks_per_node=1", "progress=false"]


@pytest.mark.slow
def test_advice_from_a_real_run_with_failures_and_two_levels(workdir, capsys):
    levels = f"checkpoint.levels=[{{name: local, path: {workdir / 'local'}, scope: node}}, {{name: shared, every: 2, write: flush}}]"
    done = run_cli([*RUN, levels, f"storage.root={workdir / 'store'}", f"hydra.run.dir={workdir / 'run'}"], cwd=workdir / "cwd")
    assert done.returncode == 0, done.stderr
    measured = load_summary(workdir / "run")
    restored = [r["level"] for r in measured["failures"]["restarts"]]
    assert main([str(workdir / "run"), "--json", "--mtbf-s", "60", "--samples", "100", "--intervals", "6", "--no-plot"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (run,) = doc["calibration"]["runs"]
    assert run["failures"] == 2 and run["interval_steps"] == 4 and run["goodput"] == measured["goodput"]
    local, shared = run["levels"]
    assert (local["name"], local["survives"], local["flushed"]) == ("local", "process", False)
    assert (shared["name"], shared["survives"], shared["flushed"], shared["every"]) == ("shared", "node", True, 2)
    assert shared["flush_s"] > 0 and local["blocking_s"] > 0
    assert shared["restore_assumed"] is ("shared" not in restored)
    assert run["step_s"] >= measured["train"]["step_s_mean"]
    (system,) = doc["calibration"]["systems"]
    assert system["node_failure_share"] == 1.0 and system["mtbf_s"] == 60.0
    assert 0 < doc["advice"]["best"]["goodput"] <= 1 and doc["search"]["configurations"] == 6 + 6 + 6 * 7
    # goodput as the run measures it: useful compute over wall, so the simulated iteration share
    # times the run's compute share of an iteration (useful compute / (steps x iteration time))
    share = measured["time_accounting"]["useful_compute_s"] / (measured["train"]["steps"] * run["step_s"])
    assert system["compute_share"] == pytest.approx(min(1.0, share)) and 0 < share < 1
    best = doc["advice"]["best"]
    assert best["goodput"] == pytest.approx(best["iteration_goodput"] * system["compute_share"])
    assert "useful compute / training wall time" in doc["goodput"]
    # the surrogate is not on the default path: exhaustive simulation decides
    assert "surrogate" not in doc["advice"] and doc["search"]["decided_by"] == "exhaustive simulation"
    config = best["configuration"]
    assert config["interval_min"] == pytest.approx(config["interval_s"] / 60)
    for name, every in config["every"].items():  # each level written before its next write
        level = next(lv for lv in run["levels"] if lv["name"] == name)
        assert config["bandwidth_Bps"][name] == pytest.approx(level["bytes"] / (config["interval_s"] * every))
