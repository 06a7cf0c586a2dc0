"""The training loop: wait for a batch, emulate compute, checkpoint when due, evaluate.

Accelerator utilisation follows DLIO so figures compare: the loop is cut into blocks at epoch
starts and after checkpoints; in each block the first step is left out (it carries the pipeline
warm-up), and AU = compute time / wall time of the rest. Checkpoint time lies outside blocks.
With one or two steps per block that figure says little (the steps that waited for data are the
ones left out), so the loop also keeps where the whole training wall time went: waiting for
data, computing, and checkpointing (the time training was blocked). Evaluation is timed apart
and is not part of the training wall time.
"""

from __future__ import annotations

import time
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from dlio_ckpt.engine.compute import ComputeModel
from dlio_ckpt.engine.context import RunContext
from dlio_ckpt.engine.readers import NativeReader, TensorFlowReader, TransferReader
from dlio_ckpt.formats.base import DatasetFormat, FormatOptions
from dlio_ckpt.metrics.progress import Progress
from dlio_ckpt.plan.dataset import DatasetPlan
from dlio_ckpt.plan.read import Batch, check_world, dlio_steps_per_epoch, plan_epoch


@dataclass
class AuBlocks:
    """DLIO's AU bookkeeping: per block, compute and wall time without the block's first step."""

    compute_s: float = 0.0
    wall_s: float = 0.0
    blocks: int = 0  # blocks with at least one step
    steps: int = 0  # steps in them, first steps included
    _block_steps: int = 0

    def start_block(self) -> None:
        self._block_steps = 0

    def step(self, wall_s: float, compute_s: float) -> None:
        self._block_steps += 1
        self.steps += 1
        if self._block_steps == 1:
            self.blocks += 1
        else:
            self.compute_s += compute_s
            self.wall_s += wall_s

    @property
    def au(self) -> float:
        return self.compute_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class TrainResult:
    epochs: int = 0
    steps: int = 0
    samples: int = 0
    payload_bytes: int = 0
    compute_s: float = 0.0
    data_wait_s: float = 0.0  # blocked waiting for the next batch
    wall_s: float = 0.0  # the training loop, evaluation excluded
    eval_samples: int = 0
    eval_wall_s: float = 0.0
    au_blocks: AuBlocks = field(default_factory=AuBlocks)
    checkpoint_s: float = 0.0  # blocked in checkpoint saves (and the final wait for async ones)


def _waiting_for(batches: Iterable[Batch], result: TrainResult) -> Iterator[Batch]:
    """The batches, adding the time spent waiting for each to `result.data_wait_s`."""
    iterator = iter(batches)
    try:
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            result.data_wait_s += time.perf_counter() - start
            yield batch
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()  # a reader records or releases what it holds now, not when collected


def make_reader(ctx: RunContext, storage: Any, fmt: DatasetFormat, options: FormatOptions, files: Any) -> Any:
    reader = ctx.config.reader
    if reader.name == "tensorflow":
        return TensorFlowReader(storage, files, reader, seed=reader.shuffle_seed + ctx.world.rank)
    if reader.access == "transfer":
        return TransferReader(storage, files, reader.transfer_size, reader.read_threads, reader.prefetch_size)
    return NativeReader(storage, fmt, options, files, reader.read_threads, reader.prefetch_size)


def whole_files(config: Any) -> bool:
    """Readers that take whole files per rank: tf.data itself, or its access pattern (reader.access=transfer)."""
    return config.reader.name == "tensorflow" or config.reader.access == "transfer"


def in_file_order(config: Any, fmt: DatasetFormat) -> bool:
    return fmt.sequential or config.reader.access == "transfer"


