"""A one-node Slurm cluster on 127.0.0.1 for the tests: munged, slurmctld and slurmd from Debian's
packages (`apt-get install slurm-wlm munge`, 22.05), run in the foreground as children of the test
process with every file they write (configuration, munge key and socket, state, spool, logs, pid
files) in one temporary folder, so stopping them is waiting for our own children and removing it.

Why a real cluster: the Slurm path (submitit's sbatch script, srun's PMI, scancel) was otherwise
tested only against stand-in scripts, which share the tests' assumptions. The node is the machine
itself with its CPU count overcommitted (SlurmdParameters=config_overrides), so two 2-rank jobs of
a sweep can run side by side on a 2-core machine; no cgroups (proctrack/linuxproc, task/none), so
it runs in a container; MpiDefault=none as Debian's default, so a test asks for --mpi itself.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "sinfo", "squeue", "scancel", "scontrol", "sacct")
NODE_CPUS = 4  # overcommitted: two jobs of 2 ranks x 1 CPU at once on 2 cores
START_TIMEOUT_S = 30.0
PARTITION = "debug"


def missing() -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    absent = [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name, path=_sbin_path()) is None]
    if absent:
        return f"Slurm or munge absent ({', '.join(absent)}): apt-get install slurm-wlm munge (as root; .ci/run does)"
    if os.geteuid() != 0:
        return "slurmd starts job steps only as root here"
    return None


def _sbin_path() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def slurm_conf(folder: Path, host: str, first_job_id: int) -> str:
    """The cluster's slurm.conf: everything under `folder`, ports chosen free, one overcommitted node.

    Job ids start at `first_job_id`, not 1: MPICH names its shared-memory segment after the PMI job
    (Slurm's pmi2: job id and step), and a segment left in /dev/shm by a killed rank of an earlier
    cluster's job 1 made a new job 1 fail MPI_Init ("failed to unpack address", "Message truncated")."""
    return f"""\
ClusterName=dliotest
FirstJobId={first_job_id}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge/munge.socket
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
ReturnToService=2
# SIGKILL 30 s after scancel's SIGTERM (a site's usual value); with 5 the ranks' 3 s grace plus
# MPI_Abort (4.8 s quiet) was SIGKILLed on a loaded 2-core machine before their line was printed
KillWait=30
MinJobAge=600
InactiveLimit=0
NodeName={host} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} State=UNKNOWN
PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """Start with start(), stop with stop(); `env` is the environment that reaches this cluster."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="dlio-slurm-"))
        self.conf = self.folder / "slurm.conf"
        self.host = socket.gethostname().split(".")[0]
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.processes: list[subprocess.Popen] = []
        self.start_s = 0.0

    def start(self) -> "SlurmCluster":
        began = time.monotonic()
        for name in ("munge", "state", "spool", "log"):
            (self.folder / name).mkdir(mode=0o700)
        key = self.folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(slurm_conf(self.folder, self.host, first_job_id=random.randrange(1_000_000, 60_000_000)))
        munge = self.folder / "munge"
        self._daemon(["munged", "-F", "-f", f"--socket={munge}/munge.socket", f"--key-file={key}",
                      f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed"],
                     ready=lambda: (munge / "munge.socket").exists())
        self._daemon(["slurmctld", "-D", "-i", "-f", str(self.conf)], ready=self._controller_answers)
        self._daemon(["slurmd", "-D", "-f", str(self.conf)], ready=self._node_idle)
        self.start_s = time.monotonic() - began
        return self

    def _daemon(self, command: list[str], ready) -> None:
        log = open(self.folder / "log" / f"{command[0]}.out", "wb")
        binary = shutil.which(command[0], path=_sbin_path())
        self.processes.append(subprocess.Popen([binary, *command[1:]], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                               env=self.env, start_new_session=True))
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if self.processes[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} did not start: {self.logs()[-3000:]}")
            time.sleep(0.05)

    def _controller_answers(self) -> bool:
        return self.run(["scontrol", "ping"], check=False).returncode == 0

    def _node_idle(self) -> bool:
        done = self.run(["sinfo", "--noheader", "--format=%T"], check=False)
        return done.returncode == 0 and done.stdout.strip() == "idle"

    def run(self, command: list[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {done.stderr}")
        return done

    def wait_for_job(self, job_id: str, timeout: float = 120) -> str:
        """The job's final state (COMPLETED, CANCELLED, FAILED ...), read from slurmctld once it ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
                return state
            time.sleep(0.1)
        raise TimeoutError(f"job {job_id} still {self.job_state(job_id)} after {timeout} s")

    def job_state(self, job_id: str) -> str:
        done = self.run(["squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%T"], check=False)
        return done.stdout.split()[0] if done.returncode == 0 and done.stdout.split() else ""

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted((self.folder / "log").glob("*")) if p.is_file())

    def stop(self) -> None:
        """Cancel what still runs, end the daemons (slurmd first, munged last) and every process still
        running a step of this cluster (linuxproc tracks steps by process tree, which survives slurmd),
        then remove the folder. Each stage runs whatever the one before raised."""
        try:
            if self.processes and self.processes[-1].poll() is None:
                self.run(["scancel", "--full", f"--partition={PARTITION}"], check=False, timeout=15)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and self.run(["squeue", "--noheader"], check=False, timeout=15).stdout.strip():
                    time.sleep(0.1)
        except (OSError, subprocess.SubprocessError):
            pass
        finally:
            for process in reversed(self.processes):
                if process.poll() is None:
                    process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            self.processes.clear()
            for pid in self.step_processes():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(self.folder, ignore_errors=True)

    def step_processes(self) -> list[int]:
        """Processes started for this cluster's jobs: their environment names its slurm.conf."""
        marker = f"SLURM_CONF={self.conf}".encode() + b"\0"
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if marker in (entry / "environ").read_bytes():
                        found.append(int(entry.name))
        return found
