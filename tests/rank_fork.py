"""MPI ranks of the tests' `mpirun -n N dlio_ckpt ...` runs forked from a process that has already
imported dlio_ckpt, as cli_fork.py does for serial runs.

Each rank of an MPI run used to be a fresh interpreter that imported numpy, Hydra, OmegaConf and the
package (~0.5 s of CPU a rank, two ranks a run, ~100 runs in a suite) before MPI started. Here
mpirun starts, for each rank, this file as a bare client (`python -I -S`: no site, stdlib only,
~15 ms), which hands the rank over to a server started once per test worker with those imports
done: its argv, working folder and environment, and the descriptors the launcher gave it (stdin,
stdout, stderr, and PMI_FD, the socket MPICH's process manager talks to the rank on). The server
forks the rank, which puts those descriptors back under their numbers and calls the same
`dlio_ckpt.cli.main` the console script calls; mpi4py is imported (MPI_Init) only there, after the
fork, by the rank itself, so MPI sees an ordinary process of the job. The client waits and ends with
the rank's exit status (or dies of its signal), so mpirun sees what it saw before; a SIGTERM or
SIGINT mpirun sends the client is passed on to the rank, and a client killed (MPI_Abort's clean-up)
takes its rank with it.

What cannot be handed over runs the real command: a rank with LD_PRELOAD (Darshan's runtime must
be loaded by the dynamic linker), or a launcher that gives no PMI_FD.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import sys

HEADER = struct.Struct("!Q")
# Per-rank descriptors handed over, at most: stdin, stdout, stderr, PMI_FD.
MAX_FDS = 4


# -- the client: what mpirun starts for each rank ------------------------------------------------

def client(address: str, argv: list[str]) -> None:
    """Hand this rank to the server at `address`, wait for it and end as it ended."""
    import json

    pmi = os.environ.get("PMI_FD", "")
    if "LD_PRELOAD" in os.environ or not pmi.isdigit():
        os.execv(argv[0], argv)
    numbers = [0, 1, 2, int(pmi)]
    payload = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "fds": numbers}).encode()
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(address)
    socket.send_fds(connection, [HEADER.pack(len(payload))], numbers)
    connection.sendall(payload)
    for fd in numbers:  # the rank owns PMI_FD now; stdin, stdout and stderr stay open until this client ends
        if fd > 2:
            os.close(fd)
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, lambda number, _frame: connection.sendall(bytes([number])))
    status = b""
    while len(status) < 8:
        chunk = connection.recv(8 - len(status))
        if not chunk:
            os._exit(1)  # the server went away
        status += chunk
    code, killed_by = struct.unpack("!ii", status)
    if killed_by:
        signal.signal(killed_by, signal.SIG_DFL)
        os.kill(os.getpid(), killed_by)
    os._exit(code)


# -- the test worker's side ----------------------------------------------------------------------

_servers: dict[str, object] = {}


def command(ranks: int, program_argv: list[str]) -> list[str]:
    """`mpirun -n RANKS` of this file's client for `program_argv`: the console script dlio_ckpt (argv[0]
    its path) or `python SCRIPT.py ARGS`; this test worker's server starts on first use."""
    bin_dir = os.path.dirname(sys.executable)
    return [os.path.join(bin_dir, "mpirun"), "-n", str(ranks), sys.executable, "-I", "-S", os.path.abspath(__file__),
            _address(), *program_argv]


def _address() -> str:
    """The socket of this worker's server, started on first use."""
    import subprocess
    import tempfile
    import time

    if "address" not in _servers:
        from cli_fork import PRELOAD

        address = os.path.join(tempfile.mkdtemp(prefix="dlio-ranks-"), "socket")
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, PYTHONSAFEPATH="1", PYTHONUNBUFFERED="1")
        # tests/ on sys.path only to import this file: the ranks see the console script's sys.path
        code = (f"import sys; sys.path.insert(0, {here!r}); import rank_fork; sys.path.pop(0); "
                f"rank_fork.serve({address!r}, {PRELOAD!r})")
        server = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  env=env)
        while not os.path.exists(address):  # bound after its imports (~0.5 s)
            if server.poll() is not None:
                raise RuntimeError(f"the ranks' server ended with {server.returncode}")
            time.sleep(0.02)
        _servers.update(address=address, process=server)
    return _servers["address"]


