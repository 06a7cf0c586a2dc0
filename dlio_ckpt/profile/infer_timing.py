"""Compute per step from the gaps between batches (DXT times; pure).

A training loop alternates: wait for the next batch, compute, and now and then checkpoint. In
the log only the reads are seen, so per epoch: the dataset files' reads (their DXT segments, all
processes) are put in the order they finished and cut into steps of `batch x ranks / samples per
file` files; step k's batch is ready when its last file's last read ended. The epoch ends where the
next checkpoint save starts (or the next epoch's first read). The compute per step c is then the
one value for which a loop that starts at the first batch, takes max(previous + c, ready) for each
next step and computes c after the last, ends exactly at the epoch's end (found by bisection: the
end grows with c). A worker's batch reaches the loop a hand-over after its reads end (twice the
worker's shortest pause between its batches: its send and the loop's receive), and a loop over per-epoch
DataLoader workers ends when they are told to quit (their processes' ends), before the save begins. Data waits (a batch not ready) are thus kept out of c, as docs/fidelity.md
defines computation_time. The median over the epochs that end in a save (or all, if none) is taken.

The first epoch is set apart when there are others: a framework that traces or compiles its step
(tf.function, torch.compile) pays that once, in the first step, and spread over a short run's steps
it would make every step as slow as the first (the Keras reference program: 2.5 s once, then
6 ms a step; a profile of its 2 epochs said 0.17 s a step). computation_time is then the median of
the later epochs and `train.first_step_time` the first epoch's excess over it, so the emulated run
spends the same compute in all and a longer run pays the tracing once, as the program would. A
first epoch that computed less a step than the later ones traced nothing worth setting apart: the
median is then over all epochs, as without the split.

Without DXT there are no read times per batch: the value is left at its default and named.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from dlio_ckpt.profile.classify import DATASET, Roles
from dlio_ckpt.profile.records import Job
from dlio_ckpt.profile.values import INFERRED, Value, assumed


def file_reads(job: Job, roles: Roles) -> list[tuple[float, float, int]]:
    """(first read start, last read end, process index) of every open-to-close use of a dataset file, from DXT;
    a file opened n times is split where its reads' offsets restart (each epoch reads it again)."""
    out: list[tuple[float, float, int]] = []
    for index, process in enumerate(job.processes):
        for f in process.files:
            if roles.files.get(f.path) != DATASET or f.segments is None or not len(f.segments):
                continue
            reads = f.segments[~f.segments["write"]]
            if not len(reads):
                continue
            opens = max(f.opens, 1)
            # an open's reads start near the start of the file; split into `opens` groups by time gaps
            order = np.argsort(reads["start"], kind="stable")
            starts, ends = reads["start"][order], reads["end"][order]
            if opens > 1 and len(starts) >= opens:
                gaps = starts[1:] - ends[:-1]
                cuts = np.sort(np.argsort(gaps)[-(opens - 1):]) + 1
                bounds = [0, *cuts.tolist(), len(starts)]
            else:
                bounds = [0, len(starts)]
            out += [(float(starts[a]), float(ends[a:b].max()), index) for a, b in zip(bounds, bounds[1:]) if b > a]
    return sorted(out)


@dataclass(frozen=True)
class EpochCompute:
    """The compute per step each epoch's loop implies, and what the profile makes of them."""

    per_epoch: tuple[float, ...]  # in epoch order, the epochs whose end was found
    epochs: tuple[int, ...]  # their indices
    steps: tuple[int, ...]  # their steps
    ends_in_save: tuple[bool, ...]

    @property
    def steady(self) -> float:
        """The median over the epochs that end in a save (or all); the first epoch left out when it
        computed more a step than the later ones (its first step traced), kept when it did not."""
        later = self._median([k for k, e in enumerate(self.epochs) if e > 0]) if self.first_known else None
        if later is not None and self.per_epoch[0] > later:
            return later
        return self._median(list(range(len(self.epochs))))

    def _median(self, among: list[int]) -> float:
        chosen = [self.per_epoch[k] for k in among if self.ends_in_save[k]] or [self.per_epoch[k] for k in among]
        return statistics.median(chosen)

    @property
    def first_known(self) -> bool:
        """The first epoch, and at least one other, are known: its excess can be told apart."""
        return len(self.epochs) >= 2 and self.epochs[0] == 0

    @property
    def first_step(self) -> float:
        """Seconds the first epoch computed beyond `steady` a step (its first step's tracing), or 0."""
        if not self.first_known:
            return 0.0
        return max(0.0, (self.per_epoch[0] - self.steady) * self.steps[0])

    def mean(self, total_steps: int) -> float:
        """Compute per step over a run of `total_steps` steps: steady, and the first step's excess once."""
        return self.steady + self.first_step / max(total_steps, 1)


