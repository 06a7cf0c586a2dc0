"""How the reference programs time their training loops, in one place.

Each program reports the same figures, measured the same way, so that fidelity.py compares like
with like: data wait is the time the loop blocks in the loader's next() for a batch, compute is the
time it holds a batch, checkpoint time is the save call's duration, wall is the loop's. Only the
clock is shared: each program keeps its own loader, model, step and save, written after its
framework's tutorials.

Each epoch's last next(), the one that raises StopIteration, returns no batch: it ends the loader's
iterator (a DataLoader shuts its worker processes down in it, tf.data stops its threads and its
autotuner). It is timed apart, `last_waits_s`, one figure an epoch, because it can be long and no
I/O trace dates it: keras_tfdata.py's took 0.08-0.16 s, or ~0.5 s after the first epoch, in a
third to a half of the runs (tf.data's autotuner stopping; benchmarks/realapps/tfdata_teardown.py,
docs/profile.md).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Iterable, Iterator


class LoopClock:
    """Data wait, compute and save times of one process's training loop."""

    def __init__(self) -> None:
        self.data_wait = self.compute = 0.0
        self.first_wait = 0.0  # of data_wait: each epoch's wait for its first batch (workers starting)
        self.last_waits: list[float] = []  # each epoch's last next(), the one that ends its iterator
        self.steps = 0
        self.saves: list[float] = []
        self.save_cpu: list[float] = []  # the saving thread's CPU seconds per save
        self.start = time.perf_counter()

    def batches(self, loader: Iterable) -> Iterator:
        """The loader's batches; blocked in next() counts as data wait, holding a batch as compute, and
        the last next(), which ends the iterator, as this epoch's last wait."""
        end = time.perf_counter()
        first = True
        for batch in loader:
            fetched = time.perf_counter()
            self.data_wait += fetched - end
            if first:
                self.first_wait += fetched - end
                first = False
            yield batch
            self.steps += 1
            end = time.perf_counter()
            self.compute += end - fetched
        self.last_waits.append(time.perf_counter() - end)

    @contextlib.contextmanager
    def save(self) -> Iterator[None]:
        began, cpu = time.perf_counter(), time.thread_time()
        yield
        self.saves.append(time.perf_counter() - began)
        self.save_cpu.append(time.thread_time() - cpu)

    def figures(self) -> dict:
        """This process's figures, under the names fidelity.py reads."""
        return {"steps": self.steps, "wall_s": time.perf_counter() - self.start, "data_wait_s": self.data_wait,
                "first_wait_s": self.first_wait, "last_waits_s": list(self.last_waits),
                "compute_s": self.compute, "compute_s_per_step": self.compute / max(1, self.steps),
                "checkpoint_s": list(self.saves), "checkpoint_cpu_s": list(self.save_cpu)}


def undated_loop_s(figures: dict) -> float:
    """Of a program's figures: the seconds its loop spent in next() that no I/O trace dates, the
    waits for batches after each epoch's first (a loader's hand-overs) and each epoch's last call."""
    return max(0.0, figures["data_wait_s"] - figures["first_wait_s"]) + sum(figures["last_waits_s"])


def report(result: dict, metrics_path: str) -> None:
    """The program's figures as one JSON line on stdout, and in `metrics_path` when given."""
    if metrics_path:
        with open(metrics_path, "w") as f:
            json.dump(result, f)
    print(json.dumps(result))
