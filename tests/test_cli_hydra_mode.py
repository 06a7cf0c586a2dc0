"""The CLI skips Hydra's compose-only-to-read-hydra.mode while it runs Hydra, and only then."""

from __future__ import annotations

from hydra._internal.hydra import Hydra

from dlio_ckpt.cli import _mode_unset_unless_given


def test_get_mode_answers_none_without_composing_inside_and_is_restored_after():
    original = Hydra.get_mode
    with _mode_unset_unless_given(["workload=unet3d", "-m"]):
        assert Hydra.get_mode is not original
        assert Hydra.get_mode(object(), config_name="config", overrides=["workload=unet3d"]) is None
    assert Hydra.get_mode is original


def test_a_hydra_mode_given_on_the_command_line_is_left_to_hydra():
    original = Hydra.get_mode
    for argument in ("hydra.mode=MULTIRUN", "+hydra.mode=RUN", "++hydra.mode=RUN"):
        with _mode_unset_unless_given(["workload=unet3d", argument]):
            assert Hydra.get_mode is original


def test_the_original_comes_back_when_the_run_fails():
    original = Hydra.get_mode
    try:
        with _mode_unset_unless_given([]):
            raise RuntimeError("the run failed")
    except RuntimeError:
        pass
    assert Hydra.get_mode is original
