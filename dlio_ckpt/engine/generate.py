"""Generate the dataset in parallel over ranks, or reuse a matching one.

Reuse is decided by rank 0 from the dataset manifest (the plan's fingerprint and every file's
size) and broadcast. The dataset is committed once, as a whole, by its manifest, not file by file:
regeneration first removes the manifest (and fsyncs its folder, so the removal survives a power
loss before any file is overwritten); each file is then written under its final name and fsynced;
once every rank is done, rank 0 fsyncs each folder once (the files' folders and every folder above
them up to storage.root: storage/durable.py) and writes the manifest last, atomically. A dataset
without its manifest is never trusted, so a crash at any point leaves one that is regenerated.

Why not stage each file (temporary name, fsync, rename, folder fsync)? The manifest already makes
the dataset all-or-nothing, and staging cost a rename and a folder fsync (a journal commit) per
file: 24 files of 32 MiB made 57 fsyncs and 26 renames, now 32 and 1 (benchmarks/README.md,
"Generation committed once"). A file that fails while written is removed (its handle's abort).
In place is for one writer only: a run that finds another generating the same dataset stages its
files (engine/dataset_claim.py). Every file operation goes through the (traced) storage, so it
works on any backend (on S3 an object appears only when its upload completes, and there are no
folders to sync).
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlio_ckpt.engine.context import RunContext
from dlio_ckpt.engine.ownership import mark_dataset
from dlio_ckpt.engine.dataset_claim import claim_dataset, release_claim, wait_for_live_claim
from dlio_ckpt.errors import RunFailure, UserError, failure_text, storage_failure
from dlio_ckpt.faults import fault_point
from dlio_ckpt.formats.base import DatasetFormat, FileSpec, FormatOptions
from dlio_ckpt.metrics.progress import Progress
from dlio_ckpt.plan import dataset_manifest
from dlio_ckpt.plan.dataset import MANIFEST_NAME, DatasetPlan, generation_share
from dlio_ckpt.storage.durable import backend_root, entry_folders, sync_folders


MANIFEST_WRITE_BYTES = 1 << 20  # the manifest goes out in writes of about this size (one below it)


@dataclass(frozen=True)
class GenerateResult:
    reused: bool
    files_written: int
    seconds: float
    bytes_on_disk: int


def format_options(ctx: RunContext) -> FormatOptions:
    ds = ctx.config.dataset
    return FormatOptions(
        compression=ds.compression,
        compression_level=ds.compression_level,
        chunking=ds.chunking,
        chunk_size_bytes=ds.chunk_size_bytes,
        write_chunk_bytes=ctx.config.generate.write_chunk_bytes,
        transfer_size=ctx.config.reader.transfer_size,
        parquet_columns=tuple(ds.parquet_columns),
        row_group_size=ds.parquet_row_group_size,
        npz_reads=ctx.config.reader.npz_reads,
    )


def all_paths(plan: DatasetPlan, fmt: DatasetFormat) -> Iterator[str]:
    """Every file's path (each main file, then its companions), one at a time."""
    if not fmt.companion_suffixes:
        return plan.files.paths()
    suffixes = ("",) + tuple(fmt.companion_suffixes)
    return (path + suffix for path in plan.files.paths() for suffix in suffixes)


def relative_paths(plan: DatasetPlan, fmt: DatasetFormat) -> Iterator[str]:
    """all_paths relative to the dataset's folder, as the manifest names them: os.path.relpath's
    result, taken by slicing where a path starts with the folder (every path the naming rule
    makes does; relpath cost ~20 us a file, most of the manifest's own time)."""
    folder = os.path.join(plan.folder, "")
    for path in all_paths(plan, fmt):
        yield path[len(folder):] if path.startswith(folder) and ".." not in path else os.path.relpath(path, plan.folder)


def dataset_folders(plan: DatasetPlan, top: str) -> list[str]:
    """The folders the dataset's files depend on, deepest first, each once: every file's folder
    and the folders above it up to `top` (from the plan's naming rule, not its files: pure, no I/O)."""
    return entry_folders((os.path.join(folder, MANIFEST_NAME) for folder in plan.files.folders()), top)


