"""The `dlio_ckpt` command: Hydra under MPI without races, and errors as one line with exit 2.

Every rank runs this. The command line is checked completely (every job of a sweep) before
anything is written. Rank 0 then chooses and creates the run (or sweep) folder and broadcasts
it, so all ranks agree on it and two concurrent runs never share one; only rank 0 writes Hydra's
`.hydra/` and log file. A rank that fails aborts the whole MPI job instead of leaving the others
waiting in a collective.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Iterator, Sequence

from dlio_ckpt.errors import (INTERRUPTED_EXIT_CODE, RUN_FAILURE_EXIT_CODE, USAGE_EXIT_CODE, RunFailure, UserError,
                              report_failure, storage_failure)
from dlio_ckpt.faults import fault_point
from dlio_ckpt.world import World, launcher_rank

# Hydra flags that only print something: they run without MPI set-up or validation.
_INFO_FLAGS = {"--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc", "--version"}
_MULTIRUN_FLAGS = {"--multirun", "-m"}
TERMINATED_EXIT_CODE = 143  # 128 + SIGTERM, as shells report a job ended by kill or scancel
INTERRUPT_GRACE_S = 3.0  # after Ctrl-C, how long other ranks leave rank 0 to report and end the job
# Info flags that show the composed config: its overrides are checked first, as for a run.
_SHOWS_CONFIG = {"--cfg", "-c", "--info", "-i", "--resolve"}
# Prints the workload library, one line per workload, and exits: no MPI, no Hydra, no run folder.
LIST_WORKLOADS_FLAG = "--list-workloads"
# Prints dlio_ckpt's version and exits (Hydra would print its own).
VERSION_FLAG = "--version"
# `dlio_ckpt clean RUN_FOLDER`: remove the dataset and checkpoints that run created (dlio_ckpt/clean.py).
CLEAN_COMMAND = "clean"
# With --cfg job: the configuration that would run, after the scale caps (Hydra's --cfg shows it before them).
SCALED_FLAG = "--scaled"
# Left in a run folder that a run has claimed, so a second run given the same folder is refused.
RUN_CLAIM = ".dlio_ckpt_run"
# Ranks other than 0 write no `.hydra/` folder and no log file of their own.
_QUIET_RANK_OVERRIDES = ("hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled")
_RUN_OUTPUTS = (RUN_CLAIM, "summary.json", "plan.json", "sweep_summary.csv", "events")


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


def agreed_refusal(world: World, refusal: str | None) -> str | None:
    """The first rank's refusal of the command line, on every rank. Ranks on other nodes can see
    other memory, free space or files; one that stopped alone would leave the others waiting in a
    collective."""
    for rank, message in enumerate(world.allgather(refusal)):
        if message:
            return message if rank == 0 else f"{message} (on rank {rank})"
    return None


def claim_given_folder(given: str, key: str) -> Path:
    """Create (or take an empty) folder the user named and claim it atomically for this run.

    Two runs given the same folder would overwrite each other's summary.json, traces and (through
    the run id) checkpoints, so the second one is refused: the claim is a file created with
    O_EXCL, and a folder holding an earlier run's outputs counts as claimed.
    """
    if not given.strip().strip("'\"").strip():
        raise UserError(f"{key}: is empty, which would put the run's files in the current folder; give a folder path "
                        f"({key}=PATH), or leave {key} out for a new folder under runs/ or multirun/")
    folder = Path(given.strip().strip("'\"")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    taken = [name for name in _RUN_OUTPUTS if (folder / name).exists()]
    try:
        if taken:
            raise FileExistsError
        claim = os.open(folder / RUN_CLAIM, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UserError(f"{key}: {folder} already holds another run ({', '.join(taken) or RUN_CLAIM}); its summary.json "
                        f"and checkpoints would be overwritten: choose a new folder with {key}=PATH") from None
    with os.fdopen(claim, "w") as note:
        note.write(f"pid {os.getpid()} on {os.uname().nodename} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    return folder


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


def choose_output_folder(world: World, overrides: Sequence[str], multirun: bool) -> tuple[str, Path, str]:
    """Rank 0 picks and creates the run (or sweep) folder; every rank gets (override key, path, token).

    The token (random, from rank 0) makes the run id unique even when a folder of the same path
    is used again later, so a run never writes into (or prunes) an earlier run's checkpoints."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"

    def create() -> tuple[Path, str]:
        given = _given(overrides, key)
        token = secrets.token_hex(4)
        try:
            if given is not None:
                from dlio_ckpt.engine.relaunch import take_resume_note

                named = Path(given.strip().strip("'\"")).resolve()
                resumed = take_resume_note(named) if given.strip() and not multirun else None
                if resumed:  # a run stopped by failures.restart=exit: resume it, with its run id
                    return named, resumed
                return claim_given_folder(given, key), token
            stamp = time.strftime("%Y-%m-%d/%H-%M-%S")
            job = os.environ.get("SLURM_JOB_ID") or os.environ.get("PBS_JOBID") or str(os.getpid())
            return create_unique_folder(f"{'multirun' if multirun else 'runs'}/{stamp}-{job}"), token
        except OSError as exc:
            raise UserError(f"{key}: cannot create the run folder {exc.filename or given}: {exc.strerror}; "
                            f"choose a writable folder with {key}=PATH") from None

    folder, token = world.root_first(create)
    return key, folder, token


