"""Serial CLI runs forked from a process that has already imported dlio_ckpt.

A serial end-to-end test used to start `dlio_ckpt` as a new interpreter, which spent about 0.3 s
of each run's second importing numpy, Hydra, OmegaConf and the package before doing anything the
test looks at; with a couple of hundred runs that was a large share of the suite's time. Here a
multiprocessing forkserver (single-threaded, started once per test worker) imports them once, and
each run is a fork of it that calls the same `dlio_ckpt.cli.main` the console script calls, with
the run's own working folder, environment, argv and stdout/stderr files, and ends with its exit
code. Nothing a run does reaches the test process: it is a separate process, as before. The
analysis programs (dlio_ckpt-analyze, PyDarshan's `darshan summary`, ...) are forked the same way
from a second server that has also imported PyDarshan, pandas and matplotlib.

Runs under mpirun, and tests that need a real executable (signals, the console script itself),
still start the installed command.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import multiprocessing.forkserver
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# What the runs' forkserver imports before forking them: the command's start-up cost.
PRELOAD = ["numpy", "omegaconf", "hydra.compose", "dlio_ckpt.cli", "dlio_ckpt.config.load", "dlio_ckpt.engine.run",
           # what checking a config imports (config.load.to_run_config): ~40 ms of each run
           "dlio_ckpt.config.accelerators", "dlio_ckpt.checkpoint.encoded", "dlio_ckpt.checkpoint.registry",
           "dlio_ckpt.formats", "dlio_ckpt.plan.checkpoint_formats", "dlio_ckpt.storage", "dlio_ckpt.config.limits",
           "dlio_ckpt.config.paths", "dlio_ckpt.config.space"]
# The analysis programs' server imports these too: what dlio_ckpt-analyze imports (~0.7 s of CPU each
# start; test_doc_commands runs ~20) and PyDarshan's `darshan summary` (~0.7 s more once, ~3 s of each
# report's start-up). Not the runs' server: these hold ~170 MiB more, and every fork of a process that
# large cost a tiny run ~0.5 s more CPU (its own fork, its reader workers' forks, its exit): 1.0 s
# against 1.5-1.7 s for `workload=unet3d scale=tiny`, alternated, 5 runs each.
ANALYSIS_PRELOAD = PRELOAD + [
    "dlio_ckpt.analysis.cli", "darshan", "darshan.backend.cffi_backend", "pandas",
    "darshan.experimental.plots.heatmap_handling", "darshan.experimental.plots.plot_common_access_table",
    "matplotlib.figure", "matplotlib.backends.backend_agg", "darshan.cli.summary"]


@contextlib.contextmanager
def _safe_path():
    """A forkserver starts as `python -c ...` in the tests' folder, the repository root, and such an
    interpreter puts its working folder first on sys.path: its preload would import ./dlio_ckpt, the
    source tree, not the installed package (which has dlio_ckpt.analysis, mapped from analysis/).
    PYTHONSAFEPATH (Python 3.11) keeps the working folder off sys.path, as it is off for a console
    script. Only the server's start sees it: the forked programs set their own environment."""
    saved = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["PYTHONSAFEPATH"]
        else:
            os.environ["PYTHONSAFEPATH"] = saved


@functools.lru_cache(maxsize=None)
def _context() -> multiprocessing.context.ForkServerContext:
    """The runs' server: multiprocessing's own forkserver, started once per test worker."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    with _safe_path():
        multiprocessing.forkserver.ensure_running()
    return context


@functools.lru_cache(maxsize=None)
def _analysis_server() -> multiprocessing.forkserver.ForkServer:
    """The analysis programs' server: a second ForkServer, started on first use."""
    server = multiprocessing.forkserver.ForkServer()
    server.set_forkserver_preload(ANALYSIS_PRELOAD)
    with _safe_path():
        server.ensure_running()
    return server


def _start(process: multiprocessing.process.BaseProcess, server: multiprocessing.forkserver.ForkServer | None) -> None:
    """Start a forkserver Process on `server` (None: the runs' server). multiprocessing starts every
    forkserver Process on its module's server (popen_forkserver calls forkserver.connect_to_new_process
    when it starts one); for the start alone that call goes to `server`. The rest (the child's exit
    code, its inherited descriptors) does not depend on which server forked it."""
    if server is None:
        process.start()
        return
    default = multiprocessing.forkserver.connect_to_new_process
    multiprocessing.forkserver.connect_to_new_process = server.connect_to_new_process
    try:
        process.start()
    finally:
        multiprocessing.forkserver.connect_to_new_process = default


