"""Errors that the command line turns into a one-line message: exit 2 for bad input, 1 at run time.

A user who mistypes a key or asks for something impossible should see what is wrong and what is
allowed, not a traceback; a run that fails (a full disk, a rank that died) says so in one line per
failing rank and ends every rank promptly; everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import os
import sys
import typing
from typing import Any, Iterable

from dlio_ckpt.local_fs import free_bytes_at, nearest_existing

USAGE_EXIT_CODE = 2
RUN_FAILURE_EXIT_CODE = 1
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as shells report a job ended by Ctrl-C


class UserError(Exception):
    """Bad input from the user: reported in one line, exit code 2, nothing written."""


class ConfigError(UserError):
    """A configuration key, type or value that cannot be run."""


class MissingDependency(UserError):
    """An optional dependency that the chosen feature needs is not installed."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line (the usage block is for --help), exit 2."""

    def error(self, message: str) -> "typing.NoReturn":
        print(f"{self.prog}: error: {message}; see {self.prog} --help", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE)


class RunFailure(Exception):
    """A failure at run time: one line (the message; empty when another rank reports it), exit 1.

    `known_everywhere` says every rank raised it from the same collective, so each can end
    normally; otherwise only this rank knows, and it must end the whole job (MPI_Abort) before
    the others wait for it in a collective or a point-to-point transfer.
    """

    def __init__(self, message: str = "", known_everywhere: bool = False) -> None:
        super().__init__(message)
        self.known_everywhere = known_everywhere


def report_failure(message: str, world: Any) -> None:
    """Print one rank's failure as one line on stderr, now: a job that is about to be ended
    (MPI_Abort) may not get the chance later."""
    where = f" (rank {world.rank})" if world.parallel else ""
    print(f"dlio_ckpt: error{where}: {message}", file=sys.stderr, flush=True)


def failure_text(error: BaseException) -> str:
    """One line for an error that failed this rank's work: ours as they are, an OSError with its
    file and (for a full disk) the free space, anything else as its repr."""
    if isinstance(error, RunFailure):
        return str(error)
    if isinstance(error, OSError):
        if error.filename:
            return str(storage_failure(error, error.filename))
        return error.strerror or repr(error)
    return repr(error)


def storage_failure(exc: OSError, path: str) -> RunFailure:
    """One line for a failed file operation: the file, the error and, when the disk is full, the free space."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += f" ({free_space_note(path)})"
    return RunFailure(f"{path}: {reason}")


def free_space_note(path: str) -> str:
    """'N MiB free on FOLDER' for the file system that holds `path` (its nearest existing folder).
    Asked of the local file system (local_fs.py, below this module; no backend is imported here):
    only a file system reports ENOSPC/EDQUOT (an object store's errors are EIO, EACCES or ENOENT,
    see storage/s3.py), so no other backend reaches this."""
    probe = nearest_existing(os.path.abspath(path))
    try:
        free = free_bytes_at(probe)
    except OSError:
        return "free space unknown"
    return f"{free / 2**20:.1f} MiB free on {probe}"


def close_match(word: str, choices: Iterable[str]) -> str:
    """Return ' (did you mean X?)' for the closest choice, or '' when nothing is close."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{matches[0]}'?)" if matches else ""