def _matching_bytes(storage: Any, plan: DatasetPlan) -> int | None:
    """The dataset's bytes on disk where the manifest is there, its fingerprint matches and every
    file is there with the size it recorded (read one entry at a time: dataset_manifest.decode);
    None where not. The sizes stat'ed here are the ones the run reports (no second stat a file)."""
    if not storage.exists(plan.manifest_path):
        return None
    try:
        handle = storage.open_read(plan.manifest_path)
    except OSError:
        return None
    try:
        header, sizes = dataset_manifest.decode(dataset_manifest.text_lines(handle.read_at, handle.size()))
        if header.get("fingerprint") != plan.fingerprint:
            return None
        checked = total = 0
        for relative, size in sizes:
            try:
                if storage.file_size(os.path.join(plan.folder, relative)) != size:
                    return None
            except OSError:
                return None
            checked += 1
            total += size
        return total if checked > 0 else None
    except (ValueError, OSError):
        return None
    finally:
        handle.close()


def _write_manifest(storage: Any, plan: DatasetPlan, fmt: DatasetFormat, workload: str) -> int:
    """The commit record, last: header and every file's size, written through the backend's
    commit primitive (temporary name, fsync, rename, folder fsync on POSIX) in pieces of
    MANIFEST_WRITE_BYTES (one write below that size), the names made again as they are written:
    no table of names is held. The sizes are stat'ed first, as before the manifest was streamed
    (the same calls in the same order), a block at a time into an unlinked temporary file (int64,
    untraced: the emulator's own scratch, not the dataset's I/O), and read back a block at a time:
    held in memory they took 8 bytes a file. Returns their sum, the dataset's bytes on disk (the
    run reports it: no second stat of every file)."""
    paths = all_paths(plan, fmt)
    block = _size_block(storage, paths)
    if len(block) < SIZE_BLOCK:  # the whole dataset in one block (most datasets): no scratch file
        _write_manifest_entries(storage, plan, fmt, workload, zip(relative_paths(plan, fmt), block.tolist()))
        return int(block.sum())
    with tempfile.TemporaryFile(prefix=".dlio_ckpt-sizes-") as scratch:
        total = 0
        while len(block):
            total += int(block.sum())
            scratch.write(block.tobytes())
            block = _size_block(storage, paths)
        scratch.seek(0)
        _write_manifest_entries(storage, plan, fmt, workload, zip(relative_paths(plan, fmt), _sizes_read_back(scratch)))
    return total


def _size_block(storage: Any, paths: Iterator[str]) -> np.ndarray:
    """The sizes of the next SIZE_BLOCK files of `paths` (fewer at its end), stat'ed in order."""
    return np.fromiter((storage.file_size(p) for p in itertools.islice(paths, SIZE_BLOCK)), np.int64)


SIZE_BLOCK = 1 << 16  # file sizes stat'ed, and read back, per block (512 KiB)


def _sizes_read_back(scratch: Any) -> Iterator[int]:
    while chunk := scratch.read(8 * SIZE_BLOCK):
        yield from np.frombuffer(chunk, np.int64).tolist()


