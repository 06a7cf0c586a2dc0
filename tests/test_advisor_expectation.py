"""The advisor's goodput is expected over the calibration runs' own costs (advisor/expectation.py,
issue 23): measured goodput is a mean over runs, each one draw of the machine's load, and goodput
is convex in the costs, so the mean of the runs' goodputs is not the goodput at their median costs.
Synthetic run folders (tests/test_advisor_pooling.py) with chosen costs; goodputs computed by hand
for failure-free jobs: useful iteration time / (that + checkpoints x stall), times the compute share."""

from __future__ import annotations

import json

import pytest

from dlio_ckpt.advisor import cli
from dlio_ckpt.advisor.calibrate import calibrate
from dlio_ckpt.advisor.expectation import expected_goodput, members, on_layout
from dlio_ckpt.advisor.simulate import FailureTrace, Level, Plan, System, simulate
from test_advisor_pooling import COMPUTE_S, STEPS, single_level_run

NO_FAILURE = FailureTrace(replicates=1, at_s=(1e12,), kinds=("node",))  # strikes long after the job ends


def pooled(folder):
    calibration = calibrate(folder)
    (variant,) = calibration.variants
    system, info = calibration.system(variant, None, mtbf_s=5.0, node_fraction=1.0)
    return calibration.runs, system, info


def test_expectation_is_the_mean_of_the_runs_goodputs_not_the_goodput_at_their_median(tmp_path):
    single_level_run(tmp_path / "calm", 4, 0.04, 0.1)
    single_level_run(tmp_path / "loaded", 4, 0.04, 0.5)
    runs, system, info = pooled(tmp_path)
    # 96 steps of 0.04 s = 3.84 s, 23 checkpoints (none at the last step), compute share 0.03 / 0.04
    calm, loaded = 0.75 * 3.84 / (3.84 + 23 * 0.1), 0.75 * 3.84 / (3.84 + 23 * 0.5)  # 0.4691, 0.1877
    got = expected_goodput(members(runs, system, info["per_checkpoint_s"]), system, Plan(4, (1,)), STEPS, NO_FAILURE)
    assert got.goodput == pytest.approx((calm + loaded) / 2)  # 0.3284
    assert sorted(got.by_run.values()) == [pytest.approx(loaded), pytest.approx(calm)]
    assert got.spread == pytest.approx(abs(calm - loaded) / 2 ** 0.5)
    typical = info["compute_share"] * simulate(system, Plan(4, (1,)), STEPS, NO_FAILURE).goodput
    assert typical == pytest.approx(0.75 * 3.84 / (3.84 + 23 * 0.3))  # the median stall: 0.2682, 6 points lower


def test_a_member_has_its_own_costs_and_the_pooled_parts_one_run_cannot_measure(tmp_path):
    # 0.040 s a step plus 0.012 s per checkpoint (interval 2: 0.046 s; interval 8: 0.0415 s)
    single_level_run(tmp_path / "k2-a", 2, 0.046, 0.20, restarts=((0.3, 0.1),))
    single_level_run(tmp_path / "k2-b", 2, 0.046, 0.30, restarts=((0.5, 0.3),))
    single_level_run(tmp_path / "k8-a", 8, 0.0415, 0.25)  # restored nothing
    runs, system, info = pooled(tmp_path)
    assert info["per_checkpoint_s"] == pytest.approx(0.012)
    by_name = {m.run.rsplit("/", 1)[-1]: m for m in members(runs, system, info["per_checkpoint_s"])}
    k2, k8 = by_name["k2-b"], by_name["k8-a"]
    assert k2.system.step_s == pytest.approx(0.040) and k8.system.step_s == pytest.approx(0.040)
    assert k2.system.levels[0].blocking_s == pytest.approx(0.30 + 0.012)
    assert (k2.system.levels[0].restore_s, k2.system.downtime_s) == (pytest.approx(0.5), pytest.approx(0.3))
    # no restore of its own: the pooled one (median over the runs that restored: 0.4 s, overhead 0.2 s)
    assert (k8.system.levels[0].restore_s, k8.system.downtime_s) == (pytest.approx(0.4), pytest.approx(0.2))
    assert k8.compute_share == pytest.approx(COMPUTE_S / 0.040)


def test_a_flushed_level_used_alone_is_written_at_its_flush_time():
    local = Level("local", 0.1, restore_s=0.05, survives="process")
    shared = Level("shared", 0.1, flush_s=2.0, restore_s=1.0, survives="node", flushed=True)
    member_system = System(step_s=0.5, mtbf_s=100.0, levels=(local, shared), downtime_s=3.0)
    layout = System(step_s=0.4, mtbf_s=50.0, levels=(Level("shared", 1.5, restore_s=0.9, survives="node"),),
                    node_fraction=0.5)
    (level,) = on_layout(layout, member_system).levels
    assert (level.blocking_s, level.flush_s, level.flushed, level.restore_s) == (2.0, 0.0, False, 1.0)
    mapped = on_layout(layout, member_system)
    assert (mapped.step_s, mapped.downtime_s, mapped.mtbf_s, mapped.node_fraction) == (0.5, 3.0, 50.0, 0.5)


def test_the_advice_prints_the_expectation_over_the_runs_beside_the_typical_runs_figure(tmp_path, capsys):
    single_level_run(tmp_path / "calm", 4, 0.04, 0.02)
    single_level_run(tmp_path / "loaded", 4, 0.04, 0.5)
    single_level_run(tmp_path / "busy", 4, 0.04, 0.98)  # stalls 0.02, 0.5, 0.98: mean = median
    assert cli.main([str(tmp_path), "--json", "--no-plot", "--mtbf-s", "20"]) == 0
    best = json.loads(capsys.readouterr().out)["advice"]["best"]
    assert best["calibration_runs"] == 3 and len(best["goodput_by_run"]) == 3
    assert best["goodput"] == pytest.approx(sum(best["goodput_by_run"].values()) / 3)
    # goodput is convex in the stall: the runs' mean goodput is above the goodput at their mean (= median) stall
    assert best["goodput"] > best["goodput_typical_run"] + 0.002
