"""The workloads added from DLIO's dlrm profile and the seed papers (Rojas et al., DeepFreeze,
LC-Checkpoint): their published figures as composed, the scale cap on layered models, and one
tiny sweep through the command that puts the planned checkpoint bytes on disk."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from conftest import load_summary, run_cli
from dlio_ckpt.config.load import load_config
from dlio_ckpt.plan.model import build_model_plan

SEED_WORKLOADS = ("cifar10_resnet", "candle", "movielens")


def unscaled_checkpoint_bytes(name: str) -> int:
    config = load_config([f"workload={name}"])
    return build_model_plan(config.model, 1, config.scale.max_model_bytes).total_bytes


def test_dlrm_is_dlios_profile():
    config = load_config(["workload=dlrm"])
    ds = config.dataset
    assert (ds.format, ds.num_files_train, ds.num_samples_per_file, ds.record_length_bytes) == ("indexed_binary", 1, 1024, 640 << 20)
    assert config.train.computation_time == 0.064296 and config.reader.batch_size == 1
    assert config.checkpoint.enabled is False
    assert (config.reader.access, config.train.step_counting) == ("sample", "dlio")  # PyTorch loader, DLIO's steps


def test_seed_paper_models_hold_their_published_parameter_counts():
    # NT3 README layer table: 154,922,918 fp32 parameters, plain SGD (no optimizer state)
    assert unscaled_checkpoint_bytes("candle") == 154_922_918 * 4
    # ResNet-50 with a 10-class head: 23,528,522 fp32 parameters plus one momentum buffer
    assert unscaled_checkpoint_bytes("cifar10_resnet") == 23_528_522 * 4 * 2
    # MovieLens-25M: 162,541 users and 62,423 movies, embeddings of 64 + 128, Adam (m and v)
    movielens = load_config(["workload=movielens"]).model
    embeddings = (162_541 + 62_423) * (64 + 128)
    assert sum(movielens.layer_parameters[:4]) == embeddings
    assert embeddings / sum(movielens.layer_parameters) > 0.99
    assert unscaled_checkpoint_bytes("movielens") == sum(movielens.layer_parameters) * 4 * 3


@pytest.mark.parametrize("name", ["candle", "movielens", "cifar10_resnet"])
def test_tiny_scale_caps_a_layered_models_whole_checkpoint(name):
    config = load_config([f"workload={name}", "scale=tiny"])
    total = build_model_plan(config.model, 1, config.scale.max_model_bytes).total_bytes
    assert 0.99 * config.scale.max_model_bytes <= total <= config.scale.max_model_bytes


def test_seed_workloads_run_at_tiny_scale_and_write_the_planned_checkpoints(workdir):
    """(dlrm, which has no checkpoint, runs in test_end_to_end's every-workload test.)"""
    sweep, root = workdir / "sweep", workdir / "store"
    done = run_cli(["-m", f"workload={','.join(SEED_WORKLOADS)}", "scale=tiny", "progress=false",
                    f"storage.root={root}", f"hydra.sweep.dir={sweep}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr[-3000:]
    with open(sweep / "sweep_summary.csv") as table:
        rows = {r["workload"]: r for r in csv.DictReader(table)}
    assert set(rows) == set(SEED_WORKLOADS) and all(r["status"] == "ok" for r in rows.values())
    for name, row in rows.items():
        summary = load_summary(sweep / row["job"])
        assert summary["train"]["steps"] >= 1 and summary["train"]["bytes_read"] > 0
        config = load_config([f"workload={name}", "scale=tiny"])
        planned = build_model_plan(config.model, 1, config.scale.max_model_bytes).total_bytes
        records = summary["checkpoint"]["per_checkpoint"]
        assert len(records) == summary["checkpoint"]["writes"] >= 1
        (run_folder,) = (root / "checkpoints").glob(f"*-{row['job']}")  # the job's own run id
        for record in records:
            # checkpoint.durability=framework (the default): the format's files only, no manifest
            files = [p for p in (run_folder / record["folder"]).rglob("*") if p.is_file()]
            assert files and not any(p.name == "dlio_ckpt_manifest.json" for p in files)
            on_disk = sum(p.stat().st_size for p in files)
            assert planned <= on_disk < planned + (1 << 20)  # tensors plus the format's headers
            assert on_disk <= record["bytes"] < on_disk + 4096  # a zip format rewrites its small headers


def test_every_workload_file_names_its_description_and_source():
    from dlio_ckpt.config.groups import workloads_dir

    for path in sorted(workloads_dir().glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert str(data.get("description", "")).strip(), path.name
        assert str(data.get("source", "")).strip(), path.name


def test_list_workloads_prints_one_line_per_file_and_writes_nothing(workdir):
    from dlio_ckpt.config.groups import workloads_dir

    done = run_cli(["--list-workloads"], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    files = sorted(workloads_dir().glob("*.yaml"))
    assert len(lines) == len(files)
    for line, path in zip(lines, files):
        data = yaml.safe_load(path.read_text())
        assert line.split()[0] == path.stem
        assert data["description"] in line and f"[source: {data['source']}]" in line
    assert list((workdir / "cwd").iterdir()) == []  # no run folder, no data