def _write_manifest_entries(storage: Any, plan: DatasetPlan, fmt: DatasetFormat, workload: str, entries: Iterator) -> None:
    """The manifest of `entries` (relative name, size), written in MANIFEST_WRITE_BYTES pieces."""
    header = {"fingerprint": plan.fingerprint, "format": fmt.name, "workload": workload,
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    handle = storage.open_staged(plan.manifest_path)
    try:
        pending: list[bytes] = []
        held = 0
        for piece in dataset_manifest.encode(header, entries):
            pending.append(piece.encode())
            held += len(pending[-1])
            if held >= MANIFEST_WRITE_BYTES:
                handle.write(b"".join(pending))
                pending, held = [], 0
        if pending:
            handle.write(b"".join(pending))
        handle.fsync()
    except BaseException:
        handle.abort()
        raise
    handle.close()


def write_file(storage: Any, fmt: DatasetFormat, spec: FileSpec, source: Any, options: FormatOptions, fsync: bool,
               rank: int = 0, staged: bool = False) -> None:
    """Write one dataset file (and its companions) under its final name, fsynced when `fsync`; on a
    failure it is removed. Only the dataset's manifest, written after every file, makes it trusted.
    `staged`: through a temporary name instead (another run is generating the same dataset).
    The bytes it wrote are counted by the traced storage (the generate phase's `bytes_written`)."""
    opened: dict[str, Any] = {}
    opener = storage.open_staged if staged else storage.open_write

    def open_output(suffix: str) -> Any:
        handle = opener(f"{spec.path}{suffix}")
        opened[suffix] = handle
        return handle

    try:
        fmt.write(open_output, spec, source, options)
        fault_point("generate-write", rank, spec.path)
        for handle in opened.values():
            if fsync:
                handle.fsync()
            handle.close()
    except BaseException:
        for handle in opened.values():
            handle.abort()
        raise


def ensure_dataset(ctx: RunContext, plan: DatasetPlan, fmt: DatasetFormat) -> GenerateResult:
    config, world = ctx.config, ctx.world
    storage = ctx.storage.with_phase("generate")

    def decide() -> tuple[bool, bool, int | None]:
        """(reuse, in place, the dataset's bytes on disk where reused) on rank 0."""
        on_disk = None if config.generate.force else _matching_bytes(storage, plan)
        if on_disk is not None:
            return True, False, on_disk
        if not config.generate.enabled:
            raise UserError(
                f"no matching dataset in {plan.folder} and generate.enabled=false; "
                "set generate.enabled=true or point dataset.folder at a generated dataset"
            )
        if storage.exists(plan.manifest_path):
            storage.remove(plan.manifest_path)
            if config.storage.fsync:  # the removal reaches the disk before any file is overwritten in place
                sync_folders(storage, [os.path.dirname(plan.manifest_path)])
        for folder in plan.files.folders():
            storage.makedirs(folder)
        in_place = claim_dataset(storage, plan)
        if not in_place and wait_for_live_claim(storage, plan):
            # another run of this host generated it meanwhile, in place: use its commit, or take over
            on_disk = None if config.generate.force else _matching_bytes(storage, plan)
            if on_disk is not None:
                return True, False, on_disk
            in_place = claim_dataset(storage, plan)
        mark_dataset(ctx.storage.inner, plan.folder, ctx.run_id, ctx.run_dir)  # this run's now (clean may remove it)
        return False, in_place, None

    reused, in_place, on_disk = world.root_first(decide)
    # The content pool (64 MiB of seeded random bytes, ~0.2 s) is set-up, like fio filling its
    # buffers before it starts its clock: generate_s times the files only.
    source = None if reused else ctx.source(seed=config.dataset.seed, zeros=config.dataset.content == "zeros")
    start = time.perf_counter()
    written_files = 0
    if not reused:
        options = format_options(ctx)
        share = generation_share(plan, world.rank, world.size)
        progress = Progress(f"generating {len(plan.files)} {fmt.name} files", len(share), enabled=config.progress and world.is_root, unit="files")
        failure: BaseException | None = None
        try:
            for spec in share:
                try:
                    write_file(storage, fmt, spec, source, options, config.storage.fsync, rank=world.rank,
                               staged=not in_place)
                except OSError as exc:  # a full disk, say: name the file (its partial copy is gone)
                    raise storage_failure(exc, spec.path) from None
                written_files += 1
                progress.advance(1, spec.payload_bytes)  # sample payload: the rate shown is nominal, the count exact
        except Exception as exc:  # every rank must learn of it, or the others wait forever
            failure = exc
        finally:
            progress.close()
        if not world.agree(failure is None):
            if in_place and world.is_root:
                release_claim(storage, plan)  # nothing committed: the next run may write in place
            if isinstance(failure, UserError):
                raise failure
            # One line from each rank that failed; the others end quietly (exit 1).
            raise RunFailure(f"dataset generation failed: {failure_text(failure)}" if failure else "", known_everywhere=True)

        def finish() -> int:
            if config.storage.fsync:
                # Every file's entry in its folder, and each folder's entry in its parent up to
                # storage.root: each folder fsynced once, after all ranks wrote, before the manifest.
                sync_folders(storage, dataset_folders(plan, backend_root(storage) or config.storage.root))
            on_disk = _write_manifest(storage, plan, fmt, config.workload)
            if in_place:
                release_claim(storage, plan)  # committed: the next generation may write in place
            return on_disk

        on_disk = world.root_first(finish)
    seconds = world.allreduce_max(time.perf_counter() - start)
    return GenerateResult(reused=reused, files_written=int(world.allreduce_sum(written_files)), seconds=seconds,
                          bytes_on_disk=int(on_disk))
