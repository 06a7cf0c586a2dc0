"""Bad input: one line naming the key or file, exit 2, nothing written (no run folder, no data).

Most cases call the loader's whole check (`validate_command_line`, what the CLI runs before it
creates anything) directly, which takes well under a second each; a handful go through the real
command to prove the exit code, the single stderr line and the empty folders.
"""

from __future__ import annotations

import os
import subprocess
from collections import namedtuple
from pathlib import Path

import pytest

from cli_fork import run_main_forked
from conftest import cli_env, run_cli
from dlio_ckpt.config import limits
from dlio_ckpt.config.load import validate_command_line
from dlio_ckpt.errors import ConfigError

TINY = ["scale=tiny", "progress=false"]
REAL_LOGS = Path(__file__).resolve().parents[2] / "shared" / "data" / "darshan" / "dlio_logs"


def dxt_log(folder: Path) -> Path:
    """A complete Darshan log with DXT_POSIX traces, written by our own writer."""
    pytest.importorskip("darshan")
    from test_replay import job
    from trace_events import two_rank_job

    from dlio_ckpt.trace.darshan_writer import write_darshan_log

    return write_darshan_log(folder / "job.darshan", two_rank_job(folder / "fs"), job(2))


def truncated_copy(log: Path, target: Path) -> Path:
    data = log.read_bytes()
    target.write_bytes(data[: len(data) * 2 // 3])
    return target


def refuse(overrides: list[str], expected: str, world_size: int = 1) -> str:
    with pytest.raises(ConfigError) as error:
        validate_command_line(overrides, multirun=False, world_size=world_size)
    message = str(error.value)
    assert expected in message and "\n" not in message
    return message


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["workload=unet3d", "checkpoint.format=tensorflow", "checkpoint.layout=raw"],
         "checkpoint.layout: checkpoint.format=tensorflow writes tensorflow files"),
        (["workload=unet3d", "model.parallelism.tensor=3"], "model.parallelism: tensor x pipeline = 3x1 = 3 does not divide"),
        (["workload=llama3_8b", "model.parallelism.tensor=3"], "model.parallelism.tensor: 3 does not divide model.num_attention_heads"),
        (["workload=resnet", "checkpoint.enabled=true"], "checkpoint.enabled: workload resnet has no model"),
        (["mode=plan", "world.size=10000000"], "world.size: at most 131,072 ranks"),
        (["workload=llama3_8b", "mode=plan", "model.parallelism.data=10000000"], "model.parallelism.data"),
        (["dataset.record_length_bytes=1e400B"], "dataset.record_length_bytes: '1e400B' is not a finite size"),
        (["dataset.record_length_bytes=1e30"], "dataset.record_length_bytes: "),
        (["dataset.seed=-1", "dataset.record_length_bytes_stdev=100"], "dataset.seed: a seed is an integer from 0"),
        (["reader.shuffle_seed=-5"], "reader.shuffle_seed: a seed"),
        (["dataset.format=hdf5", "dataset.compression=gzip", "dataset.compression_level=99"],
         "dataset.compression_level: gzip levels are 0 (none) to 9"),
        (["dataset.format=npz", "dataset.compression=gzip", "dataset.compression_level=-1"], "dataset.compression_level"),
        (["dataset.num_files_train=10000000000"], "dataset.num_files_train: 10,000,000,000 files need about"),
        (["dataset.file_prefix=../../x"], "dataset.file_prefix: '../../x' holds a path separator"),
        (["workload=unet3d", "checkpoint.folder=../../y"], "checkpoint.folder: '../../y' resolves to"),
        (["dataset.folder=/tmp/elsewhere"], "storage.allow_outside_root_dataset=true"),
        (["dataset.folder=../outside"], "dataset.folder: '../outside' resolves to"),
        (["workload=unet3d", "evaluation.enabled=true", "dataset.num_files_eval=2", "reader.batch_size_eval=3"],
         "evaluation.enabled: train.step_counting=dlio evaluates floor(2 samples / batch 3 / 1 rank) = 0 steps"),
    ],
)
def test_loader_refuses_before_anything_is_written(tmp_path, overrides, expected):
    root = tmp_path / "store"
    refuse(TINY + overrides + [f"storage.root={root}"], expected)
    assert not root.exists()


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("generate.pool_bytes", "100GiB", "generate.pool_bytes: 100.0 GiB per rank needs 300.0 GiB"),
        ("checkpoint.staging_buffer_bytes", "100GiB", "checkpoint.staging_buffer_bytes: 100.0 GiB x checkpoint.max_in_flight 1"),
    ],
)
def test_buffers_larger_than_memory_are_refused_with_the_limit(tmp_path, monkeypatch, key, value, expected):
    memory = namedtuple("Memory", "total")(64 << 30)  # a 64 GiB machine, whatever this one has
    monkeypatch.setattr(limits.psutil, "virtual_memory", lambda: memory)
    message = refuse(["workload=llama3_8b", *TINY, "checkpoint.strategy=async", f"{key}={value}",
                      f"storage.root={tmp_path / 'store'}"], expected)
    assert "half of this machine's 64.0 GiB of memory (32.0 GiB)" in message
    # the same sizes fit a machine ten times larger
    monkeypatch.setattr(limits.psutil, "virtual_memory", lambda: namedtuple("Memory", "total")(1 << 40))
    validate_command_line(["workload=llama3_8b", *TINY, "checkpoint.strategy=async", f"{key}={value}",
                           f"storage.root={tmp_path / 'store'}"], multirun=False)
    assert not (tmp_path / "store").exists()


