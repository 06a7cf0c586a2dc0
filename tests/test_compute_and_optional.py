"""Emulated compute draws, and optional dependencies that are missing."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from dlio_ckpt.engine.compute import ComputeModel
from dlio_ckpt.errors import MissingDependency
from dlio_ckpt.optional import require


@pytest.mark.parametrize("distribution", ["normal", "uniform", "lognormal"])
def test_distributions_have_the_requested_mean_and_spread(distribution):
    model = ComputeModel(mean_s=0.2, stdev_s=0.05, distribution=distribution, seed=3)
    draws = np.array([model.draw() for _ in range(20000)])
    assert draws.min() >= 0
    assert draws.mean() == pytest.approx(0.2, rel=0.02)
    assert draws.std() == pytest.approx(0.05, rel=0.05)


def test_fixed_compute_and_seeded_draws():
    assert ComputeModel(0.3, 0.1, "fixed", 1).draw() == 0.3
    a = [ComputeModel(0.3, 0.1, "normal", 5).draw() for _ in range(3)]
    b = [ComputeModel(0.3, 0.1, "normal", 5).draw() for _ in range(3)]
    assert a == b


def test_the_first_step_pays_its_tracing_once_and_again_after_a_restart(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("dlio_ckpt.engine.compute.time.sleep", slept.append)
    model = ComputeModel(0.01, 0.0, "fixed", 1, first_s=2.5)
    assert [model.run() for _ in range(3)] == pytest.approx([2.51, 0.01, 0.01])
    model.restarted()
    assert [model.run() for _ in range(2)] == pytest.approx([2.51, 0.01])
    assert slept == pytest.approx([2.51, 0.01, 0.01, 2.51, 0.01])


def test_missing_optional_dependency_gives_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # makes `import tensorflow` fail
    with pytest.raises(MissingDependency) as info:
        require("tensorflow")
    assert "pip install 'dlio_ckpt[tensorflow]'" in str(info.value)


def test_a_run_that_needs_a_missing_library_stops_before_writing(monkeypatch):
    from dlio_ckpt.config.load import validate_command_line

    real_find_spec = __import__("importlib.util").util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "tensorflow" else real_find_spec(name, *a))
    with pytest.raises(MissingDependency, match=r"pip install 'dlio_ckpt\[tensorflow\]'"):
        validate_command_line(["workload=resnet", "scale=tiny", "reader.name=tensorflow"], multirun=False)
