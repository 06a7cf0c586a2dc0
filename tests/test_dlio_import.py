"""DLIO workload YAMLs: the mapping (pure), DLIO's own formulas, the import command, real tiny runs.

The fixtures in tests/data/dlio/ are DLIO-style files written for these tests, so the conversion
is always tested without network; when the DLIO benchmark is installed (its wheel ships its
workload YAMLs), every one of those is converted and checked against the same formulas too.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import load_summary, run_cli
from dlio_ckpt.config.dlio_import import convert, import_file, to_yaml
from dlio_ckpt.config.load import load_config
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.formats.base import FileSpec
from dlio_ckpt.plan.checkpoint import build_checkpoint_plan
from dlio_ckpt.plan.read import dlio_steps_per_epoch, plan_epoch, transfer_end

DATA = Path(__file__).parent / "data" / "dlio"
GOOD = sorted(p for p in DATA.glob("*.yaml") if not p.name.startswith("bad_"))


def dlio_wheel_workloads() -> list[Path]:
    """DLIO's own workload YAMLs: a folder named by DLIO_WORKLOADS_DIR, or those of an installed
    DLIO benchmark (pip install dlio_benchmark==2.0.0); none when neither is there."""
    if os.environ.get("DLIO_WORKLOADS_DIR"):
        return sorted(Path(os.environ["DLIO_WORKLOADS_DIR"]).glob("*.yaml"))
    spec = importlib.util.find_spec("dlio_benchmark")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(list(spec.submodule_search_locations)[0]) / "configs" / "workload"
    return sorted(folder.glob("*.yaml"))


ALL_DLIO = GOOD + dlio_wheel_workloads()


# DLIO 2.0.0's formulas, written from its source (main.py, checkpointing/base_checkpointing.py),
# independent of the mapping under test.
def dlio_steps(raw: dict, ranks: int, files: int, samples_per_file: int, batch: int) -> int:
    steps = math.floor(samples_per_file * files / batch / ranks)
    total = raw.get("train", {}).get("total_training_steps", -1)
    return min(steps, total) if total > 0 else steps


def dlio_checkpoint_bytes(raw: dict, ranks: int) -> int:
    ck = raw.get("checkpoint", {})
    model = ck.get("model_size", 10240)
    groups = ck.get("optimization_groups", [])
    layers = ck.get("layer_parameters", [17371, 24740228])
    num_layers = ck.get("num_layers", 1)
    tp, pp = ck.get("tensor_parallelism", 1), ck.get("pipeline_parallelism", 1)
    writers = range(ranks) if ck.get("type", "rank_zero") == "all_ranks" else [0]
    total = 0
    for rank in writers:
        total += model + 3 * sum(groups)
        if rank % pp == 0 and layers and num_layers > 0:
            total += (num_layers + (tp if tp > 1 else 0)) * sum(layers)
    return total


def raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_pytorch_npz_fixture_maps_each_key():
    result = import_file(str(DATA / "pt_npz_epoch_ckpt.yaml"))
    v = result.values()
    assert v["dataset.format"] == "npz" and v["dataset.folder"] == "data/seg3d"
    assert (v["dataset.record_length_bytes"], v["dataset.record_length_bytes_stdev"]) == (3000000, 1000000)
    assert (v["reader.batch_size"], v["reader.batch_size_eval"], v["reader.read_threads"]) == (5, 1, 2)
    assert v["reader.file_shuffle"] is True and v["reader.sample_shuffle"] is True
    assert (v["reader.access"], v["reader.transfer_size"], v["reader.drop_last"]) == ("sample", 0, True)
    assert (v["train.epochs"], v["train.computation_time"], v["train.step_counting"]) == (4, 0.25, "dlio")
    assert (v["checkpoint.checkpoint_after_epoch"], v["checkpoint.epochs_between_checkpoints"],
            v["checkpoint.steps_between_checkpoints"]) == (2, 2, 0)
    # DLIO's default layer tensors (17,371 + 24,740,228 bytes, one layer) are part of its checkpoint.
    assert v["model.model_size_bytes"] == 2000000 and v["model.layer_parameters"] == [24757599]
    assert v["metric.au"] == 0.85
    assert dict(result.unused) .keys() == {"dataset.record_length_resize"} and result.unknown == ()


def test_tensorflow_fixture_reads_in_transfer_size_and_lists_unknown_keys():
    result = import_file(str(DATA / "tf_tfrecord_steps.yaml"))
    v = result.values()
    assert (v["reader.access"], v["reader.transfer_size"]) == ("transfer", 65536)
    assert v["dataset.record_length_bytes"] == 3000  # DLIO truncates a fractional record_length
    assert (v["train.total_steps"], v["checkpoint.steps_between_checkpoints"], v["checkpoint.epochs_between_checkpoints"]) == (5, 2, 0)
    assert (v["evaluation.enabled"], v["evaluation.computation_time"], v["reader.batch_size_eval"]) == (True, 0.02, 8)
    assert (v["reader.shuffle_buffer_size"], v["reader.shuffle_seed"], v["train.computation_distribution"]) == (64, 9, "normal")
    assert v["model.optimization_groups"] == [100000, 50000] and v["model.optimizer_states"] == 3
    assert result.unknown == ("train.warmup_steps",)
    assert "train.warmup_steps" in result.warning() and "tf_tfrecord_steps.yaml" in result.warning()
    assert {"reader.computation_threads", "train.seed_change_epoch"} <= dict(result.unused).keys()


def test_indexed_all_ranks_and_newer_transformer_keys():
    v = import_file(str(DATA / "indexed_all_ranks.yaml")).values()
    assert v["dataset.format"] == "indexed_binary" and v["checkpoint.replicas"] == "all"
    assert import_file(str(DATA / "pt_npz_epoch_ckpt.yaml")).values()["checkpoint.replicas"] == "one"
    assert v["model.layer_parameters"] == [4000] * (4 + 2)  # num_layers + tensor_parallelism copies (DLIO)
    t = import_file(str(DATA / "newer_transformer.yaml")).values()
    assert (t["mode"], t["model.kind"], t["model.model_dtype_bytes"], t["model.optimizer_dtype_bytes"]) == ("checkpoint", "transformer", 2, 4)
    assert (t["model.parallelism.tensor"], t["model.parallelism.pipeline"], t["model.parallelism.zero_stage"]) == (2, 2, 1)
    assert (t["model.num_kv_heads"], t["checkpoint.num_checkpoints_write"], t["dataset.record_length_bytes"]) == (2, 3, 4096)


@pytest.mark.parametrize("path", ALL_DLIO, ids=lambda p: p.name)
def test_every_dlio_file_gives_dlio_steps_and_checkpoint_bytes(path: Path):
    """Per-epoch samples (full scale and tiny, 1 and 2 ranks) and checkpoint bytes as DLIO's formulas give."""
    data = raw(path)
    full = load_config([f"dlio_config={path}"])
    tiny = load_config([f"dlio_config={path}", "scale=tiny"])
    for config in (full, tiny):
        ds, batch = config.dataset, config.reader.batch_size
        files = tuple(FileSpec(i, f"/f{i}", ds.num_samples_per_file, 1) for i in range(ds.num_files_train))
        whole = config.reader.access == "transfer"
        for ranks in (1, 2):
            expected = dlio_steps({"train": {"total_training_steps": config.train.total_steps or -1}}, ranks,
                                  ds.num_files_train, ds.num_samples_per_file, batch)
            if whole and ds.num_files_train < ranks:
                continue
            assert dlio_steps_per_epoch(files, batch, ranks, whole, config.train.total_steps) == expected
    assert full.dataset.num_files_train == data["dataset"].get("num_files_train", 8)
    if full.model.kind == "explicit":
        for ranks in (1, 4):  # all_ranks (checkpoint.replicas=all): every rank's own copy, as DLIO
            assert build_checkpoint_plan(full, ranks).total_bytes == dlio_checkpoint_bytes(data, ranks)


