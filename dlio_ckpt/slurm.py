"""Sweeps on Slurm through Hydra's submitit launcher (conf/hydra/launcher/slurm.yaml).

`dlio_ckpt -m hydra/launcher=slurm ...` makes one Slurm job per configuration (a job array); each
job runs nodes x tasks_per_node dlio_ckpt ranks under srun. Two things are known before anything
is submitted and are used here: the world size every job will have (so the command line is
checked for it, not for the one process that submits), and the sbatch script itself, which
`--slurm-dry-run` prints instead of submitting (the launcher configures its executor exactly as for
a real sweep; only the submission is left out).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from dlio_ckpt.errors import ConfigError

SLURM_LAUNCHER_TARGET = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
DRY_RUN_FLAG = "--slurm-dry-run"


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

    from dlio_ckpt.config.load import conf_dir, register_workloads

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


def slurm_world_size(overrides: Sequence[str]) -> int | None:
    """Ranks per job of a Slurm sweep (nodes x tasks_per_node), or None when not on Slurm."""
    launcher = launcher_config(overrides)
    if launcher is None:
        return None
    return int(launcher.nodes) * max(1, int(launcher.tasks_per_node))


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
