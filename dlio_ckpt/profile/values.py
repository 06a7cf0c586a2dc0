"""One inferred workload value with where it came from and how sure it is (pure values).

Every key the profiler writes carries one of four grades, printed beside it in the YAML:
- measured: counted or timed by darshan-runtime (or read from the file still on disk);
- inferred: derived from measured figures by a stated rule (epochs = opens per dataset file);
- given: the user said so on the command line;
- assumed: the log cannot show it; the documented default (docs/profile.md) is used and the key is
  listed under "not inferred".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MEASURED, INFERRED, GIVEN, ASSUMED = "measured", "inferred", "given", "assumed"


@dataclass(frozen=True)
class Value:
    key: str  # dotted: dataset.num_files_train
    value: Any
    how: str  # MEASURED | INFERRED | GIVEN | ASSUMED
    why: str  # where it came from, one line


def assumed(key: str, value: Any, why: str) -> Value:
    return Value(key, value, ASSUMED, why)


def value_of(values: list[Value], key: str, default: Any = None) -> Any:
    """The value given for `key`, or `default` when none was."""
    return next((v.value for v in values if v.key == key), default)
