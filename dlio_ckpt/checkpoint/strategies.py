"""Checkpoint strategies (`checkpoint.strategy=`): who writes which file, and whether training waits.

- sharded: every rank writes the files it owns, in parallel; training waits for the slowest rank
  and the commit.
- single_writer: every rank sends its state to rank 0 over MPI, chunk by chunk, and rank 0
  writes all of it while the others wait (the framework default that Rojas et al. found to be
  the bottleneck); the gather is part of what is measured, as it is in a real framework.
- async (CheckFreq / DataStates style): a blocking snapshot copies the rank's shard into a host
  staging buffer; a background thread persists it while training continues; at most
  `max_in_flight` checkpoints are in flight and the next save waits. Files that do not fit in the
  staging buffer are written synchronously during the blocking phase, so a small buffer shows up
  as blocking time rather than being hidden. Commits (collectives) run on the training thread
  only, at the next save or at finish, because MPI collectives from a helper thread are not safe.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import json

from dlio_ckpt.checkpoint.base import CheckpointRecord
from dlio_ckpt.checkpoint.encoded import Payload, container_tensor, merge_stats
from dlio_ckpt.checkpoint.fileio import FileEntry, now
from dlio_ckpt.checkpoint.framework_work import spend_cpu, thread_cpu
from dlio_ckpt.codec_registry import codec_names, encoding_label
from dlio_ckpt.errors import RunFailure, failure_text, report_failure
from dlio_ckpt.faults import fault_point
from dlio_ckpt.memory import peak_rss_bytes
from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.state.base import BytesView


def add_write_figures(record: CheckpointRecord, entries: list[FileEntry]) -> None:
    """The parts of the record's write time spent in write calls and in fsync (the rest is the
    format's serialization); write calls unknown (None) when a framework made them itself."""
    calls = [e.write_calls_s for e in entries]
    record.write_calls_s = None if any(c is None for c in calls) else sum(calls)
    record.fsync_s = sum(e.fsync_s for e in entries)
    record.prepare_s = sum(e.prepare_s for e in entries)


def framework_work(engine: Any, step: int, exchange: Callable[[], None] | None = None) -> float:
    """The save's framework work before its first byte (framework_work.py), its wall seconds: what
    the emulation does for real (the format's storage setup, DCP's `_storage_setup`, for a folder
    on local paths; `exchange`, DCP's planning), then the rest of checkpoint.framework_cpu_s as CPU
    work (the walk of the program's objects the emulator has not got), and in this engine's first save
    checkpoint.framework_first_cpu_s more (the framework's first-time work: TensorFlow traces its
    save functions once)."""
    start, cpu = now(), thread_cpu()
    setup = getattr(engine.fmt, "storage_setup", None)
    if setup is not None and engine.storage.capabilities.local_paths:
        setup(engine.folder_path(step))
    if exchange is not None:
        exchange()
    first = engine.cfg.framework_first_cpu_s if not engine.records else 0.0
    spend_cpu(engine.cfg.framework_cpu_s + first - (thread_cpu() - cpu))
    return now() - start


def add_codec_figures(record: CheckpointRecord, encoding: str, entries: list[FileEntry],
                      encoded_elsewhere: list[tuple[int, float, dict]]) -> None:
    """The state this rank's checkpoint represents and what encoding it cost: from the files it
    wrote, or (single_writer senders) from the files it encoded and sent to rank 0."""
    record.encoding = encoding
    owned = [(e.logical_bytes, e.encode_s, e.stats) for e in entries if e.owner == e.writer] + list(encoded_elsewhere)
    record.logical_bytes = sum(logical for logical, _, _ in owned)
    record.encode_s = sum(seconds for _, seconds, _ in owned)
    record.codec = merge_stats([stats for _, _, stats in owned if stats])


