"""Preparing a real darshan-runtime run: which variables are set, where the log goes, and when not."""

from __future__ import annotations

from pathlib import Path

import pytest

darshan = pytest.importorskip("darshan")

from dlio_ckpt.trace.darshan_writer import JobInfo  # noqa: E402
from dlio_ckpt.trace.outputs import write_trace_outputs  # noqa: E402
from dlio_ckpt.trace.runtime import (  # noqa: E402
    JOBID_VARIABLE,
    finalize_darshan_runtime,
    prepare_darshan_runtime,
    preloaded_darshan,
)
from trace_events import JOB_START, two_rank_job  # noqa: E402

LIB = "/opt/darshan/lib/libdarshan.so"


def test_not_preloaded_means_no_runtime(tmp_path: Path):
    env = {"LD_PRELOAD": "/usr/lib/libfoo.so"}
    assert preloaded_darshan(env) is None
    assert prepare_darshan_runtime(env, tmp_path, 4, "job") is None
    assert env == {"LD_PRELOAD": "/usr/lib/libfoo.so"}  # nothing touched
    assert preloaded_darshan({"LD_PRELOAD": f"/lib/libfoo.so:{LIB}"}) == LIB
    assert prepare_darshan_runtime({"LD_PRELOAD": LIB, "DARSHAN_DISABLE": "1"}, tmp_path, 1, "job") is None


def test_mpi_run_gets_one_log_per_job_with_dxt(tmp_path: Path):
    env = {"LD_PRELOAD": LIB, "PMI_RANK": "0", "SLURM_JOB_ID": "777"}
    info = prepare_darshan_runtime(env, tmp_path, 8, "2024-01-01_12-00-00", rank=0)
    assert info is not None and info.captures and info.replaces_own_log and info.mode == "mpi"
    assert env["DARSHAN_MOD_ENABLE"] == "DXT_POSIX"
    assert env["DARSHAN_LOGFILE"] == str(tmp_path.resolve() / "darshan" / "2024-01-01_12-00-00.darshan")
    assert env["DARSHAN_JOBID"] == "SLURM_JOB_ID"
    assert "DARSHAN_ENABLE_NONMPI" not in env  # MPI mode: the ranks' I/O is reduced into one log
    assert (tmp_path / "darshan").is_dir()
    assert str(info.logfile) in info.message and "does not write its own" in info.message


def test_user_module_list_is_kept_and_job_id_invented_without_scheduler(tmp_path: Path):
    env = {"LD_PRELOAD": LIB, "DLIO_CKPT_MPI": "1", "DARSHAN_MOD_ENABLE": "DXT_MPIIO"}
    prepare_darshan_runtime(env, tmp_path, 2, "run-a")
    assert env["DARSHAN_MOD_ENABLE"] == "DXT_MPIIO,DXT_POSIX"
    assert env["DARSHAN_JOBID"] == JOBID_VARIABLE and env[JOBID_VARIABLE].isdigit()
    assert int(env[JOBID_VARIABLE]) < 2**31
    env2 = {"LD_PRELOAD": LIB, "DLIO_CKPT_MPI": "1", "DARSHAN_JOBID": "MY_ID"}
    prepare_darshan_runtime(env2, tmp_path, 2, "run-a")
    assert env2["DARSHAN_JOBID"] == "MY_ID" and JOBID_VARIABLE not in env2


def test_serial_run_needs_nonmpi_at_launch(tmp_path: Path):
    env = {"LD_PRELOAD": LIB}
    info = prepare_darshan_runtime(env, tmp_path, 1, "run-b", pid=4321)
    assert info is not None and not info.captures and not info.replaces_own_log
    assert env["DARSHAN_ENABLE_NONMPI"] == "1"  # for processes started from here on
    assert "DARSHAN_ENABLE_NONMPI=1" in info.message
    launched = {"LD_PRELOAD": LIB, "DARSHAN_ENABLE_NONMPI": "1", "DARSHAN_MOD_ENABLE": "DXT_POSIX"}
    info = prepare_darshan_runtime(launched, tmp_path, 1, "run-b", pid=4321)
    assert info.captures and info.mode == "nonmpi"
    assert launched["DARSHAN_LOGFILE"].endswith("darshan/run-b-rank0-pid4321.darshan")
    assert "DXT tracing needs" not in info.message


def test_worker_processes_get_dated_folders_and_the_main_log_is_set_at_finalize(tmp_path: Path):
    env = {"LD_PRELOAD": LIB, "OMPI_COMM_WORLD_SIZE": "2"}
    info = prepare_darshan_runtime(env, tmp_path, 2, "run-c", worker_processes=True)
    assert env["DARSHAN_ENABLE_NONMPI"] == "1"
    assert "DARSHAN_LOGFILE" not in env  # inherited by every worker, it would make them share one path
    workers = Path(env["DARSHAN_LOGPATH"])
    assert len([p for p in workers.glob("*/*/*") if p.is_dir()]) >= 1
    finalize_darshan_runtime(env, info)
    assert env["DARSHAN_LOGFILE"] == str(info.logfile)


def test_outputs_skip_own_log_when_runtime_records(tmp_path: Path):
    ranks = two_rank_job(tmp_path / "fs")
    job = JobInfo(nprocs=2, jobid=1, uid=0, start_wall=JOB_START, end_wall=JOB_START + 1, exe="python3 x")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    info = prepare_darshan_runtime({"LD_PRELOAD": LIB, "PMI_RANK": "0"}, run_dir, 2, "job")
    written = write_trace_outputs(run_dir, ranks, job, darshan=True, chrome=True, runtime=info)
    assert written == {"darshan_runtime": "darshan/job.darshan", "chrome": "trace.chrome.json"}
    assert not list(run_dir.glob("*.darshan"))
    written = write_trace_outputs(run_dir, ranks, job, darshan=True, chrome=False)
    assert written["darshan"].endswith(".darshan") and (run_dir / written["darshan"]).is_file()
    report = darshan.DarshanReport(str(run_dir / written["darshan"]), read_all=False)
    assert report.metadata["job"]["nprocs"] == 2
