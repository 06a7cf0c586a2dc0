"""What a run asks of its storage backend, checked against the backend's capabilities up front.

Formats declare the capabilities their writers need (`write_needs`); features that only a local
POSIX file system can serve declare theirs here. `check_storage_needs` turns the first unmet need
into one line naming the key, so a run the backend cannot serve stops in the loader (exit 2,
nothing written) rather than failing half-way.
"""

from __future__ import annotations

from typing import Any

from dlio_ckpt.errors import ConfigError
from dlio_ckpt.formats import DATASET_FORMATS
from dlio_ckpt.plan.checkpoint_formats import format_spec
from dlio_ckpt.storage.base import CAPABILITY_MEANING, Capabilities


def writes_dataset(config: Any) -> bool:
    return config.workload != "replay" and config.mode in ("train", "generate") and config.generate.enabled


def reads_dataset(config: Any) -> bool:
    return config.workload != "replay" and config.mode == "train"


def writes_checkpoints(config: Any) -> bool:
    return config.workload != "replay" and (config.mode == "checkpoint" or (config.mode == "train" and config.checkpoint.enabled))


def storage_needs(config: Any) -> list[tuple[str, frozenset[str]]]:
    """(the setting that needs it, capabilities) for every storage-dependent part of the run."""
    needs: list[tuple[str, frozenset[str]]] = []
    dataset_format = DATASET_FORMATS.load(config.dataset.format)
    if writes_dataset(config):
        needs.append((f"dataset.format={config.dataset.format} (writing the dataset)", dataset_format.write_needs))
    if reads_dataset(config) and not dataset_format.sequential:
        needs.append((f"dataset.format={config.dataset.format} (reading samples by index)", frozenset({"ranged_read"})))
    if reads_dataset(config) and config.reader.name == "tensorflow":
        needs.append(("reader.name=tensorflow (tf.data opens the files by path)", frozenset({"local_paths"})))
    if writes_checkpoints(config):
        needs.append((f"checkpoint.format={config.checkpoint.format}", format_spec(config.checkpoint.format).write_needs))
    if config.storage.direct_io:
        needs.append(("storage.direct_io=true", frozenset({"direct_io"})))
    if config.storage.drop_caches:
        needs.append(("storage.drop_caches=true (drops the local page cache)", frozenset({"local_paths"})))
    if config.checkpoint.drop_caches and config.mode == "checkpoint":
        needs.append(("checkpoint.drop_caches=true (drops the local page cache)", frozenset({"local_paths"})))
    if config.trace.darshan:
        # Darshan has POSIX, MPI-IO and STDIO modules but none for S3: a log of an S3 run would
        # claim POSIX calls on local files that never existed (docs/darshan.md, docs/s3.md).
        needs.append(("trace.darshan=true (Darshan records local files; it has no S3 module: use trace.chrome and events/)",
                      frozenset({"local_paths"})))
    if config.workload == "replay":
        # Darshan calls are replayed at their logged offsets, several ranks into one file, after
        # setting each written file's length: in-place writes only a seekable file offers.
        needs.append(("workload=replay (writes at logged offsets)", frozenset({"seekable_write", "ranged_read"})))
    return needs


def check_storage_needs(config: Any, backend_name: str, capabilities: Capabilities) -> None:
    """ConfigError (one line) for the first part of the run that needs what the backend lacks."""
    for setting, needs in storage_needs(config):
        lacking = capabilities.missing(needs)
        if lacking:
            what = " and ".join(CAPABILITY_MEANING[name] for name in lacking)
            raise ConfigError(
                f"{setting} needs {what}, which storage.backend={backend_name} does not offer; "
                "choose another format or feature, or storage.backend=posix"
            )