class SyncStrategy:
    """Write, fsync, commit, then return: training waits for all of it."""

    name = "sharded"
    # What a strategy declares about itself, read where the run is configured and reported
    # (checkpoint.registry.strategy_declares) instead of testing its name:
    persists_in_background = False  # training resumes before the write ends (staging buffers, memory limits)
    gathers_to_one_writer = False  # every rank's state goes to one rank, which writes it all

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def files_to_write(self) -> tuple[PlannedFile, ...]:
        return self.engine.plan.files_by_rank[self.engine.world.rank]

    def write(self, index: int, step: int) -> list[FileEntry]:
        """This rank's part of checkpoint `step`; returns the entries of the files it wrote."""
        e = self.engine
        return e.write_planned(self.files_to_write(), step, lambda pf: e.payload(pf, index))

    def save(self, index: int, step: int, epoch: int) -> CheckpointRecord:
        e = self.engine
        start, cpu = now(), thread_cpu()
        self.encoded_here = []  # (logical bytes, encode seconds, stats) of files this rank encoded, not wrote
        exchange = getattr(e.fmt, "exchange_plans", None)
        # DCP plans inside its save: the plans' gather and scatter (formats.py)
        framework_s = framework_work(e, step, exchange and (
            lambda: exchange(e.world, e.layout.held_tensors(e.plan.model, e.world.rank))))
        entries, error = self.write_or_failure(index, step)
        metadata, commit_s = e.commit(index, step, epoch, entries, error)
        total, cpu_s = now() - start, thread_cpu() - cpu - sum(x.prepare_cpu_s for x in entries)
        record = CheckpointRecord(
            index=index, step=step, epoch=epoch, bytes=sum(x.bytes_written for x in entries), files=len(entries),
            blocking_s=total, persist_s=total, write_s=sum(x.write_s for x in entries), strategy=self.name,
            folder=e.checkpoint_name(step), metadata_bytes=metadata, commit_s=commit_s, committed=True,
            peak_rss_bytes=peak_rss_bytes(), verify_s=sum(x.verify_s for x in entries), framework_s=framework_s,
            cpu_s=cpu_s,
        )
        add_codec_figures(record, encoding_label(e.cfg), entries, self.encoded_here)
        add_write_figures(record, entries)
        return record

    def write_or_failure(self, index: int, step: int) -> tuple[list[FileEntry], BaseException | None]:
        """This rank's entries, or the error that the commit reports to every rank (so none waits forever)."""
        try:
            return self.write(index, step), None
        except Exception as exc:
            return [], exc

    def finish(self) -> None:
        pass


class ShardedStrategy(SyncStrategy):
    name = "sharded"


GATHER_TAG = 7001
GATHER_FAILED_TAG = 7002  # a sender failed: the message says why
GATHER_META_TAG = 7003  # an encoded file's container size and manifest description, before its bytes


