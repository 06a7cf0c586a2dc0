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
import sys
import time
from types import SimpleNamespace

import pytest
from ckpt_util import make_ctx
from conftest import BIN, cli_env
from syscall_order import check_commits, record_calls, strace_calls

from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME
from dlio_ckpt.engine.ownership import OWNER_MARKER

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


def _generated_with_calls(tmp_path, monkeypatch, *extra):
    from dlio_ckpt.engine.generate import ensure_dataset
    from dlio_ckpt.formats import get_format
    from dlio_ckpt.plan.dataset import plan_dataset

    ctx = make_ctx(tmp_path, ["workload=unet3d", "scale=tiny", "dataset.num_subfolders_train=2", *extra])
    fmt = get_format(ctx.config.dataset.format)
    plan = plan_dataset(ctx.config, fmt.extension)
    calls = record_calls(monkeypatch)
    ensure_dataset(ctx, plan, fmt)
    monkeypatch.undo()
    return plan, fmt, without_owner_marker(calls)


def without_owner_marker(calls: list[tuple]) -> list[tuple]:
    """The calls less the run's ownership marker (engine/ownership.py: the project's own file,
    written atomically when the run takes the folder, before any dataset file): its temporary
    file's create and fsync, its rename, and the folder fsync that follows the rename."""
    kept, after_rename = [], False
    for call in calls:
        name = os.path.basename(call[2] if call[0] == "rename" else call[1])
        if OWNER_MARKER in name:
            after_rename = call[0] == "rename"
            continue
        if after_rename and call[0] == "fsync" and call[2]:
            after_rename = False
            continue
        after_rename = False
        kept.append(call)
    return kept


def test_dataset_generation_commits_once_every_file_and_folder_entry_synced_before_its_manifest(tmp_path, monkeypatch):
    """The dataset's commit protocol: each file created under its final name (no temporary name,
    no rename), its data fsynced; then each folder fsynced once (the files' folders and every
    folder above them up to storage.root), after the last file's fsync; the manifest last."""
    plan, fmt, calls = _generated_with_calls(tmp_path, monkeypatch)
    (commit,) = check_commits(calls, str(tmp_path))
    assert commit.problems == [], commit.problems
    files = {os.path.realpath(spec.path + suffix) for spec in plan.files for suffix in ("",) + fmt.companion_suffixes}
    assert commit.files == len(files) == len(plan.files)
    manifest_at = next(i for i, c in enumerate(calls) if c[0] == "rename" and c[2] == commit.manifest)
    before = calls[:manifest_at]
    # under their names: no dataset file was renamed into place, each was created once at its name
    assert [c for c in before if c[0] == "rename"] == []
    assert sorted(c[1] for c in before if c[0] == "create" and c[1] in files) == sorted(files)
    file_syncs = [i for i, c in enumerate(before) if c[0] == "fsync" and not c[2] and c[1] in files]
    assert len(file_syncs) == len(files)
    # each folder once, all after the last file's fsync: the two subfolders, train/, the
    # fingerprint folder, data/<workload>/, data/, and storage.root itself
    folder_syncs = [c[1] for c in before[file_syncs[-1]:] if c[0] == "fsync" and c[2]]
    subfolders = {os.path.dirname(f) for f in files}
    assert len(subfolders) == 2
    expected = set(subfolders)
    folder = os.path.dirname(next(iter(subfolders)))
    while folder != os.path.dirname(os.path.realpath(str(tmp_path))):
        expected.add(folder)
        folder = os.path.dirname(folder)
    assert sorted(folder_syncs) == sorted(expected)  # each exactly once
    assert not [c for c in before[: file_syncs[-1]] if c[0] == "fsync" and c[2]]  # none while files were written


def test_regenerating_removes_the_manifest_durably_before_overwriting_files(tmp_path, monkeypatch):
    """generate.force=true over a committed dataset: the old manifest is removed and its folder
    fsynced before the first file is opened again, so a power loss mid-regeneration cannot leave
    the old manifest trusting files already overwritten in place."""
    plan, _, _ = _generated_with_calls(tmp_path, monkeypatch)
    _, _, calls = _generated_with_calls(tmp_path, monkeypatch, "generate.force=true")
    manifest_folder = os.path.realpath(plan.folder)
    first_sync = next(i for i, c in enumerate(calls) if c[0] == "fsync" and c[2] and c[1] == manifest_folder)
    first_file = next(i for i, c in enumerate(calls) if c[0] == "fsync" and not c[2])
    assert first_sync < first_file
    (commit,) = check_commits(calls, str(tmp_path))
    assert commit.problems == [] and commit.files == len(plan.files)


def test_a_run_that_finds_another_hosts_claim_stages_its_files(tmp_path, monkeypatch):
    """Two runs generating one dataset at once: the second must not truncate files the first may
    have committed. A claim from another host cannot be judged from here: every file goes through a
    temporary name and a rename; the claim (not ours) stays; each file and folder is still synced first."""
    from dlio_ckpt.engine.dataset_claim import CLAIM_NAME
    from dlio_ckpt.plan.dataset import plan_dataset

    ctx = make_ctx(tmp_path, ["workload=unet3d", "scale=tiny", "dataset.num_subfolders_train=2"])
    folder = plan_dataset(ctx.config, "npz").folder
    os.makedirs(folder)
    claim = os.path.join(folder, CLAIM_NAME)
    with open(claim, "w") as handle:
        handle.write("another-host 1")
    plan, fmt, calls = _generated_with_calls(tmp_path, monkeypatch)
    (commit,) = check_commits(calls, str(tmp_path))
    assert commit.problems == [] and commit.files == len(plan.files)
    renamed = {c[2] for c in calls if c[0] == "rename" and c[2] != commit.manifest}
    assert renamed == {os.path.realpath(spec.path) for spec in plan.files}
    assert os.path.exists(claim)