def list_workloads() -> None:
    """`--list-workloads`: print one line per shipped workload (name, description, source); no run folder."""
    from dlio_ckpt.config.catalogue import format_catalogue, workload_catalogue
    from dlio_ckpt.config.groups import workloads_dir

    try:
        print(format_catalogue(workload_catalogue(workloads_dir())), flush=True)
    except UserError as exc:
        print(f"dlio_ckpt: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE) from None


def print_datasize(overrides: Sequence[str], multirun: bool) -> bool:
    """mode=datasize: print the dataset size the MLPerf rule asks for (rank 0 only); no MPI, no run folder."""
    from dlio_ckpt.datasize import datasize_requested, run_datasize_mode

    root = launcher_rank() == 0
    try:
        if not datasize_requested(overrides):
            return False
        lines = run_datasize_mode(overrides, multirun)
    except UserError as exc:
        if root:
            print(f"dlio_ckpt: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE) from None
    if root:
        print("\n".join(lines), flush=True)
    return True


class Terminated(KeyboardInterrupt):
    """SIGTERM (scancel, a job's time limit, a shutdown), raised where Ctrl-C would be: it ends the job
    by the same path (one line, the job aborted together; an uncommitted checkpoint stays torn), and
    like KeyboardInterrupt it passes through the `except Exception` of Hydra and the engine."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> None:
    """The command; Ctrl-C before or after the job (start-up, sweep table) also ends in one line, exit 130,
    and SIGTERM in one line, exit 143 (a signal handler set by whoever started us is kept)."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        _main(argv)
    except Terminated:
        end_interrupted(_running_world(), "dlio_ckpt: terminated by SIGTERM (scancel, the job's time limit or a "
                        "shutdown)", TERMINATED_EXIT_CODE)
    except KeyboardInterrupt:
        end_interrupted(_running_world(), "dlio_ckpt: interrupted")
    except RunFailure as exc:  # a rank that fails outside the run task: its line, and no rank left waiting
        world = _running_world()
        report_failure(str(exc), world)
        world.abort(RUN_FAILURE_EXIT_CODE)
    except Exception:
        world = _running_world()
        if not world.parallel:
            raise
        traceback.print_exc()  # a bug: its traceback, once, then the whole job ends
        world.abort(1)


def _running_world() -> World:
    """This process's World at Ctrl-C: the MPI one while MPI runs (a rank that only exited would
    leave the others waiting in a collective forever), else a serial one that speaks for rank 0."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        comm = mpi.COMM_WORLD
        return World(rank=comm.Get_rank(), size=comm.Get_size(), comm=comm)
    return World(rank=launcher_rank(), size=1)


def end_interrupted(world: World, line: str, code: int = INTERRUPTED_EXIT_CODE) -> None:
    """Ctrl-C: one line for the job and exit 130 on every rank. Rank 0 says it and ends the job;
    another rank only after a grace period, when rank 0 has not (it may be blocked inside an MPI
    call, where Python never sees the signal). SIGTERM (exit 143) comes from a scheduler that signals
    every rank and prints its own line (Slurm's "CANCELLED"): there only rank 0 speaks, since a
    rank 0 still ending after the grace period would otherwise make it two lines."""
    if world.parallel and not world.is_root:
        time.sleep(INTERRUPT_GRACE_S)
    if world.is_root or (world.parallel and code != TERMINATED_EXIT_CODE):
        print(line, file=sys.stderr, flush=True)
    world.abort(code)


def _main(argv: Sequence[str] | None) -> None:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if _ran_plain_command(arguments):
        return
    from dlio_ckpt.slurm import DRY_RUN_FLAG

    dry_run = DRY_RUN_FLAG in arguments
    arguments = [a for a in arguments if a != DRY_RUN_FLAG]
    flags, overrides, multirun, info = split_command_line(arguments)
    flags, overrides = _with_workload_files(flags, overrides, info)
    if SCALED_FLAG in flags:
        print_scaled_config(flags, overrides)
        return
    if info:
        _show_config(flags, overrides, multirun)
        return
    if print_datasize(overrides, multirun):
        return
    world, darshan_preloaded = _start_world()
    fault_point("start", world.rank)
    if not (multirun or dry_run or _sets_hydra_mode(overrides)):
        run_single(world, flags, overrides, darshan_preloaded)
        return
    _run_checked(world, flags, overrides, multirun, dry_run, darshan_preloaded)


def _ran_plain_command(arguments: list[str]) -> bool:
    """`dlio_ckpt clean`, --list-workloads and --version: commands that compose no config."""
    if arguments[:1] == [CLEAN_COMMAND]:
        from dlio_ckpt.clean import main as clean_main

        clean_main(arguments[1:])
        return True
    if LIST_WORKLOADS_FLAG in arguments:
        list_workloads()
        return True
    if VERSION_FLAG in arguments:  # dlio_ckpt's version, not Hydra's (which Hydra's own --version prints)
        from dlio_ckpt import __version__

        print(f"dlio_ckpt {__version__}", flush=True)
        return True
    return False


def _with_workload_files(flags: list[str], overrides: list[str], info: bool) -> tuple[list[str], list[str]]:
    """The user's workload files (workload=PATH, --config-dir DIR, dlio_config=PATH) joined to the
    workload group, with the workloads the command line names; one line and exit 2 on a bad file."""
    from dlio_ckpt.config.groups import register_workloads, workloads_named
    from dlio_ckpt.config.workload_files import config_dirs_in, resolve

    try:
        # workload=PATH, --config-dir DIR and dlio_config=PATH join the workload group; the
        # command line then names them as it names a shipped workload.
        config_dirs, flags = config_dirs_in(flags)
        overrides, warnings = resolve(overrides, config_dirs)
        # A run needs only the workloads it names; --help, --info and --cfg list every option.
        register_workloads(None if info else workloads_named(overrides))
    except UserError as exc:
        if launcher_rank() == 0:
            print(f"dlio_ckpt: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE) from None
    if launcher_rank() == 0:
        for warning in warnings:
            print(f"dlio_ckpt: warning: {warning}", file=sys.stderr, flush=True)
    return flags, overrides


def _show_config(flags: list[str], overrides: list[str], multirun: bool) -> None:
    """--help, --info, --cfg: Hydra shows them, after the values are checked as for a run."""
    if _SHOWS_CONFIG & set(flags):
        from dlio_ckpt.config.load import validate_for_display

        try:
            validate_for_display(overrides, multirun)
        except UserError as exc:
            print(f"dlio_ckpt: error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(USAGE_EXIT_CODE) from None
    _run_hydra(flags + overrides, task=lambda cfg: None)


def _start_world() -> tuple[World, bool]:
    """The World (after Darshan's preload is prepared, before MPI starts); a Slurm allocation that
    does not start mpi4py's MPI is refused, every task, before anything is written."""
    from dlio_ckpt.trace.runtime import prepare_darshan_init

    darshan_preloaded = prepare_darshan_init(os.environ, job_name="dlio_ckpt")
    world = World.from_environment()
    from dlio_ckpt.slurm import srun_world_refusal

    refusal = srun_world_refusal(world.size, dict(os.environ))
    if refusal:  # checked before anything is written: every task stops, one says why
        if launcher_rank() == 0:
            print(f"dlio_ckpt: error: {refusal}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE)
    return world, darshan_preloaded


def _run_checked(world: World, flags: list[str], overrides: list[str], multirun: bool, dry_run: bool,
                 darshan_preloaded: bool) -> None:
    """A sweep, a Slurm submission or a dry run: every job checked for the world size, all ranks
    agreeing, before the output folder is chosen and Hydra runs (or the submission is printed)."""
    try:
        from dlio_ckpt.config.load import validate_command_line

        refusal = None
        try:
            validate_command_line(overrides, multirun, slurm_job_size(overrides, multirun, dry_run) or world.size,
                                  free_space=not dry_run)  # a dry run may be printed far from storage.root
        except UserError as exc:
            refusal = str(exc)
        refusal = agreed_refusal(world, refusal)
        if refusal:
            fail(world, refusal)
            return
        key, folder, token = choose_output_folder(world, overrides, multirun)
    except UserError as exc:
        fail(world, str(exc))
        return
    darshan_runtime = start_darshan_runtime(world, folder, darshan_preloaded)
    injected = [o for o in overrides if not o.startswith(key + "=")] + [f"{key}={folder}"]
    if not world.is_root:
        injected += list(_QUIET_RANK_OVERRIDES)
    # The run's own checkpoint folder is named after it and rank 0's token: unique even when two
    # run folders share a name or one path is used again.
    run_id = f"{folder.name}-{token}"
    if dry_run:
        print_slurm_dry_run(flags + injected, make_task(world, run_id, multirun, darshan_runtime), folder,
                            dated=_given(overrides, key) is None)
        return
    _run_hydra(flags + injected, task=make_task(world, run_id, multirun, darshan_runtime))
    if multirun and world.is_root:
        from dlio_ckpt.sweep import combine_sweep

        table = combine_sweep(folder)
        print(f"sweep summary: {table}")


def run_single(world: World, flags: list[str], overrides: list[str], darshan_preloaded: bool) -> None:
    """One run (no -m), composed once on each rank: by Hydra, for the run. That config is checked,
    and rank 0 claims the run folder, between Hydra composing it and Hydra writing anything
    (`_checked_when_composed`), instead of a first composition made only to check it: ~20 ms of
    CPU of every rank's start (the second composition found Hydra's and OmegaConf's caches warm).
    A refused command line still leaves nothing behind, and every rank still agrees on the refusal
    and on the folder."""
    from dlio_ckpt.config.load import check_override_keys, check_run, composition_error

    key = "hydra.run.dir"
    refusal = None
    try:
        check_override_keys(overrides)
    except UserError as exc:
        refusal = str(exc)
    refusal = agreed_refusal(world, refusal)
    if refusal:
        fail(world, refusal)
    launch = {}
    quiet = () if world.is_root else _QUIET_RANK_OVERRIDES

    def admit(compose):
        """Hydra's composition of the run, checked on every rank; then the folder, claimed by rank 0,
        goes into the composed config as a `hydra.run.dir=FOLDER` override would have put it."""
        refusal = cfg = None
        try:
            cfg = compose()
        except Exception as exc:
            refusal = str(composition_error(exc))
        else:
            try:
                check_run(cfg, overrides, world.size)
            except UserError as exc:
                refusal = str(exc)
        refusal = agreed_refusal(world, refusal)
        if refusal:
            fail(world, refusal)
        try:
            _, folder, token = choose_output_folder(world, overrides, multirun=False)
        except UserError as exc:
            fail(world, str(exc))
        darshan_runtime = start_darshan_runtime(world, folder, darshan_preloaded)
        launch["task"] = make_task(world, f"{folder.name}-{token}", False, darshan_runtime)
        cfg.hydra.run.dir = str(folder)
        # where the override would have been: after the user's, before the quiet ranks' and the
        # hydra.mode=RUN Hydra appends (.hydra/hydra.yaml is then what a second composition gave)
        listed, tail = cfg.hydra.overrides.hydra, (*quiet, "hydra.mode=RUN")
        at = len(listed) - len(tail) if tuple(listed[-len(tail):]) == tail else len(listed)
        listed.insert(at, f"{key}={folder}")
        return cfg

    arguments = [o for o in overrides if not o.startswith(key + "=")] + list(quiet)
    _run_hydra(flags + arguments, task=lambda cfg: launch["task"](cfg), admit=admit)


def start_darshan_runtime(world: World, folder: Path, preloaded: bool):
    """With darshan-runtime preloaded: its log goes to the run folder (trace/runtime.py); None without."""
    if not preloaded:
        return None
    from dlio_ckpt.trace.runtime import prepare_darshan_runtime

    runtime = prepare_darshan_runtime(os.environ, folder, world.size, folder.name, rank=world.rank,
                                      mpi=world.comm is not None)
    if runtime is not None and world.is_root:
        print(f"dlio_ckpt: {runtime.message}", file=sys.stderr, flush=True)
    return runtime


def _sets_hydra_mode(arguments: Sequence[str]) -> bool:
    return any(a.lstrip("+~").startswith("hydra.mode") for a in arguments)


def print_scaled_config(flags: Sequence[str], overrides: Sequence[str]) -> None:
    """`--cfg job --scaled`: the validated RunConfig after `scale=` caps, as YAML; writes nothing."""
    import dataclasses

    import yaml

    from dlio_ckpt.config.load import load_config

    if "--cfg" not in flags and "-c" not in flags:
        print(f"dlio_ckpt: error: {SCALED_FLAG} goes with --cfg job (the configuration after the scale caps)",
              file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE)
    try:
        config = load_config(overrides)
    except UserError as exc:
        print(f"dlio_ckpt: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE) from None
    print(f"# after the scale caps (scale={config.scale.name}); keys you set yourself are not capped")
    print(yaml.safe_dump(dataclasses.asdict(config), sort_keys=False), end="", flush=True)


def slurm_job_size(overrides: Sequence[str], multirun: bool, dry_run: bool) -> int | None:
    """The ranks each job of a Slurm sweep will run, which the command line is checked for instead of
    the one process that submits; None when the sweep does not go to Slurm. A real submission is first
    put to Slurm itself (sbatch --test-only), so that a job it would refuse is refused here."""
    from dlio_ckpt.slurm import DRY_RUN_FLAG, check_slurm_takes, job_world_size, launcher_config

    launcher = launcher_config(overrides) if multirun else None
    if dry_run and launcher is None:
        raise UserError(f"{DRY_RUN_FLAG}: prints the sbatch script of a Slurm sweep; use it with -m hydra/launcher=slurm")
    if launcher is None:
        return None
    if not dry_run:
        check_slurm_takes(launcher)
    return job_world_size(launcher)


def print_slurm_dry_run(arguments: list[str], task, folder: Path, dated: bool = False) -> None:
    """--slurm-dry-run: the launcher prepares the sweep's submission as for real; its sbatch script is
    printed, not submitted, and the sweep folder claimed for it is given back."""
    from dlio_ckpt.slurm import dry_run_submissions

    try:
        with dry_run_submissions() as submissions:
            _run_hydra(arguments, task=task)
    finally:
        for name in (RUN_CLAIM, "multirun.yaml"):  # all that a sweep folder holds before its first job
            (folder / name).unlink(missing_ok=True)
        # the default multirun/<date>/<time>-<job> also leaves its date and multirun folders, when empty
        for empty in [folder] + ([folder.parent, folder.parent.parent] if dated else []):
            with contextlib.suppress(OSError):
                empty.rmdir()
    for submission in submissions:
        print(f"# dry run, nothing submitted: {submission.jobs} Slurm job(s), one per configuration, "
              f"each running {submission.tasks_per_job} dlio_ckpt rank(s) under srun")
        print(submission.script, flush=True)


def make_task(world: World, run_id: str, multirun: bool, darshan_runtime=None):
    """The Hydra task function: build the RunConfig and run the job on this rank.

    A launcher that runs the task in other processes (submitit on Slurm: one process per srun
    task) gets a World built there, from that process's MPI environment."""
    launched_in = os.getpid()

    def task(cfg, world: World = world) -> None:
        if os.getpid() != launched_in:
            world = World.from_environment()
        from hydra.core.hydra_config import HydraConfig

        from dlio_ckpt.config.load import explicit_keys, to_run_config
        from dlio_ckpt.engine.failures import RESTART_EXIT_CODE, RestartExit
        from dlio_ckpt.engine.run import run_job

        hydra = HydraConfig.get()
        run_dir = Path(hydra.runtime.output_dir)
        job_id = f"{run_id}-{hydra.job.num}" if multirun else run_id
        try:
            config = to_run_config(cfg, explicit_keys(list(hydra.overrides.task)), str(run_dir), world_size=world.size)
            run_job(world, config, run_dir, job_id, darshan_runtime=darshan_runtime)
        except UserError as exc:
            report_failure(str(exc), world)
            world.abort(USAGE_EXIT_CODE)
        except RestartExit as exc:  # failures.restart=exit: every rank is here, after a clean shutdown
            if world.is_root:
                print(f"dlio_ckpt: {exc}", file=sys.stderr, flush=True)
            world.barrier()
            raise SystemExit(RESTART_EXIT_CODE) from None
        except RunFailure as exc:  # one line per failing rank (it may have printed it already), exit 1
            if str(exc):
                report_failure(str(exc), world)
            if exc.known_everywhere and world.parallel:
                # Every rank is here: once all lines are out, rank 0 alone ends the job. Ranks that
                # exit 1 by themselves race the launcher, which may SIGKILL the slower ones (exit 9).
                world.barrier()
                if not world.is_root:
                    world.barrier()  # rank 0 never joins: its MPI_Abort ends this rank
            world.abort(RUN_FAILURE_EXIT_CODE)
        except Terminated:  # scancel or a time limit signals every rank: one line for the job, exit 143
            end_interrupted(world, f"dlio_ckpt: terminated by SIGTERM (scancel, the job's time limit or a shutdown); "
                            f"the run in {run_dir} is incomplete", TERMINATED_EXIT_CODE)
        except KeyboardInterrupt:  # Ctrl-C reaches every rank: one line for the job, exit 130
            end_interrupted(world, f"dlio_ckpt: interrupted; the run in {run_dir} is incomplete")
        except BaseException as exc:
            if isinstance(exc, OSError) and exc.filename:  # a file it could not read or write: one line, not a traceback
                report_failure(str(storage_failure(exc, exc.filename)), world)
                world.abort(RUN_FAILURE_EXIT_CODE)
            if isinstance(exc, SystemExit) and not world.parallel:
                raise
            print(f"dlio_ckpt: rank {world.rank} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            world.abort(1)

    return task


def _run_hydra(arguments: list[str], task, admit=None) -> None:
    """Hydra's main with `arguments` as its command line; `admit`: see _checked_when_composed."""
    import hydra

    from dlio_ckpt.config.groups import conf_dir

    saved = sys.argv
    sys.argv = [saved[0] if saved else "dlio_ckpt"] + arguments
    try:
        with _mode_unset_unless_given(arguments), _checked_when_composed(admit):
            hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(task)()
    finally:
        sys.argv = saved


@contextlib.contextmanager
def _mode_unset_unless_given(arguments: list[str]) -> Iterator[None]:
    """Before a run or sweep, Hydra composes the whole config once only to read `hydra.mode`
    (Hydra.get_mode), then composes it again for the run: about 0.1 s of every process's start,
    on every rank. dlio_ckpt's config never sets hydra.mode, so that first compose always finds
    None, and Hydra then picks the mode from -m as usual. While Hydra runs, get_mode answers None
    without composing; the same answer, so the same run. A hydra.mode given on the command line
    is left to Hydra's own get_mode."""
    from hydra._internal.hydra import Hydra

    if _sets_hydra_mode(arguments) or not hasattr(Hydra, "get_mode"):
        yield
        return
    original = Hydra.get_mode
    Hydra.get_mode = lambda self, *args, **kwargs: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Hydra.get_mode = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _checked_when_composed(admit) -> Iterator[None]:
    """While Hydra runs a single run, its composition of the run's config goes through `admit`,
    which gets the composing as a call (`admit(compose)`) and returns the config Hydra goes on
    with, or raises SystemExit to refuse the command line. Hydra composes the run's config before
    it creates the run folder, writes `.hydra/` or sets up logging, so what admit refuses leaves
    nothing written. Only the first composition in run mode is admitted (the only one a single
    run makes, get_mode's being skipped by _mode_unset_unless_given)."""
    if admit is None:
        yield
        return
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.types import RunMode

    original = ConfigLoaderImpl.load_configuration
    pending = [admit]

    def load_configuration(self, *args, **kwargs):
        if not pending or kwargs.get("run_mode") != RunMode.RUN:
            return original(self, *args, **kwargs)
        return pending.pop()(lambda: original(self, *args, **kwargs))

    ConfigLoaderImpl.load_configuration = load_configuration  # type: ignore[method-assign]
    try:
        yield
    finally:
        ConfigLoaderImpl.load_configuration = original  # type: ignore[method-assign]
