"""Power-loss durability of every commit (storage/durable.py, docs/checkpointing.md "Atomic commit").

The calls the commit makes are recorded as the kernel got them (tests/syscall_order.py: os.open,
os.mkdir, os.replace and os.fsync wrapped in this process, an fsync's path read from /proc) and
checked per layout, format, strategy, encoding, level and for dataset generation: before the
manifest's rename every listed file's data and every folder entry it depends on (the file's name
in its folder, each new folder's name in its parent up to storage.root) were fsynced, the manifest
itself too, and its folder after the rename. One run of the command line is checked the same way
from `strace -f` (skipped where strace is not installed).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from ckpt_util import make_ctx
from conftest import BIN, cli_env
from syscall_order import check_commits, record_calls, strace_calls

from dlio_ckpt.checkpoint import make_checkpoint_engine
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME

KEEP_ALL = ["checkpoint.keep_last=0"]
SPARSE = ["checkpoint.update=sparse", "checkpoint.update_fraction=0.01", "checkpoint.update_chunk_bytes=64KiB"]
LOSSY = ["checkpoint.update=sgd", "checkpoint.encoding=lossy", "model.model_size_bytes=0",
         "model.layer_parameters=[262144,262144]"]

CASES = {
    "raw-raw": ["checkpoint.layout=raw", "checkpoint.format=raw"],
    "raw-npy": ["checkpoint.layout=raw", "checkpoint.format=npy"],
    "raw-npz": ["checkpoint.layout=raw", "checkpoint.format=npz"],
    "raw-hdf5": ["checkpoint.layout=raw", "checkpoint.format=hdf5"],
    "deepspeed-torch": ["checkpoint.layout=deepspeed", "checkpoint.format=torch"],
    "pytorch_dcp-torch": ["checkpoint.layout=pytorch_dcp", "checkpoint.format=torch"],
    "megatron-torch": ["checkpoint.layout=megatron", "checkpoint.format=torch"],
    "megatron-raw-async": ["checkpoint.layout=megatron", "checkpoint.strategy=async"],
    "raw-single_writer": ["checkpoint.strategy=single_writer"],
    "tensorflow-tensorflow": ["checkpoint.layout=tensorflow", "checkpoint.format=tensorflow"],
    "incremental": SPARSE + ["checkpoint.encoding=incremental", "checkpoint.incremental.chunk_bytes=64KiB"],
    "lossy": LOSSY,
}


def _saved(tmp_path, overrides, steps=(1, 2)):
    ctx = make_ctx(tmp_path, KEEP_ALL + overrides)
    engine = make_checkpoint_engine(ctx)
    for step in steps:
        engine.save(step, 1)
    engine.finish()
    return ctx, engine


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_file_and_folder_entry_is_fsynced_before_the_manifest_and_its_folder_after(tmp_path, monkeypatch, case):
    if case.startswith("tensorflow"):
        pytest.importorskip("tensorflow")
    calls = record_calls(monkeypatch)
    _, engine = _saved(tmp_path, CASES[case])
    monkeypatch.undo()
    commits = check_commits(calls, str(tmp_path))
    assert [os.path.basename(os.path.dirname(c.manifest)) for c in commits] == \
        [engine.layout.folder(1), engine.layout.folder(2)]
    for commit in commits:
        assert commit.problems == [], commit.problems
        assert commit.files >= 1 and commit.folder_after
    # the first commit created the checkpoint root under storage.root: its entry and the step
    # folder's are synced, so at least the step folder, the root and its parent are
    assert commits[0].folders_before >= 3


def test_a_megatron_checkpoint_syncs_its_rank_folder_and_the_iteration_folder(tmp_path, monkeypatch):
    """The issue's case: iter_N/mp_rank_00/ was never fsynced. Exact folders of the second
    commit: the rank folder, the iteration folder, the checkpoint root, the folders above it."""
    calls = record_calls(monkeypatch)
    ctx, engine = _saved(tmp_path, ["checkpoint.layout=megatron"])
    monkeypatch.undo()
    second = check_commits(calls, str(tmp_path))[1]
    assert second.problems == []
    root = os.path.realpath(engine.root)
    folder = os.path.join(root, engine.layout.folder(2))
    start = next(i for i, c in enumerate(calls) if c[0] == "mkdir" and c[1] == folder)
    end = next(i for i, c in enumerate(calls) if c[0] == "rename" and c[2] == os.path.join(folder, MANIFEST_NAME))
    synced = [c[1] for c in calls[start:end] if c[0] == "fsync" and c[2]]
    above = []
    path = root
    while path != os.path.realpath(str(tmp_path)):
        above.append(path)
        path = os.path.dirname(path)
    expected = [os.path.join(folder, "mp_rank_00"), folder] + above + [os.path.realpath(str(tmp_path))]
    assert sorted(set(synced)) == sorted(expected)


def test_flushes_to_another_level_sync_their_folders_before_the_manifests(tmp_path, monkeypatch):
    levels = (f"checkpoint.levels=[{{name:local,path:{tmp_path / 'local'},scope:node,keep_last:0}},"
              f"{{name:shared,every:2,write:flush,keep_last:0}}]")
    calls = record_calls(monkeypatch)
    _, engine = _saved(tmp_path, ["checkpoint.layout=megatron", levels], steps=(1, 2, 3, 4))
    monkeypatch.undo()
    assert all(f.committed for f in engine.flushes)
    local = check_commits(calls, str(tmp_path / "local"))
    local = [c for c in local if c.manifest.startswith(os.path.realpath(str(tmp_path / "local")))]
    shared = [c for c in check_commits(calls, str(tmp_path)) if not c.manifest.startswith(os.path.realpath(str(tmp_path / "local")))]
    assert len(local) == 4 and len(shared) == 2  # steps 2 and 4 flushed
    for commit in local + shared:
        assert commit.problems == [], commit.problems


def test_dataset_generation_syncs_its_folders_before_its_manifest(tmp_path, monkeypatch):
    from dlio_ckpt.engine.generate import ensure_dataset
    from dlio_ckpt.formats import get_format
    from dlio_ckpt.plan.dataset import plan_dataset

    ctx = make_ctx(tmp_path, ["workload=unet3d", "scale=tiny", "dataset.num_subfolders_train=2"])
    fmt = get_format(ctx.config.dataset.format)
    plan = plan_dataset(ctx.config, fmt.extension)
    calls = record_calls(monkeypatch)
    ensure_dataset(ctx, plan, fmt)
    monkeypatch.undo()
    commits = check_commits(calls, str(tmp_path))
    assert len(commits) == 1 and commits[0].files == len(plan.files) * (1 + len(fmt.companion_suffixes))
    assert commits[0].problems == [], commits[0].problems


def test_checkpoint_fsync_false_syncs_no_folder(tmp_path, monkeypatch):
    """checkpoint.fsync=false measures writes without durability: the commit adds no folder
    fsync either (the manifest's own primitive still syncs it and its folder)."""
    calls = record_calls(monkeypatch)
    _saved(tmp_path, ["checkpoint.layout=megatron", "checkpoint.fsync=false"])
    monkeypatch.undo()
    commits = check_commits(calls, str(tmp_path))
    assert [c.folders_before for c in commits] == [0, 0]
    assert [c.file_fsyncs_before for c in commits] == [1, 1]  # the manifest's temporary file only
    assert all(c.folder_after for c in commits)


def test_a_run_under_strace_commits_durably(workdir, layout="megatron"):
    """The command line, every process traced by strace -f: the same checks from the kernel's side
    (benchmarks/commit_durability.py runs every layout, format, strategy and encoding so)."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (apt-get install -y strace)")
    store, log = workdir / "store", workdir / "strace.log"
    probe = subprocess.run([strace, "-f", "-o", os.devnull, "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.decode(errors='replace').strip()[:200]}")
    command = [strace, "-f", "-y", "-qq", "-o", str(log),
               "-e", "trace=open,openat,mkdir,mkdirat,rename,renameat,renameat2,fsync,fdatasync",
               str(BIN / "dlio_ckpt"), "workload=bert", "scale=tiny", "checkpoint.enabled=true", "checkpoint.keep_last=0",
               "checkpoint.durability=commit", f"checkpoint.layout={layout}", "train.epochs=1", "checkpoint.steps_between_checkpoints=2",
               "progress=false", f"storage.root={store}", f"hydra.run.dir={workdir / 'run'}"]
    done = subprocess.run(command, cwd=workdir, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    commits = check_commits(strace_calls(log.read_text(), str(workdir)), str(store))
    checkpoints = [c for c in commits if os.path.basename(c.manifest) == MANIFEST_NAME]
    assert len(checkpoints) >= 1 and len(commits) > len(checkpoints)  # the dataset's commit too
    for commit in commits:
        assert commit.problems == [], commit.problems