def test_a_run_that_finds_a_live_generator_of_this_host_waits_for_it(tmp_path, monkeypatch, capsys):
    """A live process of this host holds the claim (it is writing the dataset in place): the run
    waits, saying so, and once the claim is released without a commit it claims the dataset and
    writes every file in place itself (no renames), the claim released after its commit."""
    import socket

    from dlio_ckpt.engine.dataset_claim import CLAIM_NAME
    from dlio_ckpt.plan.dataset import plan_dataset

    from dlio_ckpt.engine import dataset_claim

    ctx = make_ctx(tmp_path, ["workload=unet3d", "scale=tiny", "dataset.num_subfolders_train=2"])
    folder = plan_dataset(ctx.config, "npz").folder
    os.makedirs(folder)
    claim = os.path.join(folder, CLAIM_NAME)
    # The holder lives until the run has seen its claim and begun to wait (its first poll), however
    # slowly the run starts: a holder on a timer could end first on a loaded machine.
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    polls = []

    def poll(seconds):
        polls.append(seconds)
        if not holder.stdin.closed:
            holder.stdin.close()
            holder.wait()  # exited and reaped; the claim it held stays on disk, not released
        time.sleep(seconds)

    monkeypatch.setattr(dataset_claim, "time", SimpleNamespace(sleep=poll))
    with open(claim, "w") as handle:
        handle.write(f"{socket.gethostname()} {holder.pid}")
    try:
        plan, fmt, calls = _generated_with_calls(tmp_path, monkeypatch)
    finally:
        holder.kill()
        holder.wait()
    assert polls  # it waited
    assert f"process {holder.pid} is generating this dataset" in capsys.readouterr().out
    (commit,) = check_commits(calls, str(tmp_path))
    assert commit.problems == [] and commit.files == len(plan.files)
    assert [c for c in calls if c[0] == "rename" and c[2] != commit.manifest] == []  # in place
    assert not os.path.exists(claim)


def test_a_claim_of_a_process_that_is_gone_is_taken_over(tmp_path):
    import socket

    from dlio_ckpt.engine.dataset_claim import claim_dataset, claim_path
    from dlio_ckpt.plan.dataset import plan_dataset
    from dlio_ckpt.storage.posix import PosixStorage

    ctx = make_ctx(tmp_path, ["workload=unet3d", "scale=tiny"])
    plan = plan_dataset(ctx.config, "npz")
    os.makedirs(plan.folder)
    gone = subprocess.Popen(["true"])
    gone.wait()
    with open(claim_path(plan), "w") as handle:
        handle.write(f"{socket.gethostname()} {gone.pid}")
    assert claim_dataset(PosixStorage(), plan)
    with open(claim_path(plan)) as handle:
        assert handle.read() == f"{socket.gethostname()} {os.getpid()}"
    assert not claim_dataset(PosixStorage(), plan)  # now held by this live process
    with open(claim_path(plan), "w") as handle:
        handle.write(f"another-host {gone.pid}")  # another host's: cannot tell, so stage
    assert not claim_dataset(PosixStorage(), plan)


def test_a_crash_mid_generation_leaves_no_trusted_dataset(workdir):
    """SIGKILL inside the write of rank 0's first file (DLIO_CKPT_FAULT=generate-write@0:kill):
    that file is on disk under its name, half-done, and there is no manifest; a run that may not
    generate refuses the folder (exit 2), and the next run takes over the dead run's claim and
    regenerates every file."""
    from dlio_ckpt.faults import VARIABLE
    from dlio_ckpt.plan.dataset import MANIFEST_NAME as DATASET_MANIFEST

    store = workdir / "store"
    base = [str(BIN / "dlio_ckpt"), "workload=unet3d", "scale=tiny", "mode=generate", "progress=false",
            "dataset.num_files_train=4", "dataset.num_files_eval=0", "dataset.format=npy", f"storage.root={store}"]

    def run(*extra, fault=""):
        env = cli_env()
        if fault:
            env[VARIABLE] = fault
        return subprocess.run(base + [f"hydra.run.dir={workdir / f'run-{len(list(workdir.iterdir()))}'}", *extra],
                              cwd=workdir / "cwd", env=env, capture_output=True, text=True, timeout=120)

    crashed = run(fault="generate-write@0:kill")
    assert crashed.returncode in (-9, 137), crashed.stderr[-2000:]
    on_disk = sorted(p.name for p in store.rglob("*") if p.is_file())
    # the first file, under its final name, and the dead run's claim; no manifest (beside the
    # run's ownership marker, engine/ownership.py)
    on_disk = [name for name in on_disk if name != OWNER_MARKER]
    assert [os.path.splitext(name)[1] for name in on_disk] == ["", ".npy"] and on_disk[0] == ".dlio_ckpt_generating"
    assert not list(store.rglob(DATASET_MANIFEST))
    refused = run("generate.enabled=false")
    assert refused.returncode == 2 and "no matching dataset" in refused.stderr
    done = run()
    assert done.returncode == 0, done.stderr[-2000:]
    (manifest,) = store.rglob(DATASET_MANIFEST)
    assert not list(store.rglob(".dlio_ckpt_generating"))  # the crashed run's claim taken over, then released
    import json

    import numpy as np

    sizes = json.loads(manifest.read_text())["sizes"]
    assert len(sizes) == 4
    for relative, size in sizes.items():
        path = manifest.parent / relative
        assert path.stat().st_size == size
        np.load(path)  # every file whole: numpy reads it back


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