def test_the_issue_unet3d_numbers():
    """unet3d, 16 files, batch 3, 2 ranks: DLIO runs 2 steps per epoch per rank and reads 12 samples."""
    config = load_config(["workload=unet3d", "dataset.num_files_train=16", "reader.batch_size=3", "train.step_counting=dlio"])
    files = tuple(FileSpec(i, f"/f{i}", 1, 1000 + i) for i in range(16))
    steps = dlio_steps_per_epoch(files, 3, 2, False)
    assert steps == 2
    plans = [plan_epoch(files, config.reader, r, 2, 1, False, max_batches=steps) for r in range(2)]
    assert [p.num_batches for p in plans] == [2, 2]
    read = np.concatenate([p.samples[: p.samples_read] for p in plans])
    assert len(read) == 12 and len({int(f) for f, _ in read}) == 12
    # the bytes read are those 12 samples' (the 4 dropped ones are never read)
    dropped = {int(f) for p in plans for f, _ in p.samples[p.samples_read:]}
    assert sum(files[int(f)].sample_bytes for f, _ in read) == sum(1000 + i for i in range(16) if i not in dropped)
    global_plans = [plan_epoch(files, config.reader, r, 2, 1, False) for r in range(2)]
    assert [p.num_batches for p in global_plans] == [3, 3]  # dlio_ckpt's own counting keeps the partial batch
    assert sum(p.samples_read for p in global_plans) == 16


