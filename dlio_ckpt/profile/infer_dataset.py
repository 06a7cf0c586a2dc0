"""The dataset and reader keys of the workload, from the dataset files' records (pure but for
on_disk's one look at a file still there).

Rules (docs/profile.md):
- files, sizes: one entry per distinct dataset path; a file's size is its size on disk when it is
  still there, else the highest byte read + 1 (every format here reads its end: npz's central
  directory, TFRecord's last record);
- format: the file's magic bytes on disk, else its extension;
- samples per file and one sample's payload: read from one file on disk, else 1 and the file size;
- epochs: the median number of opens per file (each epoch opens each file once);
- readers: the data-loader worker processes per rank (per epoch unless they persist);
- file shuffle: the first epoch's open order against the sorted names;
- batch size: the user's --batch-size, else the workers' read bursts when they show one clearly,
  else the documented default.
"""

from __future__ import annotations

import os
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from dlio_ckpt.errors import UserError
from dlio_ckpt.profile import on_disk
from dlio_ckpt.profile.classify import DATASET, RANK, WORKER, Roles
from dlio_ckpt.profile.records import FileUse, Job, Process
from dlio_ckpt.profile.values import ASSUMED, GIVEN, INFERRED, MEASURED, Value, assumed

DEFAULT_BATCH = 4  # conf/config.yaml reader.batch_size


@dataclass
class DatasetFacts:
    """What later inferences (timing, the fidelity table) need from the dataset side."""

    paths: list[str]
    epochs: int
    ranks: int
    workers: list[Process]  # processes that read the dataset and are not ranks
    persistent_workers: bool
    batch_size: int
    samples_per_file: int
    framework: str  # torch | tensorflow | unknown


def framework_of(job: Job) -> str:
    """The framework, from the files darshan-runtime saw: its Python package (unless the run
    excluded the environment's folders), else its checkpoint files' names."""
    joined = "\n".join({f.path for p in job.processes for f in p.files})
    if "/tensorflow/" in joined or "/keras/" in joined or re.search(r"\.tempstate\d+|\.data-\d{5}-of-\d{5}", joined):
        return "tensorflow"
    if "/torch/" in joined or re.search(r"\.distcp$|\.pth?$", joined, re.MULTILINE):
        return "torch"
    return "unknown"


