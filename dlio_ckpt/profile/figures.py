"""Per file class totals of one job (pure): what the fidelity table puts side by side.

The same function sums the real program's logs and the emulated run's log, so the two columns are
counted alike: files, opens, reads, writes, seeks, fsyncs, renames, bytes read and written, over
every process of the job (ranks, workers, helpers). `other` leaves out the console and the
program's own environment (Python modules, libraries, /proc): neither side's workload.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from dlio_ckpt.profile.classify import CHECKPOINT, DATASET, OTHER, Roles, system_file
from dlio_ckpt.profile.records import Job

CLASSES = (DATASET, CHECKPOINT, OTHER)


@dataclass
class ClassFigures:
    files: int = 0
    opens: int = 0
    reads: int = 0
    writes: int = 0
    seeks: int = 0
    fsyncs: int = 0
    renames: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def class_figures(job: Job, roles: Roles) -> dict[str, ClassFigures]:
    out = {cls: ClassFigures() for cls in CLASSES}
    seen: dict[str, set[str]] = {cls: set() for cls in CLASSES}
    for process in job.processes:
        for f in process.files:
            cls = roles.files.get(f.path, OTHER)
            if cls == OTHER and system_file(f.path):
                continue  # the console, the interpreter and its libraries: the program's, not the workload's
            figures = out[cls]
            seen[cls].add(f.path)
            for key in ("opens", "reads", "writes", "seeks", "fsyncs", "renames", "bytes_read", "bytes_written"):
                setattr(figures, key, getattr(figures, key) + getattr(f, key))
    for cls in CLASSES:
        out[cls].files = len(seen[cls])
    return out
