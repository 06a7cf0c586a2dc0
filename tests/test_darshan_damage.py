"""Damaged Darshan logs (issue 24): one flipped byte or a cut never crashes analyze or replay.

Each damaged copy of a real log (../shared/data/darshan/) and of a log with DXT traces that
dlio_ckpt wrote is given to both commands, each run in a forked child so that a crash in
libdarshan-util shows here as the child's signal instead of ending the test run. Every copy must
either read exactly as the original does (same analysis document, same replay plan) or be refused
cleanly by both: exit code 2 and one line naming the log for `dlio_ckpt-analyze`, one ConfigError
line naming replay.log for the replay. The list of flips is fixed (deterministic, fast); the cases
where the commands crashed or disagreed before the fix are named. benchmarks/darshan_damage.py
runs the broader random trial.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

import pytest

darshan = pytest.importorskip("darshan")

from conftest import run_cli  # noqa: E402
from dlio_ckpt.analysis.cli import main as analyze  # noqa: E402
from dlio_ckpt.errors import ConfigError  # noqa: E402
from dlio_ckpt.plan.replay_log import load_replay_plan  # noqa: E402
from dlio_ckpt.trace.darshan_writer import JobInfo, write_darshan_log  # noqa: E402
from trace_events import JOB_START, two_rank_job  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from darshan_damage import forked  # noqa: E402  benchmarks/darshan_damage.py: the random trial's fork

REAL_LOGS = Path(__file__).resolve().parents[2] / "shared" / "data" / "darshan" / "dlio_logs"
needs_real_logs = pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="the shared real DLIO logs are not here")

# (log, offset, new byte value): log 0 is ...2110365 (5,189 bytes), 5 is ...2110483, 20 is ...2111375.
REAL_FLIPS = [
    (0, 4599, 0),     # before: analyze SIGSEGV in libdarshan, replay accepted the log
    (0, 3852, 86),    # before: analyze refused, replay accepted
    (0, 2804, 128),   # before: replay raised a traceback
    (0, 1104, 122),   # the LUSTRE version in the header; before: replay accepted
    (5, 6514, 14),    # before: analyze SIGSEGV
    (20, 2682, 86),   # before: SIGABRT (an assertion) in both
    (20, 1636, 162),  # before: analyze SIGSEGV
    (20, 5691, 171),  # before: analyze SIGSEGV, replay accepted
    (0, 2, ord("2")),   # version "3.21": the older header layout
    (0, 5, ord("x")),   # a character after the version string
    (0, 9, 0),          # the magic number
    (0, 16, 2),         # compression "none"
    (0, 16, 1),         # bzip2
    (0, 16, 7),         # no such compression
    (0, 20, 0x55),      # header padding: not read
    (0, 33, 0x09),      # name region offset
    (0, 40, 0x10),      # name region length
    (0, 64, 0x00),      # POSIX region offset
    (0, 72, 0x07),      # POSIX region length
    (0, 48 + 16 * 40, 1),    # an unused module slot gets an offset
    (0, 48 + 16 * 40 + 8, 1),  # ... or a length
    (0, 1072 + 4 * 30, 3),   # the version of an absent module: not read
    (0, 1076, 3),       # POSIX version 4 -> 3
    (0, 1330, 0x99),    # job region
    (0, 2000, 0x00),    # name region
    (0, 2700, 0xFF),    # POSIX region
    (0, 5188, 0x00),    # HEATMAP region's last byte (its Adler-32)
]
REAL_CUTS = [(0, 1000), (0, 1328), (0, 2692), (0, 5188), (20, 4000)]
# A dlio_ckpt log with DXT traces (3 regions: POSIX, DXT_POSIX, HEATMAP): offsets from each region's end.
DXT_FLIPS = [("POSIX", -40), ("DXT_POSIX", -5), ("DXT_POSIX", -700), ("HEATMAP", -1), ("header", 1076), ("header", 1072 + 40)]


def _forked(function) -> tuple[int, str, str]:
    """(wait status, stdout, stderr) of `function()` run in a forked child (the benchmark's own
    crash-isolating fork); its return value is the exit code."""
    with tempfile.TemporaryDirectory() as folder:
        return forked(function, folder)


def _analysis(path: Path) -> tuple[int, str, str]:
    return _forked(lambda: analyze([str(path), "--json", "--no-plots"]))


def _plan(path: Path) -> tuple[int, str, str]:
    """The replay plan's figures on stdout (exit 0), or its ConfigError's line on stderr (exit 2)."""
    def load() -> int:
        try:
            plan = load_replay_plan(path)
        except ConfigError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        print(json.dumps({"totals": plan.totals(), "files": [(f.relative, f.size, f.read) for f in plan.files],
                          "ops": [calls.tolist() for calls in plan.ops], "nprocs": plan.nprocs}))
        return 0
    return _forked(load)


def _outcome(result: tuple[int, str, str], original: str, path: Path, prefix: str) -> str:
    """'same' (read as the original), 'refused' (exit 2, one line naming the log) or what went wrong."""
    status, out, err = result
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    code = os.WEXITSTATUS(status)
    if code == 0:
        return "same" if out.replace(str(path), "LOG") == original else "read differently"
    lines = err.strip().splitlines()
    if code == 2 and len(lines) == 1 and lines[0].startswith(prefix) and path.name in lines[0] and "Traceback" not in err:
        return "refused"
    return f"exit {code}: {err.strip()[-300:]}"


@functools.lru_cache(maxsize=None)
def _references(original: Path) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """The original's analysis and plan, computed once per log (a written log's path is new per test)."""
    return _analysis(original), _plan(original)


def _check_damaged(original: Path, damaged_bytes: bytes, tmp_path: Path) -> tuple[str, str]:
    damaged = tmp_path / original.name
    damaged.write_bytes(damaged_bytes)
    reference, plan_reference = _references(original)
    assert reference[0] == 0 and plan_reference[0] == 0, reference[2] + plan_reference[2]
    analysis = _outcome(_analysis(damaged), reference[1].replace(str(original), "LOG"), damaged, "dlio_ckpt-analyze: error:")
    replay = _outcome(_plan(damaged), plan_reference[1], damaged, "replay.log:")
    return analysis, replay


def _flipped(data: bytes, offset: int, value: int) -> bytes:
    changed = bytearray(data)
    changed[offset] = value if value != data[offset] else value ^ 0xFF
    return bytes(changed)


@needs_real_logs
@pytest.mark.parametrize("log, offset, value", REAL_FLIPS)
def test_a_flipped_byte_in_a_real_log_is_read_as_before_or_refused_by_both(tmp_path, log, offset, value):
    original = sorted(REAL_LOGS.glob("*.darshan"))[log]
    analysis, replay = _check_damaged(original, _flipped(original.read_bytes(), offset, value), tmp_path)
    assert analysis in ("same", "refused") and replay == analysis, (analysis, replay)


@needs_real_logs
def test_the_header_partial_flag_is_read_as_a_partial_module_not_as_damage(tmp_path):
    """Bytes 24-31 of the header are darshan-runtime's partial flags, one bit per module: any value
    is valid. Setting POSIX's bit is a log whose POSIX data ran out of room: analyze reads it and
    warns that POSIX totals are lower bounds (and names the module), replay plans it as before."""
    original = sorted(REAL_LOGS.glob("*.darshan"))[0]
    damaged = tmp_path / original.name
    damaged.write_bytes(_flipped(original.read_bytes(), 24, 0x02))
    code, text, _ = _analysis(damaged)
    assert code == 0
    assert f"POSIX in {original.name}" in text and "partial log" in text
    assert _outcome(_plan(damaged), _references(original)[1][1], damaged, "replay.log:") == "same"


@needs_real_logs
@pytest.mark.parametrize("log, length", REAL_CUTS)
def test_a_cut_real_log_is_refused_by_both(tmp_path, log, length):
    original = sorted(REAL_LOGS.glob("*.darshan"))[log]
    assert _check_damaged(original, original.read_bytes()[:length], tmp_path) == ("refused", "refused")


@pytest.fixture
def dxt_log(tmp_path: Path) -> Path:
    job = JobInfo(nprocs=2, jobid=7, uid=os.getuid(), start_wall=JOB_START, end_wall=JOB_START + 2,
                  exe="python3 -m dlio_ckpt", hostnames=("node0", "node1"))
    return write_darshan_log(tmp_path / "orig.darshan", two_rank_job(tmp_path / "fs"), job)


def _region_end(data: bytes, name: str) -> int:
    slot = {"POSIX": 1, "DXT_POSIX": 10, "HEATMAP": 15}[name]
    offset, length = (int.from_bytes(data[48 + 16 * slot + i:56 + 16 * slot + i], "little") for i in (0, 8))
    return offset + length


@pytest.mark.parametrize("region, offset", DXT_FLIPS)
def test_a_flipped_byte_in_a_log_with_dxt_traces_is_read_as_before_or_refused_by_both(tmp_path, dxt_log, region, offset):
    data = dxt_log.read_bytes()
    at = offset if region == "header" else _region_end(data, region) + offset
    damaged_dir = tmp_path / "damaged"
    damaged_dir.mkdir()
    analysis, replay = _check_damaged(dxt_log, _flipped(data, at, 0x5A), damaged_dir)
    assert analysis in ("same", "refused") and replay == analysis, (analysis, replay)


@needs_real_logs
def test_replay_of_a_damaged_log_exits_2_with_one_line_and_writes_nothing(tmp_path):
    original = sorted(REAL_LOGS.glob("*.darshan"))[20]
    damaged = tmp_path / original.name
    damaged.write_bytes(_flipped(original.read_bytes(), 2682, 86))  # before: SIGABRT in libdarshan
    (tmp_path / "cwd").mkdir()
    root, run = tmp_path / "root", tmp_path / "run"
    done = run_cli(["workload=replay", f"replay.log={damaged}", "progress=false", f"storage.root={root}",
                    f"hydra.run.dir={run}"], tmp_path / "cwd")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "replay.log:" in lines[0] and damaged.name in lines[0], done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert not root.exists() and not run.exists()
    assert sorted(p.name for p in (tmp_path / "cwd").iterdir()) == []


EXAMPLES = Path(darshan.__file__).parent / "examples" / "example_logs"
# PyDarshan's own example in the older 3.21 format (16 module slots, other module numbers): its
# records are not walked by the byte check, so the log goes through the forked probe as well.
OLD_FORMAT_FLIPS = [(24, 0x77), (40 + 16 * 1, 0x00), (2000, 0x13), (3966, 0x00)]


@pytest.mark.parametrize("offset, value", OLD_FORMAT_FLIPS)
def test_a_flipped_byte_in_an_older_format_log_is_read_as_before_or_refused_by_both(tmp_path, offset, value):
    original = EXAMPLES / "ior_hdf5_example.darshan"
    analysis, replay = _check_damaged(original, _flipped(original.read_bytes(), offset, value), tmp_path)
    assert analysis in ("same", "refused") and replay == analysis, (analysis, replay)


def test_a_crash_while_probing_a_log_is_one_line_not_a_signal(monkeypatch):
    from dlio_ckpt.trace import darshan_input

    assert not darshan_input.read_checked(str(EXAMPLES / "ior_hdf5_example.darshan")).complete  # so it is probed
    monkeypatch.setattr(darshan_input, "_read_everything", lambda path: os.kill(os.getpid(), signal.SIGSEGV))
    with pytest.raises(darshan_input.BadDarshanLog, match=r"crash \(SIGSEGV\)"):
        darshan_input.open_report(str(EXAMPLES / "ior_hdf5_example.darshan"))
    monkeypatch.setattr(darshan_input, "_read_everything", lambda path: time.sleep(30))
    started = time.monotonic()
    with pytest.raises(darshan_input.BadDarshanLog, match="within 0 s"):
        darshan_input.probe_in_child(str(EXAMPLES / "ior_hdf5_example.darshan"), timeout_s=0.3)
    assert time.monotonic() - started < 10


def _rewrite_region(data: bytes, slot: int, edit) -> bytes:
    """`data` with module `slot`'s region inflated, edited, recompressed (valid zlib) and the maps after it moved."""
    offset, length = struct.unpack_from("<QQ", data, 48 + 16 * slot)
    raw = bytearray(zlib.decompress(data[offset:offset + length]))  # dlio_ckpt writes one stream per rank: take the first
    stream = zlib.decompressobj()
    stream.decompress(data[offset:offset + length])
    edit(raw)
    packed = zlib.compress(bytes(raw)) + stream.unused_data
    out = bytearray(data[:offset]) + packed + data[offset + length:]
    struct.pack_into("<QQ", out, 48 + 16 * slot, offset, len(packed))
    for other in range(64):
        at, size = struct.unpack_from("<QQ", out, 48 + 16 * other)
        if size and at > offset:
            struct.pack_into("<QQ", out, 48 + 16 * other, at + len(packed) - length, size)
    return bytes(out)


@pytest.mark.parametrize("slot, field_at, value, expected", [
    (1, 8, 7, "POSIX record of rank 7 in a job of 2 processes"),
    (10, 8, 9, "DXT_POSIX record of rank 9 in a job of 2 processes"),
    (10, 96, 1000, "DXT_POSIX record claiming"),  # read_count: 1,000 reads the region does not hold
])
def test_records_libdarshan_would_index_or_read_past_are_refused(dxt_log, slot, field_at, value, expected):
    from dlio_ckpt.trace.darshan_check import DamagedLog, check_log

    data = _rewrite_region(dxt_log.read_bytes(), slot, lambda raw: struct.pack_into("<q", raw, field_at, value))
    with pytest.raises(DamagedLog, match=expected):
        check_log(data)
