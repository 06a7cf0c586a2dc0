"""The World: this process's rank, the job's size and the communicator, passed in everywhere.

Nothing in the package reads MPI state globally; code that needs ranks takes a World. A serial
World (rank 0 of 1, no communicator) lets every layer run and be tested without mpirun, and
`World.planned(size)` stands for a job of any size in plan mode, where nothing communicates.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

# Seconds a failing rank waits, its error line flushed, before MPI_Abort (World.abort).
ABORT_GRACE_S = 0.3
# A rank waiting for others (wait_politely) spins this long, then sleeps between tests of its
# request, from POLL_FIRST_S up to POLL_MAX_S.
POLL_SPIN_S = 100e-6
POLL_FIRST_S = 50e-6
POLL_MAX_S = 1e-3

# Environment variables that MPI launchers set in every process they start.
_LAUNCHER_VARIABLES = (
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "MPI_LOCALNRANKS",
    "HYDRA_CONTROL_FD",
)


def launched_by_mpi(environ: dict[str, str] | None = None) -> bool:
    """True when an MPI launcher (mpirun, mpiexec, srun with PMI) started this process."""
    env = os.environ if environ is None else environ
    if env.get("DLIO_CKPT_SERIAL") == "1":
        return False
    return any(name in env for name in _LAUNCHER_VARIABLES) or env.get("DLIO_CKPT_MPI") == "1"


def launcher_rank(environ: dict[str, str] | None = None) -> int:
    """This process's rank as the launcher set it, readable before MPI starts (so that only rank 0
    prints a start-up message): MPICH/PMI, PMIx, Open MPI and Slurm's variables; 0 when serial."""
    env = os.environ if environ is None else environ
    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        if env.get(name, "").isdigit():
            return int(env[name])
    return 0


@dataclass(frozen=True)
class World:
    """Rank and size of the job, with the few collectives the engine and metrics need."""

    rank: int
    size: int
    comm: Any = None

    @classmethod
    def serial(cls) -> "World":
        return cls(rank=0, size=1, comm=None)

    @classmethod
    def from_environment(cls) -> "World":
        """An MPI world when launched by mpirun/srun, otherwise a serial one (no MPI import)."""
        if not launched_by_mpi():
            return cls.serial()
        from mpi4py import MPI  # imported only under a launcher: MPI_Init happens here

        comm = MPI.COMM_WORLD
        return cls(rank=comm.Get_rank(), size=comm.Get_size(), comm=comm)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.comm is not None and self.size > 1

    def barrier(self) -> None:
        if self.comm is not None:
            wait_politely(self.comm.Ibarrier())

    def bcast(self, value: Any, root: int = 0) -> Any:
        if self.comm is None:
            return value
        self.barrier()
        return self.comm.bcast(value, root=root)

    def gather(self, value: Any, root: int = 0) -> list[Any] | None:
        if self.comm is None:
            return [value]
        self.barrier()
        return self.comm.gather(value, root=root)

    def scatter(self, values: list[Any] | None, root: int = 0) -> Any:
        """Each rank's own item of the root's `values` (a list of one per rank)."""
        if self.comm is None:
            return values[0]
        self.barrier()
        return self.comm.scatter(values, root=root)

    def allgather(self, value: Any) -> list[Any]:
        if self.comm is None:
            return [value]
        self.barrier()
        return self.comm.allgather(value)

    def send(self, buffer: Any, dest: int, tag: int) -> None:
        """A point-to-point send that waits for its receiver without spinning (wait_politely)."""
        wait_politely(self.comm.Isend(buffer, dest=dest, tag=tag))

    def allreduce_buffer(self, send: Any, receive: Any) -> None:
        """Sum the numpy buffer `send` over the ranks into `receive`: a data-parallel step's gradient
        all-reduce (engine/step_sync.py). The ranks meet first (barrier), then the all-reduce runs
        blocking: a non-blocking one progresses only while tested, and tested between sleeps it
        took 2-5x as long (4.9 MB, 2 ranks: 6-28 ms against 5-11 ms)."""
        if self.comm is None:
            receive[...] = send
            return
        self.barrier()
        self.comm.Allreduce(send, receive)

    def allreduce_max(self, value: float) -> float:
        return max(self.allgather(value))

    def allreduce_sum(self, value: float) -> float:
        return sum(self.allgather(value))

    def agree(self, ok: bool) -> bool:
        """True only when every rank says ok: one rank's failure becomes everyone's."""
        return all(self.allgather(bool(ok)))

    def abort(self, code: int) -> None:
        """End the whole job now: a failed rank must not leave the others waiting in a collective."""
        sys.stdout.flush()
        sys.stderr.flush()
        if self.parallel:
            # The launcher forwards this rank's stderr through a pipe it reads on its own time, and
            # MPI_Abort kills the job at once: under load the one line said was lost (seen: exit 1,
            # empty stderr). A short pause lets it reach the terminal before the job ends.
            time.sleep(ABORT_GRACE_S)
            # MPICH adds its own "Abort(N) on node 0 ..." line to this rank's, which is out already
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            self.comm.Abort(code)
        raise SystemExit(code)

    def root_first(self, action: Callable[[], Any]) -> Any:
        """Run `action` on rank 0 and broadcast its result (or its error) to every rank."""
        result: tuple[str, Any]
        if self.is_root:
            try:
                result = ("ok", action())
            except Exception as exc:  # sent to the other ranks, raised again everywhere
                result = ("error", exc)
        else:
            result = ("ok", None)
        status, value = self.bcast(result)
        if status == "error":
            raise value
        return value


def wait_politely(request: Any) -> None:
    """Wait for a non-blocking MPI request by testing it with growing sleeps in between.

    MPICH's blocking calls spin: a rank waiting at a barrier while another writes a checkpoint
    or its summary burns a whole core (measured: 2.2 s of CPU in a 2 s wait). Where ranks share
    cores with each other, with their own I/O threads or with other jobs, that CPU comes out of
    the work being measured. So every collective first meets its ranks here (World.barrier),
    then runs blocking with nothing left to wait for. It spins for POLL_SPIN_S first (ranks that
    arrive together, as at a per-step check, meet at once), then sleeps from POLL_FIRST_S up to
    POLL_MAX_S between tests: a rank sees the others arrive at most about that late (1 ms), far
    below any timed phase, and the wait still ends on Ctrl-C."""
    spin_until = time.perf_counter() + POLL_SPIN_S
    while not request.Test():  # ranks arriving together (a per-step check) meet without a sleep
        if time.perf_counter() > spin_until:
            break
    else:
        return
    delay = POLL_FIRST_S
    while not request.Test():
        time.sleep(delay)
        delay = min(delay * 2, POLL_MAX_S)


def rank_slices(count: int, size: int) -> Sequence[tuple[int, int]]:
    """Split `count` items into `size` contiguous [start, stop) ranges that differ by at most one."""
    base, extra = divmod(count, size)
    bounds = []
    start = 0
    for rank in range(size):
        stop = start + base + (1 if rank < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
