"""Check a Darshan log's bytes against its format before libdarshan-util reads them.

libdarshan-util trusts the file: one flipped byte in a real log made it assert or segfault (issue
24), because it inflates a damaged zlib stream as far as it goes and then reads records from what
came out, and because it reads records and ranks it never checks. The format has no checksum of
its own, but every region after the header is zlib-compressed, and zlib ends each stream with an
Adler-32 of the data. So here, in pure Python, the header is checked (version, magic, compression,
a region map whose regions lie inside the file without overlapping), every region is inflated
completely (each stream must end, with its checksum, exactly where the region ends) and what came
out is checked as the reader will walk it: the job struct and its text, the name list, and the
records of the modules whose layout is known here (POSIX, STDIO, LUSTRE, HEATMAP, DXT_POSIX at the
versions the 3.41 format carries), each rank being -1 or below the job's nprocs.

What is not checked here (records of other modules, and of logs in the older 3.00-3.21 formats,
whose header is checked the same way) is marked `complete=False`, and the caller parses such a log
in a child process first (darshan_input.py). The layouts come from shared/docs/darshan-log-format.md
and from PyDarshan 3.5.0's own struct definitions (darshan/backend/api_def_c.py).
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np

MAGIC = 6567223
ZLIB, BZIP2, NO_COMPRESSION = 0, 1, 2
MAX_NPROCS = 1 << 22  # ranks the accumulator and the replay allocate per-rank state for
MAX_INFLATED = 1 << 31  # bytes all regions may inflate to: PyDarshan holds them all in memory
JOB_REGION_MAX = 4096  # the reader asks for 4096 bytes and must find the whole job region in them
METADATA_SIZE = 1024


@dataclass(frozen=True)
class Layout:
    """Where a format version keeps its header fields (3.41 has 64 module slots, older ones 16)."""

    header_size: int
    partial_flag: str  # struct code of the partial flag
    name_map_at: int
    slots: int
    job_struct: int  # bytes of the job struct before its exe and mount text
    known_modules: int  # module ids the reader knows in this format


LAYOUT_341 = Layout(header_size=1328, partial_flag="Q", name_map_at=32, slots=64, job_struct=1080, known_modules=18)
LAYOUT_OLD = Layout(header_size=360, partial_flag="I", name_map_at=24, slots=16, job_struct=1064, known_modules=16)
VERSIONS = {b"3.41": LAYOUT_341, b"3.21": LAYOUT_OLD, b"3.20": LAYOUT_OLD, b"3.10": LAYOUT_OLD, b"3.00": LAYOUT_OLD}

MODULE_NAMES = ("NULL", "POSIX", "MPI-IO", "H5F", "H5D", "PNETCDF_FILE", "PNETCDF_VAR", "BG/Q", "LUSTRE", "STDIO",
                "DXT_POSIX", "DXT_MPIIO", "MDHIM", "APXC", "APMPI", "HEATMAP", "DFS", "DAOS")
# The newest record version PyDarshan 3.5.0's reader knows, per module id (0 where it is a build option).
KNOWN_VERSIONS = (1, 4, 3, 3, 2, 3, 1, 2, 2, 2, 1, 2, 1, 0, 0, 1, 1, 1)
POSIX, LUSTRE, STDIO, DXT_POSIX, HEATMAP = 1, 8, 9, 10, 15
# Records of fixed size at the version given: (version, bytes) = 16-byte base record + counters.
FIXED_RECORDS = {POSIX: (4, 16 + 69 * 8 + 17 * 8), STDIO: (2, 16 + 14 * 8 + 15 * 8)}
VARIABLE_VERSIONS = {LUSTRE: 2, DXT_POSIX: 1, HEATMAP: 1}
# Record versions that came before the 3.41 format did (darshan 3.4.0) and have not changed since, so
# a 3.41 log holds no other: libdarshan would "convert" a lower one upward and read its records askew.
SINCE_BEFORE_341 = {POSIX: 4, DXT_POSIX: 1, HEATMAP: 1}


class DamagedLog(ValueError):
    """The log's bytes break its format; the message says where and how, without the path."""


@dataclass(frozen=True)
class LogCheck:
    """A log whose header, regions and (where `complete`) records passed every check."""

    version: str
    nprocs: int
    modules: tuple[str, ...]
    complete: bool  # every record was walked here; False: some module's layout is not known here


