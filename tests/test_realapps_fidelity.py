"""The reference programs (benchmarks/realapps/) against their emulations, counted by strace.

Each test runs one tiny program and its emulation once each under strace (fidelity.py's
`measure`, no timing repeats: no time is asserted) and checks, per file class, the bytes, read
and write calls, fsyncs, renames and checkpoint read-back against issue 21's targets:
bytes within 1 %, calls within 10 %, fsyncs and renames equal, no read-back.

The known differences once widened here (np.load's read pattern, torch.save's one write per
record, DCP's planner split and fsyncs, TensorFlow's fsyncs and manifest) are gone since the
framework-faithful writers, the worker-process loader and np.load's reads were merged, and the
workloads select them: every program now meets the count targets at the tiny size, so the two
tables below are empty. An entry goes back in only with today's figure and the reason, and its
range must hold the target too. Skips, with the reason, without strace, torch or TensorFlow.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REALAPPS = Path(__file__).resolve().parents[1] / "benchmarks" / "realapps"
sys.path.insert(0, str(REALAPPS))

from fidelity import measure  # noqa: E402
from programs import PROGRAMS  # noqa: E402
from strace_io import strace_available  # noqa: E402

# Issue 21's targets, emulated / real.
BYTES_TOLERANCE = 0.01
CALLS_TOLERANCE = 0.10
# checkpoint bytes per save: the workloads describe the programs' tensors (names, nesting, types,
# shapes) and non-tensor entries, and the containers are the frameworks' byte for byte
# (tests/test_exact_bytes.py), so a save is the program's exactly, but for what a checkpoint records
# of where it is kept, which differs between the two runs (bytes either way, measured 2026-12-01):
# - ddp_dcp: DCP's .metadata pickles the checkpoint folder's path (real_checkpoints/epoch_1 beside
#   checkpoints/<run>/step_00000002): +16 B of 10,070,146 (was -6,403 B);
# - keras_tfdata: CheckpointManager's `checkpoint` state file, written as the manager writes it in
#   its own directory (ckpt-N, N its save counter), lists the time of each tracked checkpoint and
#   the manager's start as Python's repr of a float, 17 or 18 characters as the clock falls: each
#   of the 10 floats of the tiny run's 4 state writes may differ by one, 5 B a save at most: -2 B
#   of 1,555,639 (2026-12-02; +60 B when the emulation kept a folder per checkpoint, ckpt-N/ckpt-N,
#   and named it by its step; -230 B when the tag listed the latest only; -440 B before).
PER_SAVE_LOCATION_BYTES = {"ddp_dcp": 64, "keras_tfdata": 5}

# Known differences still accepted: (program, file class, count) -> the emulated/real range
# accepted, each with today's figure and the reason in a comment. Empty: at the tiny size every
# program is within the targets (measured 2026-12-01, docs/fidelity.md): checkpoint bytes per
# save as above, write calls 1.000x (ddp_dcp's 350 with its param_groups as bytes items),
# opens, fsyncs, renames and unlinks equal.
NOT_YET_FAITHFUL: dict[tuple[str, str, str], tuple[float, float]] = {}
# Calls the real program never makes, accepted today: (program, file class, count) -> how many
# more the emulation may issue in the whole tiny run (target: 0). Empty: none.
EXTRA_CALLS_NOT_YET: dict[tuple[str, str, str], int] = {}

# The traced tiny runs of these take 30-60 s on two busy cores (TensorFlow's and torchrun's
# start-up under strace), beyond the suite's budget: they run when this variable is "all".
SLOW = {"ddp_dcp", "keras_tfdata"}
SLOW_SWITCH = "DLIO_CKPT_TEST_REALAPPS"


def _skip_reason(program) -> str | None:
    if program.name in SLOW and os.environ.get(SLOW_SWITCH) != "all":
        return f"{program.name}: its traced run takes 30-60 s here; set {SLOW_SWITCH}=all to run it"
    reason = strace_available()
    if reason:
        return reason
    try:
        __import__(program.needs)
    except ImportError:
        return f"{program.name} needs {program.needs}, which is not installed"
    return None


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Each program measured once (lazily) for all the checks on it."""
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        program = PROGRAMS[name]
        reason = _skip_reason(program)
        if reason:
            pytest.skip(reason)
        if name not in cache:
            cache[name] = measure(program, "tiny", tmp_path_factory.mktemp(name), repeats=0, timeout=240)
        return cache[name]

    return get