def compute_per_step(reads: list[tuple[float, float, int]], files: int, epochs: int, files_per_batch: float,
                     ranks: int, save_starts: list[float], exits: dict[int, float],
                     save_setup_s: tuple[float, float] = (0.0, 0.0), ready_next_s: float = 0.0) -> EpochCompute | None:
    """Each epoch's compute per step; None when unknown.
    `files_per_batch`: dataset files per rank per step; `exits`: when each data-loader worker process
    ended (a DataLoader shuts its workers down as the epoch's loop ends, before the save), by index;
    `save_setup_s`: how long a save works before its first write, which the log dates it by (the
    loop ended that much earlier; never before the epoch's last read): every save's, and the first
    save's more (a framework's first-time work); `ready_next_s`: what each step's next() costs the loop
    when the ranks read themselves and the batch is ready (tf.data: tf_data_next.py), which the
    program counts as waiting; worker processes' hand-overs are found in the log instead."""
    if not reads or files_per_batch <= 0 or len(reads) < files * epochs:
        return None
    per_epoch: list[float] = []
    found: list[int] = []
    steps: list[int] = []
    ends_in_save: list[bool] = []
    for e in range(epochs):
        chunk = reads[e * files:(e + 1) * files]
        first_read = chunk[0][0]
        next_read = reads[(e + 1) * files][0] if (e + 1) * files < len(reads) else math.inf
        last_read_end = max(end for _, end, _ in chunk)
        saves = [s for s in save_starts if last_read_end <= s < next_read]
        setup = save_setup_s[0] + (save_setup_s[1] if saves and saves[0] == save_starts[0] else 0.0)
        end = max(saves[0] - setup, last_read_end) if saves else next_read
        quitting = [exits[i] for i in {i for _, _, i in chunk} if i in exits and last_read_end <= exits[i] < next_read]
        end = min([end, *quitting])
        if not math.isfinite(end) or end <= first_read:
            continue
        ready, receive = _step_ready(chunk, files_per_batch, ranks, set(exits), ready_next_s)
        per_epoch.append(_solve(ready, end, receive))
        found.append(e)
        steps.append(len(ready))
        ends_in_save.append(bool(saves))
    if not per_epoch:
        return None
    return EpochCompute(tuple(per_epoch), tuple(found), tuple(steps), tuple(ends_in_save))


def _step_ready(chunk: list[tuple[float, float, int]], files_per_batch: float, ranks: int,
                workers: set[int], ready_next_s: float = 0.0) -> tuple[list[float], float]:
    """When each step's batches could reach the loop, and what taking a ready batch costs the loop.
    Worker processes (whole files per batch, every reader a worker): each worker's files in read order
    make its batches, handed out round-robin (a DataLoader delivers in order), a batch arriving a
    hand-over after its last read, and the loop spending the receiving half of it on every step (a
    few ms that the program counts as its wait in next(), not as compute); a step waits for one batch
    per rank. Otherwise (the ranks or tf.data's threads read): the files in the order their reads
    ended, `files_per_batch x ranks` per step, each taken at `ready_next_s` (tf.data's next() on a
    ready batch, measured on a stand-in: tf_data_next.py; 0 where the rank reads its own batches)."""
    per_process: dict[int, list[tuple[float, float]]] = {}
    for start, end, index in chunk:
        per_process.setdefault(index, []).append((start, end))
    size = int(round(files_per_batch))
    if size >= 1 and abs(size - files_per_batch) < 1e-9 and set(per_process) <= workers:
        handover = _handover(per_process, size)
        queues: list[list[float]] = []
        for spans in sorted(per_process.values(), key=lambda sp: min(sp)[0]):
            spans.sort()
            queues.append([max(end for _, end in spans[k:k + size]) + handover for k in range(0, len(spans), size)])
        batches = []
        while any(queues):
            for queue in queues:
                if queue:
                    batches.append(queue.pop(0))
        return [max(batches[k:k + ranks]) for k in range(0, len(batches), ranks)], handover / 2
    ready = np.sort(np.array([end_t for _, end_t, _ in chunk]))
    per_step = files_per_batch * ranks
    steps = max(1, math.ceil(len(ready) / per_step))
    return [float(ready[min(len(ready), math.ceil((k + 1) * per_step)) - 1]) for k in range(steps)], ready_next_s


def _handover(per_process: dict[int, list[tuple[float, float]]], size: int) -> float:
    """How long after its last read a worker's batch reaches the loop: twice the worker's shortest
    pause between two of its batches. The pause is the worker's side (collate, put the tensors in
    shared memory); the shortest, because a worker whose queue is full waits for the loop before its
    next batch and that wait is not hand-over. The loop's side (receive the descriptors, rebuild the
    tensors) is not in the log and took about as long: in pytorch_cnn.py, timed with its loop's own
    clock beside the DXT times, the first batch of an epoch reached the loop 1.7x and 1.9x the pause
    after its reads."""
    gaps = []
    for spans in per_process.values():
        spans = sorted(spans)
        gaps += [max(spans[k][0] - spans[k - 1][1], 0.0) for k in range(size, len(spans), size)]
    return 2 * min(gaps) if gaps else 0.0


