"""The checkpoint keys of the workload, from the checkpoint files' records (pure but for on_disk).

Rules (docs/profile.md):
- saves: the checkpoint files' first opens, grouped in time (a new save starts once dataset reads
  happened since the previous checkpoint file; without reads to go by, after a pause); files per
  save, bytes per save and per rank follow;
- bytes: what POSIX and STDIO counted; when they counted nothing for a file that a rank opened
  (torch.save: fopen, then writev on the descriptor, which darshan-runtime does not see), its size
  on disk when it is still there, or the --strace counts (strace_input.py);
- layout and format: from the file names (.distcp and .metadata: pytorch_dcp; ckpt-N.index and
  .data-*: tensorflow; .pt/.pth/.bin of a torch program: torch) and the writing ranks; `flat`
  where every save's files are in one folder (a torch.save loop makes no folder per save);
- interval: epochs per save when the saves divide the epochs;
- fsync and rename: POSIX_FSYNCS / POSIX_RENAME_SOURCES on the checkpoint files;
- the model: dlio_ckpt-describe-model's readers on the first save still on disk, so the emulated
  checkpoint holds the same tensors; else a blob of the per-save bytes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from dlio_ckpt.plan.checkpoint_formats import archive_stem
from dlio_ckpt.profile import on_disk
from dlio_ckpt.profile.classify import CHECKPOINT, Roles
from dlio_ckpt.profile.records import FileUse, Job
from dlio_ckpt.profile.values import ASSUMED, INFERRED, MEASURED, Value, assumed


@dataclass
class Save:
    start: float
    files: list[tuple[str, int, int]]  # (path, rank index, bytes written)

    @property
    def bytes(self) -> int:
        return sum(b for _, _, b in self.files)


@dataclass
class CheckpointFacts:
    saves: list[Save]
    per_save_bytes: int
    bytes_source: str  # "log", "disk", "strace", "unknown"
    model_yaml: str | None
    format: str = "raw"  # checkpoint.format as inferred
    on_disk: str | None = None  # the first save's checkpoint, still on disk, that describe-model read


def checkpoint_values(job: Job, roles: Roles, epochs: int, framework: str,
                      extra_bytes: dict[str, int] | None = None, reads: list[float] | None = None) -> tuple[list[Value], CheckpointFacts]:
    """`extra_bytes`: bytes written per path from a second input (strace), for files the log saw
    opened but not written; `reads`: the dataset files' open times (saves lie between them)."""
    uses: list[tuple[FileUse, int]] = []
    ranks = [i for i, r in enumerate(roles.processes) if r == "rank"]
    for index, process in enumerate(job.processes):
        for f in process.files:
            if roles.files.get(f.path) == CHECKPOINT:
                uses.append((f, ranks.index(index) if index in ranks else process.rank))
    if not uses:
        values = [Value("checkpoint.enabled", False, INFERRED, "no file was written under a checkpoint folder or name")]
        return values, CheckpointFacts([], 0, "log", None)
    values: list[Value] = []
    add = values.append
    extra_bytes = extra_bytes or {}
    sources = set()
    sized: list[tuple[FileUse, int, int]] = []
    for f, rank in uses:
        written, source = _bytes_of(f, extra_bytes)
        sources.add(source)
        sized.append((f, rank, written))
    saves = _saves(sized, sorted(reads or []))
    per_save = [s.bytes for s in saves]
    source = "log" if sources == {"log"} else "+".join(sorted(sources))
    add(Value("checkpoint.enabled", True, MEASURED, f"{len(uses)} checkpoint file records under {roles.checkpoint_root}"))
    writers = sorted({rank for s in saves for _, rank, b in s.files if b})
    names = " ".join(f.path for f, _ in uses)
    layout, fmt, why = _layout(names, framework, len(writers))
    if layout == "raw" and saves and len({os.path.dirname(path) for s in saves for path, _, _ in s.files}) == 1:
        layout, why = "flat", why + "; every save's files in one folder, none made for a save"
    add(Value("checkpoint.layout", layout, INFERRED, why))
    add(Value("checkpoint.format", fmt, INFERRED, why))
    numbering = _numbering(saves, layout)
    if numbering is not None:
        add(numbering)
    if fmt == "torch" and layout == "raw" and saves:  # flat: the emulated files have the program's names  # torch.save(obj, path) records the file's name in its zip
        first = saves[0].files[0][0]
        add(Value("checkpoint.archive_name", archive_stem(first), MEASURED,
                  f"the folder torch.save's zip records: {os.path.basename(first)}'s name (the first save)"))
    many = max(job.nprocs, len(ranks))
    add(Value("checkpoint.strategy", "single_writer" if len(writers) == 1 and many > 1 else "sharded", INFERRED,
              f"{len(writers)} of {many} rank(s) wrote checkpoint bytes"))
    interval = epochs // len(saves) if saves and epochs % len(saves) == 0 else 0
    if interval:
        add(Value("checkpoint.epochs_between_checkpoints", interval, INFERRED,
                  f"{len(saves)} saves over {epochs} epochs, each after the epoch's reads"))
    else:
        add(assumed("checkpoint.epochs_between_checkpoints", 1, f"{len(saves)} saves do not divide {epochs} epochs"))
    fsyncs = sum(f.fsyncs for f, _ in uses)
    renames = sum(f.renames for f, _ in uses)
    add(Value("checkpoint.fsync", fsyncs > 0, MEASURED, f"{fsyncs} fsync/fdatasync calls on checkpoint files"))
    add(Value("_comment.checkpoint", _summary(saves, sized, renames, source), MEASURED, "per save"))
    model_yaml = None
    target = _describable([path for path, _, _ in saves[0].files], layout) if saves else None
    described = on_disk.checkpoint_model(target) if target else None
    if described:
        model_yaml, declared = described
        add(Value("_comment.model", f"model: the tensors of {target} (dlio_ckpt-describe-model), {declared:,} B of tensors; "
                  f"the container adds the rest of the {per_save[0]:,} B per save", MEASURED, "on disk"))
    else:
        add(Value("model.kind", "explicit", ASSUMED, "the checkpoint is not on disk here (or its library is missing): "
                  "one blob of the per-save bytes per rank; a Darshan log holds no tensor names or shapes, so for the "
                  "container's exact bytes paste `dlio_ckpt-describe-model <a saved checkpoint>`'s model section"))
        add(Value("model.model_size_bytes", max(per_save) if per_save else 0, INFERRED if source != "unknown" else ASSUMED,
                  f"bytes per save ({source})"))
    return values, CheckpointFacts(saves, max(per_save) if per_save else 0, source, model_yaml, fmt,
                                   target if described else None)


