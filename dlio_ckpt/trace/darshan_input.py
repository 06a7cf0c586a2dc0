"""Darshan logs given as input (replay.log, dlio_ckpt-analyze): checked before PyDarshan opens them.

libdarshan-util trusts the file it reads: one flipped byte in a real log made it assert or
segfault, taking the whole command down with a signal (issue 24). So every log, for every command,
goes through this one door: its bytes are checked against the format first (darshan_check.py:
header, region map, every zlib stream inflated with its checksum, the job, names and records),
and a log whose records this check cannot walk (an older format, a module whose layout is not
known here) is first read by PyDarshan in a forked child process, so that a crash there becomes
one line naming the problem, never a signal in the caller. PyDarshan then runs with the C stderr
captured: whatever it says becomes part of one message, never loose lines on the terminal.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import tempfile
import time
from typing import Any, Iterator

from dlio_ckpt.optional import require
from dlio_ckpt.trace.darshan_check import DamagedLog, LogCheck, check_log

PROBE_TIMEOUT_S = 120.0  # reading a log PyDarshan can read takes well under a second per MB


class BadDarshanLog(ValueError):
    """A file that is not a complete Darshan log; the message says why, without the path."""


def read_checked(path: str) -> LogCheck:
    """The LogCheck of the log at `path`; BadDarshanLog (one line, no path) when it is not usable."""
    if not os.path.exists(path):
        raise BadDarshanLog("no such file")
    if not os.path.isfile(path):
        raise BadDarshanLog("is not a file")
    try:
        with open(path, "rb") as log:
            data = log.read()
    except OSError as exc:
        raise BadDarshanLog(f"cannot be read ({exc.strerror})") from None
    if not data:
        raise BadDarshanLog("is empty (0 bytes)")
    try:
        return check_log(data)
    except DamagedLog as exc:
        raise BadDarshanLog(str(exc)) from None


@contextlib.contextmanager
def captured_c_stderr() -> Iterator[list[str]]:
    """Send file descriptor 2 (where libdarshan-util prints) to a temporary file for the block;
    the lines it printed are in the yielded list afterwards."""
    lines: list[str] = []
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(line.strip() for line in sink.read().decode(errors="replace").splitlines() if line.strip())


def open_report(path: str) -> Any:
    """`darshan.DarshanReport(path, read_all=True)` of a checked log; BadDarshanLog (one line) if it is
    not usable. Both commands read every record here, so that what the analysis refuses the replay
    refuses too (the replay used to open without the records and read them later unchecked)."""
    checked = read_checked(path)
    darshan = require("darshan")
    if not checked.complete:
        probe_in_child(path)
    with captured_c_stderr() as said:
        try:
            report = darshan.DarshanReport(path, read_all=True)
            error = None
        except Exception as exc:  # PyDarshan raises RuntimeError, ValueError, ... for bad input
            report, error = None, " ".join(str(exc).split()) or type(exc).__name__
    complaints = [line for line in said if "error" in line.lower()]
    if error is not None or complaints:
        detail = "; ".join(([error] if error else []) + complaints[:2])
        raise BadDarshanLog(f"cannot be read by PyDarshan ({detail})")
    return report


def probe_in_child(path: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Read the whole log with PyDarshan in a forked child first; BadDarshanLog when that child dies
    by a signal (libdarshan-util asserting or segfaulting on it), raises, or does not finish in time."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: read everything the commands read, then leave without cleanup
        code = 0
        try:
            faulthandler.disable()  # its crash is told by the parent, in one line
            os.close(reader)
            with open(os.devnull, "wb") as sink:
                os.dup2(sink.fileno(), 1)
                os.dup2(sink.fileno(), 2)
            _read_everything(path)
        except BaseException as exc:  # noqa: BLE001 - told to the parent in one line
            os.write(writer, (" ".join(str(exc).split()) or type(exc).__name__).encode()[:300])
            code = 3
        os._exit(code)
    os.close(writer)
    try:
        status = _wait(pid, timeout_s)
        said = os.read(reader, 400).decode(errors="replace")
    finally:
        os.close(reader)
    if status is None:
        raise BadDarshanLog(f"could not be read by PyDarshan within {timeout_s:.0f} s: the log is damaged")
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        raise BadDarshanLog(f"makes PyDarshan's libdarshan-util crash ({name}) while reading it: the log is damaged")
    if os.WEXITSTATUS(status):
        raise BadDarshanLog(f"cannot be read by PyDarshan ({said or 'it failed'})")


def _wait(pid: int, timeout_s: float) -> int | None:
    """The child's wait status, or None after killing it at the deadline."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _read_everything(path: str) -> None:
    """What the analysis and the replay read of a log: every module's records, as frames, and
    PyDarshan's accumulator over the POSIX records."""
    darshan = require("darshan")
    report = darshan.DarshanReport(path, read_all=True)
    for module, records in report.records.items():
        if hasattr(records, "to_df"):
            records.to_df()
    if "POSIX" in report.records and len(report.records["POSIX"]):
        frames = report.records["POSIX"].to_df()
        accumulate = require("darshan.backend.cffi_backend").accumulate_records
        accumulate(frames, "POSIX", int(report.metadata["job"]["nprocs"]))