def _solve(ready: list[float], end: float, receive: float = 0.0) -> float:
    """The compute per step c with which the loop, taking step k at max(previous + c + receive,
    ready[k]), computes its last step to end exactly at `end` (bisection: the end grows with c)."""
    def finish(c: float) -> float:
        t = ready[0]
        for r in ready[1:]:
            t = max(t + c + receive, r)
        return t + c

    lo, hi = 0.0, max(end - ready[0], 0.0)
    if finish(lo) >= end:
        return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if finish(mid) < end:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# A tf.data pipeline runs in the rank's own threads and ends with its iterator, in the loop's last
# next(): there it stops its threads and, with AUTOTUNE, its autotuner, which took 0.08-0.16 s, or ~0.5 s
# after the first epoch, in a third to a half of keras_tfdata.py's runs
# (benchmarks/realapps/tfdata_teardown.py, profile_accuracy.py, docs/profile.md). Nothing is read
# then, so the log dates none of it and the epoch's compute holds it: the comment says so.
_TF_DATA_END = ("; with tf.data, an epoch's end (its iterator stopping its threads and AUTOTUNE's autotuner: "
                "0.1-0.5 s in a third to a half of a Keras program's runs on 2 cores) reads nothing, so it counts here "
                "(an epoch that took it stands out above); over more epochs the median leaves out a minority of them")


def _ready_next_text(ready_next_s: float | None) -> str:
    if ready_next_s is None:
        return ("; tf.data's next() on a ready batch (a few tenths of a ms a step) is counted here: "
                "TensorFlow is not installed to measure it")
    return (f"; each step's next() on a batch tf.data has ready, {1e3 * ready_next_s:.3f} ms (measured on a "
            f"stand-in pipeline here), left out: the program waits there and the emulated run's pipeline pays its own")


def timing_values(job: Job, roles: Roles, files: int, epochs: int, batch: int, ranks: int, samples_per_file: int,
                  save_starts: list[float], save_setup_s: tuple[float, float] = (0.0, 0.0),
                  tf_data: bool = False, ready_next_s: float | None = None) -> tuple[list[Value], float | None]:
    """train.computation_time and first_step_time from the DXT read times, and the run's mean compute
    per step (None when unknown). `tf_data`: the ranks read through tf.data (reader.name tensorflow);
    `ready_next_s`: its next() on a ready batch, measured on a stand-in (tf_data_next.py; None when
    it could not be), left out of every step."""
    reads = file_reads(job, roles)
    if not reads:
        return [assumed("train.computation_time", 0.0, f"no DXT read times in the logs ({job.source}): "
                        "run with DXT_ENABLE_IO_TRACE=1 to infer it"),
                assumed("train.first_step_time", 0.0, "no DXT read times in the logs: the first step's tracing cannot be seen")], None
    files_per_batch = batch / max(samples_per_file, 1)
    exits = {i: p.end for i, (p, role) in enumerate(zip(job.processes, roles.processes)) if role == "worker"}
    found = compute_per_step(reads, files, epochs, files_per_batch, ranks, save_starts, exits, save_setup_s,
                             ready_next_s or 0.0)
    if found is None:
        return [assumed("train.computation_time", 0.0, "the reads do not split into whole epochs"),
                assumed("train.first_step_time", 0.0, "the reads do not split into whole epochs")], None
    steady = found.steady
    epochs_text = ", ".join(f"{c:.4f}" for c in found.per_epoch)
    values = [Value("train.computation_time", round(float(steady), 6), INFERRED,
                    f"DXT: per epoch, the compute per step that ends the loop where the epoch's workers quit or its save "
                    f"starts ({epochs_text} s), batch {batch} x {ranks} rank(s)"
                    + (f"; each save taken to start {1e3 * save_setup_s[0]:.1f} ms before its first write, the first "
                       f"{1e3 * sum(save_setup_s):.1f} ms (checkpoint.framework_cpu_s, framework_first_cpu_s)"
                       if any(save_setup_s) else "")
                    + ("; the median of the epochs after the first" if found.first_step > 0 else "")
                    + (_ready_next_text(ready_next_s) + _TF_DATA_END if tf_data else ""))]
    if found.first_known:
        values.append(Value("train.first_step_time", round(found.first_step, 6), INFERRED,
                            f"DXT: the first epoch's compute beyond the later epochs' ({found.per_epoch[0]:.4f} vs "
                            f"{steady:.4f} s a step, x {found.steps[0]} steps): a first step's tracing or compilation, paid once"))
    else:
        values.append(assumed("train.first_step_time", 0.0, "one epoch's compute in the log: a first step's tracing "
                              "cannot be told from the others' compute; computation_time holds it"))
    return values, float(found.mean(found.steps[0] * epochs))
