"""Progress on rank 0 during long phases: a live bar on a terminal, periodic lines otherwise.

Batch jobs on clusters write to files, where a redrawn bar becomes noise; there a line every
few seconds says how far the phase is.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO


@dataclass
class Progress:
    label: str
    total: int
    enabled: bool
    unit: str = "steps"
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    interval_s: float = 5.0
    _done: int = 0
    _bar: Any = None
    _task: Any = None
    _last_line: float = 0.0
    _start: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        if self.stream.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn(self.unit), TimeElapsedColumn(), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total or None)
        else:
            self._last_line = time.perf_counter()

    def advance(self, count: int = 1) -> None:
        self._done += count
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, advance=count)
            return
        now = time.perf_counter()
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            total = f"/{self.total}" if self.total else ""
            print(f"[dlio_ckpt] {self.label}: {self._done}{total} {self.unit} ({now - self._start:.1f} s)", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
