"""Writes one checkpoint's files for one rank, as a WritePlan says, through the format.

The writer is the only part of the checkpoint engine that creates data files (DCP's
StorageWriter.write_data): each file is written through the checkpoint format (or the framework's
own file writer), fsynced as checkpoint.durability says, and described by a FileEntry for the
manifest. On any failure it removes the files it started, so a failed checkpoint leaves no
partial files of this rank behind, and names the file in one line (`storage_failure`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from dlio_ckpt.checkpoint.encoded import Payload
from dlio_ckpt.checkpoint.fileio import FileEntry, write_file, write_framework_file
from dlio_ckpt.checkpoint.write_plan import WritePlan
from dlio_ckpt.errors import storage_failure
from dlio_ckpt.faults import fault_point
from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.plan.model import TensorSpec


class CheckpointWriter:
    """One rank's writer: `rank` is the writer recorded in each entry and the rank fault points name.

    `fmt`: the checkpoint format; `framework_writes`: the format's framework opens and names its
    own files (TensorFlow), staged per rank; `data_fsync`, `checksum`, `chunk_bytes`: as resolved
    from checkpoint.* by the engine."""

    def __init__(self, storage: Any, fmt: Any, rank: int, data_fsync: bool, checksum: str, chunk_bytes: int,
                 framework_writes: bool) -> None:
        self.storage = storage
        self.fmt = fmt
        self.rank = rank
        self.data_fsync = data_fsync
        self.checksum = checksum
        self.chunk_bytes = chunk_bytes
        self.framework_writes = framework_writes

    def write(self, plan: WritePlan, payload_for: Callable[[PlannedFile], Payload]) -> list[FileEntry]:
        """Write the files of `plan` (each fsynced) and return their manifest entries."""
        entries = []
        started: list[str] = []
        path = plan.folder
        try:
            for item in plan.files:
                pf = item.planned
                path = item.path
                if item.makes_folder is not None:
                    self.storage.makedirs(item.makes_folder)
                started.append(path)
                payload = payload_for(pf)
                chunks = self._with_write_fault_point(payload.chunks, plan.step, path)
                if self.framework_writes:
                    done = write_framework_file(self.storage, path, pf.owner, payload.tensors, self.fmt, chunks,
                                                self.data_fsync, self.checksum, self.chunk_bytes)
                else:
                    done = write_file(self.storage, path, payload.tensors, self.fmt, chunks, self.data_fsync,
                                      self.checksum, self.chunk_bytes)
                entries.append(FileEntry(item.relpath, done.size, done.checksum, pf.owner, self.rank,
                                         done.bytes_written, done.write_s, done.verify_s, payload.encoding,
                                         pf.payload_bytes, payload.encode_s, payload.stats or None,
                                         done.write_calls_s, done.fsync_s, done.prepare_s, done.records,
                                         prepare_cpu_s=done.prepare_cpu_s))
                fault_point(f"checkpoint-step:{plan.step}", self.rank)
        except OSError as exc:  # a full disk, say: name the file, and leave no partial files behind
            self.remove(started)
            raise storage_failure(exc, exc.filename or path) from None
        except BaseException:
            self.remove(started)
            raise
        return entries

    def _with_write_fault_point(self, chunks: Callable[[TensorSpec], Iterator[memoryview]], step: int,
                                path: str) -> Callable[[TensorSpec], Iterator[memoryview]]:
        """`chunks`, with the `checkpoint-write:<step>` fault point after each tensor's first chunk
        (the format has written that chunk to `path` before it asks for the next)."""
        point = f"checkpoint-write:{step}"

        def with_fault_point(tensor: TensorSpec) -> Iterator[memoryview]:
            for number, piece in enumerate(chunks(tensor)):
                yield piece
                if number == 0:
                    fault_point(point, self.rank, path)

        return with_fault_point

    def remove(self, paths: list[str]) -> None:
        """This rank's files of a checkpoint that failed: they would only fill the disk."""
        for path in paths:
            try:
                if self.storage.exists(path):
                    self.storage.remove(path)
            except OSError:
                pass  # the failure being reported matters more than a leftover file