def check_log(data: bytes) -> LogCheck:
    """The LogCheck of a Darshan log given as bytes; DamagedLog (one line) where it is damaged."""
    order, layout, version = _preamble(data)
    comp_type = data[16]
    if comp_type == BZIP2:
        raise DamagedLog("is bzip2-compressed, which PyDarshan's libdarshan-util cannot read")
    if comp_type not in (ZLIB, NO_COMPRESSION):
        raise DamagedLog(f"has compression type {comp_type} in its header (0 zlib or 2 none expected): the header is damaged")
    modules = _module_map(data, order, layout)
    name_map = struct.unpack_from(order + "QQ", data, layout.name_map_at)
    job_span = _job_span(data, layout, name_map, modules)
    _check_regions(data, layout, job_span, name_map, modules)
    budget = [MAX_INFLATED]
    job = _inflate(data, job_span, comp_type, "job", budget, limit=JOB_REGION_MAX)
    nprocs = _check_job(job, order, layout)
    if name_map[1]:
        _check_names(_inflate(data, name_map, comp_type, "name", budget), order)
    complete = True
    for module, (offset, length, ver) in sorted(modules.items()):
        region = _inflate(data, (offset, length), comp_type, _label(layout, module), budget)
        if layout is LAYOUT_341 and _check_records(module, ver, region, order, nprocs):
            continue
        complete = False
    return LogCheck(version=version, nprocs=nprocs, modules=tuple(_label(layout, m) for m in sorted(modules)),
                    complete=complete)


def _label(layout: Layout, module: int) -> str:
    return MODULE_NAMES[module] if layout is LAYOUT_341 else f"module {module}"


def _preamble(data: bytes) -> tuple[str, Layout, str]:
    if len(data) < 16:
        raise DamagedLog(f"is not a Darshan log ({len(data)} bytes, too short for a Darshan header)")
    if struct.unpack_from("<q", data, 8)[0] == MAGIC:
        order = "<"
    elif struct.unpack_from(">q", data, 8)[0] == MAGIC:
        order = ">"
    else:
        raise DamagedLog("is not a Darshan log (no Darshan magic number in its header)")
    raw = data[:8]
    text = raw.split(b"\0", 1)[0]
    if not text.startswith(b"3."):
        shown = text.decode(errors="replace")
        raise DamagedLog(f"is a Darshan log of format '{shown}', which PyDarshan 3.5 cannot read (3.00-3.41 only)")
    if text not in VERSIONS or raw.rstrip(b"\0") != text:
        shown = raw.rstrip(b"\0").decode(errors="replace")
        raise DamagedLog(f"has version string '{shown}' in its header (3.00, 3.10, 3.20, 3.21 or 3.41 expected): "
                         "the header is damaged")
    layout = VERSIONS[text]
    if len(data) < layout.header_size:
        raise DamagedLog(f"is truncated: {len(data)} bytes, shorter than the {layout.header_size}-byte Darshan header")
    return order, layout, text.decode()


def _module_map(data: bytes, order: str, layout: Layout) -> dict[int, tuple[int, int, int]]:
    """{module id: (offset, length, version)} of the modules present; damaged slots raise."""
    maps_at = layout.name_map_at + 16
    versions_at = maps_at + 16 * layout.slots
    modules = {}
    for module in range(layout.slots):
        offset, length = struct.unpack_from(order + "QQ", data, maps_at + 16 * module)
        ver = struct.unpack_from(order + "I", data, versions_at + 4 * module)[0]
        if not length:
            # darshan-runtime 3.4.7 maps a module that recorded nothing (STDIO, DXT_POSIX, HEATMAP of a
            # short process) to the log's end with length 0: nothing to read, so only past the end is damage
            if offset > len(data):
                raise DamagedLog(f"maps module slot {module} to offset {offset}, past the log's end ({len(data):,} B), "
                                 "with no length: the header is damaged")
            continue
        if layout is not LAYOUT_341:  # older formats number their modules differently
            modules[module] = (offset, length, ver)
            continue
        if module >= layout.known_modules or module == 0:
            raise DamagedLog(f"maps data to module slot {module}, which no Darshan module uses: the header is damaged")
        name = MODULE_NAMES[module]
        if ver == 0 or ver > max(KNOWN_VERSIONS[module], 1):
            raise DamagedLog(f"gives module {name} version {ver}, which PyDarshan 3.5 does not know "
                             f"(1-{KNOWN_VERSIONS[module]}): the header is damaged or the log is newer")
        if module in SINCE_BEFORE_341 and ver != SINCE_BEFORE_341[module]:
            raise DamagedLog(f"gives module {name} version {ver}, but a log of format 3.41 has version "
                             f"{SINCE_BEFORE_341[module]}: the header is damaged")
        modules[module] = (offset, length, ver)
    return modules