def run_training(ctx: RunContext, plan: DatasetPlan, fmt: DatasetFormat, options: FormatOptions, checkpoints: Any) -> TrainResult:
    config, world = ctx.config, ctx.world
    whole = whole_files(config)
    sequential = in_file_order(config, fmt)
    check_world(plan.train, world.size, whole)
    compute = ComputeModel.for_training(config.train, world.rank)
    train_reader = make_reader(ctx, ctx.storage.with_phase("train"), fmt, options, plan.train)
    result = TrainResult()
    # DLIO's counting: the same floor(samples / batch / ranks) steps on every rank, every epoch,
    # total_steps and step checkpoints counted within the epoch.
    dlio = config.train.step_counting == "dlio"
    max_batches = dlio_steps_per_epoch(plan.train, config.reader.batch_size, world.size, whole,
                                       config.train.total_steps) if dlio else None
    first_plan = plan_epoch(plan.train, config.reader, world.rank, world.size, 1, sequential, whole_files=whole,
                            max_batches=max_batches)
    steps_per_epoch = first_plan.num_batches
    total = steps_per_epoch * config.train.epochs if dlio else (config.train.total_steps or steps_per_epoch * config.train.epochs)
    progress = Progress("training", total, enabled=config.progress and world.is_root)
    start = time.perf_counter()
    done = False
    try:
        for epoch in range(1, config.train.epochs + 1):
            epoch_plan = first_plan if epoch == 1 else plan_epoch(
                plan.train, config.reader, world.rank, world.size, epoch, sequential, whole_files=whole,
                max_batches=max_batches)
            result.au_blocks.start_block()
            step_start = time.perf_counter()
            epoch_step = 0
            with closing(_waiting_for(train_reader.batches(epoch_plan), result)) as batches:
                for batch in batches:
                    seconds = compute.run()
                    result.steps += 1
                    epoch_step += 1
                    result.samples += batch.samples
                    result.payload_bytes += batch.payload_bytes
                    result.compute_s += seconds
                    now = time.perf_counter()
                    result.au_blocks.step(now - step_start, seconds)
                    progress.advance(1, batch.payload_bytes)
                    if checkpoints.due(result.steps, epoch, False, trigger_step=epoch_step if dlio else None):
                        result.checkpoint_s += _checkpoint(checkpoints, result.steps, epoch)
                        result.au_blocks.start_block()
                    if not dlio and config.train.total_steps and result.steps >= config.train.total_steps:
                        done = True
                        break
                    step_start = time.perf_counter()
            result.epochs = epoch
            if config.evaluation.enabled and epoch % config.evaluation.epochs_between_evals == 0:
                _evaluate(ctx, plan, fmt, options, epoch, result)
            if checkpoints.due(result.steps, epoch, True):
                result.checkpoint_s += _checkpoint(checkpoints, result.steps, epoch)
            if done:
                break
        finish = time.perf_counter()
        checkpoints.finish()  # waits for checkpoints still in flight: training is blocked until then
        result.checkpoint_s += time.perf_counter() - finish
    finally:
        progress.close()
    result.wall_s = time.perf_counter() - start - result.eval_wall_s
    return result


def _checkpoint(checkpoints: Any, step: int, epoch: int) -> float:
    start = time.perf_counter()
    checkpoints.save(step, epoch)
    return time.perf_counter() - start


def _evaluate(ctx: RunContext, plan: DatasetPlan, fmt: DatasetFormat, options: FormatOptions, epoch: int, result: TrainResult) -> None:
    config, world = ctx.config, ctx.world
    whole = whole_files(config)
    check_world(plan.eval, world.size, whole)
    max_batches = dlio_steps_per_epoch(plan.eval, config.reader.batch_size_eval, world.size, whole) \
        if config.train.step_counting == "dlio" else None
    eval_plan = plan_epoch(plan.eval, config.reader, world.rank, world.size, epoch, in_file_order(config, fmt),
                           batch_size=config.reader.batch_size_eval, shuffle=False, whole_files=whole,
                           max_batches=max_batches)
    compute = ComputeModel(config.evaluation.computation_time, 0.0, "fixed", 0)
    reader = make_reader(ctx, ctx.storage.with_phase("eval"), fmt, options, plan.eval)
    start = time.perf_counter()
    with closing(reader.batches(eval_plan)) as batches:
        for batch in batches:
            compute.run()
            result.eval_samples += batch.samples
    result.eval_wall_s += time.perf_counter() - start
