"""What the training loop needs from a checkpoint engine, and what each checkpoint reports.

The engine decides nothing about bytes or files itself: a CheckpointEngine is built from the
config, the World and the (traced) storage, and the loop only asks `due` and calls `save`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass
class CheckpointRecord:
    """One checkpoint as one rank saw it."""

    index: int
    step: int
    epoch: int
    bytes: int  # bytes this rank's write calls moved into its data files (the tracer's count)
    files: int  # files this rank wrote
    blocking_s: float  # what training lost (snapshot, or the whole write for sync strategies)
    persist_s: float  # time until the data was durable (write + fsync), from the save call
    write_s: float  # this rank's data files, each from its open to its fsync, summed (MLPerf's per-rank duration)
    strategy: str = ""
    folder: str = ""  # the checkpoint's folder name under the run's checkpoint root
    metadata_bytes: int = 0  # manifest, tag and coordinator files (rank 0)
    wait_s: float = 0.0  # async: time the save waited for an earlier checkpoint in flight
    snapshot_s: float = 0.0  # async: copy into the staging buffer
    commit_s: float = 0.0  # folder fsyncs, gather of file lists, manifest, tag and retention, as this rank waited
    committed: bool = False  # the manifest is on disk (async: set when the persist is committed)
    peak_rss_bytes: int = 0
    verify_s: float = 0.0  # reading data files back for their checksums (formats that seek back), not in write_s
    encoding: str = "full"  # checkpoint.encoding
    logical_bytes: int = 0  # the state this rank's files represent (its own files, whoever wrote them)
    encode_s: float = 0.0  # encoding this rank's files (hashing, quantising): in blocking_s when synchronous
    codec: dict = field(default_factory=dict)  # the codec's figures over this rank's files (encoded.merge_stats)
    level: str = ""  # checkpoint.levels: the level the checkpoint was written to ("": a single level)
    # write_s split (docs/metrics.md): inside write calls, inside fsync, and the rest, the format
    # building its container (serialization); None: the framework made its own calls (TensorFlow)
    write_calls_s: float | None = 0.0
    fsync_s: float = 0.0
    # the emulator assembling tensors in memory before a framework's save (torch.save takes whole
    # tensors a real program already holds): in blocking_s, not in write_s
    prepare_s: float = 0.0
    # the framework's work before the first byte (checkpoint/framework_work.py): DCP's storage setup
    # and checkpoint.framework_cpu_s (its walk of the program's objects); in blocking_s, not in write_s
    framework_s: float = 0.0
    # the saving thread's CPU seconds in a synchronous save, prepare left out: the work itself, which
    # a busy machine stretches far less than the wall time (fidelity.py compares it with the program's)
    cpu_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RestoreRecord:
    checkpoint_index: int
    bytes: int
    files: int
    read_s: float
    verified: bool
    message: str = ""
    checkpoint_step: int = -1
    folder: str = ""
    skipped: list[str] = field(default_factory=list)  # newer checkpoints rejected, with the reason
    peak_rss_bytes: int = 0
    level: str = ""  # checkpoint.levels: the level the checkpoint was restored from ("": a single level)
    resume: dict = field(default_factory=dict)  # the training loop's resume point saved with the checkpoint
    state_digests: dict = field(default_factory=dict)  # file key -> xxh3_128 of the restored state (rebuilt or loaded)
    chain_length: int = 0  # checkpoints read to rebuild the restored one (1: a full checkpoint)
    encoding: str = "full"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class CheckpointEngine(Protocol):
    records: list[CheckpointRecord]

    def due(self, step: int, epoch: int, epoch_end: bool, trigger_step: int | None = None) -> bool: ...

    def save(self, step: int, epoch: int) -> CheckpointRecord: ...

    def finish(self) -> None: ...

    def restore(self) -> RestoreRecord | None: ...


class NoCheckpoints:
    """The checkpoint engine of a run with checkpointing off."""

    def __init__(self) -> None:
        self.records: list[CheckpointRecord] = []

    def due(self, step: int, epoch: int, epoch_end: bool, trigger_step: int | None = None) -> bool:
        return False

    def save(self, step: int, epoch: int) -> CheckpointRecord:
        raise AssertionError("save() called with checkpointing disabled")

    def finish(self) -> None:
        pass

    def restore(self) -> None:
        return None