def dataset_values(job: Job, roles: Roles, batch_hint: int | None) -> tuple[list[Value], DatasetFacts]:
    per_path: dict[str, list[tuple[FileUse, Process, str]]] = defaultdict(list)
    for process, role in zip(job.processes, roles.processes):
        for f in process.files:
            if roles.files.get(f.path) == DATASET and (f.bytes_read > 0 or f.opens > 0):
                per_path[f.path].append((f, process, role))
    if not per_path:
        partial = job.partial
        hint = (f"; {partial[0][0].name} is partial (darshan-runtime ran out of record memory): rerun with "
                "DARSHAN_EXCLUDE_DIRS=<the Python environment's prefix>") if partial else \
            "; give --data-root PATH if the dataset is there"
        raise UserError(f"{job.logs[0]}: no recognisable dataset: no process read a file outside the program's own "
                        f"environment{hint}")
    paths = sorted(per_path)
    values: list[Value] = []
    add = values.append
    framework = framework_of(job)
    add(Value("dataset.num_files_train", len(paths), MEASURED, f"{len(paths)} distinct files read under {roles.dataset_root}"))
    fmt, fmt_how, fmt_why = _format(paths)
    add(Value("dataset.format", fmt, fmt_how, fmt_why))
    sizes, size_how = _sizes(paths, per_path)
    sample = on_disk.samples(paths[0], fmt) if fmt in ("npz", "npy", "hdf5", "tfrecord") else None
    if sample:
        add(Value("dataset.num_samples_per_file", sample.per_file, MEASURED, f"on disk: {sample.how}"))
        add(Value("dataset.record_length_bytes", sample.record_bytes, MEASURED, f"on disk: one sample's payload ({sample.how})"))
        per_file = sample.per_file
    else:
        per_file = 1
        add(assumed("dataset.num_samples_per_file", 1, "the files are not on disk here: one sample per file"))
        add(Value("dataset.record_length_bytes", int(round(statistics.mean(sizes))), INFERRED,
                  f"mean file size ({size_how}) as one sample: the format's framing is counted in it"))
    stdev = statistics.pstdev(sizes) if len(sizes) > 1 else 0.0
    add(Value("dataset.record_length_bytes_stdev", int(round(stdev / max(per_file, 1) ** 0.5)) if sample is None or stdev else 0,
              INFERRED, f"file sizes ({size_how}): min {min(sizes):,}, mean {statistics.mean(sizes):,.0f}, "
                        f"max {max(sizes):,} B, stdev {stdev:,.0f}"))
    add(Value("dataset.file_prefix", _prefix(paths), INFERRED, "the file names' common stem"))
    opens = [sum(f.opens for f, _, _ in per_path[p]) for p in paths]
    epochs = max(1, int(round(statistics.median(opens))))
    add(Value("train.epochs", epochs, INFERRED, f"median opens per dataset file: {statistics.median(opens):g} "
                                                f"(min {min(opens)}, max {max(opens)}); each epoch opens each file once"))
    ranks_list = [p for p, r in zip(job.processes, roles.processes) if r == RANK]
    ranks = job.nprocs if job.nprocs > 1 else max(1, len(ranks_list))
    workers = [p for p, r in zip(job.processes, roles.processes)
               if r == WORKER and any(roles.files.get(f.path) == DATASET and f.opens for f in p.files)]
    persistent = any(f.opens > 1 for p in workers for f in p.files if roles.files.get(f.path) == DATASET) and epochs > 1
    reader_name = "tensorflow" if framework == "tensorflow" and fmt == "tfrecord" else "native"
    add(Value("reader.name", reader_name, INFERRED, f"{framework} program" if framework != "unknown" else "no framework seen: per-sample reads"))
    if workers:
        per_rank = len(workers) / ranks / (1 if persistent else epochs)
        threads = max(1, int(round(per_rank)))
        add(Value("reader.read_threads", threads, MEASURED,
                  f"{len(workers)} worker processes read the dataset, {ranks} rank(s), "
                  + ("persistent over the epochs" if persistent else f"new ones each of {epochs} epochs")))
        add(assumed("reader.prefetch_size", 2 * threads, "PyTorch DataLoader's prefetch_factor 2 per worker (not in the log)"))
    elif reader_name == "tensorflow":
        add(assumed("reader.read_threads", 1, "tf.data reads in threads of the rank itself: a log per process cannot tell them"))
    else:
        add(Value("reader.read_threads", 1, INFERRED, "the ranks read the dataset themselves (no worker process read it)"))
    batch, batch_how, batch_why = _batch(batch_hint, workers, roles, epochs)
    add(Value("reader.batch_size", batch, batch_how, batch_why))
    shuffle = _shuffled(per_path, paths)
    if shuffle is None:
        add(assumed("reader.file_shuffle", False, "too few files, or no open times, to tell the order"))
    else:
        add(Value("reader.file_shuffle", shuffle, INFERRED, "the first epoch opened the files "
                  + ("out of" if shuffle else "in") + " name order"))
        add(Value("reader.sample_shuffle", shuffle, INFERRED, "as the files"))
    add(Value("_comment.read_pattern", _pattern(per_path, paths, sizes), MEASURED, "per file per open"))
    facts = DatasetFacts(paths, epochs, ranks, workers, persistent, batch, per_file, framework)
    return values, facts


