"""Write a Darshan 3.41 log of a run from its events, in pure Python (struct + zlib).

The log is what HPC centres already analyse (darshan-util, PyDarshan, `darshan summary`), so a
dlio_ckpt run can be compared with a real application's log in the same tools. darshan-runtime
is not needed: the POSIX counters, DXT traces and heat map are computed from the events by the
runtime's own rules (darshan_posix, darshan_dxt), and laid out as the 3.41 format asks
(shared/docs/darshan-log-format.md): an uncompressed header, then zlib regions for the job, the
names and each module, with one zlib stream per rank in module regions as the runtime writes them.
"""

from __future__ import annotations

import getpass
import os
import socket
import struct
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from dlio_ckpt.storage.events import RankEvents
from dlio_ckpt.trace.darshan_dxt import HEATMAP_POSIX_NAME, DxtRecord, HeatmapRecord, dxt_records, heatmap_record
from dlio_ckpt.trace.darshan_hash import darshan_hash
from dlio_ckpt.trace.darshan_posix import PosixRecord, rank_records, reduce_shared

LOG_VERSION = b"3.41"
MAGIC = 6567223
HEADER_SIZE = 1328
JOB_STRUCT_SIZE = 1080
JOB_REGION_MAX = 4096
METADATA_SIZE = 1024
EXE_AND_MOUNTS_MAX = 3015
MODULE_SLOTS = 64
POSIX_MOD, DXT_POSIX_MOD, HEATMAP_MOD = 1, 10, 15
MODULE_VERSIONS = {POSIX_MOD: 4, DXT_POSIX_MOD: 1, HEATMAP_MOD: 1}
LIB_VER = "3.5.0"  # the darshan-util release whose format this writes; `darshan summary` needs the key
# File-system types the runtime leaves out of the mount table.
_SKIPPED_FS = frozenset(("tmpfs", "proc", "sysfs", "devpts", "binfmt_misc", "fusectl", "debugfs", "securityfs",
                         "nfsd", "none", "rpc_pipefs", "hugetlbfs", "cgroup", "cgroup2"))
# Scheduler variables darshan-runtime is commonly configured to take the job id from.
JOBID_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID", "COBALT_JOBID", "LSB_JOBID", "FLUX_JOB_ID")

_POSIX_RECORD = struct.Struct("<Qq69q17d")
_DXT_HEADER = struct.Struct("<Qqq64sqq")
_HEATMAP_HEADER = struct.Struct("<QqdqQQ")
_JOB_STRUCT = struct.Struct("<7q")


@dataclass(frozen=True)
class JobInfo:
    """Job-level facts the log's job region holds; times are absolute UNIX seconds."""

    nprocs: int
    jobid: int
    uid: int
    start_wall: float
    end_wall: float
    exe: str
    hostnames: tuple[str, ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)
    mpi: bool = True  # MPI mode: files every rank touched are reduced to one rank -1 record

    @classmethod
    def for_run(cls, nprocs: int, start_wall: float, end_wall: float, hostnames: Sequence[str] = (),
                metadata: Mapping[str, str] | None = None, mpi: bool | None = None,
                environ: Mapping[str, str] | None = None) -> "JobInfo":
        """A JobInfo for this process's run: uid, command line and job id taken from here."""
        env = os.environ if environ is None else environ
        return cls(nprocs=nprocs, jobid=job_id_from_environment(env), uid=os.getuid(), start_wall=start_wall,
                   end_wall=end_wall, exe=" ".join(sys.argv) or "dlio_ckpt", hostnames=tuple(hostnames),
                   metadata=dict(metadata or {}), mpi=nprocs > 1 if mpi is None else mpi)


def job_id_from_environment(environ: Mapping[str, str]) -> int:
    """The scheduler's job id (leading digits, as the runtime's %d parse takes them), else the pid."""
    for name in JOBID_VARIABLES:
        digits = ""
        for char in environ.get(name, ""):
            if not char.isdigit():
                break
            digits += char
        if digits:
            return int(digits)
    return os.getpid()