@pytest.mark.parametrize("name,key", [("bad_not_yaml.yaml", "not valid YAML"), ("bad_no_dataset.yaml", "dataset"),
                                      ("bad_wrong_type.yaml", "reader.batch_size")])
def test_bad_dlio_files_name_the_file_and_key(name: str, key: str, workdir: Path):
    path = DATA / name
    with pytest.raises(ConfigError) as caught:
        import_file(str(path))
    assert str(caught.value).startswith(str(path)) and key in str(caught.value)
    result = run_cli([f"dlio_config={path}", f"storage.root={workdir}/root", f"hydra.run.dir={workdir}/run"], workdir / "cwd")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and key in lines[0]
    assert not (workdir / "run").exists() and not (workdir / "root").exists() and not any((workdir / "cwd").iterdir())


def test_convert_rejects_what_dlio_ckpt_cannot_run():
    with pytest.raises(ConfigError, match="x.yaml: dataset.format: 'png'"):
        convert({"dataset": {"format": "png"}, "reader": {}}, "x", "x.yaml")
    with pytest.raises(ConfigError, match="x.yaml: not a DLIO workload"):
        convert(["dataset"], "x", "x.yaml")


def test_import_command_writes_an_equivalent_workload(tmp_path: Path, capsys):
    from dlio_ckpt.import_dlio import main

    source = DATA / "tf_tfrecord_steps.yaml"
    out = tmp_path / "textnet.yaml"
    main([str(source), "-o", str(out)])
    text = out.read_text()
    assert "transfer_size: 65536  # reader.transfer_size" in text
    assert "train.warmup_steps" in capsys.readouterr().err
    written = load_config([f"workload={out}", "scale=tiny"])
    direct = load_config([f"dlio_config={source}", "scale=tiny"])
    for section in ("dataset", "reader", "train", "evaluation", "model", "checkpoint", "metric"):
        assert getattr(written, section) == getattr(direct, section), section
    assert yaml.safe_load(to_yaml(import_file(str(source))))["reader"]["access"] == "transfer"


def test_dlio_config_tiny_run_matches_dlio(workdir: Path):
    """A real run: DLIO's sample count per epoch, overrides on top, checkpoint bytes on disk."""
    path = DATA / "pt_npz_epoch_ckpt.yaml"
    result = run_cli([f"dlio_config={path}", "scale=tiny", "reader.batch_size=3", f"storage.root={workdir}/root",
                      f"hydra.run.dir={workdir}/run", "progress=false"], workdir / "cwd")
    assert result.returncode == 0, result.stderr
    summary = load_summary(workdir / "run")
    config = load_config([f"dlio_config={path}", "scale=tiny", "reader.batch_size=3"])
    steps = dlio_steps({}, 1, config.dataset.num_files_train, 1, 3)  # 8 files, batch 3: 2 steps, 2 samples dropped
    assert summary["train"]["steps"] == steps * config.train.epochs
    assert summary["train"]["samples"] == steps * 3 * config.train.epochs
    on_disk = sum(p.stat().st_size for p in (workdir / "root" / "checkpoints" / "seg3d").rglob("*.bin"))
    assert config.train.epochs == 2 and summary["checkpoint"]["writes"] == 1  # after epoch 2 (DLIO's rule)
    assert on_disk == build_checkpoint_plan(config, 1).total_bytes == summary["checkpoint"]["bytes"]


