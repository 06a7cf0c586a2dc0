"""A job's logs -> its Profile: every workload value with its grade, the model section, and the
log's own figures for the fidelity table (pure but for on_disk's looks at files still there and
the stand-ins timed on this machine: a TensorFlow save's setup, tf.data's next() on a ready batch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dlio_ckpt.profile.classify import DATASET, Roles, classify
from dlio_ckpt.profile.figures import ClassFigures, class_figures
from dlio_ckpt.profile.framework_setup import setup_values
from dlio_ckpt.profile.infer_checkpoint import CheckpointFacts, checkpoint_values
from dlio_ckpt.profile.infer_dataset import DatasetFacts, dataset_values
from dlio_ckpt.profile.infer_sync import gradient_sync_value
from dlio_ckpt.profile.infer_timing import file_reads, timing_values
from dlio_ckpt.profile.records import Job, load_job
from dlio_ckpt.profile.tf_data_next import ready_batch_next_s
from dlio_ckpt.profile.values import ASSUMED, Value, assumed, value_of


@dataclass
class Profile:
    job: Job
    roles: Roles
    values: list[Value]
    dataset: DatasetFacts
    checkpoint: CheckpointFacts
    figures: dict[str, ClassFigures]
    compute_s: float | None
    notes: list[str] = field(default_factory=list)

    def value(self, key: str):
        return value_of(self.values, key)

    @property
    def not_inferred(self) -> list[Value]:
        return [v for v in self.values if v.how == ASSUMED and not v.key.startswith("_")]


def profile_logs(paths: list[Path], data_root: str = "", checkpoint_root: str = "", batch_size: int | None = None,
                 strace_bytes: dict[str, int] | None = None) -> Profile:
    job = load_job(paths)
    roles = classify(job, data_root, checkpoint_root)
    busy = [p for p, role in zip(job.processes, roles.processes) if role in ("rank", "worker")]
    job.source = "DXT" if busy and all(p.dxt for p in busy) else "POSIX counters"  # a helper's log may lack DXT
    values, dataset = dataset_values(job, roles, batch_size)
    spans = file_reads(job, roles)  # with DXT: each open's reads; else each file's first open
    opens = [start for start, _, _ in spans] or [f.first_open for p in job.processes for f in p.files
                                                 if roles.files.get(f.path) == DATASET]
    ckpt_values, checkpoint = checkpoint_values(job, roles, dataset.epochs, dataset.framework, strace_bytes, opens)
    values += ckpt_values
    setup, setup_s = setup_values(checkpoint.format, checkpoint.on_disk) if checkpoint.saves else ([], (0.0, 0.0))
    values += setup
    tf_data = value_of(values, "reader.name") == "tensorflow"
    ready_next_s = (ready_batch_next_s(int(value_of(values, "dataset.record_length_bytes", 0)), dataset.batch_size)
                    if tf_data and job.source == "DXT" else None)
    timing, compute = timing_values(job, roles, len(dataset.paths), dataset.epochs, dataset.batch_size, dataset.ranks,
                                    dataset.samples_per_file, [s.start for s in checkpoint.saves], setup_s,
                                    tf_data=tf_data, ready_next_s=ready_next_s)
    values += timing
    values.append(gradient_sync_value(spans if job.source == "DXT" else [], len(dataset.paths), dataset.epochs,
                                      dataset.batch_size / max(dataset.samples_per_file, 1), dataset.ranks))
    values.append(assumed("checkpoint.keep_last", 0, "deletions are not in a Darshan log: every save is kept"))
    figures = class_figures(job, roles)
    if checkpoint.bytes_source not in ("log", "unknown"):
        figures["checkpoint"].bytes_written = checkpoint.per_save_bytes * len(checkpoint.saves)
    notes = [f"{len(paths)} log(s) of job {job.job_id}: {len(job.processes)} process(es) "
             f"({', '.join(f'{roles.processes.count(r)} {r}' for r in sorted(set(roles.processes)))}); "
             f"read from {job.source}" + ("" if job.source == "DXT" else " (no DXT: no read times per call)")]
    for log, modules in job.partial:
        notes.append(f"{log.name}: darshan-runtime ran out of record memory ({', '.join(modules)} partial): files this "
                     f"process opened later are missing; rerun with DARSHAN_EXCLUDE_DIRS=<the Python environment's "
                     f"prefix> (or a larger DARSHAN_MODMEM, MiB) so that the interpreter's own files leave room")
    if checkpoint.bytes_source not in ("log",):
        notes.append(f"checkpoint bytes: darshan-runtime counted none for some checkpoint files (torch.save writes "
                     f"with writev on an fopen()ed descriptor); taken from: {checkpoint.bytes_source}")
    return Profile(job, roles, values, dataset, checkpoint, figures, compute, notes)
