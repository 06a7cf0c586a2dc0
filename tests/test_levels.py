"""Multi-level checkpointing (checkpoint.levels, docs/levels.md): SCR's level rule, flushes that
copy a checkpoint byte for byte with the manifest last, retention per level, node failures that
take a node-local level's files, and a restore that takes the newest surviving checkpoint."""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rank_fork
from ckpt_util import data_files, make_ctx
from conftest import REPO, cli_env, load_summary, run_cli

from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.checkpoint.flush import copy_entries
from dlio_ckpt.config.load import load_config
from dlio_ckpt.errors import ConfigError, RunFailure
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME
from dlio_ckpt.plan.levels import (host_indices, level_for, node_count, node_of, placement, ranks_on_node,
                                   to_copy)
from dlio_ckpt.storage.events import OP_CODE

DRIVER = Path(__file__).resolve().parent / "levels_mpi_driver.py"


def levels(tmp_path: Path, local_keep: int = -1, shared_keep: int = -1, every: int = 2, write: str = "flush") -> str:
    """A node-local level under tmp_path/local (every checkpoint) and the run's own folder as the
    shared level (every `every`-th, flushed or written directly)."""
    return (f"checkpoint.levels=[{{name:local,path:{tmp_path / 'local'},scope:node,keep_last:{local_keep}}},"
            f"{{name:shared,every:{every},write:{write},keep_last:{shared_keep}}}]")


def steps_in(root: str) -> list[int]:
    """Steps of the complete checkpoints (manifest present) in a level's root."""
    if not os.path.isdir(root):
        return []
    return sorted(int(name.split("_")[1]) for name in os.listdir(root)
                  if os.path.isfile(os.path.join(root, name, MANIFEST_NAME)))


# SCR's rule and the node layout (pure) ------------------------------------------------------
def test_each_checkpoint_goes_to_the_level_with_the_largest_interval_dividing_its_number():
    intervals = [1, 4, 8]
    assert [level_for(n, intervals) for n in range(1, 17)] == [0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2]
    with pytest.raises(ValueError):
        level_for(0, intervals)
    # a flushed level is reached through the first level: written there, then copied
    assert placement(8, intervals, [False, False, True]).write == 0
    assert placement(8, intervals, [False, False, True]).flush == (2,)
    assert placement(4, intervals, [False, False, True]).write == 1  # a level written directly
    assert placement(4, intervals, [False, False, True]).flush == ()


def test_node_boundaries_emulated_by_ranks_per_node_or_taken_from_host_names():
    assert [node_of(r, 2) for r in range(5)] == [0, 0, 1, 1, 2]
    assert ranks_on_node(1, 5, 2) == {2, 3} and node_count(5, 2) == 3
    hosts = host_indices(["b", "b", "a", "c", "a"])
    assert hosts == [0, 0, 1, 2, 1]
    assert ranks_on_node(1, 5, 0, hosts) == {2, 4} and node_count(5, 0, hosts) == 3
    assert node_of(0, 0) == 0 and node_count(1, 0) == 1  # serial: one node


def test_a_flush_copies_the_chain_members_the_target_lacks_oldest_first():
    assert to_copy(6, [4, 5, 6], present=[]) == [4, 5, 6]
    assert to_copy(6, [4, 5, 6], present=[4]) == [5, 6]
    assert to_copy(6, [], present=[6]) == [6]  # a full checkpoint: itself (again, if an older copy was torn)


