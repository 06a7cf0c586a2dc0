"""dlio_ckpt-advise's output (issue 27, item 11): intervals in wall time and in the write rate they
ask of the storage beside their steps, and scikit-learn as the `advisor` extra, named when missing."""

from __future__ import annotations

import tomllib

import pytest

from conftest import REPO
from dlio_ckpt.advisor import cli


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


def test_the_text_table_shows_each_interval_in_steps_seconds_minutes_and_its_bandwidth(monkeypatch):
    """35 steps of 7.2 s = 252 s = 4.2 min; 1 GB per checkpoint of the shared level every interval
    needs 1e9 / 252 s = 3.97 MB/s."""
    class Level:
        def __init__(self, name):
            self.name = name

    class Plan:
        interval_steps, every = 35, (1,)

    class System:
        step_s, levels = 7.2, (Level("shared"),)

    class Fake:
        plan, system, variant = Plan(), System(), "sync"

        def describe(self):
            return "shared: every 35 steps"

    config = cli._config(Fake(), {"shared": 1e9})
    assert config["interval_min"] == pytest.approx(4.2) and config["interval_s"] == pytest.approx(252.0)
    assert config["bandwidth_Bps"]["shared"] == pytest.approx(1e9 / 252.0)
    assert cli._rate(config["bandwidth_Bps"]["shared"]) == "3.97 MB/s"
