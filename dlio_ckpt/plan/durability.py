"""Which protocol a run's checkpoints follow (`checkpoint.durability`), decided from the config (pure).

- `framework` (the default): each checkpoint issues the calls the framework it is named after
  issues and nothing else: torch.save's writes (no fsync, no rename), DCP's fsync per `.distcp`
  and its `.metadata` through a temporary name, TensorFlow's renames and `checkpoint` tag. No
  manifest, no checksum, no read-back: a real training program does none of them.
- `commit`: the project's own commit protocol (every data file fsynced, the folder fsynced, the
  manifest written last, checksums computed as the bytes pass or read back): what a restore
  needs to tell a complete checkpoint from a torn one and verify it.

Some runs read their checkpoints back and need the manifest to do it: `mode=restore` and
`mode=checkpoint` (MLPerf Storage's procedure, which also keeps MLPerf's fsync rule), a restore
at the end of the run, injected failures (each restart restores), encoded chains (a restore
follows the chain through the manifests) and multi-level checkpoints (a flush copies committed
checkpoints, a node failure restores the newest surviving one). A user asking for one of those
asked for a restore, so such a run uses `commit` whatever `checkpoint.durability` says, and the
summary names the setting that required it (`checkpoint.durability_reason`). Refusing the run
instead would make the user set a key whose only possible value is already known.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlio_ckpt.codec_registry import codec_names, codec_setting
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.schema import RunConfig


@dataclass(frozen=True)
class Durability:
    """The protocol the checkpoints of a run follow, and why when it is not the one asked for."""

    mode: str  # "framework" | "commit"
    reason: str = ""  # the setting that required `commit`, when checkpoint.durability said framework

    @property
    def commit(self) -> bool:
        return self.mode == "commit"

    def describe(self) -> dict:
        return {"durability": self.mode, "durability_reason": self.reason}


def needs_commit(config: RunConfig) -> str:
    """The first setting of `config` that reads checkpoints back through their manifests ("" if none)."""
    ck = config.checkpoint
    failures = config.failures
    if config.mode == "restore":
        return "mode=restore reads an earlier run's checkpoint through its manifest"
    if config.mode == "checkpoint":
        return "mode=checkpoint (MLPerf Storage) reads back and verifies every checkpoint it writes, fsync on"
    if ck.restore:
        return "checkpoint.restore=true verifies the last checkpoint against its manifest"
    if failures.at_steps or failures.mtbf_s > 0:
        return "failures restore the newest complete checkpoint after each failure"
    if codec_names(ck):
        return f"{codec_setting(ck)} chains are rebuilt through their manifests"
    if ck.levels:
        return "checkpoint.levels flush and restore committed checkpoints"
    return ""


def resolve_durability(config: RunConfig) -> Durability:
    """`checkpoint.durability`, or `commit` with the reason when the run needs it (see above)."""
    asked = config.checkpoint.durability
    if asked == "commit":
        return Durability("commit")
    reason = needs_commit(config)
    return Durability("commit", reason) if reason else Durability("framework")


def data_fsync(durability: Durability, fmt, layout, checkpoint_fsync: bool) -> bool:
    """Whether each data file is fsynced: under `commit`, `checkpoint.fsync`; under `framework`,
    what the framework does: the layout's writer where it has one (DCP's FileSystemWriter fsyncs
    every `.distcp`), else the format's library (torch.save and TensorFlow never fsync), else
    (raw, npy, npz, hdf5: no framework of their own, a program's own writes) `checkpoint.fsync`."""
    if durability.commit:
        return checkpoint_fsync
    for declared in (getattr(layout, "data_fsync", None), getattr(fmt, "framework_fsync", None)):
        if declared is not None:
            return declared
    return checkpoint_fsync


def check_flat_layout(layout, durability: Durability, keep_last: int) -> None:
    """A layout without a folder per checkpoint (`flat`) has nowhere for a manifest and nothing to
    delete as one checkpoint: it runs under `framework` durability and keeps every file."""
    if layout.folder_per_checkpoint:
        return
    if durability.commit:
        why = durability.reason or "checkpoint.durability=commit"
        raise ConfigError(f"checkpoint.layout={layout.name} writes each checkpoint's files straight into the checkpoint "
                          f"folder, with no folder or manifest of its own, but {why}: use checkpoint.layout=raw")
    if keep_last:
        raise ConfigError(f"checkpoint.layout={layout.name} keeps every file, as a program saving "
                          f"checkpoint_<n>.pt into one folder does: set checkpoint.keep_last=0")