# configuration ------------------------------------------------------------------------------
@pytest.mark.parametrize("value, words", [
    ("[{name:a,every:2}]", "checkpoint.levels[0]: the first (fastest) level takes every checkpoint"),
    ("[{name:a,path:/tmp/a},{name:b,every:1}]", "checkpoint.levels[1].every: intervals rise"),
    ("[{name:a,path:/tmp/a},{name:a,every:2}]", "checkpoint.levels[1].name: 'a' names two levels"),
    ("[{name:a},{name:b,every:2}]", "checkpoint.levels[1].path: 'storage.root/checkpoint.folder' is already"),
    ("[{name:a,path:/tmp/a},{name:b,every:2,backend:posx}]", "checkpoint.levels[1].backend: unknown backend 'posx'"),
    ("[{name:a,path:/tmp/a},{name:b,every:0}]", "checkpoint.levels[1].every: an interval in checkpoints"),
    ("[{name:a,path:/tmp/a},{name:b,every:2,backend:s3}]", "checkpoint.levels[1].backend: a level without a path"),
])
def test_unusable_level_lists_are_refused_naming_the_key(value, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        load_config([f"checkpoint.levels={value}"])


def test_a_level_backend_that_cannot_write_the_format_is_refused():
    from dlio_ckpt.config.load import check_level_paths

    config = load_config(["checkpoint.enabled=true", "checkpoint.format=hdf5", "storage.s3.bucket=b",
                          "checkpoint.levels=[{name:a,path:/tmp/a},{name:b,path:/pfs,every:2,backend:s3}]"])
    with pytest.raises(ConfigError, match=r"checkpoint.levels\[1\].backend: checkpoint.format=hdf5 .* needs seekable"):
        check_level_paths(config)


def test_a_level_folder_blocked_by_a_file_is_refused_before_anything_is_written(workdir):
    (workdir / "afile").write_text("x")
    done = run_cli(["workload=bert", "scale=tiny", "checkpoint.enabled=true", f"storage.root={workdir / 'store'}",
                    f"checkpoint.levels=[{{name:local,path:{workdir / 'afile' / 'local'}}},{{name:shared,every:2}}]"],
                   workdir / "cwd")
    assert done.returncode == 2, done.stderr
    assert "checkpoint.levels[0].path" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (workdir / "store").exists()


# flushes and retention ----------------------------------------------------------------------
def test_a_flush_copies_the_checkpoint_byte_for_byte_with_its_manifest_last(tmp_path):
    ctx = make_ctx(tmp_path, [levels(tmp_path, local_keep=0, shared_keep=0)])
    engine = make_checkpoint_engine(ctx)
    for step in range(1, 5):
        engine.save(step, 1)
    engine.finish()
    local, shared = engine.engines[0].root, engine.engines[1].root
    assert steps_in(local) == [1, 2, 3, 4] and steps_in(shared) == [2, 4]
    assert [f.step for f in engine.flushes] == [2, 4] and all(f.committed and not f.error for f in engine.flushes)
    events = ctx.recorder.array()
    path_ids = {path: number for number, path in enumerate(ctx.recorder.paths)}
    for step in (2, 4):
        name = f"step_{step:08d}"
        copies = data_files(Path(shared) / name)
        assert [p.name for p in copies] == [p.name for p in data_files(Path(local) / name)] and copies
        for copy in copies:  # the same bytes on both tiers
            assert filecmp.cmp(copy, Path(local) / name / copy.name, shallow=False)
        manifest = Path(shared) / name / MANIFEST_NAME
        assert manifest.read_bytes() == (Path(local) / name / MANIFEST_NAME).read_bytes()
        # manifest last: its publishing close comes after every flushed data file's
        closes = events[events["op"] == OP_CODE["close"]]
        data_end = max(closes[closes["file"] == path_ids[str(p)]]["end"].max() for p in copies)
        manifest_closes = closes[closes["file"] == path_ids[str(manifest)]]
        assert len(manifest_closes) == 1 and manifest_closes["start"][0] >= data_end
    assert sum(f.bytes for f in engine.flushes) == 2 * engine.plan.per_rank_bytes()[0]


@pytest.mark.parametrize("strategy", [["checkpoint.strategy=sharded"],
                                      ["checkpoint.strategy=async", "checkpoint.max_in_flight=2"]])
def test_retention_is_per_level_and_a_flushed_source_survives_its_flush(tmp_path, monkeypatch, strategy):
    import dlio_ckpt.checkpoint.levels as levels_module

    def slow_copy(*args, **kwargs):  # a copy slower than a save: the next save's retention must wait for it
        time.sleep(0.3)
        return copy_entries(*args, **kwargs)

    monkeypatch.setattr(levels_module, "copy_entries", slow_copy)
    ctx = make_ctx(tmp_path, [levels(tmp_path, local_keep=1, shared_keep=2), *strategy])
    engine = make_checkpoint_engine(ctx)
    for step in range(1, 8):
        engine.save(step, 1)
    engine.finish()
    assert steps_in(engine.engines[0].root) == [7]
    assert steps_in(engine.engines[1].root) == [4, 6]
    assert [f.step for f in engine.flushes if f.committed] == [2, 4, 6]  # the source was kept until copied


def test_a_level_written_directly_gets_its_checkpoints_only(tmp_path):
    ctx = make_ctx(tmp_path, [levels(tmp_path, local_keep=0, shared_keep=0, every=3, write="direct")])
    engine = make_checkpoint_engine(ctx)
    for step in range(1, 7):
        engine.save(step, 1)
    engine.finish()
    assert steps_in(engine.engines[0].root) == [1, 2, 4, 5] and steps_in(engine.engines[1].root) == [3, 6]
    assert [r.level for r in engine.records] == ["local", "local", "shared", "local", "local", "shared"]
    assert not engine.flushes


def test_a_damaged_source_file_is_never_published_on_the_target(tmp_path):
    ctx = make_ctx(tmp_path)
    source, target = tmp_path / "a", tmp_path / "b"
    source.mkdir()
    (source / "f.bin").write_bytes(b"x" * 10_000)
    import xxhash

    good = {"path": "f.bin", "size": 10_000, "checksum": xxhash.xxh3_128(b"x" * 10_000).hexdigest()}
    buffer = memoryview(bytearray(4096))
    copied = copy_entries(ctx.storage, ctx.storage, str(source), str(target), [good], "xxh3_128", True, buffer)
    assert copied.bytes == 10_000 and (target / "f.bin").read_bytes() == b"x" * 10_000
    (source / "f.bin").write_bytes(b"x" * 9_999 + b"y")
    with pytest.raises(RunFailure, match="checksum mismatch"):
        copy_entries(ctx.storage, ctx.storage, str(source), str(tmp_path / "c"), [good], "xxh3_128", True, buffer)
    assert not (tmp_path / "c" / "f.bin").exists() and os.listdir(tmp_path / "c") == []


# node failures and restore ------------------------------------------------------------------
def test_a_node_failure_loses_the_local_level_and_the_restore_takes_the_shared_one(tmp_path):
    ctx = make_ctx(tmp_path, [levels(tmp_path, local_keep=0, shared_keep=0), "world.ranks_per_node=1"])
    engine = make_checkpoint_engine(ctx)
    for step in range(1, 6):
        engine.save(step, 1)
    engine.finish()
    local = engine.engines[0].root
    removed = engine.fail("node", 0)
    assert len(removed) == 2 * 5  # the one rank's data file and the manifest of each of the 5 checkpoints
    assert not any(data_files(Path(local) / f"step_{s:08d}") for s in range(1, 6))
    restored = engine.restore()
    assert (restored.level, restored.checkpoint_step, restored.verified) == ("shared", 4, True)
    assert restored.bytes == engine.plan.per_rank_bytes()[0]
    assert "level local" in " ".join(restored.skipped)
    # training goes on: the next checkpoint is written (step 5 again) and restorable from the local level
    engine.save(5, 1)
    engine.finish()
    again = engine.restore()
    assert (again.level, again.checkpoint_step) == ("local", 5)


def test_a_process_failure_keeps_the_local_level(tmp_path):
    ctx = make_ctx(tmp_path, [levels(tmp_path), "world.ranks_per_node=1"])
    engine = make_checkpoint_engine(ctx)
    for step in range(1, 4):
        engine.save(step, 1)
    assert engine.fail("process") == []
    restored = engine.restore()
    assert (restored.level, restored.checkpoint_step, restored.skipped) == ("local", 3, [])
    with pytest.raises(ValueError):
        engine.fail("node", 1)  # one rank per node, one rank: node 1 does not exist


def test_node_failure_under_mpi_loses_only_that_nodes_files(tmp_path):
    done = subprocess.run(rank_fork.command(2, [sys.executable, str(DRIVER), str(tmp_path),  # ranks forked (rank_fork.py)
                                                levels(tmp_path, local_keep=0, shared_keep=0), "world.ranks_per_node=1"]),
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["nodes"] == 2
    assert (found["restored"]["level"], found["restored"]["checkpoint_step"]) == ("shared", 4)
    assert found["restored"]["verified"]
    local = Path(found["local_root"])
    for step in range(1, 6):  # rank 0's files and manifests stay, rank 1's are gone
        writers = found["writers"][str(step)]
        left = {p.name for p in data_files(local / f"step_{step:08d}")}
        assert left == {name for name, writer in writers.items() if writer == 0} and left
        assert (local / f"step_{step:08d}" / MANIFEST_NAME).exists()
    assert found["removed"] == 5  # one file of rank 1 in each checkpoint


def test_summary_reports_every_level(workdir):
    run = workdir / "run"
    done = run_cli(["workload=bert", "scale=tiny", "progress=false", "checkpoint.enabled=true", "checkpoint.restore=true",
                    "train.computation_time=0", "checkpoint.steps_between_checkpoints=2", "checkpoint.keep_last=0",
                    f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}", levels(workdir)],
                   workdir / "cwd")
    assert done.returncode == 0, done.stderr[-3000:]
    ck = load_summary(run)["checkpoint"]
    local, shared = ck["levels"]
    writes = len(ck["per_checkpoint"])
    assert (local["name"], local["checkpoints"], local["flushes"]) == ("local", writes, 0)
    assert (shared["name"], shared["checkpoints"], shared["flushes"], shared["flushes_failed"]) == ("shared", 0, writes // 2, 0)
    assert local["bytes"] == ck["total_bytes_written"]
    assert shared["bytes"] == sum(c["bytes"] for c in ck["per_checkpoint"][1::2])
    assert local["restores"] == 1 and local["restore_s_mean"] > 0 and shared["flush_s_mean"] > 0
    assert steps_in(shared["path"]) == [c["step"] for c in ck["per_checkpoint"][1::2]]
    # `dlio_ckpt clean` removes this run's folder in the local level too, and nothing else there
    (workdir / "local" / "someone-else").mkdir()
    done = run_cli(["clean", str(run)], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    assert not os.path.exists(local["path"]) and not os.path.exists(shared["path"])
    assert sorted(os.listdir(workdir / "local")) == ["someone-else"]


def test_a_flush_of_an_encoded_checkpoint_takes_its_chain_and_retention_keeps_it(tmp_path):
    encoded = ["checkpoint.update=sparse", "checkpoint.update_fraction=0.05", "checkpoint.update_chunk_bytes=64KiB",
               "checkpoint.encoding=incremental", "checkpoint.incremental.chunk_bytes=64KiB",
               "checkpoint.incremental.full_every=3"]
    ctx = make_ctx(tmp_path, [levels(tmp_path, local_keep=0, shared_keep=1, every=3), "world.ranks_per_node=1", *encoded])
    engine = make_checkpoint_engine(ctx)
    for step in range(1, 7):
        engine.save(step, 1)
    engine.finish()
    # checkpoints 4-6 are one chain (4 is full): the flush of 6 copies all three, and the
    # shared level's keep_last=1 keeps 6 with the chain it needs, deleting 1-3
    assert [(f.step, f.steps, f.committed) for f in engine.flushes] == [(3, [1, 2, 3], True), (6, [4, 5, 6], True)]
    assert steps_in(engine.engines[1].root) == [4, 5, 6]
    engine.fail("node", 0)
    restored = engine.restore()
    assert (restored.level, restored.checkpoint_step, restored.chain_length) == ("shared", 6, 3)
    assert restored.verified


def test_free_space_is_checked_per_level_folder(tmp_path, monkeypatch):
    from dlio_ckpt.config.space import FREE_BYTES_VARIABLE, check_free_space, checkpoint_bytes, kept_per_level

    config = load_config([f"storage.root={tmp_path}", "workload=bert", "scale=tiny", "checkpoint.enabled=true",
                          "checkpoint.steps_between_checkpoints=1", "checkpoint.keep_last=0", "train.total_steps=8",
                          "generate.enabled=false",
                          levels(tmp_path, local_keep=3, shared_keep=-1, every=4)])
    assert kept_per_level(config, 1) == [3, 2]  # 8 checkpoints: the local level keeps 3, the shared one gets 4 and 8
    each = checkpoint_bytes(config, 1)
    monkeypatch.setenv(FREE_BYTES_VARIABLE, str(3 * each))
    check_free_space(config, 1, free_bytes=2 * each)  # 3 fit the local folder, 2 storage.root
    monkeypatch.setenv(FREE_BYTES_VARIABLE, str(3 * each - 1))
    with pytest.raises(ConfigError, match=r"checkpoint.levels\[0\].path: level local keeps up to 3 checkpoints"):
        check_free_space(config, 1, free_bytes=10 * each)
    monkeypatch.setenv(FREE_BYTES_VARIABLE, str(3 * each))
    with pytest.raises(ConfigError, match="storage.root: the run needs"):
        check_free_space(config, 1, free_bytes=2 * each - 1)


def test_a_level_on_s3_receives_flushes_and_restores_after_a_node_failure(tmp_path, s3_server, s3_bucket):
    s3 = [f"storage.s3.bucket={s3_bucket}", f"storage.s3.endpoint_url={s3_server.endpoint_url}",
          "storage.s3.prefix=levels", "storage.s3.part_size=5MiB", "world.ranks_per_node=1",
          f"checkpoint.levels=[{{name:local,path:{tmp_path / 'local'},scope:node,keep_last:0}},"
          f"{{name:shared,path:/pfs,every:2,write:flush,backend:s3,keep_last:1}}]"]
    ctx = make_ctx(tmp_path, s3)
    engine = make_checkpoint_engine(ctx)
    for step in range(1, 6):
        engine.save(step, 1)
    engine.finish()
    assert [(f.step, f.committed) for f in engine.flushes] == [(2, True), (4, True)]
    listing = s3_server.client().list_objects_v2(Bucket=s3_bucket, Prefix="levels/")
    objects = {o["Key"]: o["Size"] for o in listing.get("Contents", [])}  # read by boto3, not the backend
    local = Path(engine.engines[0].root)
    expected = {f"levels/{ctx.run_id}/step_00000004/{p.relative_to(local / 'step_00000004')}": p.stat().st_size
                for p in (local / "step_00000004").rglob("*") if p.is_file()}
    assert objects == expected  # step 2 deleted by the level's keep_last=1, step 4 whole, manifest included
    engine.fail("node", 0)
    restored = engine.restore()
    assert (restored.level, restored.checkpoint_step, restored.verified) == ("shared", 4, True)


def test_a_failure_abandons_the_flush_in_flight_and_leaves_no_torn_copy(tmp_path, monkeypatch):
    import dlio_ckpt.checkpoint.levels as levels_module

    def slow_copy(*args, **kwargs):  # still copying when the failure strikes
        time.sleep(0.3)
        return copy_entries(*args, **kwargs)

    monkeypatch.setattr(levels_module, "copy_entries", slow_copy)
    ctx = make_ctx(tmp_path, [levels(tmp_path, local_keep=0, shared_keep=0), "world.ranks_per_node=1"])
    engine = make_checkpoint_engine(ctx)
    for step in range(1, 5):
        engine.save(step, 1)  # the flush of 2 commits at save 4 (it waits for it), that of 4 is in flight
    engine.fail("node", 0)
    assert [(f.step, f.committed) for f in engine.flushes] == [(2, True), (4, False)]
    assert engine.flushes[1].error == "abandoned: node failure"
    assert steps_in(engine.engines[1].root) == [2] and not os.path.exists(Path(engine.engines[1].root) / "step_00000004")
    restored = engine.restore()
    assert (restored.level, restored.checkpoint_step) == ("shared", 2)


def test_after_a_restart_checkpoints_are_numbered_on_from_the_restored_one(tmp_path):
    """SCR's numbering: the redone checkpoints go to the levels they went to the first time, also
    in a relaunched process (the number is in the manifest's resume point)."""
    ctx = make_ctx(tmp_path, [levels(tmp_path, local_keep=0, shared_keep=0, every=3), "world.ranks_per_node=1"])
    engine = make_checkpoint_engine(ctx)
    for step in range(1, 6):
        engine.save(step, 1, resume={"step": step})
    engine.finish()
    engine.fail("node", 0)
    assert engine.restore().checkpoint_step == 3  # checkpoint 3, from the shared level
    for step in (4, 5, 6, 7):
        engine.save(step, 1, resume={"step": step})
    engine.finish()
    assert [f.step for f in engine.flushes if f.committed] == [3, 6]  # 4, 5, 6 are numbers 4, 5, 6 again
    relaunched = make_checkpoint_engine(ctx)  # a new process of the same run (failures.restart=exit)
    assert relaunched.restore().checkpoint_step == 7
    for step in (8, 9, 10):
        relaunched.save(step, 1, resume={"step": step})
    relaunched.finish()
    assert [f.step for f in relaunched.flushes] == [9]  # numbers 8, 9 and 10
    relaunched.fail("node", 0)
    for name in os.listdir(relaunched.engines[1].root):  # the shared level lost too
        relaunched.engines[1].storage.remove_tree(os.path.join(relaunched.engines[1].root, name))
    assert relaunched.restore(warn_if_none=False).checkpoint_step == -1  # nothing left: numbered from 1 again
    for step in (1, 2, 3):
        relaunched.save(step, 1)
    relaunched.finish()
    assert [f.step for f in relaunched.flushes] == [9, 3]
