"""Shared fixtures: a scratch storage root per test, and helpers to run the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cli_fork import run_forked, stop_servers
import rank_fork

# pytest rewrites each test module's asserts as it imports it and keeps the result as bytecode in
# tests/__pycache__, unless the interpreter writes none (PYTHONDONTWRITEBYTECODE, set on these
# machines): then each of the suite's pytest-xdist workers rewrote all ~110 modules at every run,
# ~2.7 s of CPU each (collection 4.2 s -> 1.5 s with the cache). The package's own bytecode is
# compiled at the session's start for the same reason (pytest_sessionstart).
sys.dont_write_bytecode = False

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHM = Path("/dev/shm")


def _mpich_leftovers() -> set[Path]:
    """mpich's leftovers: its ranks' shared memory, and the hwloc topology file mpiexec (hydra)
    writes in the temporary folder for its proxies."""
    segments = set(SHM.glob("mpich_shm_*")) if SHM.is_dir() else set()
    return segments | set(Path(tempfile.gettempdir()).glob("hydra_hwloc_xmlfile_*"))


def pytest_sessionstart(session) -> None:
    """Compile the package's bytecode once, as installing it does (pip compiles what it installs).
    The suite starts hundreds of Python processes (MPI ranks, `python -c`, the analysis CLI), and
    where nothing writes bytecode (PYTHONDONTWRITEBYTECODE, an editable install) each of them
    compiled the ~70 modules it imports from source: ~0.1 s of CPU every process. Python reads
    bytecode whatever that variable says, and skips a file whose source changed since."""
    import compileall

    import dlio_ckpt

    compileall.compile_dir(Path(dlio_ckpt.__file__).parent, quiet=1)
    session.config.stash[_SEGMENTS] = _mpich_leftovers()


def pytest_sessionfinish(session) -> None:
    """The forked runs' servers stop with the session, so that their runs' CPU time is counted
    (cli_fork.stop_servers, rank_fork.stop_server)."""
    stop_servers()
    rank_fork.stop_server()
    _remove_left_segments(session)


_SEGMENTS = pytest.StashKey[set]()


def _remove_left_segments(session) -> None:
    """mpich keeps a node's ranks' shared memory in /dev/shm/mpich_shm_*, unlinked once every rank
    has attached, and mpiexec its hwloc topology in /tmp/hydra_hwloc_xmlfile_*, removed as it exits:
    a rank or an mpiexec the suite kills on purpose (injected failures, cancelled jobs) leaves them
    behind, ~21 segments (2 MB each; 1,152 had piled up here) and ~20 topology files a suite run.
    The ones that appeared during the session go with it, once every test is done: only in the
    controller (pytest-xdist's workers finish while others still run MPI jobs), and only while no
    MPI launcher runs on the machine: another MPI job started beside the suite has files of its own
    among the new ones, and a rank that has yet to attach to a removed segment hangs."""
    if hasattr(session.config, "workerinput") or _SEGMENTS not in session.config.stash:
        return
    if _launcher_running():
        return
    for segment in _mpich_leftovers() - session.config.stash[_SEGMENTS]:
        segment.unlink(missing_ok=True)


def _launcher_running() -> bool:
    """Whether an MPI launcher (mpiexec, its hydra proxies) runs on the machine: /proc's command names."""
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            name = comm.read_text().strip()
        except OSError:
            continue
        if name.startswith(("mpiexec", "mpirun", "hydra_pmi_prox")):
            return True
    return False


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DLIO_CKPT_MPI", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cli(args: list[str], cwd: Path, mpi_ranks: int = 0, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `dlio_ckpt ARGS` (under `mpirun -n N` when mpi_ranks > 0) and capture its output; a
    serial run is forked from a process that has the package imported already (cli_fork.py), and so
    is each rank of an MPI run (rank_fork.py)."""
    command = [str(BIN / "dlio_ckpt"), *args]
    if not mpi_ranks:
        return run_forked(command, cwd, cli_env(), timeout)
    command = rank_fork.command(mpi_ranks, command)
    return subprocess.run(command, cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout)


def load_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def made_once(folder: Path, name: str, make) -> Path:
    """folder/name made by make(path) once per test session, whichever xdist worker needs it first:
    under an exclusive lock, skipped where another worker finished it (a `.done` marker). For
    expensive runs several tests only read: with worksteal, a module's tests can land on every
    worker, and a module-scoped fixture would run once on each."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    path, done = folder / name, folder / f".{name}.done"
    with open(folder / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            make(path)
            done.touch()
    return path


def session_folder(tmp_path_factory) -> Path:
    """A temporary folder all the session's xdist workers share (their own ones sit in it)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"


def made_run(tmp_path_factory, name: str, args, mpi_ranks: int = 0) -> tuple[Path, str]:
    """A dlio_ckpt run made once per session (made_once) in a shared folder, for tests that only
    read it: the folder (args(folder) gives the run's arguments; its working folder is folder/cwd)
    and what the run printed."""
    def make(folder: Path) -> None:
        (folder / "cwd").mkdir(parents=True, exist_ok=True)
        done = run_cli(args(folder), folder / "cwd", mpi_ranks=mpi_ranks)
        assert done.returncode == 0, done.stderr
        (folder / "stdout.txt").write_text(done.stdout)

    folder = made_once(session_folder(tmp_path_factory), name, make)
    return folder, (folder / "stdout.txt").read_text()


@pytest.fixture
def tensorflow_without_keras(monkeypatch) -> None:
    """Runs this test starts import TensorFlow without Keras: `import tensorflow` (2.16+) loads
    Keras 3 eagerly, and Keras scikit-learn, ~2 of its ~5.5 s of CPU, unless TF_USE_LEGACY_KERAS asks
    for tf_keras, whose absence it then skips. For runs that use only tf.data, tf.io and
    tf.train (dlio_ckpt uses no Keras); not for the real Keras applications."""
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "cwd").mkdir()
    return tmp_path


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server in its own process on 127.0.0.1 (tests/s3_server.py), started once; the
    AWS credential variables are set for this process and every run it starts, then restored."""
    from s3_server import S3Server, credential_env

    server = S3Server().start()
    variables = credential_env(server.endpoint_url)
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield server
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.stop()


@pytest.fixture
def s3_bucket(s3_server) -> str:
    """A new, empty bucket on the session's server."""
    import uuid

    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_server.client().create_bucket(Bucket=name)
    return name