class SingleWriterStrategy(SyncStrategy):
    """Rank 0 writes everything while the others stream their state to it.

    A failure of rank 0 must not go to the commit: the other ranks are inside point-to-point
    transfers, not a collective, so the commit's gather would wait forever (rank 0 in the gather,
    rank 1 in a Send nobody receives). Rank 0 instead removes the partial checkpoint, says why in
    one line and ends the job (RunFailure, not known everywhere: MPI_Abort). A sender that fails
    tells rank 0 in a small message and goes to the commit: rank 0 either is still waiting for its
    data (it gets the message, and fails as above, naming that rank) or has all of it already
    (the message stays unread, and the commit reports the failure to every rank).
    """

    name = "single_writer"
    gathers_to_one_writer = True

    def write_or_failure(self, index: int, step: int) -> tuple[list[FileEntry], BaseException | None]:
        e = self.engine
        if not e.world.parallel:
            return super().write_or_failure(index, step)
        if e.world.is_root:
            try:
                return e.write_planned(self.files_to_write(), step, lambda pf: self._payload(pf, index)), None
            except Exception as exc:
                e.discard_failed(step)
                report_failure(f"checkpoint {e.checkpoint_name(step)} not written: {failure_text(exc)}", e.world)
                raise RunFailure() from None
        try:
            self._send_own_state(index, step)
        except Exception as exc:
            reason = np.frombuffer(failure_text(exc).encode()[:1024], dtype=np.uint8)
            e.world.comm.Send(reason, dest=0, tag=GATHER_FAILED_TAG)  # small: sent eagerly, never blocks
            return [], exc
        return [], None

    def files_to_write(self) -> tuple[PlannedFile, ...]:
        e = self.engine
        if not e.world.is_root:
            return ()
        return tuple(pf for rank_files in e.plan.files_by_rank for pf in rank_files)


    def _send_own_state(self, index: int, step: int) -> None:
        """Stream this rank's files to rank 0 in write-chunk messages, in the plan's order; an
        encoded file is encoded here, by the rank that holds the state, and rank 0 first hears
        its container's size and description (a small message)."""
        e = self.engine
        for pf in e.plan.files_by_rank[e.world.rank]:
            payload = e.payload(pf, index)
            if payload.encoding is not None:
                self.encoded_here.append((pf.payload_bytes, payload.encode_s, payload.stats))
                meta = json.dumps({"nbytes": payload.tensors[0].nbytes, "encoding": payload.encoding}).encode()
                e.world.send(np.frombuffer(meta, dtype=np.uint8), dest=0, tag=GATHER_META_TAG)
            for tensor in payload.tensors:
                for number, piece in enumerate(payload.chunks(tensor)):
                    e.world.send(piece, dest=0, tag=GATHER_TAG)
                    if number == 0:
                        fault_point(f"checkpoint-write:{step}", e.world.rank)
            fault_point(f"checkpoint-step:{step}", e.world.rank)

    def _payload(self, pf: PlannedFile, index: int) -> Payload:
        """On rank 0: its own files from its state, every other rank's as they arrive."""
        e = self.engine
        if pf.owner == 0:
            return e.payload(pf, index)
        buffer = np.empty(max(e.cfg.write_chunk_bytes, 1 << 16), dtype=np.uint8)
        tensors, encoding = pf.tensors, None
        if codec_names(e.cfg):
            meta = self._receive(buffer, pf.owner)
            tensors, encoding = (container_tensor(meta["nbytes"]),), meta["encoding"]

        def received(tensor):
            from mpi4py import MPI

            status = MPI.Status()
            remaining = tensor.nbytes
            while remaining > 0:
                e.world.comm.Recv(buffer, source=pf.owner, tag=MPI.ANY_TAG, status=status)
                count = status.Get_count(MPI.BYTE)
                if status.Get_tag() == GATHER_FAILED_TAG:
                    raise _SenderFailed(pf.owner, bytes(buffer[:count]).decode(errors="replace"))
                remaining -= count
                yield memoryview(buffer[:count])

        return Payload(tensors, received, encoding)

    def _receive(self, buffer: np.ndarray, rank: int) -> dict:
        """The description of `rank`'s next encoded file (or its failure)."""
        from mpi4py import MPI

        status = MPI.Status()
        self.engine.world.comm.Recv(buffer, source=rank, tag=MPI.ANY_TAG, status=status)
        count = status.Get_count(MPI.BYTE)
        text = bytes(buffer[:count]).decode(errors="replace")
        if status.Get_tag() == GATHER_FAILED_TAG:
            raise _SenderFailed(rank, text)
        return json.loads(text)


class _SenderFailed(Exception):
    """On rank 0: a rank failed while sending its state."""

    def __init__(self, rank: int, reason: str) -> None:
        super().__init__(f"rank {rank} failed: {reason}")

    def __repr__(self) -> str:
        return str(self)


@dataclass
class _InFlight:
    index: int
    step: int
    epoch: int
    record: CheckpointRecord
    future: concurrent.futures.Future
    buffer: np.ndarray | None
    sync_entries: list[FileEntry] = field(default_factory=list)
    save_start: float = 0.0


