"""Failures that must be loud and prompt: a failing rank or a full disk ends every rank with one
line per failing rank and exit 1, leaves no partial files of the failed checkpoint, and the
previous checkpoint stays restorable; Ctrl-C ends the job with exit 130 and one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ckpt_util import SMALL_MODEL, make_ctx
import rank_fork
from cli_fork import run_forked
from conftest import BIN, cli_env, run_cli
from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.errors import RunFailure
from dlio_ckpt.faults import VARIABLE
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME

# A hang is forever: this only turns one into a failure instead of a stuck suite.
HANG = 60
# ZeRO 3: every rank holds (and, but with single_writer, writes) a 3 MiB shard
CHECKPOINT_RUN = ["workload=unet3d", "scale=tiny", "mode=checkpoint", *SMALL_MODEL, "model.layer_parameters=[]",
                  "model.parallelism.zero_stage=3",
                  "checkpoint.num_checkpoints_write=3", "checkpoint.write_chunk_bytes=64KiB", "progress=false"]


def run_with_fault(workdir: Path, fault: str, extra: list[str], ranks: int = 2) -> subprocess.CompletedProcess:
    env = cli_env()
    env[VARIABLE] = fault
    command = [str(BIN / "dlio_ckpt"), *CHECKPOINT_RUN, *extra, f"storage.root={workdir / 'store'}",
               f"hydra.run.dir={workdir / 'run'}"]
    if not ranks:
        return run_forked(command, workdir / "cwd", env, HANG)
    command = rank_fork.command(ranks, command)  # each rank forked from the tests' server
    return subprocess.run(command, cwd=workdir / "cwd", env=env, capture_output=True, text=True, timeout=HANG)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("dlio_ckpt: error")]


def checkpoint_folders(workdir: Path) -> dict[str, bool]:
    """Checkpoint folder name -> committed (has a manifest), for the run's only checkpoint root."""
    (root,) = (workdir / "store" / "checkpoints").iterdir()
    return {p.name: (p / MANIFEST_NAME).exists() for p in root.iterdir() if p.is_dir()}