def stop_servers() -> None:
    """Stop the servers this process started and wait for them (at the end of a test session). A
    server reaps the programs it forked, so their CPU time is in its own children's; a server left
    to exit after its test worker is adopted by init, and that time (most of the suite's runs) never
    reached the worker's parent: `/usr/bin/time pytest` left it out."""
    if _context.cache_info().currsize:
        multiprocessing.forkserver._forkserver._stop()  # multiprocessing's own server (its tests use _stop too)
    if _analysis_server.cache_info().currsize:
        _analysis_server()._stop()


def _run(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """The forked run: the console script's view of the world, then the command."""
    _redirect(cwd, env, out, err)
    sys.argv = list(argv)
    from dlio_ckpt.cli import main

    sys.exit(main(argv[1:]))


def _run_module(module: str, argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """The forked `python -m module ARGS`."""
    import runpy

    _redirect(cwd, env, out, err)
    sys.argv = list(argv)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    sys.exit(0)


def _run_entry_point(module: str, argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """The forked console script: `sys.exit(module.main())` with its argv, as the installed script does."""
    import importlib

    _redirect(cwd, env, out, err)
    sys.argv = list(argv)
    sys.exit(importlib.import_module(module).main())


def _redirect(cwd: str, env: dict[str, str], out: str, err: str) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)


def run_module_forked(module: str, args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m module ARGS` (e.g. PyDarshan's `darshan summary`) as a fork of the analysis server,
    which has imported what it needs: like subprocess.run(capture_output=True, text=True)."""
    return _forked(_run_module, module, [module, *args], cwd, dict(os.environ), timeout, _analysis_server())


# The analysis-side console scripts' entry points (pyproject.toml [project.scripts]): `name = module:main`.
ENTRY_POINTS = {"dlio_ckpt-analyze": "dlio_ckpt.analysis.cli", "dlio_ckpt-import-dlio": "dlio_ckpt.import_dlio",
                "dlio_ckpt-advise": "dlio_ckpt.advisor.cli"}


def run_main_forked(program: str, args: list[str], cwd: Path, env: dict[str, str] | None = None,
                    timeout: float = 300) -> subprocess.CompletedProcess:
    """The console script `program ARGS` (one of ENTRY_POINTS) as a fork of the analysis server: a
    fresh dlio_ckpt-analyze spent ~2 s of CPU importing PyDarshan, pandas and matplotlib, which the
    server has imported. Like subprocess.run(capture_output=True, text=True), in `env` (default: this
    process's). Not `python -m`: runpy warns on stderr about a module the server preloaded."""
    argv = [str(Path(sys.executable).parent / program), *args]
    return _forked(_run_entry_point, ENTRY_POINTS[program], argv, cwd, dict(os.environ) if env is None else env,
                   timeout, _analysis_server())


def run_forked(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run the command `argv` (argv[0] the console script) like subprocess.run(capture_output=True, text=True)."""
    return _forked(_run, None, argv, cwd, env, timeout)


def start_forked(argv: list[str], cwd: Path, env: dict[str, str]) -> ForkedRun:
    """Start the command `argv` (argv[0] the console script) without waiting for it, like
    subprocess.Popen: for runs that must overlap (tests/test_concurrent_runs.py)."""
    return ForkedRun(_run, None, argv, cwd, env)


def _forked(target, module: str | None, argv: list[str], cwd: Path, env: dict[str, str],
            timeout: float, server: multiprocessing.forkserver.ForkServer | None = None) -> subprocess.CompletedProcess:
    return ForkedRun(target, module, argv, cwd, env, server).wait(timeout)


class ForkedRun:
    """A forked program, started; wait() gives what subprocess.run(capture_output=True, text=True) gives."""

    def __init__(self, target, module: str | None, argv: list[str], cwd: Path, env: dict[str, str],
                 server: multiprocessing.forkserver.ForkServer | None = None):
        self.argv = argv
        self.folder = tempfile.TemporaryDirectory(prefix="dlio-cli-")
        self.out, self.err = os.path.join(self.folder.name, "stdout"), os.path.join(self.folder.name, "stderr")
        for path in (self.out, self.err):  # there to read even if the run dies before it opens them
            open(path, "w").close()
        prefix = (module,) if module else ()
        self.process = _context().Process(target=target, args=(*prefix, argv, str(cwd), env, self.out, self.err))
        _start(self.process, server)

    def wait(self, timeout: float) -> subprocess.CompletedProcess:
        with self.folder:
            self.process.join(timeout)
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join()
                raise subprocess.TimeoutExpired(self.argv, timeout)
            with open(self.out, errors="replace") as stdout, open(self.err, errors="replace") as stderr:
                return subprocess.CompletedProcess(self.argv, self.process.exitcode, stdout.read(), stderr.read())
