"""dlio_ckpt-advise's output (issue 27, item 11): intervals in wall time and in the write rate they
ask of the storage beside their steps, and scikit-learn as the `advisor` extra, named when missing."""

from __future__ import annotations

import tomllib

import pytest

from conftest import REPO
from dlio_ckpt.advisor import cli

MIB = float(1 << 20)


def doc(step_s: float, nbytes: float, world_size: int = 4, run_world_size: int = 4) -> dict:
    """The parts of an advice document that the interval text reads."""
    return {"calibration": {
        "systems": [{"variant": "sync", "world_size": world_size}],
        "runs": [{"variant": "sync", "world_size": run_world_size, "levels": [{"name": "shared", "bytes": nbytes}]},
                 {"variant": "async", "world_size": world_size, "levels": [{"name": "shared", "bytes": 99 * nbytes}]}]}}


def configuration(steps: int, step_s: float) -> dict:
    return {"variant": "sync", "levels": ["shared"], "interval_steps": steps, "interval_s": steps * step_s,
            "interval_min": steps * step_s / 60}


def test_an_interval_is_given_in_minutes_and_the_write_rate_it_needs():
    # 35 steps of 7.2 s = 252 s = 4.2 min; 1 GiB per checkpoint / 252 s = 4.06 MiB/s
    text = cli.interval_text(doc(7.2, 1 << 30), configuration(35, 7.2))
    assert text == "4.2 min; 1,024.0 MiB per checkpoint: 4.06 MiB/s of writes on average"


def test_a_short_interval_is_given_in_seconds():
    assert cli.interval_text(doc(0.03, 16 * MIB), configuration(8, 0.03)) == (
        "0.24 s; 16.0 MiB per checkpoint: 66.67 MiB/s of writes on average")


def test_no_rate_without_a_run_measured_at_the_advised_world_size():
    """A projected world size has no measured checkpoint size: the rate is left out, not guessed."""
    assert cli.interval_text(doc(7.2, 1 << 30, world_size=64), configuration(35, 7.2)) == "4.2 min"


def test_the_advisor_names_the_extra_when_scikit_learn_is_missing(monkeypatch, capsys, tmp_path):
    real_find_spec = __import__("importlib.util").util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "sklearn" else real_find_spec(name, *a))
    assert cli.main([str(tmp_path), "--no-plot"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dlio_ckpt-advise: error: sklearn is needed for dlio_ckpt-advise")
    assert err.endswith("install it with: pip install 'dlio_ckpt[advisor]'") and "\n" not in err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_scikit_learn_is_an_extra_that_the_tests_install():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("scikit-learn") for dep in project["dependencies"])
    extras = project["optional-dependencies"]
    assert any(dep.startswith("scikit-learn") for dep in extras["advisor"])
    assert any(dep.startswith("scikit-learn") for dep in extras["test"])


@pytest.mark.parametrize("name", ["best", "surrogate"])
def test_the_text_table_shows_each_interval_in_time(name):
    row = {"configuration": {**configuration(35, 7.2), "description": "shared: every 35 steps"},
           "predicted_goodput": 0.9, "goodput": 0.88, "checkpoint_share": 0.01, "lost_work_share": 0.1,
           "restart_share": 0.01, "censored": False}
    document = {**doc(7.2, 1 << 30), "folder": "runs", "advice": {"best": row, name: row},
                "search": {"configurations": 1, "exhaustive_s": 1.0, "surrogate_s": 0.1, "speedup": 10.0,
                           "model_used": "trees", "surrogate_simulated": 1, "surrogate_over_optimum": 1.0,
                           "training_samples": 10, "sampling": "x", "sampling_s": 0.1, "training_s": 0.1, "models": {}}}
    document["calibration"]["systems"][0].update(projected=False, step_s=7.2, mtbf_s=3600.0, node_failure_share=0.0,
                                                 restart_overhead_s=0.0, weibull_shape=1.0, levels=[], assumed=[])
    document["calibration"]["notes"] = []
    text = cli.format_text(document)
    assert f"| {name} | shared: every 35 steps (4.2 min; 1,024.0 MiB per checkpoint: 4.06 MiB/s" in text