def _format(paths: list[str]) -> tuple[str, str, str]:
    ext = os.path.splitext(paths[0])[1].lower()
    sniffed = on_disk.sniff_format(paths[0])
    if sniffed:
        return sniffed, MEASURED, f"on disk: the magic bytes of {os.path.basename(paths[0])}"
    if ext in on_disk.EXTENSIONS:
        return on_disk.EXTENSIONS[ext], INFERRED, f"the files' extension {ext} (not on disk here to confirm)"
    return "raw", ASSUMED, f"extension {ext or '(none)'} names no format and the files are not on disk here"


def _sizes(paths: list[str], per_path) -> tuple[list[int], str]:
    disk = [on_disk.file_size(p) for p in paths]
    if all(s is not None for s in disk):
        return [int(s) for s in disk], "measured on disk"
    return [max(f.max_byte_read for f, _, _ in per_path[p]) + 1 for p in paths], "highest byte read + 1"


def _prefix(paths: list[str]) -> str:
    stems = [os.path.basename(p) for p in paths]
    common = os.path.commonprefix(stems)
    match = re.match(r"[A-Za-z]+", common)
    return match.group(0) if match else "img"


def _shuffled(per_path, paths: list[str]) -> bool | None:
    firsts = [(min(f.first_open for f, _, _ in per_path[p]), p) for p in paths]
    if len(firsts) < 4 or any(t != t for t, _ in firsts):
        return None
    order = [p for _, p in sorted(firsts)]
    return order != sorted(order)


def _pattern(per_path, paths: list[str], sizes: list[int]) -> str:
    opens = sum(f.opens for p in paths for f, _, _ in per_path[p])
    reads = sum(f.reads for p in paths for f, _, _ in per_path[p])
    seeks = sum(f.seeks for p in paths for f, _, _ in per_path[p])
    nbytes = sum(f.bytes_read for p in paths for f, _, _ in per_path[p])
    common: dict[int, int] = defaultdict(int)
    for p in paths:
        for f, _, _ in per_path[p]:
            for size, count in f.access_sizes.items():
                common[size] += count
    top = ", ".join(f"{s:,} B x{c}" for s, c in sorted(common.items(), key=lambda kv: -kv[1])[:4])
    return (f"{reads / max(opens, 1):.1f} reads and {seeks / max(opens, 1):.1f} seeks per open, "
            f"{nbytes / max(opens, 1):,.0f} B read per open ({nbytes / max(opens, 1) / max(statistics.mean(sizes), 1):.2f}x "
            f"the file); common read sizes: {top or 'none recorded'}")


def _batch(hint: int | None, workers: list[Process], roles: Roles, epochs: int) -> tuple[int, str, str]:
    if hint:
        return hint, GIVEN, "--batch-size"
    bursts = _burst_size(workers, roles)
    if bursts:
        return bursts, INFERRED, "each worker read the files in bursts of this many (one batch each), DXT times"
    if not workers or all(f.segments is None for p in workers for f in p.files):
        return DEFAULT_BATCH, ASSUMED, "no worker read times (DXT) to show the batches; give --batch-size N"
    return DEFAULT_BATCH, ASSUMED, ("the workers' reads show no clear batch boundary (a small run prefetches every "
                                    "batch at once); give --batch-size N")


def _burst_size(workers: list[Process], roles: Roles) -> int | None:
    """B when, in every worker, the idle gaps after every B-th file are all at least 5x every other
    gap (and at least 2 batches per worker); None otherwise."""
    best = None
    for process in workers:
        spans = sorted((f.segments["start"].min(), f.segments["end"].max()) for f in process.files
                       if roles.files.get(f.path) == DATASET and f.segments is not None and len(f.segments))
        if len(spans) < 4:
            return None
        gaps = np.array([max(b[0] - a[1], 0.0) for a, b in zip(spans, spans[1:])])
        found = None
        for size in range(1, len(spans) // 2 + 1):
            cut = np.zeros(len(gaps), bool)
            cut[size - 1::size] = True
            if cut.all() or not cut.any():
                continue
            if gaps[cut].min() >= 5 * max(gaps[~cut].max(), 1e-4):
                found = size
                break
        if found is None or (best is not None and best != found):
            return None
        best = found
    return best
