"""Write a Darshan 3.41 log of a run from its events, in pure Python (struct + zlib).

The log is what HPC centres already analyse (darshan-util, PyDarshan, `darshan summary`), so a
dlio_ckpt run can be compared with a real application's log in the same tools. darshan-runtime
is not needed: the POSIX counters, DXT traces and heat map are computed from the events by the
runtime's own rules (darshan_posix, darshan_dxt), and laid out as the 3.41 format asks
(shared/docs/darshan-log-format.md): an uncompressed header, then zlib regions for the job, the
names and each module, with one zlib stream per rank in module regions as the runtime writes them.

`write_darshan_log` makes the records from the ranks' events a block at a time and compresses the
regions as it writes them (darshan_stream.py, darshan_shared.py), so a run of millions of files
is written in the memory of a few blocks; `build_log_contents` and `encode_log` make the same log
in memory, every record at once: the reference the streamed log is compared with in the tests.
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
import shutil
from typing import IO, Iterator, Mapping, Sequence

import numpy as np

from dlio_ckpt.storage.events import RankEvents
from dlio_ckpt.trace.darshan_dxt import HEATMAP_POSIX_NAME, DxtRecord, HeatmapRecord, dxt_bytes, dxt_records, heatmap_record
from dlio_ckpt.trace.darshan_hash import darshan_hash
from dlio_ckpt.trace.darshan_posix import PosixRecord, rank_records, reduce_shared
from dlio_ckpt.trace.darshan_shared import NAMED, SHARED, CrossRank, Rechunk, reduces
from dlio_ckpt.trace.darshan_stream import EventSource, RankPass, rank_pass, temporary_file

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
    return record.pack(darshan_hash(record.name))


def _dxt_bytes(record: DxtRecord) -> bytes:
    return dxt_bytes(darshan_hash(record.name), record.rank, record.hostname, record.writes, record.reads)


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
    for module_id in sorted(modules):
        region = modules[module_id]
        if not region:
            continue
        mod_map[module_id] = (offset + len(body), len(region))
        body += region
    return _header(name_map, mod_map) + bytes(body)


def _header(name_map: tuple[int, int], mod_map: Sequence[tuple[int, int]]) -> bytes:
    """The log's first HEADER_SIZE bytes: version, magic, the name region's and each module
    region's (offset, length), and the version of each module present."""
    versions = [MODULE_VERSIONS[module] if length else 0 for module, (_, length) in enumerate(mod_map)]
    header = struct.pack("<8sqB7xQ", LOG_VERSION.ljust(8, b"\0"), MAGIC, 0, 0)
    header += struct.pack("<QQ", *name_map)
    header += b"".join(struct.pack("<QQ", off, length) for off, length in mod_map)
    header += struct.pack(f"<{MODULE_SLOTS}I", *versions)
    assert len(header) == HEADER_SIZE
    return header


class ZlibStreams:
    """A region of one or more zlib streams back to back, compressed as it is written into `out`
    (as zlib.compress of each stream's whole bytes, a buffer at a time)."""

    BUFFER = 1 << 18

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.size = 0
        self._compressor = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def begin(self) -> None:
        self._compressor = None

    def write(self, data: bytes) -> None:
        if self._compressor is None:
            self._compressor = zlib.compressobj()
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= self.BUFFER:
            self._emit(self._compressor.compress(b"".join(self._pending)))

    def end(self) -> None:
        """Close the stream begun; a stream given no bytes leaves none (as `_streams` does)."""
        if self._compressor is not None:
            self._emit(self._compressor.compress(b"".join(self._pending)) + self._compressor.flush())
            self._compressor = None

    def _emit(self, data: bytes) -> None:
        self._pending, self._pending_bytes = [], 0
        self.out.write(data)
        self.size += len(data)