@pytest.mark.mpi
def test_all_ranks_checkpoint_bytes_on_disk_under_mpi(workdir: Path):
    """DLIO's all_ranks on 2 ranks: each rank writes its own whole copy, in its own file."""
    path = DATA / "indexed_all_ranks.yaml"
    args = [f"dlio_config={path}", "scale=tiny", "train.epochs=1", "train.total_steps=1",
            "checkpoint.steps_between_checkpoints=1", "train.computation_time=0"]
    result = run_cli(args + [f"storage.root={workdir}/root", f"hydra.run.dir={workdir}/run", "progress=false"],
                     workdir / "cwd", mpi_ranks=2)
    assert result.returncode == 0, result.stderr
    summary = load_summary(workdir / "run")
    files = sorted((workdir / "root" / "checkpoints" / "gptlike").rglob("*.bin"))
    writes = summary["checkpoint"]["writes"]
    assert writes == 1 and [f.name for f in files] == ["rank_00000.bin", "rank_00001.bin"]
    one_copy = dlio_checkpoint_bytes(raw(path), 1)
    assert [f.stat().st_size for f in files] == [one_copy, one_copy]
    assert sum(f.stat().st_size for f in files) == dlio_checkpoint_bytes(raw(path), 2) == \
        build_checkpoint_plan(load_config(args), 2).total_bytes