def _job_span(data: bytes, layout: Layout, name_map: tuple[int, int], modules: dict) -> tuple[int, int]:
    """(offset, length) of the job region: from the header's end to the name region (the reader's rule)."""
    if name_map[0]:
        end = name_map[0]
    else:
        end = next((offset for _, (offset, _, _) in sorted(modules.items()) if offset), len(data))
    if end <= layout.header_size:
        raise DamagedLog(f"has no job region (its next region starts at byte {end}, inside the "
                         f"{layout.header_size}-byte header): the header is damaged")
    return layout.header_size, end - layout.header_size


def _check_regions(data: bytes, layout: Layout, job: tuple[int, int], name_map: tuple[int, int], modules: dict) -> None:
    """Every region inside the file, after the header, none overlapping another."""
    if bool(name_map[0]) != bool(name_map[1]):
        raise DamagedLog(f"maps its name region to ({name_map[0]}, {name_map[1]}): the header is damaged")
    spans = [("job", *job)] + ([("name", *name_map)] if name_map[1] else [])
    spans += [(_label(layout, m), offset, length) for m, (offset, length, _) in modules.items()]
    size = len(data)
    for label, offset, length in spans:
        if offset < layout.header_size:
            raise DamagedLog(f"maps its {label} region to byte {offset}, inside the header: the header is damaged")
        if offset + length > size:
            raise DamagedLog(f"is truncated or its header is damaged: {size} bytes, but its {label} region "
                             f"runs to byte {offset + length}")
    ordered = sorted(spans, key=lambda span: span[1])
    for (first, offset, length), (second, next_offset, _) in zip(ordered, ordered[1:]):
        if offset + length > next_offset:
            raise DamagedLog(f"has its {first} and {second} regions overlapping (bytes {next_offset}-"
                             f"{offset + length}): the header is damaged")


def _inflate(data: bytes, span: tuple[int, int], comp_type: int, label: str, budget: list[int],
             limit: int | None = None) -> bytes:
    """A region's contents: one or more zlib streams filling it exactly, each with its checksum."""
    offset, length = span
    raw = data[offset:offset + length]
    if comp_type == NO_COMPRESSION:
        return raw
    cap = min(budget[0], limit) if limit is not None else budget[0]
    out = bytearray()
    pending = raw
    try:
        while pending:
            stream = zlib.decompressobj()
            chunk = stream.decompress(pending, cap - len(out) + 1)
            out += chunk
            if len(out) > cap:
                raise DamagedLog(f"has a {label} region that inflates to more than {cap:,} bytes"
                                 + (" (the format's limit)" if limit is not None else ""))
            if not stream.eof:
                raise DamagedLog(f"has a damaged or cut {label} region (its compressed data ends before its "
                                 "zlib stream does)")
            pending = stream.unused_data
    except zlib.error as exc:
        raise DamagedLog(f"has a damaged {label} region (zlib: {exc})") from None
    budget[0] -= len(out)
    return bytes(out)


def _check_job(job: bytes, order: str, layout: Layout) -> int:
    """nprocs of a job region whose struct and metadata are there (the reader copies a fixed length of the
    exe and mount text after them, so that text needs no terminator: old logs fill it to the end)."""
    if len(job) <= layout.job_struct:
        raise DamagedLog(f"has a job region of {len(job)} bytes, no more than the {layout.job_struct}-byte job "
                         "struct: the log is damaged")
    fields = 7 if layout is LAYOUT_341 else 5
    values = struct.unpack_from(order + f"{fields}q", job)
    nprocs = values[5] if layout is LAYOUT_341 else values[3]
    if not 1 <= nprocs <= MAX_NPROCS:
        raise DamagedLog(f"says the job ran on {nprocs} processes (1-{MAX_NPROCS:,} expected): the log is damaged")
    metadata = job[fields * 8:fields * 8 + METADATA_SIZE]
    if b"\0" not in metadata:
        raise DamagedLog("has job metadata without its terminating NUL: the log is damaged")
    return nprocs