def _bytes_of(f: FileUse, extra: dict[str, int]) -> tuple[int, str]:
    if f.bytes_written > 0:
        return f.bytes_written, "log"
    if f.path in extra:
        return extra[f.path], "strace"
    if f.opens == 0:  # a rename's target: its bytes are its source's
        return 0, "log"
    size = on_disk.file_size(f.path)
    if f.reads == 0 and size is not None:
        return size, "disk"
    return 0, "log" if f.reads else "unknown"


def _saves(sized: list[tuple[FileUse, int, int]], reads: list[float]) -> list[Save]:
    """Files in time order; a new save starts when dataset reads happened since the previous file
    was opened. Only a log without dataset reads to go by (none known) splits on a pause longer
    than max(0.25 s, half the current save's length): under load a save's own files can be that
    far apart (CheckpointManager's second `checkpoint` state write 0.5-1.6 s after its index, at
    load 2-8), which split keras_tfdata's 2 saves into 4 when the pause rule applied beside reads."""
    events = sorted((f.first_open, f.last_close if f.last_close == f.last_close else f.first_open, f.path, rank, b)
                    for f, rank, b in sized if f.first_open == f.first_open and (b or f.reads == 0))
    saves: list[Save] = []
    end = begin = last_open = float("-inf")
    for start, close, path, rank, nbytes in events:
        # from the last open, not the last close: darshan-runtime can date a file fopen()ed by torch.save
        # closed only when its descriptor is reused (at the next save's open)
        read_between = any(last_open < t < start for t in reads)
        if not saves or read_between or (not reads and start - end > max(0.25, 0.5 * (end - begin))):
            saves.append(Save(start, []))
            begin = start
        saves[-1].files.append((path, rank, nbytes))
        end = max(end, close) if saves[-1].files[:-1] else close
        last_open = start
    return saves


