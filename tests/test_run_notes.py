"""A run says when its configuration could not do what it asks (issue: documentation examples
that do not do what they claim): an MTBF longer than the run, a checkpoint interval not shorter
than the run, and single_writer on one rank."""

from __future__ import annotations

from conftest import load_summary, run_cli
from dlio_ckpt.config.load import load_config
from dlio_ckpt.engine.phases import run_length_notes


def notes(overrides: list[str], steps: int, epochs: int, wall_s: float, failures: int, checkpoints: int) -> list[str]:
    config = load_config(["workload=unet3d", "scale=tiny", *overrides])
    return [note for note in run_length_notes(config, steps, epochs, wall_s, failures, checkpoints) if note]


def test_an_mtbf_longer_than_the_run_that_injected_nothing_is_named():
    (note,) = notes(["failures.mtbf_s=60"], steps=4, epochs=2, wall_s=0.5, failures=0, checkpoints=0)
    assert note.startswith("failures.mtbf_s=60 is longer than the training run (0.50 s): no failure struck")
    # a failure struck, or the run outlasted the MTBF: nothing to say
    assert notes(["failures.mtbf_s=60"], steps=4, epochs=2, wall_s=0.5, failures=1, checkpoints=0) == []
    assert notes(["failures.mtbf_s=60"], steps=4, epochs=2, wall_s=61.0, failures=0, checkpoints=0) == []
    assert notes([], steps=4, epochs=2, wall_s=0.5, failures=0, checkpoints=0) == []


def test_a_checkpoint_interval_not_shorter_than_the_run_is_named_per_epoch_or_per_run():
    ckpt = ["checkpoint.enabled=true", "checkpoint.steps_between_checkpoints=9"]
    # unet3d counts steps as DLIO does: the interval is counted within each epoch
    (note,) = notes(ckpt, steps=18, epochs=2, wall_s=1.0, failures=0, checkpoints=2)
    assert note.startswith("checkpoint.steps_between_checkpoints=9 is not shorter than an epoch (9 steps): 2 checkpoint(s)")
    assert notes(ckpt, steps=20, epochs=2, wall_s=1.0, failures=0, checkpoints=2) == []
    (note,) = notes([*ckpt, "train.step_counting=global"], steps=9, epochs=2, wall_s=1.0, failures=0, checkpoints=1)
    assert note.startswith("checkpoint.steps_between_checkpoints=9 is not shorter than the run (9 steps): 1 checkpoint(s)")
    assert notes([*ckpt, "train.step_counting=global"], steps=18, epochs=2, wall_s=1.0, failures=0, checkpoints=2) == []
    assert notes(["checkpoint.enabled=false", "checkpoint.steps_between_checkpoints=9"], steps=9, epochs=1, wall_s=1.0, failures=0, checkpoints=0) == []


def test_single_writer_on_one_rank_says_it_has_nothing_to_gather(workdir):
    result = run_cli(["workload=unet3d", "scale=tiny", "checkpoint.enabled=true", "checkpoint.strategy=single_writer",
                      f"storage.root={workdir / 'data'}", f"hydra.run.dir={workdir / 'run'}"], cwd=workdir / "cwd")
    assert result.returncode == 0, result.stderr
    warnings = load_summary(workdir / "run")["warnings"]
    assert any(w.startswith("checkpoint.strategy=single_writer on 1 rank: there is nothing to gather") for w in warnings)
    assert "nothing to gather" in result.stdout