def test_ranks_on_a_node_share_its_memory(monkeypatch):
    monkeypatch.setenv("MPI_LOCALNRANKS", "4")
    assert limits.local_ranks(8) == 4
    assert limits.local_ranks(2) == 2  # never more than the world
    monkeypatch.delenv("MPI_LOCALNRANKS")
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    assert limits.local_ranks(8) == 1


@pytest.mark.parametrize("key", ["storage.root", "dataset.folder", "checkpoint.folder"])
def test_a_file_where_a_folder_must_go_is_refused(tmp_path, key):
    blocker = tmp_path / "root" / "afile"
    blocker.parent.mkdir()
    blocker.write_bytes(b"x")
    root = blocker if key == "storage.root" else blocker.parent
    overrides = ["workload=unet3d", f"storage.root={root}", "storage.allow_outside_root_dataset=true"]
    if key != "storage.root":
        overrides.append(f"{key}={blocker if key == 'dataset.folder' else 'afile/ckpt'}")
    refuse(overrides, f"{key}: ")  # storage.root: the POSIX backend's check; the folders below it: the path check
    assert blocker.read_bytes() == b"x"


def test_symlink_out_of_the_root_is_outside(tmp_path):
    root, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    (root / "data").mkdir(parents=True)
    elsewhere.mkdir()
    os.symlink(elsewhere, root / "data" / "unet3d")
    os.symlink(elsewhere, root / "ckpt")
    refuse(["workload=unet3d", *TINY, f"storage.root={root}"], f"resolves to {elsewhere}, outside storage.root")
    refuse(["workload=unet3d", *TINY, f"storage.root={root}", "dataset.folder=x", "checkpoint.folder=ckpt/run"],
           "checkpoint.folder: 'ckpt/run' resolves to")
    # the documented key lets the dataset (only) live elsewhere
    validate_command_line(["workload=unet3d", *TINY, f"storage.root={root}", "storage.allow_outside_root_dataset=true"],
                          multirun=False)
    assert sorted(p.name for p in root.iterdir()) == ["ckpt", "data"] and list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("case", ["missing", "empty", "garbage", "truncated", "no_dxt"])
def test_replay_log_is_checked_in_the_loader(tmp_path, case):
    pytest.importorskip("darshan")
    log = tmp_path / f"{case}.darshan"
    if case == "empty":
        log.write_bytes(b"")
    elif case == "garbage":
        log.write_bytes(os.urandom(4096))
    elif case == "truncated":
        truncated_copy(dxt_log(tmp_path), log)
    elif case == "no_dxt":
        from test_replay import job
        from trace_events import two_rank_job

        from dlio_ckpt.trace.darshan_writer import build_log_contents, encode_log

        contents = build_log_contents(two_rank_job(tmp_path / "fs"), job(2))
        contents.dxt.clear()
        contents.posix.clear()  # POSIX counters alone replay approximately (tests/test_replay_approx.py)
        log.write_bytes(encode_log(contents, job(2)))
    expected = {"missing": "no such file", "empty": "is empty (0 bytes)", "garbage": "is not a Darshan log",
                "truncated": "is truncated", "no_dxt": "has neither DXT_POSIX traces nor POSIX counters"}[case]
    message = refuse(["workload=replay", f"replay.log={log}", f"storage.root={tmp_path / 'store'}"], expected)
    assert message.startswith("replay.log:")
    assert not (tmp_path / "store").exists()


