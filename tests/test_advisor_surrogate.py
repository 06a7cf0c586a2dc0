"""The learned surrogate against exhaustive simulation, and the advise command end to end on a
synthetic run folder (summary.json as issue 10 writes it)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dlio_ckpt.advisor.cli import main
from dlio_ckpt.advisor.search import Settings, candidates, exhaustive, score, young_daly
from dlio_ckpt.advisor.surrogate import near, random_system, samples, search, train
from test_advisor_calibrate import write_run


def test_surrogate_pick_reaches_98_percent_of_the_exhaustive_optimum_on_held_out_systems():
    base = random_system(np.random.default_rng(3))
    rng = np.random.default_rng(5)
    X, y, groups = samples([near(base, rng) for _ in range(60)], 10, Settings(replicates=16), seed=1, with_groups=True)
    assert len(set(groups.tolist())) == 60 and np.array_equal(np.bincount(groups), np.full(60, 10))
    by_sample = train(X, y, seed=0)
    surrogate = train(X, y, seed=0, groups=groups)  # held out: 12 whole systems, none of their samples fitted
    assert set(surrogate.errors) == {"gradient_boosting", "neural_network"}
    assert all(e["r2"] > 0.8 for e in surrogate.errors.values()), surrogate.errors
    assert by_sample.errors != surrogate.errors  # a different split: another held-out set
    held_out = np.random.default_rng(99)  # systems no training sample came from
    settings = Settings(seed=7)
    for _ in range(2):
        pool = candidates(near(base, held_out), points=10)
        best, optimum, _ = exhaustive(pool, settings)
        found = search(surrogate, pool, settings, top=5)
        assert found.outcome.goodput >= 0.98 * optimum.goodput, (found.best.describe(), best.describe())
        assert found.simulated * 10 <= len(pool)  # a tenth of the simulations (the time: benchmarks/advisor_speed.py)


def test_advise_json_and_plot(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    plot = tmp_path / "out" / "map.png"
    assert main([str(run), "--json", "--surrogate", "--samples", "200", "--intervals", "8", "--plot", str(plot)]) == 0
    doc = json.loads(capsys.readouterr().out)
    best, surrogate, baseline = doc["advice"]["best"], doc["advice"]["surrogate"], doc["advice"]["young_daly[sync/full:local+shared]"]
    assert best["configuration"]["levels"] and best["configuration"]["interval_steps"] >= 1
    assert 0 < baseline["goodput"] <= best["goodput"] + 0.01  # the advice is no worse than Young/Daly's single level
    assert surrogate["search_goodput"] <= best["search_goodput"]
    assert doc["search"]["surrogate_simulated"] == 5 and doc["search"]["configurations"] == 8 + 8 + 8 * 7
    system = doc["calibration"]["systems"][0]
    assert [lv["name"] for lv in system["levels"]] == ["local", "shared"] and system["mtbf_s"] == 600.0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and doc["plot"]["x"] != doc["plot"]["y"]


def test_young_daly_baseline_uses_the_durable_level_at_dalys_interval():
    base = random_system(np.random.default_rng(1))
    baseline = young_daly(base)
    assert [lv.name for lv in baseline.system.levels] == ["shared"] and not baseline.system.levels[0].flushed
    assert score(baseline, Settings(replicates=4, horizon_mtbf=3)).goodput == pytest.approx(
        score(baseline, Settings(replicates=4, horizon_mtbf=3)).goodput)