def write_darshan_log(path: Path | str, ranks: Sequence[RankEvents | Path | str], job: JobInfo,
                      cwd: str | None = None) -> Path:
    """Write the log of `ranks` (events in memory, or the ranks' event files, read a block at a
    time) to `path` (a file, or a folder to name it in) and return its path.

    The log holds what `encode_log(build_log_contents(ranks, job), job)` holds, made in memory that
    does not grow with the files or events (darshan_stream.py, darshan_shared.py): the regions are
    compressed as they are made, the name region into the log itself, the POSIX and DXT_POSIX
    regions into temporary files appended after it, and the header, which gives their offsets,
    written last. The bytes go to `<name>.darshan_partial` first and are renamed when complete, as
    the runtime does, so a reader never sees half a log; on an error the partial file and every
    temporary file are removed.
    """
    target = Path(path)
    if target.is_dir():
        target = target / darshan_log_name(job)
    partial = target.with_name(target.name + "_partial") if target.suffix == ".darshan" else target.with_name(target.name + ".darshan_partial")
    sources = sorted((EventSource.of_events(r) if isinstance(r, RankEvents) else EventSource.of_file(Path(r))
                      for r in ranks), key=lambda source: source.rank)
    passes: list[RankPass] = []
    try:
        with open(partial, "wb") as out, temporary_file(partial.parent) as posix_file, \
                temporary_file(partial.parent) as dxt_file:
            dxt = ZlibStreams(dxt_file)
            for source in sources:
                host = job.hostnames[source.rank] if source.rank < len(job.hostnames) else source.hostname
                dxt.begin()
                passes.append(rank_pass(source, host, partial.parent, cwd, dxt.write))
                dxt.end()
            _write_body(out, posix_file, dxt_file, dxt.size, passes, job, partial.parent)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        for rank_pass_done in passes:
            rank_pass_done.close()
    return target


def _write_body(out: IO[bytes], posix_file: IO[bytes], dxt_file: IO[bytes], dxt_size: int,
                passes: Sequence[RankPass], job: JobInfo, folder: Path) -> None:
    """Header (a placeholder until the end), job region, names, POSIX, DXT_POSIX and HEATMAP."""
    last_io = max((p.last_io for p in passes if p.event_count), default=0.0)
    end_rel = last_io if last_io > 0 else max(job.end_wall - job.start_wall, 0.0)
    out.write(bytes(HEADER_SIZE))
    out.write(zlib.compress(_job_region(job, job.start_wall, job.start_wall + end_rel)))
    names_at = out.tell()
    names, posix = ZlibStreams(out), ZlibStreams(posix_file)
    heatmaps = [h for h in (p.heatmap.finish(end_rel) for p in passes) if h is not None]
    _write_records(passes, job, names, posix, folder)
    if heatmaps:
        names.write(struct.pack("<Q", darshan_hash(HEATMAP_POSIX_NAME)) + HEATMAP_POSIX_NAME.encode("utf-8") + b"\0")
    names.end()
    name_map = (names_at, names.size) if names.size else (0, 0)
    mod_map = [(0, 0)] * MODULE_SLOTS
    for module, region, size in ((POSIX_MOD, posix_file, posix.size), (DXT_POSIX_MOD, dxt_file, dxt_size)):
        if size:
            mod_map[module] = (out.tell(), size)
            region.seek(0)
            shutil.copyfileobj(region, out, ZlibStreams.BUFFER)
    heatmap_region = _streams([_heatmap_bytes(h) for h in heatmaps])
    if heatmap_region:
        mod_map[HEATMAP_MOD] = (out.tell(), len(heatmap_region))
        out.write(heatmap_region)
    out.seek(0)
    out.write(_header(name_map, mod_map))
    out.seek(0, os.SEEK_END)


def _write_records(passes: Sequence[RankPass], job: JobInfo, names: ZlibStreams, posix: ZlibStreams,
                   folder: Path) -> None:
    """Each rank's POSIX stream (rank 0's ending with the reduced records) and, beside it, the
    name of each record id where it first occurs."""
    reduce = reduces(passes, job.mpi, job.nprocs)
    names.begin()
    if len(passes) <= 1 and not reduce:  # one rank, nothing to reduce: every record names its file
        for one in passes:
            _write_rank(one, names, posix, None, None)
        return
    with CrossRank(passes, reduce, job.nprocs, folder) as across:
        flags = across.flag_blocks()
        for number, one in enumerate(passes):
            _write_rank(one, names, posix, flags, across.shared.chunks() if number == 0 and reduce else None)


def _write_rank(rank_pass: RankPass, names: ZlibStreams, posix: ZlibStreams, flags: Rechunk | None,
                shared: Iterator[np.ndarray] | None) -> None:
    posix.begin()
    table = rank_pass.names
    for block in rank_pass.record_blocks():
        marks = flags.take(len(block)) if flags is not None else np.full(len(block), NAMED, np.uint8)
        for rid, index, body, mark in zip(block["rid"].tolist(), block["file"].tolist(), block["body"], marks.tolist()):
            if mark == SHARED:
                continue
            posix.write(bytes(body))
            if mark == NAMED:
                names.write(struct.pack("<Q", rid) + table.name(index) + b"\0")
    for block in shared or ():
        for rid, index, body in zip(block["rid"].tolist(), block["file"].tolist(), block["body"]):
            posix.write(bytes(body))
            names.write(struct.pack("<Q", rid) + table.name(index) + b"\0")
    posix.end()
