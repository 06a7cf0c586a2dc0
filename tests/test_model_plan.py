"""Model and checkpoint plans against DLIO's parameter formula and the MLPerf Storage table."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dlio_ckpt.config.load import load_config
from dlio_ckpt.engine.plan_mode import run_plan_mode
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.plan.checkpoint import build_checkpoint_plan
from dlio_ckpt.plan.model import build_model_plan, transformer_parameters

GIB = 1 << 30

# docs/checkpoint-techniques.md, MLPerf Storage v2.0: total / model / optimizer in GiB
MLPERF = {
    "llama3_8b": (8, 105, 15, 90),
    "llama3_70b": (64, 912, 130, 781),
    "llama3_405b": (512, 5292, 756, 4536),
}


def within(actual: float, expected: float, fraction: float = 0.005) -> bool:
    return abs(actual - expected) <= fraction * expected


def test_dlio_parameter_formula_by_hand():
    cfg = load_config(["workload=llama3_8b"]).model
    V, H, F, L, dkv = 128256, 4096, 14336, 32, 4096 * 8 // 32
    expected = 2 * V * H + L * (2 * H + H * (H + 2 * dkv) + H * H + 3 * H * F) + H
    assert transformer_parameters(cfg) == expected == 8_030_261_248


@pytest.mark.parametrize("workload", sorted(MLPERF))
def test_mlperf_table_totals_and_split(workload):
    ranks, total, model, optimizer = MLPERF[workload]
    config = load_config([f"workload={workload}"])
    plan = build_model_plan(config.model, ranks)
    assert plan.logical_ranks == ranks and plan.scale_factor == 1.0
    assert within(plan.total_bytes / GIB, total)
    assert within(plan.model_bytes / GIB, model)
    assert within(plan.optimizer_bytes / GIB, optimizer)
    # per-rank bytes add up to the total: every byte has exactly one writer
    assert sum(plan.per_rank_bytes()) == plan.total_bytes
    # 14 bytes per parameter with Adam (norms replicated over TP add a little)
    assert within(plan.total_bytes, 14 * plan.parameters, 0.001)


def test_llama3_1t_recomputed_total():
    config = load_config(["workload=llama3_1t"])
    plan = build_model_plan(config.model, 1024)
    assert within(plan.total_bytes / GIB, 15427)
    assert within(plan.model_bytes / GIB, 2204)
    assert within(plan.optimizer_bytes / GIB, 13221)


def _explicit(overrides):
    return load_config(["model.kind=explicit", "model.model_size_bytes=8000", "model.optimization_groups=[1000]",
                        *overrides]).model


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_ownership_under_zero_stages(zero):
    """DP=4: who writes what under each ZeRO stage (model 8000 B, optimizer 3 x 1000 fp32)."""
    plan = build_model_plan(_explicit([f"model.parallelism.zero_stage={zero}"]), 4)
    split = [plan.rank_bytes(r) for r in range(4)]
    model = [m for m, _ in split]
    optimizer = [o for _, o in split]
    assert sum(model) == 8000 and sum(optimizer) == 12000
    if zero == 0:
        assert model == [8000, 0, 0, 0] and optimizer == [12000, 0, 0, 0]
    elif zero in (1, 2):
        assert model == [8000, 0, 0, 0] and optimizer == [3000] * 4
    else:
        assert model == [2000] * 4 and optimizer == [3000] * 4


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_replicas_all_every_replica_writes_its_copy_in_its_own_files(zero):
    """checkpoint.replicas=all (DLIO's all_ranks): each DP replica writes the replicated state, under
    a name of its own in every layout; ZeRO-partitioned state is still written once."""
    from dlio_ckpt.plan.layouts import LAYOUTS, writing_ranks

    base = ["model.kind=explicit", "model.model_size_bytes=8000", "model.optimization_groups=[1000]",
            "model.layer_parameters=[300,700]", "model.parallelism.pipeline=2", f"model.parallelism.zero_stage={zero}"]
    one = build_checkpoint_plan(load_config(base), 8)
    every = load_config(base + ["checkpoint.replicas=all"])
    for layout in LAYOUTS.names():
        plan = build_checkpoint_plan(replace(every, checkpoint=replace(every.checkpoint, layout=layout)), 8)
        model, optimizer = plan.model.model_bytes, plan.model.optimizer_bytes
        expected = {0: 4 * (model + optimizer), 1: 4 * model + optimizer, 3: model + optimizer}[zero]
        assert plan.total_bytes == expected and one.total_bytes == model + optimizer
        assert list(writing_ranks(plan.model)) == [bool(plan.model.rank_tensors(r)) for r in range(8)]
        names, count, _ = plan.files_summary(1)
        assert len(set(names)) == count, layout  # no two replicas share a file
        assert sum(f.payload_bytes for files in plan.files_by_rank for f in files) == expected


def test_plan_mode_shows_every_replica_writing(tmp_path, capsys):
    dlio_file = Path(__file__).parent / "data" / "dlio" / "indexed_all_ranks.yaml"
    config = load_config([f"dlio_config={dlio_file}", "mode=plan", "world.size=4"])
    report = run_plan_mode(config, tmp_path)
    per_rank = json.loads((tmp_path / "plan.json").read_text())["checkpoint"]["per_rank_bytes"]
    assert report["model"]["replicas"] == "all" and len(set(per_rank)) == 1 and per_rank[0] > 0
    assert "every replica writes its copy (checkpoint.replicas=all)" in capsys.readouterr().out
    scaled = load_config(["workload=llama3_8b", "scale=tiny", "mode=plan", "world.size=8", "checkpoint.replicas=all",
                          "model.parallelism.zero_stage=1"])
    run_plan_mode(scaled, tmp_path)  # the unscaled figure is one copy: say so
    assert "one copy of the state: the replicas' copies come on top" in capsys.readouterr().out


def test_pipeline_stages_are_uneven_and_tp_splits_layers():
    config = load_config(["workload=llama3_405b"])
    plan = build_model_plan(config.model, 512)
    first = plan.rank_bytes(0)  # pp 0, dp 0: embedding + model + optimizer partition
    middle = plan.rank_bytes(plan.dp * plan.tp * 5)  # pp 5, dp 0
    last_dp1 = plan.rank_bytes(511)  # pp 31, dp 1: optimizer only (ZeRO-1)
    assert first[0] > middle[0] > 0
    assert last_dp1[0] == 0 and last_dp1[1] > 0
    names = {t.name for t in plan.rank_tensors(0)}
    assert "embed_tokens.weight" in names and "lm_head.weight" not in names
    assert "lm_head.weight" in {t.name for t in plan.rank_tensors(plan.world_size - 1 - plan.tp)}


def test_subset_mode_plans_the_first_ranks_of_the_full_job():
    config = load_config(["workload=llama3_70b"])
    full = build_model_plan(config.model, 64)
    subset = build_model_plan(config.model, 8)
    assert subset.subset and subset.per_rank_bytes() == full.per_rank_bytes()[:8]


def test_bad_parallelism_names_the_key():
    config = load_config(["model.kind=explicit", "model.model_size_bytes=1000", "model.parallelism.tensor=3"])
    with pytest.raises(ConfigError, match=r"^model.parallelism: tensor x pipeline = 3x1"):
        build_model_plan(config.model, 4)


def test_unknown_strategy_and_layout_get_close_matches():
    with pytest.raises(ConfigError, match="checkpoint.strategy: .*did you mean 'single_writer'"):
        load_config(["checkpoint.strategy=single_writr"])
    with pytest.raises(ConfigError, match="checkpoint.layout: .*did you mean 'deepspeed'"):
        load_config(["checkpoint.layout=deepspeeed"])


def test_tiny_scale_shrinks_uniformly_and_keeps_unscaled_figures():
    config = load_config(["workload=llama3_8b", "scale=tiny"])
    plan = build_model_plan(config.model, 8, config.scale.max_model_bytes)
    assert plan.total_bytes <= config.scale.max_model_bytes
    assert plan.total_bytes > 0.99 * config.scale.max_model_bytes
    assert within(plan.unscaled_total_bytes / GIB, 105)
    assert within(plan.optimizer_bytes / plan.model_bytes, 6.0, 0.01)  # 12 vs 2 bytes per parameter


@pytest.mark.parametrize("layout,names", [
    ("deepspeed", ["global_step4/zero_pp_rank_0_mp_rank_00_model_states.pt",
                   "global_step4/zero_pp_rank_7_mp_rank_00_optim_states.pt", "latest"]),
    ("pytorch_dcp", ["step_00000004/__7_0.distcp", "step_00000004/.metadata"]),
    ("megatron", ["iter_0000004/mp_rank_00/distrib_optim_dp007.pt", "latest_checkpointed_iteration.txt"]),
    ("tensorflow", ["ckpt-4/ckpt-4.data-00007-of-00008", "ckpt-4/ckpt-4.index", "checkpoint"]),
    ("raw", ["step_00000004/rank_00007.bin"]),
])
def test_layout_file_names(layout, names):
    config = load_config(["workload=llama3_8b", f"checkpoint.layout={layout}"])
    plan = build_checkpoint_plan(config, 8)
    listed = plan.file_names(4)
    for name in names:
        assert name in listed


def test_tensorflow_framework_layout_is_flat_and_numbered_by_saves(tmp_path):
    """Under checkpoint.durability=framework TensorFlow's files lie in the checkpoint folder itself,
    named by CheckpointManager's save counter (the first save: ckpt-1); under commit, in a folder
    per checkpoint, named by the step (above)."""
    config = load_config(["workload=llama3_8b", "scale=tiny", "checkpoint.layout=tensorflow",
                          "checkpoint.durability=framework", "mode=plan", "world.size=8"])
    names = run_plan_mode(config, tmp_path)["checkpoint"]["file_names"]
    assert "ckpt-1.data-00007-of-00008" in names and "ckpt-1.index" in names and "checkpoint" in names
    assert not any("/" in name for name in names)


def test_plan_mode_1024_ranks_writes_plan_json(tmp_path):
    config = load_config(["workload=llama3_1t", "mode=plan", "world.size=1024"])
    report = run_plan_mode(config, tmp_path)
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert len(saved["checkpoint"]["per_rank_bytes"]) == 1024
    assert saved["checkpoint"]["total_bytes"] == sum(saved["checkpoint"]["per_rank_bytes"])
    assert saved["checkpoint"]["files"] == len(saved["checkpoint"]["file_names"]) > 1024
    assert report["model"]["logical_ranks"] == 1024 and report["world_size"] == 1024


@pytest.mark.parametrize("layout", ["deepspeed", "megatron", "pytorch_dcp", "tensorflow", "raw"])
@pytest.mark.parametrize("zero", [0, 1, 3])
def test_rank_bytes_without_tensors_equal_the_files_payload(layout, zero):
    """The per-rank bytes computed from numpy columns are exactly the bytes of the tensors in the
    rank's planned files (uneven DP splits: 1000 and 3 elements over 3 DP ranks, pipeline 2)."""
    config = load_config(["model.kind=explicit", "model.model_size_bytes=1000", "model.layer_parameters=[7,3,5]",
                          "model.optimization_groups=[1000,3]", f"model.parallelism.zero_stage={zero}",
                          "model.parallelism.tensor=2", "model.parallelism.pipeline=2", "model.parallelism.data=3",
                          f"checkpoint.layout={layout}"])
    plan = build_checkpoint_plan(config, 12)
    layout = plan.layout  # the layout decides who saves what (pytorch_dcp: DCP's planner; the others: ZeRO's rule)
    for rank, files in enumerate(plan.files_by_rank):
        tensors = [t for f in files for t in f.tensors]
        model = sum(t.nbytes for t in tensors if t.kind == "model")
        optimizer = sum(t.nbytes for t in tensors if t.kind == "optimizer")
        assert layout.rank_bytes(plan.model, rank) == (model, optimizer)
        assert plan.rank_bytes(rank) == model + optimizer
        assert sorted(t.name for t in tensors) == sorted(t.name for t in layout.rank_tensors(plan.model, rank))
        if layout.name != "pytorch_dcp":
            assert plan.model.rank_bytes(rank) == (model, optimizer)
    assert plan.total_bytes == plan.model.total_bytes  # one copy of the state, whoever saves it
    names, count, encoded = plan.files_summary(4)
    assert count == sum(len(files) for files in plan.files_by_rank) == len(names)
    assert encoded == plan.total_bytes  # the raw format: payload only


def test_a_16384_rank_plan_sizes_every_rank_without_building_their_tensor_lists(monkeypatch):
    """Sizing a job (plan mode, the free-space check on every rank) must not build each rank's
    tensor list: under ZeRO-3 that is N ranks x every tensor, and every rank of a real run does it."""
    from dlio_ckpt.plan.model import ModelPlan

    config = load_config(["workload=llama3_70b", "model.parallelism.data=0"])
    built = []
    original = ModelPlan.rank_tensors
    monkeypatch.setattr(ModelPlan, "rank_tensors", lambda self, rank: built.append(rank) or original(self, rank))
    plan = build_checkpoint_plan(config, 16384)
    per_rank = plan.per_rank_bytes()
    assert len(per_rank) == 16384 and sum(per_rank) == plan.total_bytes == plan.model.total_bytes
    assert plan.encoded_bytes() in (None, plan.total_bytes)  # what the free-space check asks, on every rank
    assert built == []
    own = plan.files_by_rank[16383]  # a rank builds only its own files
    assert built == [16383] and sum(f.payload_bytes for f in own) == per_rank[16383]


@pytest.mark.parametrize("fmt", ["raw", "npy", "npz", "hdf5"])
def test_encoded_bytes_without_walking_the_ranks_agree_with_the_files(fmt):
    """The free-space check (on every rank) asks for encoded bytes: payload-only and unknown sizes
    come without building any rank's files, and agree with summing the files' encoded sizes."""
    from dlio_ckpt.plan.checkpoint_formats import format_spec

    config = load_config(["workload=llama3_8b", "model.parallelism.data=0", f"checkpoint.format={fmt}"])
    plan = build_checkpoint_plan(config, 16)
    spec = format_spec(fmt)
    sizes = [spec.encoded_size(f.tensors) for files in plan.files_by_rank for f in files]
    expected = None if None in sizes else sum(sizes)
    assert plan.encoded_bytes() == expected == plan.files_summary(1)[2]
    if fmt == "npy":
        assert expected > plan.total_bytes  # one header per file