def test_a_complete_replay_log_passes_the_loader(tmp_path):
    validate_command_line(["workload=replay", f"replay.log={dxt_log(tmp_path)}", f"storage.root={tmp_path / 'store'}"],
                          multirun=False)


def test_a_sweep_checks_every_job_beyond_the_old_256(tmp_path):
    # 261 jobs, the bad one last: the check used to stop after 256 and let the sweep start
    with pytest.raises(ConfigError, match="reader.batch_size: must be at least 1"):
        validate_command_line([*TINY, f"storage.root={tmp_path / 'store'}", "dataset.format=raw",
                               "reader.batch_size=range(260,-1,-1)", "dataset.num_files_train=300"], multirun=True)


# -- through the real command: exit 2, one stderr line, nothing in the working folder or the root --


def assert_refused(done: subprocess.CompletedProcess, workdir: Path, expected: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("dlio_ckpt: error:") and expected in lines[0], lines
    assert list((workdir / "cwd").iterdir()) == [] and not (workdir / "store").exists()


@pytest.mark.parametrize(
    "args,expected",
    [
        (["workload=unet3d", *TINY, "checkpoint.format=tensorflow", "checkpoint.layout=raw"], "checkpoint.layout"),
        (["mode=plan", "world.size=10000000"], "world.size"),
        ([*TINY, "dataset.record_length_bytes=1e400B"], "dataset.record_length_bytes"),
        ([*TINY, "hydra.run.dir="], "hydra.run.dir: is empty"),
        (["--cfg", "job", "reader.batch_sise=3"], "did you mean 'reader.batch_size'"),
        (["--cfg", "job", "workload=nope"], "workload: unknown workload 'nope'"),
    ],
)
def test_command_refuses_in_one_line_with_exit_2(workdir, args, expected):
    assert_refused(run_cli([*args, f"storage.root={workdir / 'store'}"], workdir / "cwd"), workdir, expected)


def test_command_keeps_libdarshan_quiet_on_a_truncated_replay_log(workdir):
    log = truncated_copy(dxt_log(workdir), workdir / "cut.darshan")
    done = run_cli(["workload=replay", f"replay.log={log}", f"storage.root={workdir / 'store'}"], workdir / "cwd")
    assert_refused(done, workdir, "is truncated")
    assert "Error:" not in done.stderr


def test_cfg_job_still_prints_a_good_config(workdir):
    done = run_cli(["--cfg", "job", "workload=unet3d", "reader.batch_size=3"], workdir / "cwd")
    assert done.returncode == 0 and "batch_size: 3" in done.stdout


def analyze(log: Path, cwd: Path) -> subprocess.CompletedProcess:
    """dlio_ckpt-analyze LOG, forked from the tests' analysis server (cli_fork.py): ~2 s of CPU less than a fresh interpreter."""
    return run_main_forked("dlio_ckpt-analyze", [str(log)], cwd, cli_env(), timeout=120)


@pytest.mark.parametrize("source", ["ours", "shared"])
def test_analyze_refuses_a_truncated_log(workdir, source):
    pytest.importorskip("darshan")
    if source == "shared":
        logs = sorted(REAL_LOGS.glob("*.darshan")) if REAL_LOGS.is_dir() else []
        if not logs:
            pytest.skip("the shared Darshan logs are not here")
        original = logs[0]
    else:
        original = dxt_log(workdir)
    (workdir / "whole").mkdir()
    whole = analyze(original, workdir / "whole")
    assert whole.returncode == 0, whole.stderr
    done = analyze(truncated_copy(original, workdir / "cut.darshan"), workdir / "cwd")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "cut.darshan" in lines[0] and "truncated" in lines[0], done.stderr
    assert "Error:" not in done.stderr and done.stdout == "" and list((workdir / "cwd").iterdir()) == []


@pytest.mark.mpi
def test_under_mpi_the_ranks_of_a_node_share_its_memory(workdir):
    # 3 x pool fits half the memory for one rank, not for the two that mpirun puts on this node
    pool = int(limits.psutil.virtual_memory().total * limits.MEMORY_SHARE / 4)
    done = run_cli([*TINY, f"generate.pool_bytes={pool}", f"storage.root={workdir / 'store'}"], workdir / "cwd", mpi_ranks=2)
    assert_refused(done, workdir, "generate.pool_bytes")
    assert "with 2 ranks on this node" in done.stderr
