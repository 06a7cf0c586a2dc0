"""Run one job: set up the traced storage, run the phases the mode asks for, report.

Every rank runs this. Ranks synchronise only where the work needs it (generation, checkpoints,
the final gather); rank 0 writes the run folder's summary and traces.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from pathlib import Path
from typing import Any

from dlio_ckpt.schema import RunConfig
from dlio_ckpt.engine.checkpoint_mode import run_checkpoint_mode, run_restore_mode
from dlio_ckpt.engine.context import RunContext
from dlio_ckpt.engine.left_on_disk import left_on_disk
from dlio_ckpt.engine.ownership import claim_run, created_paths
from dlio_ckpt.engine.phases import run_training_phases
from dlio_ckpt.engine.plan_mode import run_plan_mode
from dlio_ckpt.engine.repeats import run_repeats
from dlio_ckpt.engine.replay import run_replay
from dlio_ckpt.local_fs import file_system
from dlio_ckpt.memory import peak_rss_bytes
from dlio_ckpt.metrics import latency, mlperf
from dlio_ckpt.metrics import summary as summaries
from dlio_ckpt.metrics.report import log_report, print_report
from dlio_ckpt.storage import backend_class, make_backend
from dlio_ckpt.storage.events import EventRecorder, JobClock, event_files
from dlio_ckpt.storage.traced import TracedStorage
from dlio_ckpt.trace.darshan_writer import JobInfo
from dlio_ckpt.trace.outputs import write_trace_outputs
from dlio_ckpt.world import World


def make_context(world: World, config: RunConfig, run_dir: Path, run_id: str) -> RunContext:
    clock = JobClock.start(world.bcast(time.time()))
    recorder = EventRecorder(rank=world.rank, clock=clock, spill_dir=run_dir)  # its spill files: unlinked, there
    storage = TracedStorage(make_backend(config.storage), recorder)
    return RunContext(config=config, world=world, run_dir=run_dir, run_id=run_id, clock=clock, recorder=recorder, storage=storage)


def announce_new_root(world: World, config: RunConfig) -> None:
    """A storage.root that does not exist (a typo: /nonexistent/dlio) used to be made silently by
    the run's first write, on whatever file system holds its nearest existing parent (often the
    root file system, not the storage meant). Rank 0 makes it before any rank writes (the others
    wait for it in root_first, after a relaunch's checks, so a refused relaunch makes nothing) and
    says so in one line, with that file system. An OSError is claim_run's to report."""
    if not world.is_root or not backend_class(config.storage.backend).capabilities.local_paths:
        return
    root = os.path.abspath(config.storage.root)
    if os.path.isdir(root):
        return

    os.makedirs(root, exist_ok=True)
    note = (f"dlio_ckpt: note: storage.root {root} did not exist; created it, on {file_system(root)} "
            "(check storage.root if you meant an existing folder)")
    print(note, flush=True)
    log_report(note, heading="")


def run_job(world: World, config: RunConfig, run_dir: Path, run_id: str, darshan_runtime: Any = None) -> dict[str, Any] | None:
    """Run the job (run.repeats times) and return the summary on rank 0 (None on other ranks).

    `darshan_runtime` (a trace.runtime.RuntimeInfo) says a preloaded darshan-runtime records
    this run, so no emulated Darshan log is written beside its log.
    """
    if config.run.repeats > 1:
        return run_repeats(world, config, run_dir, run_id, lambda folder, report: run_once(
            world, config, folder, run_id, darshan_runtime, report=report))
    return run_once(world, config, run_dir, run_id, darshan_runtime)


def run_once(world: World, config: RunConfig, run_dir: Path, run_id: str, darshan_runtime: Any = None,
             report: bool = True) -> dict[str, Any] | None:
    """One run of the job in `run_dir`: its summary.json there, printed unless `report` is False."""
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    start = time.perf_counter()
    if config.mode == "plan":
        return run_plan_mode(config, run_dir) if world.is_root else None

    # before anything under storage.root: a relaunch's checks, then the root (made and announced), the markers
    world.root_first(lambda: claim_run(config, run_dir, run_id, world.size, make_root=lambda: announce_new_root(world, config)))
    ctx = make_context(world, config, run_dir, run_id)
    sections: dict[str, Any] = {}
    local: dict[str, Any] = {"rank": world.rank, "hostname": socket.gethostname(), **mlperf.host_resources()}
    warnings: list[str] = []
    if config.workload == "replay":
        local["replay"] = run_replay(ctx)
    elif config.mode == "checkpoint":
        sections["checkpoint"] = run_checkpoint_mode(ctx)
    elif config.mode == "restore":
        sections["checkpoint"] = run_restore_mode(ctx)
    else:
        phase_sections, phase_local, phase_warnings = run_training_phases(ctx)
        sections.update(phase_sections)
        local.update(phase_local)
        warnings.extend(phase_warnings)

    # a block of events at a time (the recorder spilled the rest): a long run holds millions of events
    local["io"] = summaries.rank_io(ctx.recorder.blocks())
    local["latency"] = latency.rank_latency(ctx.recorder.blocks())
    if config.trace.events or config.trace.darshan or config.trace.chrome:
        ctx.recorder.save(run_dir / "events", local["hostname"])
    local["peak_rss_bytes"] = peak_rss_bytes()  # after the event file: saving it can be the peak
    everyone = world.gather(local)
    world.barrier()
    if not world.is_root:
        return None
    assert everyone is not None
    wall_s = time.perf_counter() - start
    summary = summaries.header(config, world.size, [r["hostname"] for r in everyone], run_dir, started_at, wall_s)
    summary["config"] = dataclasses.asdict(config)
    for key, value in sections.items():
        if callable(value):
            value = value(everyone)
        summary[key] = value
    if "train" in everyone[0]:
        summary["train"] = summaries.train_section(everyone, config, bool((summary.get("dataset") or {}).get("page_cache_risk")))
        if config.evaluation.enabled:
            summary["eval"] = summaries.eval_section(everyone)
    if "replay" in everyone[0]:
        summary["replay"] = everyone[0]["replay"]  # run_replay already reduced over ranks
    summary["io"] = summaries.io_section(everyone)
    summary["latency"] = latency.latency_section(everyone)
    summary["ranks"] = summaries.rank_rows(everyone)
    summary["traces"] = _write_traces(ctx, everyone, darshan_runtime)
    # Rank 0 writes the traces after the gather; its peak is taken again once they are written.
    summary["ranks"][0]["peak_rss_bytes"] = max(summary["ranks"][0]["peak_rss_bytes"], peak_rss_bytes())
    summary["peak_rss_bytes_max"] = max(r["peak_rss_bytes"] for r in summary["ranks"])
    summary["warnings"] = warnings
    wrote_checkpoints = bool((summary.get("checkpoint") or {}).get("writes"))
    summary["created"] = created_paths(config, ctx.checkpoint_root() if wrote_checkpoints else None, summary.get("dataset"))
    summary["left_on_disk"] = left_on_disk(config, summary["created"], summary.get("dataset"), run_dir)
    summary.update(mlperf.dlio_header(everyone, started_at))
    summary["metric"] = mlperf.dlio_metric([summary], config.dataset.record_length_bytes)
    summaries.write_summary(run_dir, summary)
    if report:
        print_report(summary, config.progress)
    return summary


def _write_traces(ctx: RunContext, everyone: list[dict[str, Any]], darshan_runtime: Any) -> dict[str, Any]:
    config = ctx.config
    traces: dict[str, Any] = {"events": "events" if config.trace.events else None, "darshan": None, "chrome": None}
    if not (config.trace.darshan or config.trace.chrome or darshan_runtime is not None):
        return traces

    ranks = event_files(ctx.run_dir)  # read a block at a time by the writers, never loaded whole
    job = JobInfo.for_run(ctx.world.size, ctx.clock.job_start_wall, time.time(), [r["hostname"] for r in everyone],
                          metadata={"run_id": ctx.run_id, "workload": config.workload}, mpi=ctx.world.parallel)
    traces.update(write_trace_outputs(ctx.run_dir, ranks, job, darshan=config.trace.darshan, chrome=config.trace.chrome,
                                      runtime=darshan_runtime))
    if not config.trace.events:
        for path in ranks:
            os.unlink(path)
    return traces
