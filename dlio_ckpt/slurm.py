"""Sweeps on Slurm through Hydra's submitit launcher (conf/hydra/launcher/slurm.yaml).

`dlio_ckpt -m hydra/launcher=slurm ...` makes one Slurm job per configuration (a job array); each
job runs nodes x tasks_per_node dlio_ckpt ranks under srun. Two things are known before anything
is submitted and are used here: the world size every job will have (so the command line is
checked for it, not for the one process that submits), and the sbatch script itself, which
`--slurm-dry-run` prints instead of submitting (the launcher configures its executor exactly as for
a real sweep; only the submission is left out). Before a real submission, Slurm itself is asked
whether it would take that same script (`sbatch --test-only`, which submits nothing): a missing
Slurm, an unreachable controller, a partition that does not exist or jobs larger than the partition's
nodes are then one line and exit 2 instead of a traceback or a job that pends forever.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from dlio_ckpt.config.groups import conf_dir, register_workloads
from dlio_ckpt.errors import ConfigError

SLURM_LAUNCHER_TARGET = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
DRY_RUN_FLAG = "--slurm-dry-run"
# sbatch retries an unreachable controller for a while; a login node that cannot reach it in this
# time is misconfigured for our purpose.
TEST_ONLY_TIMEOUT_S = 30


@dataclass(frozen=True)
class Submission:
    """What one launch would hand to sbatch."""

    script: str  # the sbatch file's text
    jobs: int  # configurations in the array: one Slurm job each
    tasks_per_job: int  # srun tasks (dlio_ckpt ranks) per job


def launcher_requested(overrides: Sequence[str]) -> bool:
    return any(o.split("=", 1)[0].lstrip("+~") == "hydra/launcher" for o in overrides)


def launcher_config(overrides: Sequence[str]) -> Any | None:
    """The composed hydra.launcher node when the command line picks a Slurm launcher, else None."""
    if not launcher_requested(overrides):
        return None
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_workloads()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            # Sweeps are not expanded here: the launcher's settings are the same for every job.
            plain = [o for o in overrides if "," not in o.split("=", 1)[-1] or o.startswith("hydra")]
            cfg = compose(config_name="config", overrides=plain, return_hydra_config=True)
    except Exception as exc:
        message = " ".join(str(exc).split())
        hint = " (pip install 'dlio_ckpt[slurm]' provides hydra/launcher=slurm)" if "launcher" in message else ""
        raise ConfigError(f"hydra/launcher: {message}{hint}") from None
    launcher = cfg.hydra.launcher
    return launcher if launcher.get("_target_") == SLURM_LAUNCHER_TARGET else None


def srun_world_refusal(world_size: int, environ: dict[str, str]) -> str | None:
    """Why the tasks of this srun step must not run, when they did not form one MPI world, else None.

    srun starts mpi4py's MPI only through a PMI it shares with it (`--mpi=pmi2` for the mpich wheel);
    with another (Debian's default MpiDefault=none) each task is a world of one, and N such tasks
    would each run the whole job into the same run folder. DLIO_CKPT_SERIAL=1 asks for exactly that
    (one independent serial run per task, as for a node-local dataset), so it is let through."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    if world_size != 1 or not tasks.isdigit() or int(tasks) < 2 or environ.get("DLIO_CKPT_SERIAL") == "1":
        return None
    return (f"srun started {tasks} tasks but they did not join one MPI world (each is rank 0 of 1): srun's PMI "
            f"(--mpi={environ.get('SLURM_MPI_TYPE', 'the site default')}) does not start mpi4py's MPI; use srun --mpi=pmi2 "
            f"for the mpich wheel (or the PMI the site's MPI was built for), or DLIO_CKPT_SERIAL=1 for independent serial runs")


def job_world_size(launcher: Any) -> int:
    """Ranks per job of a Slurm sweep: nodes x tasks_per_node."""
    return int(launcher.nodes) * max(1, int(launcher.tasks_per_node))


def sbatch_script(launcher: Any, folder: str, jobs: int = 1) -> str:
    """The sbatch script the launcher would submit for `jobs` configurations, its logs under `folder`.

    The executor is configured as hydra-submitit-launcher's launch() configures it (init keys to the
    constructor, the queue's own keys prefixed with `slurm_`), so the script is the one that a sweep
    submits, only the submitit folder differs."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf
    from submitit.slurm.slurm import _make_sbatch_string

    params = {key: OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
              for key, value in ((key, launcher[key]) for key in launcher if key not in ("_target_", "submitit_folder"))}
    init = {f"slurm_{key}": params.pop(key) for key in ("max_num_timeout",) if key in params}
    executor = submitit.AutoExecutor(cluster="slurm", folder=folder, **init)
    queue_keys = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{key if key in queue_keys else f"slurm_{key}": value for key, value in params.items()})
    slurm = executor._executor
    return _make_sbatch_string(command=slurm._submitit_command_str, folder=slurm.folder, **dict(slurm.parameters, map_count=jobs))


def check_slurm_takes(launcher: Any) -> None:
    """Ask Slurm, without submitting, whether it would run the sweep's jobs; ConfigError if not.

    `sbatch --test-only` checks the script's request against the partitions and nodes slurmctld
    knows (what no reading of sinfo by us could do as exactly) and never queues a job."""
    for tool in ("sbatch", "srun"):
        if shutil.which(tool) is None:
            raise ConfigError(f"hydra/launcher=slurm: {tool} is not on PATH, so nothing can be submitted; run on a "
                              f"Slurm login node, or print the sbatch script with {DRY_RUN_FLAG}")
    request = (f"{launcher.nodes} node(s) x {launcher.tasks_per_node} task(s) x {launcher.cpus_per_task} CPU(s)"
               f" in partition {launcher.partition or '(the default)'}")
    with tempfile.TemporaryDirectory(prefix="dlio_ckpt-sbatch-test-") as folder:
        script = f"{folder}/test-only.sh"
        with open(script, "w") as file:
            file.write(sbatch_script(launcher, folder))
        try:
            done = subprocess.run(["sbatch", "--test-only", script], capture_output=True, text=True,
                                  timeout=TEST_ONLY_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"hydra/launcher=slurm: sbatch --test-only had no answer from slurmctld in "
                              f"{TEST_ONLY_TIMEOUT_S} s; check the cluster (scontrol ping) and SLURM_CONF") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()] or [f"exit status {done.returncode}"]
        errors = [line for line in lines if "error:" in line or "fatal:" in line] or lines
        reason = errors[-1].replace("sbatch: error: ", "").replace("sbatch: fatal: ", "").replace("Batch job submission failed: ", "").strip()
        raise ConfigError(f"hydra/launcher=slurm: Slurm would not run {request}: {reason}; nothing was submitted "
                          f"(compare hydra.launcher.partition, nodes, tasks_per_node and cpus_per_task with sinfo)")


@contextlib.contextmanager
def dry_run_submissions() -> Iterator[list[Submission]]:
    """Inside this block the Slurm launcher submits nothing; each launch adds its Submission.

    The launcher builds and configures its submitit executor as for a real sweep and then calls
    map_array, the one call that pickles the jobs and runs sbatch; that call is replaced by one that
    renders the sbatch script from the configured executor and returns no jobs.
    """
    import submitit
    from submitit.slurm.slurm import _make_sbatch_string

    captured: list[Submission] = []

    def render(executor: Any, function: Any, *iterables: Any) -> list:
        jobs = len(list(zip(*iterables)))
        slurm = executor._executor
        parameters = dict(slurm.parameters, map_count=jobs)
        script = _make_sbatch_string(command=slurm._submitit_command_str, folder=slurm.folder, **parameters)
        captured.append(Submission(script=script, jobs=jobs, tasks_per_job=slurm._num_tasks()))
        return []

    # The executor refuses to exist where there is no srun; a dry run is for machines without Slurm.
    saved = submitit.AutoExecutor.map_array, submitit.SlurmExecutor.__dict__["affinity"]
    submitit.AutoExecutor.map_array = render  # type: ignore[method-assign]
    submitit.SlurmExecutor.affinity = classmethod(lambda cls: 2)  # type: ignore[method-assign,assignment]
    try:
        yield captured
    finally:
        submitit.AutoExecutor.map_array, submitit.SlurmExecutor.affinity = saved  # type: ignore[method-assign]