def darshan_log_name(job: JobInfo, user: str | None = None, pid: int | None = None) -> str:
    """The runtime's default name: user_exe_id<jobid>-<pid>_<M>-<D>-<secs>-<hash>_<N>.darshan."""
    try:
        user = user or getpass.getuser()
    except (KeyError, OSError):
        user = str(job.uid)
    exe = os.path.basename(job.exe.split(" ", 1)[0]) or "python"
    local = time.localtime(job.start_wall)
    seconds = local.tm_hour * 3600 + local.tm_min * 60 + local.tm_sec
    host = job.hostnames[0] if job.hostnames else socket.gethostname()
    logmod = darshan_hash(host, level=int(job.start_wall * 1_000_000))
    pid = os.getpid() if pid is None else pid
    clean = lambda text: "".join(ch if (ch.isalnum() or ch in "-.") else "-" for ch in text)  # noqa: E731
    return f"{clean(user)}_{clean(exe)}_id{job.jobid}-{pid}_{local.tm_mon}-{local.tm_mday}-{seconds}-{logmod}_1.darshan"


def _mount_entries(limit: int) -> str:
    """`\\n<type>\\t<path>` entries from /proc/mounts, as the runtime lists them (NFS last)."""
    local, nfs, seen = [], [], set()
    try:
        with open("/proc/mounts", encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) < 3:
                    continue
                path, fstype = parts[1], parts[2]
                if fstype in _SKIPPED_FS or "\\" in path or (path, fstype) in seen:
                    continue
                seen.add((path, fstype))
                (nfs if fstype.startswith("nfs") else local).append(f"\n{fstype}\t{path}")
    except OSError:
        pass
    text = ""
    for entry in local + nfs:
        if len(text) + len(entry) > limit:
            break
        text += entry
    return text or "\nrootfs\t/"


def _metadata_text(job: JobInfo) -> bytes:
    lines = [f"lib_ver={LIB_VER}", "writer=dlio_ckpt"]
    for key, value in job.metadata.items():
        key = "".join(ch for ch in str(key) if ch not in "=\n") or "key"
        value = str(value).replace("\n", " ")
        lines.append(f"{key}={value}")
    text = b""
    for line in lines:
        encoded = (line + "\n").encode("utf-8")
        if len(text) + len(encoded) >= METADATA_SIZE:  # the NUL must still fit
            break
        text += encoded
    return text


def _job_region(job: JobInfo, start_wall: float, end_wall: float) -> bytes:
    start_sec, start_nsec = _split_time(start_wall)
    end_sec, end_nsec = _split_time(end_wall)
    head = _JOB_STRUCT.pack(job.uid, start_sec, start_nsec, end_sec, end_nsec, job.nprocs, job.jobid)
    metadata = _metadata_text(job).ljust(METADATA_SIZE, b"\0")
    exe = job.exe.replace("\n", " ")
    if len(exe) > 1024:
        exe = exe[: 1024 - len("<TRUNCATED>")] + "<TRUNCATED>"
    exe_bytes = exe.encode("utf-8")[:1024]
    mounts = _mount_entries(EXE_AND_MOUNTS_MAX - len(exe_bytes)).encode("utf-8")
    region = head + metadata + exe_bytes + mounts + b"\0"
    assert JOB_STRUCT_SIZE < len(region) <= JOB_REGION_MAX
    return region


def _split_time(wall: float) -> tuple[int, int]:
    seconds = int(wall)
    return seconds, int(round((wall - seconds) * 1e9)) % 1_000_000_000


def _posix_bytes(record: PosixRecord) -> bytes:
    return _POSIX_RECORD.pack(darshan_hash(record.name), record.rank, *record.counters, *record.fcounters)


def _dxt_bytes(record: DxtRecord) -> bytes:
    host = record.hostname.encode("utf-8")[:63]
    header = _DXT_HEADER.pack(darshan_hash(record.name), record.rank, 0, host, len(record.writes), len(record.reads))
    return header + record.writes.tobytes() + record.reads.tobytes()


def _heatmap_bytes(record: HeatmapRecord) -> bytes:
    header = _HEATMAP_HEADER.pack(darshan_hash(HEATMAP_POSIX_NAME), record.rank, record.bin_width,
                                  len(record.write_bins), 0, 0)
    return header + record.write_bins.astype("<i8").tobytes() + record.read_bins.astype("<i8").tobytes()


def _streams(chunks: Sequence[bytes]) -> bytes:
    """One zlib stream per rank's chunk, back to back (empty chunks write nothing)."""
    return b"".join(zlib.compress(chunk) for chunk in chunks if chunk)


