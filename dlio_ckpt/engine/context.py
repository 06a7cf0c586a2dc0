"""RunContext: everything a phase of the engine needs, passed in explicitly (no globals)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlio_ckpt.schema import RunConfig
from dlio_ckpt.content import ByteSource
from dlio_ckpt.storage.events import EventRecorder, JobClock
from dlio_ckpt.storage.traced import TracedStorage
from dlio_ckpt.world import World


@dataclass(frozen=True)
class RunContext:
    config: RunConfig
    world: World
    run_dir: Path  # the run folder (rank 0 chose it; every rank knows it)
    run_id: str  # unique name of this run, the same on every rank
    clock: JobClock
    recorder: EventRecorder
    storage: TracedStorage  # phase "other"; use storage.with_phase(...)

    def source(self, seed: int, zeros: bool = False) -> ByteSource:
        """A ByteSource for this rank (pool size from generate.pool_bytes)."""
        return ByteSource(seed=seed, pool_bytes=self.config.generate.pool_bytes, zeros=zeros)

    def checkpoint_root(self) -> str:
        """This run's own checkpoint folder (retention never deletes outside it), or, in
        mode=restore, the earlier run's folder named by checkpoint.restore_from."""
        import os

        if self.config.mode == "restore":
            return os.path.abspath(self.config.checkpoint.restore_from)
        return os.path.abspath(os.path.join(self.config.storage.root, self.config.checkpoint.folder, self.run_id))