def _layout(names: str, framework: str, writers: int) -> tuple[str, str, str]:
    if ".distcp" in names:
        return "pytorch_dcp", "torch", "DCP's __<rank>_<n>.distcp and .metadata files"
    if re.search(r"\.index\b|\.data-\d+-of-\d+", names):
        fmt = "tensorflow" if framework == "tensorflow" else "raw"
        return "tensorflow", fmt, "TensorFlow's ckpt-N.index and ckpt-N.data-* files"
    if re.search(r"\.(pt|pth|bin)\b", names) and framework in ("torch", "unknown"):
        return "raw", "torch", "torch.save files (.pt/.pth/.bin)" + ("" if framework == "torch" else ", no framework seen")
    return "raw", "raw", "no framework's file names"


def _numbering(saves: list[Save], layout: str) -> Value | None:
    """checkpoint.flat_numbers from the numbers in the saves' names (TensorFlow's ckpt-N, a flat
    file's last number): 1, 2, 3 ... is a save counter (CheckpointManager.save(), an epoch loop);
    any other is the program's own numbering, which the emulation can give only as its global step."""
    if layout not in ("tensorflow", "flat") or not saves:
        return None
    pattern = r"ckpt-(\d+)\." if layout == "tensorflow" else r"(\d+)\.[^.]+$"
    numbers = []
    for save in saves:
        found = [int(match.group(1)) for path, _, _ in save.files if (match := re.search(pattern, os.path.basename(path)))]
        if not found:
            return None
        numbers.append(min(found))
    shown = ", ".join(map(str, numbers[:6])) + (", ..." if len(numbers) > 6 else "")
    if numbers == list(range(1, len(numbers) + 1)):
        return Value("checkpoint.flat_numbers", "counter", INFERRED, f"the saves' names number them {shown}: a save counter from 1")
    return Value("checkpoint.flat_numbers", "step", INFERRED,
                 f"the saves' names number them {shown}, not 1 to {len(numbers)}: the program numbers them itself "
                 "(manager.save(checkpoint_number=step)); the emulation names them by its global step, the same "
                 "names where the program passes its step")


def _describable(paths: list[str], layout: str) -> str | None:
    """What describe-model reads for the first save: its DCP folder, its TensorFlow ckpt-N prefix,
    or its (first) file."""
    if layout == "pytorch_dcp":
        return os.path.dirname(paths[0])
    if layout == "tensorflow":
        for path in paths:
            match = re.match(r"(.*ckpt-\d+)\.index$", path)
            if match:
                return match.group(1)
        return None
    return paths[0]


def _summary(saves: list[Save], sized, renames: int, source: str) -> str:
    if not saves:
        return "no save could be told apart"
    files = [len(s.files) for s in saves]
    writes = sum(f.writes for f, _, _ in sized)
    per_rank: dict[int, int] = {}
    for _, rank, nbytes in saves[0].files:
        per_rank[rank] = per_rank.get(rank, 0) + nbytes
    sizes: dict[int, int] = {}
    for f, _, _ in sized:
        for size, count in f.access_sizes.items():
            sizes[size] = sizes.get(size, 0) + count
    common = ", ".join(f"{size:,} B x{count}" for size, count in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
    return (f"{len(saves)} saves, {files[0]} file(s) each, {saves[0].bytes:,} B per save "
            f"(bytes from: {source}); per rank: " + ", ".join(f"rank {r} {b:,} B" for r, b in sorted(per_rank.items()))
            + f"; {writes} write calls seen (common sizes: {common or 'none recorded'}); {renames} renames")
