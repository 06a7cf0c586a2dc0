"""Darshan logs given as input (replay.log, dlio_ckpt-analyze): checked before PyDarshan opens them.

libdarshan-util prints its own `Error:` lines on the C stderr and PyDarshan may still return a
report of a truncated log, whose missing modules then read as zero bytes. So a log is first
checked here against its own header (the magic number and, for the 3.41 format that dlio_ckpt and
current Darshan write, every region the header maps lying inside the file; older layouts differ),
and PyDarshan runs with the C stderr captured: whatever it says becomes part of one message, never
loose lines on the terminal.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
from typing import Any, Iterator

from dlio_ckpt.optional import require
from dlio_ckpt.trace.darshan_writer import HEADER_SIZE, LOG_VERSION, MAGIC, MODULE_SLOTS

_PREAMBLE = struct.Struct("<8sqB7xQ")  # version string, magic, compression, partial flag
_REGION = struct.Struct("<QQ")  # (offset, length) of the name region and of each module's region


class BadDarshanLog(ValueError):
    """A file that is not a complete Darshan log; the message says why, without the path."""


def log_problem(path: str) -> str | None:
    """Why `path` is not a complete Darshan log (missing, empty, not Darshan, truncated), or None."""
    if not os.path.exists(path):
        return "no such file"
    if not os.path.isfile(path):
        return "is not a file"
    size = os.path.getsize(path)
    if size == 0:
        return "is empty (0 bytes)"
    try:
        with open(path, "rb") as log:
            header = log.read(HEADER_SIZE)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if len(header) < _PREAMBLE.size:
        return f"is not a Darshan log ({size} bytes, too short for a Darshan header)"
    version, magic, _, _ = _PREAMBLE.unpack_from(header)
    order = "<" if magic == MAGIC else ">" if struct.unpack_from(">q", header, 8)[0] == MAGIC else None
    if order is None:
        return "is not a Darshan log (no Darshan magic number in its header)"
    if len(header) < HEADER_SIZE:
        return f"is truncated: {size} bytes, shorter than the {HEADER_SIZE}-byte Darshan header"
    if not version.rstrip(b"\0").startswith(b"3."):
        return f"is a Darshan log of format {version.rstrip(bytes(1)).decode(errors='replace')}, which PyDarshan 3.4 cannot read"
    if version.rstrip(b"\0") != LOG_VERSION:
        return None  # older header layouts differ: PyDarshan's own complaints are the check there
    region = struct.Struct(order + "QQ")
    maps = [region.unpack_from(header, _PREAMBLE.size + i * region.size) for i in range(1 + MODULE_SLOTS)]
    end = max((offset + length for offset, length in maps if length), default=HEADER_SIZE)
    if end > size:
        return f"is truncated: {size} bytes, but its header maps data up to byte {end}"
    return None


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


def open_report(path: str, read_all: bool) -> Any:
    """`darshan.DarshanReport(path)` of a checked log; BadDarshanLog (one line) if it is not usable."""
    problem = log_problem(path)
    if problem:
        raise BadDarshanLog(problem)
    darshan = require("darshan")
    with captured_c_stderr() as said:
        try:
            report = darshan.DarshanReport(path, read_all=read_all)
            error = None
        except Exception as exc:  # PyDarshan raises RuntimeError, ValueError, ... for bad input
            report, error = None, " ".join(str(exc).split()) or type(exc).__name__
    complaints = [line for line in said if "error" in line.lower()]
    if error is not None or complaints:
        detail = "; ".join(([error] if error else []) + complaints[:2])
        raise BadDarshanLog(f"cannot be read by PyDarshan ({detail})")
    return report