class AsyncStrategy:
    """Snapshot into a staging buffer (blocking), persist in a background thread."""

    name = "async"
    persists_in_background = True
    gathers_to_one_writer = False

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._in_flight: list[_InFlight] = []
        self._free: list[np.ndarray] = []
        self.buffer_bytes = self._buffer_size()

    def _buffer_size(self) -> int:
        e = self.engine
        shard = e.plan.rank_bytes(e.world.rank)
        if e.cfg.staging_buffer_bytes:
            return e.cfg.staging_buffer_bytes
        try:
            import psutil

            available = psutil.virtual_memory().available
        except Exception:  # no psutil: a conservative 1 GiB
            available = 4 << 30
        return max(0, min(shard, available // 4 // max(1, e.cfg.max_in_flight)))

    def _buffer(self) -> np.ndarray:
        if self._free:
            return self._free.pop()
        return np.empty(self.buffer_bytes, dtype=np.uint8)

    def save(self, index: int, step: int, epoch: int) -> CheckpointRecord:
        e = self.engine
        start = now()
        # Bound the checkpoints in flight: wait for the oldest persist before the next snapshot.
        while len(self._in_flight) >= e.cfg.max_in_flight:
            concurrent.futures.wait([self._in_flight[0].future])  # its error, if any, goes to the commit
            self._commit_done(wait_all=False, oldest=True)
        wait_s = now() - start
        self._commit_done(wait_all=False)

        files = e.plan.files_by_rank[e.world.rank]
        buffer = self._buffer() if files and self.buffer_bytes else None
        staged: list[tuple[PlannedFile, int]] = []  # (file, offset in the buffer)
        direct: list[PlannedFile] = []
        offset = 0
        framework_s = framework_work(e, step)  # before the snapshot, in the blocking part, as an async save's state_dict()
        snap_start = now()
        for pf in files:
            size = pf.payload_bytes
            if buffer is not None and offset + size <= len(buffer):
                position = offset
                for piece in e.state.view(pf).stream(e.cfg.write_chunk_bytes):
                    buffer[position : position + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
                    position += len(piece)
                staged.append((pf, offset))
                offset += size
            else:
                direct.append(pf)
        snapshot_s = now() - snap_start
        sync_entries: list[FileEntry] = []
        failed: concurrent.futures.Future | None = None
        if direct:  # what did not fit in the staging buffer is written while training waits
            if e.encoder is not None:
                # An encoder takes one file at a time, in checkpoint order: let the persist thread
                # finish the earlier checkpoints' files before this thread encodes (max_in_flight > 1).
                concurrent.futures.wait([f.future for f in self._in_flight])
            try:
                sync_entries = e.write_planned(tuple(direct), step, lambda pf: e.payload(pf, index))
            except Exception as exc:  # reported through the commit, like a failed persist, so no rank waits forever
                failed = concurrent.futures.Future()
                failed.set_exception(exc)
        record = CheckpointRecord(
            index=index, step=step, epoch=epoch, bytes=0, files=0, blocking_s=0.0, persist_s=0.0,
            write_s=sum(x.write_s for x in sync_entries), strategy=self.name, folder=e.checkpoint_name(step), wait_s=wait_s,
            snapshot_s=snapshot_s, peak_rss_bytes=peak_rss_bytes(), framework_s=framework_s,
        )
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-persist")
        future = failed or self._executor.submit(self._persist, staged, buffer, index, step, start, record)
        self._in_flight.append(_InFlight(index, step, epoch, record, future, buffer, sync_entries, start))
        record.blocking_s = now() - start
        return record

    def _persist(self, staged, buffer, index, step, save_start, record) -> list[FileEntry]:
        """In the persist thread: encode (when asked) and write the snapshot of each staged file."""
        e = self.engine
        if not staged:
            return []
        offsets = {id(pf): off for pf, off in staged}

        def payload_for(pf: PlannedFile) -> Payload:
            base = offsets[id(pf)]
            return e.payload(pf, index, view=BytesView(buffer[base : base + pf.payload_bytes]))

        entries = e.write_planned(tuple(pf for pf, _ in staged), step, payload_for)
        record.write_s += sum(x.write_s for x in entries)
        record.persist_s = now() - save_start
        return entries

    def _commit_done(self, wait_all: bool, oldest: bool = False) -> None:
        """Collective: commit every checkpoint whose persist finished on every rank, in order."""
        e = self.engine
        while self._in_flight:
            head = self._in_flight[0]
            if wait_all or oldest:
                concurrent.futures.wait([head.future])
            local_done = head.future.done()
            if not e.world.agree(local_done):
                if wait_all:
                    continue
                return
            error = head.future.exception()
            entries = [] if error else head.future.result()
            entries = list(head.sync_entries) + list(entries)
            metadata, commit_s = e.commit(head.index, head.step, head.epoch, entries, error)
            record = head.record
            record.bytes = sum(x.bytes_written for x in entries)
            record.verify_s = sum(x.verify_s for x in entries)
            record.files = len(entries)
            record.metadata_bytes = metadata
            record.commit_s = commit_s
            record.committed = True
            add_codec_figures(record, encoding_label(e.cfg), entries, [])
            add_write_figures(record, entries)
            if record.persist_s == 0.0:
                record.persist_s = record.blocking_s
            if not record.bytes:
                record.write_s = 0.0
            record.peak_rss_bytes = max(record.peak_rss_bytes, peak_rss_bytes())
            if head.buffer is not None:
                self._free.append(head.buffer)
            self._in_flight.pop(0)
            if oldest:
                return

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def abandon(self) -> list[int]:
        """A failure: checkpoints still being persisted are never committed (a thread cannot be
        killed, so their persists run out first, their errors ignored); returns their steps, whose
        uncommitted folders the engine removes."""
        steps = [f.step for f in self._in_flight]
        concurrent.futures.wait([f.future for f in self._in_flight])
        self._in_flight.clear()
        self._free.clear()
        return steps

    def finish(self) -> None:
        self._commit_done(wait_all=True)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._free.clear()
