"""The training loop: wait for a batch, emulate compute, checkpoint when due, evaluate.

Accelerator utilisation follows DLIO so figures compare: the loop is cut into blocks at epoch
starts and after checkpoints; in each block the first step is left out (it carries the pipeline
warm-up), and AU = compute time / wall time of the rest. Checkpoint time lies outside blocks.
With one or two steps per block that figure says little (the steps that waited for data are the
ones left out), so the loop also keeps where the whole training wall time went: waiting for
data, computing, and checkpointing (the time training was blocked). Evaluation is timed apart
and is not part of the training wall time.

Failures (failures.*, docs/failures.md) cut the run into lives: an injected failure unwinds out of
the reader, every rank restores the newest surviving checkpoint, and the next life starts at the
data loader position that checkpoint stored (plan/resume.py). The ledger (metrics/goodput.py) keeps
what counts as useful, lost and restart time; ResumeChecks compares samples and state with an
uninterrupted run's. When to checkpoint is the policy's call (checkpoint/policy.py).
"""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from dlio_ckpt.checkpoint.policy import make_policy
from dlio_ckpt.engine.compute import ComputeModel
from dlio_ckpt.engine.context import RunContext
from dlio_ckpt.engine.failures import (FailureInjector, InjectedFailure, RestartExit, drop_state, fail_and_restore,
                                       perturb_state, restore_for_restart, restored_step)
from dlio_ckpt.engine.readers import NativeReader, TensorFlowReader, TransferReader
from dlio_ckpt.engine.relaunch import mark_note_done, read_resumed_note, write_resume_note
from dlio_ckpt.engine.resume_checks import ResumeChecks, UninterruptedRun, state_digest, truth_state_factory
from dlio_ckpt.engine.step_sync import StepSync, gradient_bytes, steps_every_rank_takes
from dlio_ckpt.engine.workers import ProcessReader, workers_fork
from dlio_ckpt.errors import RunFailure
from dlio_ckpt.faults import fault_how, fault_point
from dlio_ckpt.formats.base import DatasetFormat, FormatOptions
from dlio_ckpt.metrics.goodput import Ledger
from dlio_ckpt.metrics.progress import Progress
from dlio_ckpt.plan.dataset import DatasetPlan
from dlio_ckpt.plan.model import build_model_plan
from dlio_ckpt.plan.failures import FailureSchedule
from dlio_ckpt.plan.read import Batch, EpochReadPlan, check_world, dlio_steps_per_epoch, plan_epoch
from dlio_ckpt.plan.resume import ResumePoint, resume_plan


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
    compute_s: float = 0.0  # the emulated compute, the per-step meeting's wait included (train.gradient_sync)
    sync_wait_s: float = 0.0  # of compute_s: waiting for the other ranks at the per-step meeting
    data_wait_s: float = 0.0  # blocked waiting for the next batch
    wall_s: float = 0.0  # the training loop, evaluation excluded
    eval_samples: int = 0
    eval_wall_s: float = 0.0
    au_blocks: AuBlocks = field(default_factory=AuBlocks)
    checkpoint_s: float = 0.0  # blocked in checkpoint saves (and the final wait for async ones)
    ledger: Ledger = field(default_factory=Ledger)  # goodput: useful, lost and restart time (metrics/goodput.py)
    restarts: list[dict[str, Any]] = field(default_factory=list)  # one per injected failure
    policy: dict[str, Any] = field(default_factory=dict)  # the checkpoint policy's summary
    resume: dict[str, Any] = field(default_factory=dict)  # the determinism checks (ResumeChecks.local)
    loader: dict[str, Any] = field(default_factory=dict)  # reader.workers=processes: worker start-up, fetch, decode, collate


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
    if reader.workers == "processes" and workers_fork(storage.capabilities):
        return ProcessReader(storage, fmt, options, files, reader.read_threads, reader.prefetch_size,
                             reader.persistent_workers, reader.decode)
    return NativeReader(storage, fmt, options, files, reader.read_threads, reader.prefetch_size)


