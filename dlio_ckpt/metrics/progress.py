"""Progress on rank 0 during long phases: a live bar on a terminal, periodic lines otherwise.

Batch jobs on clusters write to files, where a redrawn bar becomes noise; there a line at most
every `interval_s` seconds says how far the phase is, how fast it goes (units/s, and MiB/s when
the caller counts bytes) and when it should end at that rate. Rank 0's own progress is shown:
ranks advance together in synchronous training.
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
    _bytes: int = 0
    _bar: Any = None
    _task: Any = None
    _last_line: float = 0.0
    _start: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        if self.stream.isatty():
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn(self.unit), TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                                     TextColumn("ETA"), TimeRemainingColumn(), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total or None, rate="")
        else:
            self._last_line = time.perf_counter()

    def advance(self, count: int = 1, nbytes: int = 0) -> None:
        self._done += count
        self._bytes += nbytes
        if not self.enabled:
            return
        now = time.perf_counter()
        if self._bar is not None:
            self._bar.update(self._task, advance=count, rate=self.rates(now - self._start))
            return
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            print(self.line(now - self._start), file=self.stream, flush=True)

    def rates(self, elapsed_s: float) -> str:
        """`12.5 steps/s, 48.0 MiB/s` so far (MiB/s only when bytes are counted)."""
        if elapsed_s <= 0:
            return ""
        text = f"{self._done / elapsed_s:.1f} {self.unit}/s"
        return text + (f", {self._bytes / elapsed_s / (1 << 20):.1f} MiB/s" if self._bytes else "")

    def line(self, elapsed_s: float) -> str:
        """One progress line for a file or a pipe: done, rate, elapsed and the time left at this rate."""
        total = f"/{self.total}" if self.total else ""
        eta = ""
        if self.total and self._done and elapsed_s > 0:
            eta = f", ETA {max(self.total - self._done, 0) * elapsed_s / self._done:.0f} s"
        return f"[dlio_ckpt] {self.label}: {self._done}{total} {self.unit}, {self.rates(elapsed_s)} ({elapsed_s:.1f} s{eta})"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