@dataclass(frozen=True)
class LogContents:
    """Everything one log holds, before encoding; also what tests compare against."""

    posix: list[list[PosixRecord]]  # per rank, in rank order; rank 0's list ends with the shared records
    dxt: list[list[DxtRecord]]
    heatmaps: list[HeatmapRecord]
    start_wall: float
    end_wall: float


def build_log_contents(ranks: Sequence[RankEvents], job: JobInfo, cwd: str | None = None) -> LogContents:
    """Compute every record of the log from the ranks' events."""
    ordered = sorted(ranks, key=lambda r: r.rank)
    last_io = max((float(r.events["end"].max()) for r in ordered if len(r.events)), default=0.0)
    # The job ends with its last I/O: PyDarshan's heat map stretches DXT times by run_time / last
    # DXT end, so a long tail after the I/O would move every event to the left.
    end_rel = last_io if last_io > 0 else max(job.end_wall - job.start_wall, 0.0)
    per_rank = [rank_records(r, cwd) for r in ordered]
    if job.mpi:
        kept, shared = reduce_shared(per_rank, job.nprocs)
        if kept and shared:
            kept[0] = kept[0] + shared
        per_rank = kept
    hostnames = list(job.hostnames)

    def host(rank: RankEvents) -> str:
        return hostnames[rank.rank] if rank.rank < len(hostnames) else rank.hostname

    dxt = [dxt_records(r, host(r), cwd) for r in ordered]
    heatmaps = [h for h in (heatmap_record(r, end_rel) for r in ordered) if h is not None]
    return LogContents(per_rank, dxt, heatmaps, job.start_wall, job.start_wall + end_rel)


def encode_log(contents: LogContents, job: JobInfo) -> bytes:
    """The log's bytes: header, job region, names, then POSIX, DXT_POSIX and HEATMAP regions."""
    names: dict[int, str] = {}
    for records in contents.posix:
        for record in records:
            names[darshan_hash(record.name)] = record.name
    for dxt_list in contents.dxt:
        for record in dxt_list:
            names[darshan_hash(record.name)] = record.name
    if contents.heatmaps:
        names[darshan_hash(HEATMAP_POSIX_NAME)] = HEATMAP_POSIX_NAME

    body = bytearray()
    offset = HEADER_SIZE
    body += zlib.compress(_job_region(job, contents.start_wall, contents.end_wall))
    name_region = b"".join(struct.pack("<Q", rec_id) + name.encode("utf-8") + b"\0" for rec_id, name in names.items())
    name_map = (0, 0)
    if name_region:
        compressed = zlib.compress(name_region)
        name_map = (offset + len(body), len(compressed))
        body += compressed

    modules = {
        POSIX_MOD: _streams([b"".join(_posix_bytes(r) for r in records) for records in contents.posix]),
        DXT_POSIX_MOD: _streams([b"".join(_dxt_bytes(r) for r in records) for records in contents.dxt]),
        HEATMAP_MOD: _streams([_heatmap_bytes(h) for h in contents.heatmaps]),
    }
    mod_map = [(0, 0)] * MODULE_SLOTS
    versions = [0] * MODULE_SLOTS
    for module_id in sorted(modules):
        region = modules[module_id]
        if not region:
            continue
        mod_map[module_id] = (offset + len(body), len(region))
        versions[module_id] = MODULE_VERSIONS[module_id]
        body += region

    header = struct.pack("<8sqB7xQ", LOG_VERSION.ljust(8, b"\0"), MAGIC, 0, 0)
    header += struct.pack("<QQ", *name_map)
    header += b"".join(struct.pack("<QQ", off, length) for off, length in mod_map)
    header += struct.pack(f"<{MODULE_SLOTS}I", *versions)
    assert len(header) == HEADER_SIZE
    return header + bytes(body)


def write_darshan_log(path: Path | str, ranks: list[RankEvents], job: JobInfo) -> Path:
    """Write the log of `ranks` to `path` (a file, or a folder to name it in) and return its path.

    The bytes go to `<name>.darshan_partial` first and are renamed when complete, as the runtime
    does, so a reader never sees half a log.
    """
    target = Path(path)
    if target.is_dir():
        target = target / darshan_log_name(job)
    data = encode_log(build_log_contents(ranks, job), job)
    partial = target.with_name(target.name + "_partial") if target.suffix == ".darshan" else target.with_name(target.name + ".darshan_partial")
    with open(partial, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, target)
    return target