def _check_ratio(name: str, cls: str, key: str, real: int, emulated: int, tolerance: float) -> None:
    lo, hi = NOT_YET_FAITHFUL.get((name, cls, key), (1 - tolerance, 1 + tolerance))
    assert real > 0, f"{name}: the real program has no {cls} {key}: the check would mean nothing"
    assert lo <= emulated / real <= hi, f"{name} {cls} {key}: emulated {emulated:,} / real {real:,} = {emulated / real:.3f}, accepted {lo}..{hi}"


def _check_equal(name: str, cls: str, key: str, real: int, emulated: int) -> None:
    extra = EXTRA_CALLS_NOT_YET.get((name, cls, key), 0)
    assert real <= emulated <= real + extra, f"{name} {cls} {key}: emulated {emulated}, real {real} (+{extra} accepted)"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_emulation_issues_the_programs_io(measured, name):
    result = measured(name)
    real, emu = result["io"]["real"], result["io"]["emulated"]
    saves = result["sizes"]["epochs"]
    # checkpoint bytes per save: issue 21's target, met today by every program
    per_save = result["io_ratio"]["checkpoint_bytes_per_save"]
    assert per_save["real"] > 0
    assert abs(per_save["emulated"] - per_save["real"]) <= PER_SAVE_LOCATION_BYTES.get(name, 0), per_save
    _check_ratio(name, "checkpoint", "bytes_written", real["checkpoint"]["bytes_written"], emu["checkpoint"]["bytes_written"], BYTES_TOLERANCE)
    _check_ratio(name, "checkpoint", "writes", real["checkpoint"]["writes"], emu["checkpoint"]["writes"], CALLS_TOLERANCE)
    _check_ratio(name, "checkpoint", "opens", real["checkpoint"]["opens"], emu["checkpoint"]["opens"], CALLS_TOLERANCE)
    for key in ("fsyncs", "renames", "unlinks"):
        _check_equal(name, "checkpoint", key, real["checkpoint"][key], emu["checkpoint"][key])
    # no read-back the program does not do: TensorFlow's MergeV2Checkpoints reads the shards'
    # indexes back, each whole, the same calls on both sides; an emulated index may differ by a
    # byte per tensor (its offsets' varints: tests/test_exact_bytes.py), so the bytes within 1 %
    assert emu["checkpoint"]["reads"] <= real["checkpoint"]["reads"], (real["checkpoint"], emu["checkpoint"])
    _check_ratio(name, "checkpoint", "bytes_read", real["checkpoint"]["bytes_read"] or 1,
                 emu["checkpoint"]["bytes_read"] or 1, BYTES_TOLERANCE)
    # the dataset: every file opened as often, bytes and calls
    assert real["dataset"]["files"] == emu["dataset"]["files"] == result["sizes"]["files"]
    _check_ratio(name, "dataset", "opens", real["dataset"]["opens"], emu["dataset"]["opens"], CALLS_TOLERANCE)
    _check_ratio(name, "dataset", "bytes_read", real["dataset"]["bytes_read"], emu["dataset"]["bytes_read"], BYTES_TOLERANCE)
    _check_ratio(name, "dataset", "reads", real["dataset"]["reads"], emu["dataset"]["reads"], CALLS_TOLERANCE)
    # neither side writes the dataset during training
    assert real["dataset"]["bytes_written"] == emu["dataset"]["bytes_written"] == 0
    # nothing else under the storage root on either side; dlio_ckpt's own bookkeeping (dataset
    # manifest and lease, the run's ownership marker: class "emulator") is the emulation's alone
    assert (emu["other"]["opens"], emu["other"]["writes"]) == (real["other"]["opens"], real["other"]["writes"]) == (0, 0)
    assert real["emulator"]["opens"] == 0
    assert saves >= 2