def assert_failed_cleanly(done: subprocess.CompletedProcess, workdir: Path, reason: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and reason in lines[0] and "step_00000002" in lines[0], done.stderr
    assert checkpoint_folders(workdir) == {"step_00000001": True}  # the failed one left nothing behind
    assert not (workdir / "run" / "summary.json").exists()


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", ["sharded", "single_writer", "async"])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_failing_mid_checkpoint_ends_the_job(workdir, strategy, rank):
    done = run_with_fault(workdir, f"checkpoint-step:2@{rank}", [f"checkpoint.strategy={strategy}"])
    assert_failed_cleanly(done, workdir, f"failure injected at checkpoint-step:2 on rank {rank}")
    if rank == 0:  # and a restart restores the newest complete checkpoint
        (root,) = (workdir / "store" / "checkpoints").iterdir()
        restored = run_cli([*CHECKPOINT_RUN, "mode=restore", f"checkpoint.restore_from={root}",
                            f"storage.root={workdir / 'store'}", f"hydra.run.dir={workdir / 'restore'}"], workdir / "cwd")
        assert restored.returncode == 0, restored.stderr
        summary = json.loads((workdir / "restore" / "summary.json").read_text())["checkpoint"]
        assert summary["restore_verified"] is True and summary["restore_step"] == 1 and not summary["restore_skipped"]


@pytest.mark.mpi
def test_single_writer_sender_failing_while_rank_0_still_receives(workdir):
    # rank 1 fails after its first chunk: rank 0 is waiting in a Recv for the rest
    done = run_with_fault(workdir, "checkpoint-write:2@1", ["checkpoint.strategy=single_writer"])
    assert_failed_cleanly(done, workdir, "rank 1 failed: failure injected at checkpoint-write:2 on rank 1")


@pytest.mark.mpi
@pytest.mark.parametrize("strategy,rank", [("sharded", 1), ("single_writer", 0), ("async", 0)])
def test_a_full_disk_mid_checkpoint_ends_the_job(workdir, strategy, rank):
    done = run_with_fault(workdir, f"checkpoint-write:2@{rank}:enospc", [f"checkpoint.strategy={strategy}"])
    assert_failed_cleanly(done, workdir, "No space left on device")
    (line,) = error_lines(done.stderr)
    assert f"rank_0000{rank}.bin: No space left on device (" in line and " MiB free on " in line


def test_a_full_disk_serially_names_the_file_and_leaves_no_partial_file(tmp_path, monkeypatch):
    ctx = make_ctx(tmp_path, ["checkpoint.write_chunk_bytes=64KiB"])
    engine = make_checkpoint_engine(ctx)
    engine.save(1, 1)
    monkeypatch.setenv(VARIABLE, "checkpoint-write:2@0:enospc")
    with pytest.raises(RunFailure) as failure:
        engine.save(2, 1)
    folder = Path(engine.root) / engine.layout.folder(2)
    message = str(failure.value)
    assert message.startswith("checkpoint step_00000002 not committed: ")
    assert f"{folder / 'rank_00000.bin'}: No space left on device (" in message and " MiB free on " in message
    assert failure.value.known_everywhere
    assert not folder.exists()
    monkeypatch.delenv(VARIABLE)
    restored = engine.restore()
    assert restored.verified and restored.checkpoint_step == 1 and not restored.skipped


def test_a_full_disk_serially_exits_1_with_one_line(workdir):
    done = run_with_fault(workdir, "checkpoint-write:2@0:enospc", ["checkpoint.strategy=sharded"], ranks=0)
    assert_failed_cleanly(done, workdir, "No space left on device")


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT's default action, as a terminal's job has it. A suite
    started in the background by a non-interactive shell (`.ci/run &`) inherits SIGINT ignored,
    and Python then never raises KeyboardInterrupt: the run would sleep through the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(workdir: Path, ranks: int) -> subprocess.CompletedProcess:
    """Start a run that checkpoints slowly, wait until its first checkpoint is on disk, then Ctrl-C
    (SIGINT to the whole process group, as a terminal does)."""
    command = [str(BIN / "dlio_ckpt"), *CHECKPOINT_RUN, "checkpoint.sleep_between_s=30", "checkpoint.num_checkpoints_write=2",
               f"storage.root={workdir / 'store'}", f"hydra.run.dir={workdir / 'run'}"]
    if ranks:
        command = [str(BIN / "mpirun"), "-n", str(ranks), *command]
    process = subprocess.Popen(command, cwd=workdir / "cwd", env=cli_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        deadline = time.monotonic() + HANG
        while not list((workdir / "store").glob("checkpoints/*/step_00000001/" + MANIFEST_NAME)):
            assert process.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=HANG)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.parametrize("ranks", [0, pytest.param(2, marks=pytest.mark.mpi)])
def test_ctrl_c_exits_130_with_one_line(workdir, ranks):
    done = _interrupt(workdir, ranks)
    assert done.returncode == 130
    # every stderr line: MPICH's own "Abort(130) on node 0 ..." line is one too many
    assert [line for line in done.stderr.splitlines() if line.strip()] == [
        f"dlio_ckpt: interrupted; the run in {workdir / 'run'} is incomplete"]


@pytest.mark.mpi
@pytest.mark.parametrize("rank", [0, 1])
def test_ctrl_c_at_start_up_seen_by_one_rank_ends_the_job(workdir, rank):
    # Ctrl-C while starting: the rank that sees it must end the job, not leave the other one
    # waiting forever in the collective that chooses the run folder
    done = run_with_fault(workdir, f"start@{rank}:interrupt", [])
    assert done.returncode == 130, done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == ["dlio_ckpt: interrupted"]
    assert not (workdir / "store").exists()


@pytest.mark.mpi
@pytest.mark.parametrize("refusing", [0, 1])
def test_ranks_that_disagree_on_the_input_check_all_stop(workdir, refusing):
    # ranks on other nodes can see other free space, memory or files: one rank refusing the run
    # alone must stop them all (exit 2, one line), not leave the others waiting in a collective
    args = [*CHECKPOINT_RUN, f"storage.root={workdir / 'store'}", f"hydra.run.dir={workdir / 'run'}"]
    ranks = [["-n", "1", str(BIN / "dlio_ckpt"), *args], ["-n", "1", str(BIN / "dlio_ckpt"), *args]]
    ranks[refusing][2:2] = ["-env", "DLIO_CKPT_FREE_BYTES", "1"]  # a small disk on that rank's node
    done = subprocess.run([str(BIN / "mpirun"), *ranks[0], ":", *ranks[1]], cwd=workdir / "cwd", env=cli_env(),
                          capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 2, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith("dlio_ckpt: error: storage.root: the run needs at least ")
    assert line.endswith(" (on rank 1)") == (refusing == 1)
    assert list((workdir / "cwd").iterdir()) == [] and not (workdir / "store").exists() and not (workdir / "run").exists()


@pytest.mark.mpi
def test_a_rank_failing_at_start_up_ends_the_job(workdir):
    # before the run task exists (the run-folder collective): one line, exit 1, no rank left waiting
    done = run_with_fault(workdir, "start@1", [])
    assert done.returncode == 1, done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == [
        "dlio_ckpt: error (rank 1): failure injected at start on rank 1 (DLIO_CKPT_FAULT)"]
    assert not (workdir / "store").exists()


def test_restore_of_an_empty_folder_fails_with_one_line(workdir):
    empty = workdir / "store" / "checkpoints" / "nothing-here"
    empty.mkdir(parents=True)
    done = run_cli(["workload=unet3d", "scale=tiny", "mode=restore", f"checkpoint.restore_from={empty}",
                    f"storage.root={workdir / 'store'}", f"hydra.run.dir={workdir / 'run'}"], workdir / "cwd", timeout=HANG)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert error_lines(done.stderr) == [f"dlio_ckpt: error: nothing restored: no checkpoint folders of layout "
                                        f"raw in {empty}"]
    assert not (workdir / "run" / "summary.json").exists()


@pytest.mark.parametrize("ranks", [0, pytest.param(2, marks=pytest.mark.mpi)])
def test_restore_of_only_rejected_checkpoints_fails_naming_each(workdir, ranks):
    ctx = make_ctx(workdir / "store")
    engine = make_checkpoint_engine(ctx)
    for step in (1, 2):
        engine.save(step, 1)
    root = Path(engine.root)
    (root / "step_00000002" / MANIFEST_NAME).unlink()  # torn
    with open(root / "step_00000001" / "rank_00000.bin", "r+b") as handle:
        handle.truncate(100)
    done = run_cli([*SMALL_MODEL, "mode=restore", f"checkpoint.restore_from={root}", f"storage.root={workdir / 'store'}",
                    f"hydra.run.dir={workdir / 'run'}"], workdir / "cwd", mpi_ranks=ranks, timeout=HANG)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = error_lines(done.stderr)
    assert line.startswith(f"dlio_ckpt: error{' (rank 0)' if ranks else ''}: nothing restored: no complete checkpoint "
                           f"to restore in {root}: ")
    assert "step_00000002: torn: no manifest" in line and "step_00000001: rank_00000.bin: size 100 bytes" in line
    assert not (workdir / "run" / "summary.json").exists()


def test_checkpoint_mode_with_nothing_to_write_is_refused_before_anything_is_written(workdir):
    done = run_cli(["workload=unet3d", "scale=tiny", "mode=checkpoint", "checkpoint.num_checkpoints_write=0",
                    f"storage.root={workdir / 'store'}", f"hydra.run.dir={workdir / 'run'}"], workdir / "cwd", timeout=HANG)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert error_lines(done.stderr) == ["dlio_ckpt: error: checkpoint.num_checkpoints_write: 0 with mode=checkpoint "
                                        "leaves nothing to do; set it to 1 or more"]
    assert not (workdir / "run").exists() and not (workdir / "store").exists()