def close_reader(reader: Any) -> None:
    """Persistent worker processes stop (and hand over their last events) when training ends."""
    close = getattr(reader, "close", None)
    if close is not None:
        close()


def whole_files(config: Any) -> bool:
    """Readers that take whole files per rank: tf.data itself, or its access pattern (reader.access=transfer)."""
    return config.reader.name == "tensorflow" or config.reader.access == "transfer"


def in_file_order(config: Any, fmt: DatasetFormat) -> bool:
    return fmt.sequential or config.reader.access == "transfer"


STALLED_RESTARTS = 50  # failures in a row that restore the same step: the run stops (it would never end)


def run_training(ctx: RunContext, plan: DatasetPlan, fmt: DatasetFormat, options: FormatOptions, checkpoints: Any) -> TrainResult:
    return _Training(ctx, plan, fmt, options, checkpoints).run()


class _Training:
    """One rank's training run: lives separated by failures, each resumed where the restore says.

    A life runs epochs and steps from a ResumePoint until the end or an injected failure; the
    failure unwinds out of the reader (closing it drops its prefetched batches and open files)
    and the restart (engine/failures.py) gives the next life's ResumePoint.
    """

    def __init__(self, ctx: RunContext, plan: DatasetPlan, fmt: DatasetFormat, options: FormatOptions,
                 checkpoints: Any) -> None:
        config, world = ctx.config, ctx.world
        self.ctx, self.config, self.world, self.plan, self.checkpoints = ctx, config, world, plan, checkpoints
        self.fmt, self.options = fmt, options
        self.whole = whole_files(config)
        self.sequential = in_file_order(config, fmt)
        check_world(plan.train, world.size, self.whole)
        self.compute = ComputeModel.for_training(config.train, world.rank)
        self.reader = make_reader(ctx, ctx.storage.with_phase("train"), fmt, options, plan.train)
        self.result = TrainResult()
        # DLIO's counting: the same floor(samples / batch / ranks) steps on every rank, every epoch,
        # total_steps and step checkpoints counted within the epoch.
        self.dlio = config.train.step_counting == "dlio"
        self.max_batches = dlio_steps_per_epoch(plan.train, config.reader.batch_size, world.size, self.whole,
                                                config.train.total_steps) if self.dlio else None
        self.first_plan = self.epoch_plan(1, config.reader.shuffle_seed)
        self.sync = self.step_sync()
        prepare = getattr(self.reader, "prepare", None)
        if prepare is not None:  # tf.data: the pipeline is built before training, as a program builds its dataset
            prepare(self.first_plan)
        self.policy = make_policy(checkpoints, world, config)
        self.injector = FailureInjector(FailureSchedule.from_config(config.failures, world.size), world)
        self.checks = ResumeChecks(world.rank, self.uninterrupted_run() if self.injector.enabled else None)
        self.ledger = self.result.ledger
        self.ledger.keep_steps = self.injector.enabled  # no restart can take a step back: steps are summed
        self.last_checkpoint_step = -1  # never save a step at or before the one last saved or restored
        self.last_checkpoint_end = 0.0
        self.warming = False  # the first batch after a restart is the restart's warm-up
        self.start = 0.0

    def epoch_plan(self, epoch: int, seed: int) -> EpochReadPlan:
        reader = self.config.reader
        if seed != reader.shuffle_seed:
            reader = dataclasses.replace(reader, shuffle_seed=seed)
        return plan_epoch(self.plan.train, reader, self.world.rank, self.world.size, epoch, self.sequential,
                          whole_files=self.whole, max_batches=self.max_batches)

    def step_sync(self) -> StepSync:
        """train.gradient_sync: the per-step meeting of the ranks (engine/step_sync.py)."""
        config, world = self.config, self.world
        mode = config.train.gradient_sync
        steps = steps_every_rank_takes(self.plan.train, config.reader.batch_size, config.reader.drop_last, world.size,
                                       self.whole, self.max_batches)
        nbytes = 0
        if mode == "allreduce":
            model = getattr(getattr(self.checkpoints, "plan", None), "model", None)
            if model is None:
                model = build_model_plan(config.model, world.size, config.scale.max_model_bytes)
            nbytes = gradient_bytes(model, world.rank)
        return StepSync(world, mode, steps, nbytes)

    def uninterrupted_run(self) -> UninterruptedRun:
        """The truth the determinism checks compare with: from the configuration alone."""
        factory, files = truth_state_factory(self.checkpoints)
        return UninterruptedRun(lambda epoch: self.epoch_plan(epoch, self.config.reader.shuffle_seed),
                                self.config.train.epochs, factory, files)

    @property
    def tracking(self) -> bool:
        """Determinism checks cost a digest of the state per checkpoint: only where failures can happen."""
        return self.injector.enabled

    def run(self) -> TrainResult:
        config, world = self.config, self.world
        steps_per_epoch = self.first_plan.num_batches
        total = (steps_per_epoch * config.train.epochs if self.dlio
                 else (config.train.total_steps or steps_per_epoch * config.train.epochs))
        self.progress = Progress("training", total, enabled=config.progress and world.is_root)
        point = ResumePoint.start(config.reader.shuffle_seed)
        try:
            # The broadcast meets every rank first (World.bcast): the training clock starts when all
            # are ready, as a program's dist.barrier() before its loop. Started before it, a rank
            # whose setup ended first counted its wait for the slowest one's (the checkpoint
            # engine's, 0.1-0.9 s apart under load) as training time: ddp_dcp's intermittent extra
            # wall time (docs/fidelity.md).
            note = world.bcast(read_resumed_note(self.ctx.run_dir) if world.is_root else None)
            self.start = self.last_checkpoint_end = time.perf_counter()
            if note is not None:
                point = self.relaunched(note)
            while True:
                try:
                    self.life(point)
                    break
                except InjectedFailure as failure:
                    point = self.restart(failure)
            finish = time.perf_counter()
            self.checkpoints.finish()  # waits for checkpoints still in flight: training is blocked until then
            self.blocked(time.perf_counter() - finish)
        finally:
            self.progress.close()
            close_reader(self.reader)
            if self.checks.truth is not None:
                self.checks.truth.close()
        result = self.result
        result.wall_s = time.perf_counter() - self.start - result.eval_wall_s
        self.ledger.wall_s = self.ledger.carried_wall_s + result.wall_s
        result.policy = self.policy.summary()
        result.restarts = self.injector.restarts
        result.resume = self.checks.local()
        stats = getattr(self.reader, "stats", None)
        result.loader = stats.as_dict() if stats is not None else {}
        if note is not None and world.is_root:
            mark_note_done(self.ctx.run_dir)
        return result

    def elapsed(self) -> float:
        """Training wall time so far, earlier processes included (the failures' clock)."""
        return self.ledger.carried_wall_s + time.perf_counter() - self.start - self.result.eval_wall_s

    def blocked(self, seconds: float) -> None:
        self.result.checkpoint_s += seconds
        self.ledger.checkpoint_s += seconds

    # one life -------------------------------------------------------------------------------
    def life(self, point: ResumePoint) -> None:
        config, result = self.config, self.result
        step = result.steps = point.step
        for epoch in range(point.epoch, config.train.epochs + 1):
            seed = point.shuffle_seed if epoch == point.epoch else config.reader.shuffle_seed
            whole_epoch = self.first_plan if epoch == 1 and seed == config.reader.shuffle_seed else self.epoch_plan(epoch, seed)
            resumed = epoch == point.epoch and point.step_in_epoch > 0
            run_plan = resume_plan(whole_epoch, point) if resumed else whole_epoch
            epoch_step = point.step_in_epoch if resumed else 0
            done = False
            result.au_blocks.start_block()
            step_start = time.perf_counter()
            waited = result.data_wait_s
            with closing(_waiting_for(self.reader.batches(run_plan), result)) as batches:
                for index, batch in enumerate(batches):
                    fault_point("step", self.world.rank)  # tests: DLIO_CKPT_FAULT=step@<rank>:delay=<s>, a slower rank
                    seconds = self.compute.run()
                    step += 1
                    epoch_step += 1
                    synced = self.sync.meet(epoch_step)  # where backward's gradient all-reduce ends
                    seconds += synced
                    result.sync_wait_s += synced
                    result.steps = step
                    result.samples += batch.samples
                    result.payload_bytes += batch.payload_bytes
                    result.compute_s += seconds
                    now = time.perf_counter()
                    wall = now - step_start
                    if self.warming:  # the reader refilling after a restart: part of the restart's time
                        warm = result.data_wait_s - waited
                        self.ledger.restart_s += warm
                        self.injector.restarts[-1]["warmup_s"] = warm
                        wall -= warm
                        self.warming = False
                    self.ledger.step(step, seconds, wall)
                    self.policy.step_done(wall, first=index == 0)
                    self.checks.samples(step, run_plan.batch(index))
                    result.au_blocks.step(now - step_start, seconds)
                    self.progress.advance(1, batch.payload_bytes)
                    event = self.injector.strikes(step, self.elapsed())
                    if event is not None:
                        raise InjectedFailure(event, step)
                    if self.policy.due(step, epoch, False, trigger_step=epoch_step if self.dlio else None):
                        self.checkpoint(step, epoch, ResumePoint(step, epoch, epoch_step, seed,
                                                                 epoch_step * run_plan.batch_size))
                        result.au_blocks.start_block()
                    if not self.dlio and config.train.total_steps and step >= config.train.total_steps:
                        done = True
                        break
                    step_start = time.perf_counter()
                    waited = result.data_wait_s
            result.epochs = max(result.epochs, epoch)
            if config.evaluation.enabled and epoch % config.evaluation.epochs_between_evals == 0:
                _evaluate(self.ctx, self.plan, self.fmt, self.options, epoch, result)
            if self.policy.due(step, epoch, True):
                # the loader's position is the next epoch's start
                self.checkpoint(step, epoch, ResumePoint(step, epoch + 1, 0, config.reader.shuffle_seed, 0))
            if done:
                return

    def checkpoint(self, step: int, epoch: int, point: ResumePoint) -> None:
        if step <= self.last_checkpoint_step:
            return
        probe = self.policy.probe(step)
        start = time.perf_counter()
        record = self.checkpoints.save(step, epoch, resume=point.as_dict())
        if probe:
            self.checkpoints.finish()  # the profile needs the full persist time (CheckFreq waits for it too)
        end = time.perf_counter()
        self.blocked(end - start)
        self.policy.checkpoint_done(step, record, end - self.last_checkpoint_end)
        event = self.injector.strikes_during_write(self.elapsed())
        if event is not None:  # it struck before the commit: this checkpoint never counted
            raise InjectedFailure(event, step, torn_step=step)
        if self.tracking:
            self.checks.saved_state(step, state_digest(self.checkpoints))
        self.last_checkpoint_step = step
        self.last_checkpoint_end = time.perf_counter()

    # failures ---------------------------------------------------------------------------------
    def restart(self, failure: InjectedFailure) -> ResumePoint:
        event = failure.event
        entry = {"index": event.index, "step": failure.step, "kind": event.kind, "rank": event.rank,
                 "at_s": event.at_s, "restart": self.config.failures.restart, "torn_step": failure.torn_step}
        self.injector.restarts.append(entry)
        self.check_progress()
        if self.config.failures.restart == "exit":
            self.exit_for_relaunch(failure)
        record = fail_and_restore(self.ctx, self.checkpoints, event, failure.torn_step)
        return self.resume_from(record, time.perf_counter() - failure.at, entry)

    def check_progress(self) -> None:
        """Failures more frequent than a checkpoint interval's work would restart the job forever."""
        back = [r.get("restored_step") for r in self.injector.restarts[-STALLED_RESTARTS - 1:-1]]
        if len(back) == STALLED_RESTARTS and len(set(back)) == 1:
            raise RunFailure(f"{STALLED_RESTARTS} failures in a row restarted from step {back[0]}: the job makes no "
                             f"progress; checkpoint more often, or raise failures.mtbf_s "
                             f"({self.config.failures.mtbf_s} s)", known_everywhere=True)

    def resume_from(self, record: Any, seconds: float, entry: dict[str, Any]) -> ResumePoint:
        """After a restore: account for it, check the restored state, and say where to go on from."""
        step = restored_step(record)
        lost_steps, lost_s = self.ledger.roll_back(step)
        self.ledger.restart_s += seconds
        entry.update(restored_step=step, level=getattr(record, "level", None), restore_s=seconds,
                     warmup_s=0.0, lost_steps=lost_steps, lost_work_s=lost_s)
        self.result.au_blocks.start_block()
        self.policy.restarted(step)
        self.last_checkpoint_step = step if step > 0 else -1
        self.last_checkpoint_end = time.perf_counter()
        self.warming = True
        self.compute.restarted()
        fault = fault_how("resume", self.world.rank)
        if fault == "perturb-state" and step > 0:
            perturb_state(self.checkpoints, self.world.rank)
        self.checks.restored_state(step, state_digest(self.checkpoints) if step > 0 and self.tracking else None)
        point = self.resume_point(record, step)
        if fault == "skip-batch":  # the loader loses one batch: the run reads the next step's samples early
            batch = self.first_plan.batch_size
            point = dataclasses.replace(point, step_in_epoch=point.step_in_epoch + 1,
                                        sample_offset=point.sample_offset + batch)
        return point

    def resume_point(self, record: Any, step: int) -> ResumePoint:
        if step == 0:
            return ResumePoint.start(self.config.reader.shuffle_seed)
        stored = getattr(record, "resume", None)
        if stored:
            return ResumePoint.from_dict(stored)
        # a checkpoint without the loader's position (written before it was stored): derived from
        # the step, which every epoch of this run divides alike
        per_epoch = max(1, self.first_plan.num_batches)
        epoch, within = divmod(step, per_epoch)
        return ResumePoint(step, epoch + 1, within, self.config.reader.shuffle_seed, within * self.first_plan.batch_size)

    def exit_for_relaunch(self, failure: InjectedFailure) -> None:
        """failures.restart=exit: drop what the failure destroys, leave the note, end the job."""
        drop_state(self.checkpoints, failure.event, failure.torn_step)
        self.ledger.wall_s = self.elapsed()
        mine = {"ledger": self.ledger.as_dict(), "checks": self.checks.carried()}
        everyone = self.world.gather(mine)
        path = None
        if self.world.is_root:
            token = self.ctx.run_id.rsplit("-", 1)[-1]
            path = write_resume_note(self.ctx.run_dir, {
                "token": token, "run_id": self.ctx.run_id, "world_size": self.world.size,
                "storage_root": os.path.realpath(self.config.storage.root),
                "next_failure": self.injector.next_index, "restarts": self.injector.restarts, "ranks": everyone})
        path = self.world.bcast(path)
        self.progress.close()
        raise RestartExit(path)

    def relaunched(self, note: dict[str, Any]) -> ResumePoint:
        """The first thing a relaunch does: take up the note, restore, go on."""
        if note.get("world_size") != self.world.size:
            raise RunFailure(f"the run stopped on a failure with {note.get('world_size')} ranks; relaunch it with as many "
                             f"(this launch has {self.world.size})", known_everywhere=True)
        mine = note["ranks"][self.world.rank]
        carried = Ledger.from_dict(mine["ledger"])
        carried.carried_wall_s = carried.wall_s
        self.ledger = self.result.ledger = carried
        self.checks.take_carried(mine["checks"])
        self.injector.next_index = int(note["next_failure"])
        self.injector.restarts = list(note["restarts"])
        start = time.perf_counter()
        record = restore_for_restart(self.ctx, self.checkpoints)
        return self.resume_from(record, time.perf_counter() - start, self.injector.restarts[-1])


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
    try:
        with closing(reader.batches(eval_plan)) as batches:
            for batch in batches:
                compute.run()
                result.eval_samples += batch.samples
    finally:
        close_reader(reader)
    result.eval_wall_s += time.perf_counter() - start