def stop_server() -> None:
    """Stop this worker's server (closing its stdin) and wait for it, so that the ranks' CPU time,
    reaped by it, reaches whoever waits for this process (`/usr/bin/time pytest`)."""
    import shutil

    server = _servers.pop("process", None)
    if server is not None:
        server.stdin.close()
        server.wait()
        shutil.rmtree(os.path.dirname(_servers.pop("address")), ignore_errors=True)


# -- the server: started once per test worker ----------------------------------------------------

def serve(address: str, preload: list[str]) -> None:
    """Accept ranks until stdin (a pipe from the test worker) closes; each is forked (_supervise)."""
    import importlib
    import select

    for module in preload:
        importlib.import_module(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address + ".new")
    listener.listen(64)
    os.rename(address + ".new", address)  # there only once it accepts
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [], 1.0)
        _reap(block=False)
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            break
        if listener in ready:
            connection, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                _supervise(connection)
            connection.close()
    listener.close()
    _reap(block=True)  # their CPU time is then this server's children's, counted by whoever waits for it


def _reap(block: bool) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _supervise(connection: socket.socket) -> None:
    """One rank: fork it, pass on the signals its client forwards, report how it ended."""
    import select

    try:
        request, fds = _request(connection)
    except Exception:  # noqa: BLE001 - a client that died before it was through: nothing to run
        os._exit(1)
    rank = os.fork()
    if rank == 0:
        connection.close()
        _rank(request, fds)  # ends the process as the console script would: it does not return here
    try:
        for fd in fds:
            os.close(fd)
        ended = os.pidfd_open(rank)
        status = None
        while status is None:
            ready, _, _ = select.select([connection, ended], [], [])
            if connection in ready:
                forwarded = connection.recv(1)
                if forwarded:
                    os.kill(rank, forwarded[0])
                    continue
                os.kill(rank, signal.SIGKILL)  # the client was killed: mpirun is taking the job down
            _, status = os.waitpid(rank, 0)
        code = os.waitstatus_to_exitcode(status)
        connection.sendall(struct.pack("!ii", max(code, 0), -min(code, 0)))
    finally:
        os._exit(0)


def _request(connection: socket.socket) -> tuple[dict, list[int]]:
    import json

    header, fds, _, _ = socket.recv_fds(connection, HEADER.size, MAX_FDS)
    size, = HEADER.unpack(header)
    payload = b""
    while len(payload) < size:
        chunk = connection.recv(size - len(payload))
        if not chunk:
            raise EOFError("the client closed its connection")
        payload += chunk
    return json.loads(payload), fds


def _rank(request: dict, fds: list[int]) -> None:
    """The rank itself: the client's descriptors under their own numbers, its folder, environment
    and argv, then the console script's `sys.exit(main())`. Its SystemExit (or exception) unwinds
    out of the server's loop, which catches nothing, so the interpreter ends the rank as it ends a
    script: atexit and mpi4py's MPI_Finalize (a Py_AtExit hook, which os._exit would skip, and
    MPICH's process manager takes a rank gone without it for a failed job), buffers flushed."""
    import fcntl

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1000) for fd in fds]  # out of the way of the numbers they go to
    for fd in fds:
        os.close(fd)
    for source, target in zip(high, request["fds"]):
        os.dup2(source, target)
        os.close(source)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = list(request["argv"])
    if len(argv) > 1 and argv[1].endswith(".py"):  # `python SCRIPT ARGS`, e.g. tests/levels_mpi_driver.py
        import runpy

        sys.argv = argv[1:]
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[1])))  # as the interpreter puts it there
        runpy.run_path(argv[1], run_name="__main__")
        sys.exit(0)
    sys.argv = argv
    from dlio_ckpt.cli import main

    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    client(sys.argv[1], sys.argv[2:])