def test_strace_lines_are_tallied_per_file_class(tmp_path):
    """The counter itself, on lines as strace -ff -y -s 0 writes them (no strace needed)."""
    from strace_io import Classifier, tally

    lines = [
        'openat(AT_FDCWD</w>, "/r/data/x/f1.npz", O_RDONLY|O_CLOEXEC) = 3</r/data/x/f1.npz>',
        'read(3</r/data/x/f1.npz>, ""..., 4096) = 3328',
        'lseek(3</r/data/x/f1.npz>, -22, SEEK_END)  = 3306',
        'read(3</r/data/x/f1.npz>, "", 1)           = 0',
        'openat(AT_FDCWD</w>, "/r/data/x", O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_DIRECTORY) = 4</r/data/x>',
        'openat(AT_FDCWD</w>, "/r/data/x/.dlio_ckpt_dataset.json", O_RDONLY) = 5</r/data/x/.dlio_ckpt_dataset.json>',
        'read(5</r/data/x/.dlio_ckpt_dataset.json>, ""..., 8192) = 700',
        'openat(AT_FDCWD</w>, "/r/ck/.dlio_ckpt_owner.tmp-1-ab", O_RDWR|O_CREAT|O_TRUNC|O_CLOEXEC, 0644) = 8</r/ck/.dlio_ckpt_owner.tmp-1-ab>',
        'fsync(8</r/ck/.dlio_ckpt_owner.tmp-1-ab>) = 0',
        'rename("/r/ck/.dlio_ckpt_owner.tmp-1-ab", "/r/ck/.dlio_ckpt_owner") = 0',
        'openat(AT_FDCWD</w>, "/r/data/x/notes.txt", O_RDONLY) = 5</r/data/x/notes.txt>',
        'read(5</r/data/x/notes.txt>, ""..., 8192) = 10',
        'openat(AT_FDCWD</w>, "/r/ck/a.tmp", O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0666) = 6</r/ck/a.tmp>',
        'writev(6</r/ck/a.tmp>, [...], 3)          = 70000',
        'pwrite64(6</r/ck/a.tmp>, ""..., 64, 0) = 64',
        'fsync(6</r/ck/a.tmp>)                     = 0',
        'renameat2(AT_FDCWD</r/ck>, "a.tmp", AT_FDCWD</r/ck>, "a", RENAME_NOREPLACE) = 0',
        'rename("/r/ck/b.tmp", "/r/ck/b") = 0',
        'unlink("/r/ck/old") = 0',
        'openat(AT_FDCWD</w>, "/r/ck/missing", O_RDONLY) = -1 ENOENT (No such file or directory)',
        'read(7</usr/lib/python3/os.py>, ""..., 4096) = 4096',
        '--- SIGCHLD {si_signo=SIGCHLD} ---',
    ]
    (tmp_path / "trace.1").write_text("\n".join(lines[:14]) + "\n")
    (tmp_path / "trace.2").write_text("\n".join(lines[14:]) + "\n")
    got = tally(sorted(tmp_path.glob("trace.*")), Classifier("/r", "/r/data/x", ".npz", ("/r/ck",)))
    d, c, o, e = (got[k].as_dict() for k in ("dataset", "checkpoint", "other", "emulator"))
    assert (d["opens"], d["reads"], d["seeks"], d["bytes_read"], d["files"]) == (1, 2, 1, 3328, 1)
    assert d["read_sizes"] == {"0": 1, "4KiB": 1}
    assert (o["opens"], o["reads"], o["bytes_read"]) == (1, 1, 10)
    assert (e["opens"], e["reads"], e["bytes_read"], e["fsyncs"], e["renames"]) == (2, 1, 700, 1, 1)
    # the folder holding the run's ownership marker (opened to fsync it) is the emulator's too
    folder = tmp_path / "root" / "ck" / "run"
    folder.mkdir(parents=True)
    classifier = Classifier(str(tmp_path / "root"), str(tmp_path / "root" / "data"), ".npz", (str(tmp_path / "root" / "ck"),))
    assert classifier.classify(str(folder)) == "checkpoint"
    (folder / ".dlio_ckpt_owner").write_text("{}")
    assert classifier.classify(str(folder)) == "emulator"
    assert (c["opens"], c["writes"], c["bytes_written"], c["fsyncs"], c["renames"], c["unlinks"]) == (1, 2, 70064, 1, 2, 1)
    assert c["write_sizes"] == {"64B": 1, "128KiB": 1}
    assert c["files"] == 4  # a.tmp, a, b, old