def _check_names(names: bytes, order: str) -> None:
    """The name region is whole entries: an 8-byte record id, then a NUL-terminated name."""
    at = 0
    while at < len(names):
        end = names.find(b"\0", at + 8)
        if at + 8 > len(names) or end < 0:
            raise DamagedLog(f"has a name region that ends inside an entry (at byte {at} of {len(names)}): "
                             "the log is damaged")
        at = end + 1


def _check_records(module: int, ver: int, region: bytes, order: str, nprocs: int) -> bool:
    """Walk a module's records as the reader will; False when its layout at `ver` is not known here."""
    if module in FIXED_RECORDS:
        known, size = FIXED_RECORDS[module]
        if ver != known:
            return False
        if len(region) % size:
            raise DamagedLog(f"has a {MODULE_NAMES[module]} region of {len(region)} bytes, not whole "
                             f"{size}-byte records: the log is damaged")
        ranks = np.frombuffer(region, dtype=np.dtype(np.int64).newbyteorder(order)).reshape(-1, size // 8)[:, 1]
        bad = ranks[(ranks < -1) | (ranks >= nprocs)]
        if len(bad):
            raise DamagedLog(f"has a {MODULE_NAMES[module]} record of rank {int(bad[0])} in a job of {nprocs} "
                             "processes: the log is damaged")
        return True
    if VARIABLE_VERSIONS.get(module) != ver:
        return False
    walk = {LUSTRE: _lustre_record, DXT_POSIX: _dxt_record, HEATMAP: _heatmap_record}[module]
    at = 0
    while at < len(region):
        _header(module, region, order, at, 16, "", 0)
        _check_rank(module, region, order, at, nprocs)
        at = walk(region, order, at)
    return True


def _check_rank(module: int, region: bytes, order: str, at: int, nprocs: int) -> None:
    rank = struct.unpack_from(order + "q", region, at + 8)[0]
    if not -1 <= rank < nprocs:
        raise DamagedLog(f"has a {MODULE_NAMES[module]} record of rank {rank} in a job of {nprocs} processes: "
                         "the log is damaged")


def _header(module: int, region: bytes, order: str, at: int, size: int, fields: str, fields_at: int) -> tuple:
    """The fields of a record header of `size` bytes at `at`; a cut record raises."""
    if at + size > len(region):
        raise DamagedLog(f"has a {MODULE_NAMES[module]} record cut short (at byte {at} of its {len(region)}-byte "
                         "region): the log is damaged")
    return struct.unpack_from(order + fields, region, at + fields_at)


def _trailing(module: int, region: bytes, end: int, counts: tuple[int, ...], sizes: tuple[int, ...], what: str) -> int:
    """The end of a record whose header (ending at `end`) is followed by `counts` entries of `sizes` bytes."""
    room = len(region) - end
    need = sum(count * size for count, size in zip(counts, sizes))
    if min(counts) < 0 or need > room:
        raise DamagedLog(f"has a {MODULE_NAMES[module]} record claiming {what} that its region does not hold: "
                         "the log is damaged")
    return end + need


def _lustre_record(region: bytes, order: str, at: int) -> int:
    """base, num_comps, num_stripes, then 72-byte components and 8-byte OST ids."""
    comps, stripes = _header(LUSTRE, region, order, at, 32, "qq", 16)
    return _trailing(LUSTRE, region, at + 32, (comps, stripes), (72, 8), f"{comps} components and {stripes} stripes")


def _dxt_record(region: bytes, order: str, at: int) -> int:
    """base, shared flag, hostname[64], write_count, read_count, then 32-byte segments."""
    writes, reads = _header(DXT_POSIX, region, order, at, 104, "qq", 88)
    return _trailing(DXT_POSIX, region, at + 104, (writes, reads), (32, 32), f"{writes} writes and {reads} reads")


def _heatmap_record(region: bytes, order: str, at: int) -> int:
    """base, bin width, nbins, two pointer slots, then nbins write and nbins read bins."""
    width, nbins = _header(HEATMAP, region, order, at, 48, "dq", 16)
    if nbins and not (math.isfinite(width) and width > 0):
        raise DamagedLog(f"has a HEATMAP record with bin width {width}: the log is damaged")
    return _trailing(HEATMAP, region, at + 48, (nbins,), (16,), f"{nbins} bins")