@pytest.mark.mpi
def test_tensorflow_dlio_config_reads_whole_files_in_transfer_size_under_mpi(workdir: Path):
    """tf.data's pattern on 2 ranks: whole files per rank, read from the start in 64 KiB requests."""
    path = DATA / "tf_tfrecord_steps.yaml"
    args = [f"dlio_config={path}", "scale=tiny", "evaluation.enabled=false"]
    result = run_cli(args + [f"storage.root={workdir}/root", f"hydra.run.dir={workdir}/run", "progress=false"],
                     workdir / "cwd", mpi_ranks=2)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "warning" in line and "train.warmup_steps" in line]
    assert len(warnings) == 1  # the unknown DLIO key, named once (rank 0)
    summary = load_summary(workdir / "run")
    config = load_config(args)
    paths = sorted((workdir / "root" / "data" / "textnet").rglob("*.tfrecord"))
    sizes = [p.stat().st_size for p in paths]
    files = tuple(FileSpec(i, str(p), config.dataset.num_samples_per_file, 1) for i, p in enumerate(paths))
    steps = dlio_steps_per_epoch(files, config.reader.batch_size, 2, True, config.train.total_steps)
    assert steps == min(5, 48 // 4 // 2) == 5
    expected_bytes = expected_reads = 0
    for epoch in range(1, config.train.epochs + 1):
        for rank in range(2):
            plan = plan_epoch(files, config.reader, rank, 2, epoch, True, whole_files=True, max_batches=steps)
            for position in {int(f) for f in plan.samples[: plan.samples_read, 0]}:
                last = max(int(s) for f, s in plan.samples[: plan.samples_read] if int(f) == position)
                end = transfer_end(sizes[position], config.dataset.num_samples_per_file, last, 65536)
                expected_bytes += end
                expected_reads += math.ceil(end / 65536)
    assert summary["train"]["steps_per_rank"] == [steps * config.train.epochs] * 2
    assert summary["train"]["bytes_read"] == expected_bytes
    assert summary["train"]["reads"] == expected_reads


# DLIO 2.0.0's per-accelerator files: (computation_time, batch_size) of *_a100/_h100/_v100.yaml.
ACCELERATORS = [("unet3d", "a100", 0.636, 7), ("unet3d", "h100", 0.323, 7), ("unet3d", "v100", 1.3604, 4),
                ("resnet", "a100", 0.435, 400), ("resnet", "h100", 0.224, 400), ("resnet", "v100", 0.195, 64),
                ("cosmoflow", "a100", 0.00551, 1), ("cosmoflow", "h100", 0.0035, 1), ("cosmoflow", "v100", 0.00936, 1),
                ("bert", "v100", 0.968, 48)]


@pytest.mark.parametrize("workload,accelerator,compute,batch", ACCELERATORS)
def test_accelerator_selects_dlio_figures(workload, accelerator, compute, batch):
    config = load_config([f"workload={workload}", f"accelerator={accelerator}"])
    assert (config.train.computation_time, config.reader.batch_size) == (compute, batch)
    dlio_name = {"resnet": "resnet50"}.get(workload, workload) + f"_{accelerator}.yaml"
    for path in dlio_wheel_workloads():
        if path.name == dlio_name:
            dlio = load_config([f"dlio_config={path}"])
            assert (dlio.train.computation_time, dlio.reader.batch_size, dlio.reader.file_shuffle, dlio.metric.au) == \
                (config.train.computation_time, config.reader.batch_size, config.reader.file_shuffle, config.metric.au)


def test_accelerator_errors_and_explicit_keys_win():
    with pytest.raises(ConfigError, match="accelerator: workload bert has no figures for 'h100'; choose one of: v100"):
        load_config(["workload=bert", "accelerator=h100"])
    with pytest.raises(ConfigError, match="workload llama3_8b has no figures for 'a100'"):
        load_config(["workload=llama3_8b", "accelerator=a100"])
    config = load_config(["workload=unet3d", "accelerator=v100", "reader.batch_size=3", "scale=tiny"])
    assert config.reader.batch_size == 3 and config.train.computation_time == 0.002  # tiny caps compute after it


def test_own_workload_files_run_like_shipped_ones(workdir: Path):
    folder = workdir / "mine"
    folder.mkdir()
    (folder / "mine.yaml").write_text("dataset:\n  format: npy\n  num_files_train: 4\n  record_length_bytes: 64KiB\n"
                                      "reader:\n  batch_size: 2\n  read_threads: 0\n")
    config = load_config([f"workload={folder / 'mine.yaml'}", "scale=tiny"])
    assert (config.workload, config.dataset.format, config.dataset.num_files_train) == ("mine", "npy", 4)
    done = run_cli(["--config-dir", str(folder), "workload=mine", "scale=tiny", "progress=false",
                    f"storage.root={workdir}/root", f"hydra.run.dir={workdir}/run"], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    summary = load_summary(workdir / "run")
    assert summary["workload"] == "mine" and summary["train"]["samples"] == 4  # 4 files, 1 epoch (conf/config.yaml)
    (folder / "bad.yaml").write_text("reader:\n  batch_sise: 2\n")
    done = run_cli([f"workload={folder / 'bad.yaml'}", f"storage.root={workdir}/root2", f"hydra.run.dir={workdir}/run2"],
                   workdir / "cwd")
    assert done.returncode == 2 and not (workdir / "run2").exists() and not (workdir / "root2").exists()
    (line,) = done.stderr.strip().splitlines()
    assert "bad.yaml" in line and "reader.batch_sise" in line and "reader.batch_size" in line
    with pytest.raises(ConfigError, match="looks like a DLIO benchmark workload; run it with dlio_config="):
        load_config([f"workload={DATA / 'pt_npz_epoch_ckpt.yaml'}"])


def test_shipped_unet3d_checkpoint_holds_dlio_layer_tensors():
    """DLIO 2.0.0's unet3d checkpoint: the 499,153,191-byte model and its default layer tensors."""
    config = load_config(["workload=unet3d"])
    assert build_checkpoint_plan(config, 2).total_bytes == 499153191 + 17371 + 24740228
    assert build_checkpoint_plan(config, 2).total_bytes == \
        dlio_checkpoint_bytes(yaml.safe_load((DATA / "pt_npz_epoch_ckpt.yaml").read_text()) | {"checkpoint": {"model_size": 499153191}}, 2)


def test_dlio_never_deletes_checkpoints_and_a_folder_outside_the_root_is_named():
    """DLIO keeps every checkpoint it writes (keep_last 0 = keep all, not the workload default of a
    few); an absolute or escaping data or checkpoint folder cannot be taken as it is, and says so."""
    base = {"dataset": {"format": "npz", "num_files_train": 4, "record_length": 1024, "data_folder": "/lus/me/unet3d"},
            "reader": {"batch_size": 2}, "workflow": {"train": True, "checkpoint": True},
            "checkpoint": {"checkpoint_folder": "../ckpt"}}
    result = convert(base, "mine", "mine.yaml")
    assert result.values()["checkpoint.keep_last"] == 0
    assert "dataset.folder" not in result.values() and "checkpoint.folder" not in result.values()
    warning = result.warning()
    assert warning.startswith("mine.yaml: dataset.data_folder: '/lus/me/unet3d' is absolute or outside storage.root")
    assert "checkpoint.checkpoint_folder: '../ckpt' is absolute or outside storage.root" in warning
    relative = convert({**base, "dataset": {**base["dataset"], "data_folder": "data/unet3d"},
                        "checkpoint": {"checkpoint_folder": "ckpt"}}, "mine", "mine.yaml")
    assert relative.warning() == "" and relative.values()["dataset.folder"] == "data/unet3d"
