"""Everyday use (issue 13): a short --help, --cfg job --scaled, progress with rate and ETA,
checkpoint.keep_last's default, datasets of different scales side by side, `dlio_ckpt clean`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from conftest import load_summary, run_cli
from dlio_ckpt.cli import main
from dlio_ckpt.config.load import load_config
from dlio_ckpt.metrics.progress import Progress

MIB = 1 << 20


def test_help_lists_the_most_used_keys_in_a_screen(workdir):
    done = run_cli(["--help"], workdir / "cwd")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert len(lines) < 40  # not the composed configuration (well over 100 lines)
    for key in ("workload=", "scale=", "mode=", "storage.root=", "reader.batch_size=", "checkpoint.strategy=",
                "checkpoint.keep_last=", "dlio_ckpt clean"):
        assert sum(line.strip().startswith(key) for line in lines) == 1, key
    assert "docs/configuration.md" in lines[-1]
    assert "num_samples_per_file" not in done.stdout


def test_cfg_job_scaled_shows_the_values_after_the_caps(workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir / "cwd")
    main(["--cfg", "job", "--scaled", "workload=unet3d", "scale=tiny", "reader.batch_size=3"])
    shown = yaml.safe_load(capsys.readouterr().out)
    expected = load_config(["workload=unet3d", "scale=tiny", "reader.batch_size=3"])
    unscaled = load_config(["workload=unet3d"])
    assert shown["dataset"]["num_files_train"] == expected.dataset.num_files_train < unscaled.dataset.num_files_train
    assert shown["reader"]["batch_size"] == 3  # set by the user: never capped
    assert not list((workdir / "cwd").iterdir())  # writes nothing
    with pytest.raises(SystemExit) as exit_code:
        main(["--scaled", "workload=unet3d"])
    err = capsys.readouterr().err
    assert exit_code.value.code == 2 and len(err.strip().splitlines()) == 1 and "--cfg job" in err


def test_progress_lines_carry_rate_and_eta():
    stream = io.StringIO()
    progress = Progress("training", total=20, enabled=True, stream=stream, interval_s=3600.0)
    for _ in range(5):
        progress.advance(1, MIB)
    assert stream.getvalue() == ""  # a pipe gets at most a line per interval
    assert progress.line(10.0) == "[dlio_ckpt] training: 5/20 steps, 0.5 steps/s, 0.5 MiB/s (10.0 s, ETA 30 s)"
    every = Progress("generating", total=4, enabled=True, stream=stream, interval_s=0.0, unit="files")
    for _ in range(4):
        every.advance()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4 and all(" files/s" in line and "ETA" in line for line in lines)
    assert lines[-1].startswith("[dlio_ckpt] generating: 4/4 files,") and lines[-1].endswith("ETA 0 s)")


def test_keep_last_defaults_to_a_few_checkpoints():
    keep = load_config(["workload=unet3d"]).checkpoint.keep_last
    assert 1 <= keep <= 5
    # MLPerf's checkpoint mode reads back every checkpoint written: the llama3 workloads keep them all
    assert load_config(["workload=llama3_8b"]).checkpoint.keep_last == 0


@pytest.fixture(scope="module")
def two_scales(tmp_path_factory) -> tuple[Path, Path, Path]:
    """unet3d at scale=tiny, then at scale=tiny with larger files, on one storage root."""
    base = tmp_path_factory.mktemp("scales")
    (base / "cwd").mkdir()
    store = base / "store"
    runs = []
    for name, extra in (("tiny", []), ("bigger", ["dataset.num_samples_per_file=2"])):
        run = base / name
        done = run_cli(["workload=unet3d", "scale=tiny", "progress=false", "checkpoint.enabled=true",
                        "checkpoint.steps_between_checkpoints=2", "dataset.format=raw", f"storage.root={store}",
                        f"hydra.run.dir={run}", *extra], base / "cwd")
        assert done.returncode == 0, done.stderr
        runs.append(run)
    return store, runs[0], runs[1]


def test_datasets_of_different_scales_do_not_overwrite_each_other(two_scales):
    store, tiny, bigger = two_scales
    first, second = load_summary(tiny)["dataset"], load_summary(bigger)["dataset"]
    assert first["folder"] != second["folder"] and not first["reused"] and not second["reused"]
    for dataset in (first, second):  # both still on disk, each with its own bytes
        on_disk = sum(f.stat().st_size for f in (Path(dataset["folder"]) / "train").rglob("*") if f.is_file())
        assert on_disk == dataset["bytes_on_disk"]


def test_clean_removes_only_what_the_run_created(two_scales, tmp_path):
    store, tiny, bigger = two_scales
    created = load_summary(tiny)["created"]
    other = load_summary(bigger)["created"]
    assert created["storage_root"] == str(store) and Path(created["checkpoints"]).is_dir()
    dry = run_cli(["clean", "--dry-run", str(tiny)], tmp_path)
    assert dry.returncode == 0 and Path(created["checkpoints"]).is_dir() and Path(created["dataset"]).is_dir()
    assert f"would remove checkpoints {created['checkpoints']}" in dry.stdout
    done = run_cli(["clean", str(tiny)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert not Path(created["checkpoints"]).exists() and not Path(created["dataset"]).exists()
    # the other run's dataset and checkpoints, and this run's folder, are untouched
    assert Path(other["checkpoints"]).is_dir() and Path(other["dataset"]).is_dir()
    assert (tiny / "summary.json").is_file()


def test_clean_refuses_a_run_folder_its_run_never_marked(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    summary = {"config": {"storage": {"backend": "posix", "root": str(tmp_path / "store"), "direct_io": False}},
               "dataset": {"folder": str(tmp_path / "store" / "data" / "x"), "reused": True},
               "created": {"storage_root": str(tmp_path / "store"), "checkpoints": str(outside), "dataset": None}}
    (run / "summary.json").write_text(json.dumps(summary))
    done = run_cli(["clean", str(run)], tmp_path)  # no run marker: summary.json alone proves nothing
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "by hand" in done.stderr
    assert outside.is_dir()
    bad = run_cli(["clean", str(tmp_path / "missing")], tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
