"""Checkpoint strategies end to end through real files: bytes, manifests, restore, failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import xxhash

import rank_fork
from ckpt_util import data_files, make_ctx
from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.content import tensor_key
from dlio_ckpt.checkpoint.report import checkpoint_summary
from dlio_ckpt.engine.checkpoint_mode import run_checkpoint_mode
from dlio_ckpt.config.load import load_config
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST_NAME).read_text())


@pytest.mark.parametrize("strategy", ["sharded", "single_writer", "async", "sync"])
def test_strategy_writes_the_plan_and_restores_verified(tmp_path, strategy):
    ctx = make_ctx(tmp_path, [f"checkpoint.strategy={strategy}"])
    engine = make_checkpoint_engine(ctx)
    for step in (3, 6):
        engine.save(step, 1)
    engine.finish()
    root = Path(engine.root)
    assert root.is_relative_to(tmp_path) and ctx.run_id in root.name
    for step in (3, 6):
        folder = root / engine.layout.folder(step)
        files = data_files(folder)
        # bytes on disk equal the plan (raw format: no headers)
        assert sum(f.stat().st_size for f in files) == engine.plan.total_bytes == engine.plan.encoded_bytes()
        # manifest sizes and checksums match what is on disk
        listed = {e["path"]: e for e in manifest(folder)["files"]}
        for f in files:
            entry = listed[str(f.relative_to(folder))]
            assert entry["size"] == f.stat().st_size
            assert entry["checksum"] == xxhash.xxh3_128(f.read_bytes()).hexdigest()
    # contents are the ByteSource's bytes for (rank, tensor, step), read back from disk
    pf = engine.plan.files_by_rank[0][0]
    tensor = pf.tensors[0]
    on_disk = (root / engine.layout.folder(6) / pf.path_for(6)).read_bytes()[: tensor.nbytes]
    expected = b"".join(bytes(c) for c in engine.source.chunks(tensor_key(0, tensor.name, 6), tensor.nbytes))
    assert on_disk == expected and len(set(on_disk[:4096])) > 200  # random, not zeros
    record = engine.records[-1]
    assert record.committed and record.bytes == engine.plan.total_bytes and record.files == 1
    assert ctx.recorder.bytes_written["checkpoint"] >= 2 * engine.plan.total_bytes  # every byte traced
    restored = engine.restore()
    assert restored.verified and restored.checkpoint_step == 6 and restored.bytes == engine.plan.total_bytes
    assert ctx.recorder.bytes_read["restore"] >= engine.plan.total_bytes


@pytest.mark.parametrize("layout,fmt", [("deepspeed", "raw"), ("pytorch_dcp", "npy"), ("megatron", "npz"),
                                        ("tensorflow", "hdf5"), ("raw", "hdf5")])
def test_layouts_and_formats_round_trip(tmp_path, layout, fmt):
    ctx = make_ctx(tmp_path, [f"checkpoint.layout={layout}", f"checkpoint.format={fmt}",
                              "model.optimization_groups=[100000,5000]"])
    engine = make_checkpoint_engine(ctx)
    engine.save(5, 1)
    engine.finish()
    root = Path(engine.root)
    folder = root / engine.layout.folder(5)
    names = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert set(engine.plan.file_names(5)) == names
    files = data_files(folder)
    assert sum(f.stat().st_size for f in files) >= engine.plan.total_bytes
    pf = engine.plan.files_by_rank[0][0]
    tensor = pf.tensors[-1]
    expected = np.frombuffer(b"".join(bytes(c) for c in engine.source.chunks(
        tensor_key(0, tensor.name, 5), tensor.nbytes, ctx.config.checkpoint.write_chunk_bytes)), dtype=tensor.dtype)
    path = folder / pf.path_for(5)
    if fmt == "hdf5":
        import h5py

        with h5py.File(path, "r") as h5:
            assert np.array_equal(h5[tensor.name][...].view(np.uint8), expected.view(np.uint8))
    elif fmt == "npz":
        with np.load(path) as archive:
            assert np.array_equal(archive[tensor.name].view(np.uint8), expected.view(np.uint8))
    elif fmt == "npy":
        flat = np.load(path)
        assert flat.size == pf.payload_bytes
    assert engine.restore().verified


def _two_checkpoints(tmp_path, extra=()):
    ctx = make_ctx(tmp_path, list(extra))
    engine = make_checkpoint_engine(ctx)
    engine.save(1, 1)
    engine.save(2, 1)
    engine.finish()
    return ctx, engine


def test_torn_checkpoint_without_manifest_falls_back(tmp_path, capsys):
    ctx, engine = _two_checkpoints(tmp_path)
    # a rank killed mid-write: data files of step 3 on disk, no commit
    engine.state.advance(3)
    engine.write_planned(engine.plan.files_by_rank[0], 3, lambda pf: engine.payload(pf, 2))
    assert not (Path(engine.root) / engine.layout.folder(3) / MANIFEST_NAME).exists()
    restored = make_checkpoint_engine(ctx).restore()
    assert restored.verified and restored.checkpoint_step == 2
    assert "step_00000003: torn: no manifest" in restored.message
    assert "fell back to the previous complete checkpoint" in restored.message
    assert "torn" in capsys.readouterr().err


def test_truncated_file_is_detected(tmp_path):
    ctx, engine = _two_checkpoints(tmp_path)
    victim = data_files(Path(engine.root) / engine.layout.folder(2))[0]
    with open(victim, "r+b") as handle:
        handle.truncate(victim.stat().st_size // 2)
    restored = engine.restore()
    assert restored.verified and restored.checkpoint_step == 1
    assert "truncated" in restored.message and "step_00000002" in restored.skipped[0]


def test_corrupted_file_is_detected(tmp_path):
    ctx, engine = _two_checkpoints(tmp_path, ["checkpoint.checksum=blake3"])
    victim = data_files(Path(engine.root) / engine.layout.folder(2))[0]
    with open(victim, "r+b") as handle:
        handle.seek(12345)
        byte = handle.read(1)
        handle.seek(12345)
        handle.write(bytes([byte[0] ^ 0xFF]))
    restored = engine.restore()
    assert restored.verified and restored.checkpoint_step == 1
    assert "blake3 checksum mismatch" in restored.message


def test_no_complete_checkpoint_is_never_loaded_silently(tmp_path):
    ctx, engine = _two_checkpoints(tmp_path)
    for step in (1, 2):
        (Path(engine.root) / engine.layout.folder(step) / MANIFEST_NAME).unlink()
    restored = engine.restore()
    assert not restored.verified and "no complete checkpoint" in restored.message


def test_retention_deletes_only_inside_the_run_folder(tmp_path):
    ctx = make_ctx(tmp_path, ["checkpoint.keep_last=2", "checkpoint.layout=deepspeed"])
    root = Path(ctx.checkpoint_root())
    other_run = root.parent / "another-run" / "global_step1"
    other_run.mkdir(parents=True)
    (other_run / "keep.me").write_bytes(b"x")
    decoy = root.parent / "global_step1"
    decoy.mkdir()
    engine = make_checkpoint_engine(ctx)
    for step in (1, 2, 3, 4):
        engine.save(step, 1)
    engine.finish()
    kept = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert kept == ["global_step3", "global_step4"]
    assert (root / "latest").read_text() == "global_step4"
    assert (other_run / "keep.me").exists() and decoy.exists()


def test_async_blocks_less_than_it_persists_and_bounds_in_flight(tmp_path):
    ctx = make_ctx(tmp_path, ["checkpoint.strategy=async", "model.model_size_bytes=32MiB",
                              "model.optimization_groups=[4194304]", "checkpoint.write_chunk_bytes=1MiB"])
    engine = make_checkpoint_engine(ctx)
    in_flight = []
    for step in (1, 2, 3):
        engine.save(step, 1)
        in_flight.append(engine.strategy.in_flight)
    engine.finish()
    assert max(in_flight) <= ctx.config.checkpoint.max_in_flight == 1
    assert engine.strategy.in_flight == 0
    records = engine.records
    assert all(r.committed and r.bytes == engine.plan.total_bytes for r in records)
    # the snapshot is a memory copy; the persist writes and fsyncs the same bytes
    assert sum(r.blocking_s - r.wait_s for r in records) < sum(r.persist_s for r in records)
    assert all(r.snapshot_s > 0 and r.write_s > 0 for r in records)
    assert engine.restore().verified


def test_async_small_staging_buffer_writes_the_rest_while_blocking(tmp_path):
    ctx = make_ctx(tmp_path, ["checkpoint.strategy=async", "checkpoint.layout=deepspeed",
                              "model.parallelism.zero_stage=0", "checkpoint.staging_buffer_bytes=1MiB"])
    engine = make_checkpoint_engine(ctx)
    engine.save(1, 1)
    engine.finish()
    assert engine.records[0].bytes == engine.plan.total_bytes
    assert engine.restore().verified


def test_streaming_write_memory_stays_far_below_the_shard(tmp_path):
    import psutil

    shard = 96 << 20
    ctx = make_ctx(tmp_path, [f"model.model_size_bytes={shard}", "model.optimization_groups=[]",
                              "checkpoint.write_chunk_bytes=1MiB", "checkpoint.fsync=false"])
    engine = make_checkpoint_engine(ctx)
    engine.source  # the bounded pool exists before we measure
    rss_before = psutil.Process().memory_info().rss
    tracemalloc.start()
    engine.save(1, 1)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_growth = psutil.Process().memory_info().rss - rss_before
    assert engine.records[0].bytes == shard
    assert peak < shard // 16
    assert rss_growth < shard // 4


def test_triggers_steps_epochs_and_no_double_save(tmp_path):
    ctx = make_ctx(tmp_path, ["checkpoint.steps_between_checkpoints=4", "checkpoint.epochs_between_checkpoints=1"])
    engine = make_checkpoint_engine(ctx)
    due = [s for s in range(1, 9) if engine.due(s, 1, False)]
    assert due == [4, 8]
    engine.save(8, 1)
    assert not engine.due(8, 1, True)  # the epoch ended on a step that was just saved
    assert engine.due(9, 2, True)


def test_summary_rates_come_from_averaged_times():
    Cfg = load_config(["checkpoint.strategy=sharded", "checkpoint.layout=raw", "checkpoint.format=raw"])
    gib = 1 << 30
    rec = lambda i, b, w, blk: {"index": i, "step": i, "epoch": 1, "bytes": b, "files": 1, "write_s": w,
                                "blocking_s": blk, "persist_s": blk, "peak_rss_bytes": 10}
    ranks = [[rec(0, gib, 1.0, 1.5), rec(1, gib, 3.0, 3.5)], [rec(0, gib, 2.0, 2.5), rec(1, gib, 2.0, 2.5)]]
    restores = [{"bytes": gib, "files": 1, "read_s": 0.5, "verified": True},
                {"bytes": gib, "files": 1, "read_s": 1.0, "verified": True}]
    s = checkpoint_summary(ranks, restores, 100.0, Cfg)
    assert s["writes"] == 2 and s["bytes"] == 2 * gib
    assert s["write_s_max"] == pytest.approx(2.5)  # mean of per-checkpoint maxima (2.0, 3.0)
    assert s["write_gib_per_s"] == pytest.approx(2 / 2.5)  # from the averaged time, not mean(1.0, 0.667)
    assert s["write_gib_per_s_min_rank"] == pytest.approx(0.5)  # rank 0 and 1 both average 2.0 s
    assert s["training_time_lost_fraction"] == pytest.approx(5.0 / 100)
    assert s["restore_s_max"] == 1.0 and s["restore_gib_per_s"] == pytest.approx(2.0)
    assert s["restore_verified"] is True and s["peak_rss_bytes_max"] == 10
    assert len(s["per_checkpoint"]) == 2


def test_checkpoint_mode_writes_then_reads(tmp_path):
    ctx = make_ctx(tmp_path, ["mode=checkpoint", "checkpoint.enabled=false", "checkpoint.num_checkpoints_write=3",
                              "checkpoint.num_checkpoints_read=2", "checkpoint.layout=megatron"])
    summary = run_checkpoint_mode(ctx)
    assert summary["writes"] == 3 and summary["reads"] == 2 and summary["restore_verified"]
    assert summary["bytes"] == 6 << 20
    assert summary["mlperf"]["write_throughput_gib_per_s"] > 0 and summary["page_cache_drop"] == "not requested"
    assert [r["step"] for r in summary["per_read"]] == [1, 2]


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", ["sharded", "async"])
def test_strategy_under_mpirun(tmp_path, strategy):
    env = {k: v for k, v in os.environ.items() if k != "DLIO_CKPT_MPI"}
    result = subprocess.run(
        rank_fork.command(2, [str(BIN / "python"), str(REPO / "tests" / "mpi_checkpoint_driver.py"), str(tmp_path),
                              strategy]),  # each rank forked from the tests' server
        capture_output=True, text=True, timeout=240, env=env, cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["world"] == 2
    per_rank = out["plan_per_rank"]
    assert all(b > 0 for b in per_rank)  # ZeRO-1: both ranks write their optimizer partition
    root = Path(out["root"])
    for step_folder in ("step_00000002", "step_00000004"):
        files = data_files(root / step_folder)
        assert sorted(f.name for f in files) == ["rank_00000.bin", "rank_00001.bin"]
        assert [f.stat().st_size for f in files] == per_rank
        assert len(manifest(root / step_folder)["files"]) == 2
    summary = out["summary"]
    assert summary["writes"] == 2 and summary["bytes"] == sum(per_rank)
    assert summary["restore_verified"] and summary["restore_bytes"] == sum(per_rank)
    assert [len(r) for r in out["records"]] == [2, 2]


def test_torch_format_without_torch_gives_an_install_hint(tmp_path):
    from dlio_ckpt.errors import MissingDependency
    from dlio_ckpt.optional import available

    if available("torch"):
        ctx = make_ctx(tmp_path, ["checkpoint.format=torch"])
        engine = make_checkpoint_engine(ctx)
        engine.save(1, 1)
        assert engine.restore().verified
    else:
        ctx = make_ctx(tmp_path, ["checkpoint.format=torch"])
        with pytest.raises(MissingDependency, match="pip install torch"):
            make_checkpoint_engine(ctx)


def test_trigger_rules_together_and_the_clock_rule_decided_once_for_all_ranks():
    from dlio_ckpt.checkpoint.triggers import Triggers

    asked: list[bool] = []

    def rank0_says_no(mine: bool) -> bool:  # as World.bcast from a rank 0 whose clock disagrees
        asked.append(mine)
        return False

    triggers = Triggers(steps_between=4, epochs_between=2, after_epoch=0, seconds_between=10.0)
    assert triggers.due(8, 1, False, 0.0, rank0_says_no) and asked == []  # the step rule, no clock asked
    assert not triggers.due(8, 2, True, 99.0, rank0_says_no) and asked == []  # epoch end: the epoch rule alone
    assert triggers.due(3, 3, True, 0.0, rank0_says_no) and not triggers.due(3, 2, True, 0.0, rank0_says_no)
    assert not triggers.due(5, 1, False, 11.0, rank0_says_no) and asked == [True]  # rank 0's answer wins
    assert triggers.due(5, 1, False, 11.0, lambda mine: mine)
    assert not triggers.due(5, 1, False, 9.9, lambda mine: mine)
    assert not Triggers(4, 0, 0).due(5, 1, False, 1e9, lambda mine: True)  # no seconds rule: never by the clock
