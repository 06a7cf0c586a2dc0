"""The `dlio_ckpt` command: Hydra under MPI without races, and errors as one line with exit 2.

Every rank runs this. The command line is checked completely (every job of a sweep) before
anything is written. Rank 0 then chooses and creates the run (or sweep) folder and broadcasts
it, so all ranks agree on it and two concurrent runs never share one; only rank 0 writes Hydra's
`.hydra/` and log file. A rank that fails aborts the whole MPI job instead of leaving the others
waiting in a collective.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Sequence

from dlio_ckpt.errors import USAGE_EXIT_CODE, UserError
from dlio_ckpt.world import World

# Hydra flags that only print something: they run without MPI set-up or validation.
_INFO_FLAGS = {"--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc", "--version"}
_MULTIRUN_FLAGS = {"--multirun", "-m"}


def split_command_line(argv: Sequence[str]) -> tuple[list[str], list[str], bool, bool]:
    """(flags, overrides, multirun, info_only) from the raw arguments."""
    flags, overrides = [], []
    info = multirun = False
    expects_value = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun", "--shell-completion", "-sc"}
    args = list(argv)
    index = 0
    while index < len(args):
        arg = args[index]
        if arg.startswith("-"):
            flags.append(arg)
            if arg in _MULTIRUN_FLAGS:
                multirun = True
            if arg in _INFO_FLAGS:
                info = True
            if arg in expects_value and index + 1 < len(args) and "=" not in args[index + 1]:
                flags.append(args[index + 1])
                index += 1
        else:
            overrides.append(arg)
        index += 1
    return flags, overrides, multirun, info


def fail(world: World, message: str, code: int = USAGE_EXIT_CODE) -> None:
    if world.is_root:
        print(f"dlio_ckpt: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def _given(overrides: Sequence[str], key: str) -> str | None:
    for override in overrides:
        if override.startswith(key + "="):
            return override.split("=", 1)[1]
    return None


def create_unique_folder(base: str) -> Path:
    """Create `base` (or base-2, base-3, ... when taken) atomically and return its absolute path."""
    candidate = Path(base)
    suffix = 1
    while True:
        try:
            candidate.parent.mkdir(parents=True, exist_ok=True)
            candidate.mkdir()
            return candidate.resolve()
        except FileExistsError:
            suffix += 1
            candidate = Path(f"{base}-{suffix}")


def choose_output_folder(world: World, overrides: Sequence[str], multirun: bool) -> tuple[str, Path]:
    """Rank 0 picks and creates the run (or sweep) folder; every rank gets (override key, path)."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"

    def create() -> Path:
        given = _given(overrides, key)
        try:
            if given is not None:
                folder = Path(given).resolve()
                folder.mkdir(parents=True, exist_ok=True)
                return folder
            stamp = time.strftime("%Y-%m-%d/%H-%M-%S")
            job = os.environ.get("SLURM_JOB_ID") or os.environ.get("PBS_JOBID") or str(os.getpid())
            return create_unique_folder(f"{'multirun' if multirun else 'runs'}/{stamp}-{job}")
        except OSError as exc:
            raise UserError(f"{key}: cannot create the run folder {exc.filename or given}: {exc.strerror}; "
                            f"choose a writable folder with {key}=PATH") from None

    return key, world.root_first(create)


def main(argv: Sequence[str] | None = None) -> None:
    arguments = list(sys.argv[1:] if argv is None else argv)
    flags, overrides, multirun, info = split_command_line(arguments)
    from dlio_ckpt.config.load import register_workloads

    try:
        register_workloads()
    except UserError as exc:
        print(f"dlio_ckpt: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE) from None
    if info:
        _run_hydra(flags + overrides, task=lambda cfg: None)
        return
    from dlio_ckpt.trace.runtime import prepare_darshan_init, prepare_darshan_runtime

    darshan_preloaded = prepare_darshan_init(os.environ, job_name="dlio_ckpt")
    world = World.from_environment()
    try:
        from dlio_ckpt.config.load import validate_command_line

        validate_command_line(overrides, multirun, world.size)
        key, folder = choose_output_folder(world, overrides, multirun)
    except UserError as exc:
        fail(world, str(exc))
        return
    darshan_runtime = None
    if darshan_preloaded:
        darshan_runtime = prepare_darshan_runtime(os.environ, folder, world.size, folder.name, rank=world.rank,
                                                  mpi=world.comm is not None)
        if darshan_runtime is not None and world.is_root:
            print(f"dlio_ckpt: {darshan_runtime.message}", file=sys.stderr, flush=True)
    injected = [o for o in overrides if not o.startswith(key + "=")] + [f"{key}={folder}"]
    if not world.is_root:
        injected += ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    # The run's own checkpoint folder is named after it: unique even when two run folders share a name.
    run_id = f"{folder.name}-{hashlib.sha1(str(folder).encode()).hexdigest()[:8]}"
    _run_hydra(flags + injected, task=make_task(world, run_id, multirun, darshan_runtime))
    if multirun and world.is_root:
        from dlio_ckpt.sweep import combine_sweep

        table = combine_sweep(folder)
        print(f"sweep summary: {table}")


def make_task(world: World, run_id: str, multirun: bool, darshan_runtime=None):
    """The Hydra task function: build the RunConfig and run the job on this rank."""

    def task(cfg) -> None:
        from hydra.core.hydra_config import HydraConfig

        from dlio_ckpt.config.load import explicit_keys, to_run_config
        from dlio_ckpt.engine.run import run_job

        hydra = HydraConfig.get()
        run_dir = Path(hydra.runtime.output_dir)
        job_id = f"{run_id}-{hydra.job.num}" if multirun else run_id
        try:
            config = to_run_config(cfg, explicit_keys(list(hydra.overrides.task)), str(run_dir))
            run_job(world, config, run_dir, job_id, darshan_runtime=darshan_runtime)
        except UserError as exc:
            print(f"dlio_ckpt: error{f' (rank {world.rank})' if world.parallel else ''}: {exc}", file=sys.stderr, flush=True)
            world.abort(USAGE_EXIT_CODE)
        except BaseException as exc:
            if isinstance(exc, SystemExit) and not world.parallel:
                raise
            print(f"dlio_ckpt: rank {world.rank} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            world.abort(1)

    return task


def _run_hydra(arguments: list[str], task) -> None:
    import hydra

    from dlio_ckpt.config.load import conf_dir

    saved = sys.argv
    sys.argv = [saved[0] if saved else "dlio_ckpt"] + arguments
    try:
        hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(task)()
    finally:
        sys.argv = saved
