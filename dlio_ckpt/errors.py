"""Errors that the command line turns into a one-line message and exit code 2.

A user who mistypes a key or asks for something impossible should see what is wrong and what is
allowed, not a traceback; everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
from typing import Iterable

USAGE_EXIT_CODE = 2


class UserError(Exception):
    """Bad input from the user: reported in one line, exit code 2, nothing written."""


class ConfigError(UserError):
    """A configuration key, type or value that cannot be run."""


class MissingDependency(UserError):
    """An optional dependency that the chosen feature needs is not installed."""


class CorruptCheckpoint(Exception):
    """A checkpoint on disk that fails verification (size or checksum)."""


def close_match(word: str, choices: Iterable[str]) -> str:
    """Return ' (did you mean X?)' for the closest choice, or '' when nothing is close."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{matches[0]}'?)" if matches else ""
