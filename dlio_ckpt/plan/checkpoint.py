"""CheckpointPlan: per rank, which files it writes and which tensors go in each (pure).

Built from the ModelPlan (who owns which bytes), the layout (file names) and the format
(extension, predictable size). The strategy decides who actually issues the writes: under
`single_writer` rank 0 writes every rank's files, but the files are the same.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from dlio_ckpt.plan.checkpoint_formats import format_spec
from dlio_ckpt.plan.layouts import Layout, get_layout
from dlio_ckpt.schema import RunConfig
from dlio_ckpt.plan.model import ModelPlan, TensorSpec, build_model_plan

MANIFEST_NAME = "dlio_ckpt_manifest.json"


@dataclass(frozen=True)
class PlannedFile:
    relpath: str  # inside the checkpoint folder; "{step}" is filled per checkpoint
    owner: int  # the rank whose state the file holds
    tensors: tuple[TensorSpec, ...]

    @property
    def payload_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def path_for(self, step: int) -> str:
        return self.relpath.replace("{step}", str(step))


@dataclass(frozen=True)
class PlannedRanks(Sequence):
    """Every running rank's files (`files_by_rank[rank]`), built when asked for and not kept.

    A rank writes only its own files, so a run of N ranks builds one rank's list, not N of them on
    every rank (N^2 work over the job); plan mode walks all ranks once without holding N ranks of
    tensor lists in memory (16,384 ranks of a 70B model under ZeRO-3 are 8 million tensors)."""

    model: ModelPlan
    layout: Layout
    extension: str

    def __len__(self) -> int:
        return self.model.world_size

    def __getitem__(self, rank):
        if isinstance(rank, slice):
            return tuple(self[r] for r in range(*rank.indices(len(self))))
        if rank < 0:
            rank += len(self)
        if not 0 <= rank < len(self):
            raise IndexError(f"rank {rank} of {len(self)}")
        grouped = self.layout.rank_files(self.model, rank, self.layout.rank_tensors(self.model, rank), self.extension)
        return tuple(PlannedFile(name, rank, ts) for name, ts in grouped if ts)


@dataclass(frozen=True)
class CheckpointPlan:
    model: ModelPlan
    layout_name: str
    format_name: str
    files_by_rank: Sequence[tuple[PlannedFile, ...]]  # index: running rank (a PlannedRanks)

    @property
    def layout(self) -> Layout:
        return get_layout(self.layout_name)

    @property
    def world_size(self) -> int:
        return len(self.files_by_rank)

    @cached_property
    def _per_rank_bytes(self) -> tuple[int, ...]:
        # Every tensor a rank owns goes in one of its files, so its files' payload is its share.
        layout = self.layout
        return tuple(sum(layout.rank_bytes(self.model, r)) for r in range(self.world_size))

    def rank_bytes(self, rank: int) -> int:
        return self._per_rank_bytes[rank]

    def per_rank_bytes(self) -> list[int]:
        return list(self._per_rank_bytes)

    @property
    def total_bytes(self) -> int:
        """Payload bytes of one checkpoint over the running ranks (format headers excluded)."""
        return sum(self._per_rank_bytes)

    def encoded_bytes(self) -> int | None:
        """Bytes on disk of the data files, where the format makes that predictable. Only a
        per-file header (npy) needs the files themselves; every rank's free-space check asks this."""
        rule = format_spec(self.format_name).size_rule
        if rule == "payload":
            return self.total_bytes
        if rule == "unknown":
            return None
        return self.files_summary(1)[2]

    def files_summary(self, step: int, flat: bool = False) -> tuple[list[str], int, int | None]:
        """(the data files' names at `step`, their count, their encoded bytes or None), in one walk
        over the ranks (each rank's files are built once, then dropped). `flat`: in the root, not
        the checkpoint's folder (Layout.flat_framework under durability=framework)."""
        fmt = format_spec(self.format_name)
        folder = "" if flat else self.layout.folder(step)
        names: list[str] = []
        encoded: int | None = 0
        for files in self.files_by_rank:
            for f in files:
                names.append(os.path.join(folder, f.path_for(step)))
                if encoded is not None:
                    size = fmt.encoded_size(f.tensors)
                    encoded = None if size is None else encoded + size
        return names, len(names), encoded

    @property
    def file_count(self) -> int:
        return self.files_summary(1)[1]

    def file_names(self, step: int, manifest: bool = True) -> list[str]:
        return self.names_with_metadata(step, self.files_summary(step)[0], manifest)

    def names_with_metadata(self, step: int, data_files: list[str], manifest: bool = True) -> list[str]:
        """The data files' names plus the coordinator's files, the manifest (only the commit
        protocol writes one: checkpoint.durability; without it a flat layout's files lie
        in the root) and the tag."""
        folder = "" if self.layout.flat(manifest) else self.layout.folder(step)
        names = list(data_files)
        names += [os.path.join(folder, name) for name in self.layout.coordinator_files(step, self.world_size)]
        if manifest:
            names.append(f"{folder}/{MANIFEST_NAME}")
        tag = self.layout.tag(step)
        if tag:
            names.append(tag[0])
        return names


def build_checkpoint_plan(config: RunConfig, world_size: int) -> CheckpointPlan:
    """The plan for `world_size` running ranks (pure: plan mode calls this for 1,024 ranks)."""
    ck = config.checkpoint
    layout = get_layout(ck.layout)
    fmt = format_spec(ck.format)
    model = build_model_plan(config.model, world_size, config.scale.max_model_bytes, ck.replicas)
    return CheckpointPlan(model=model, layout_name=layout.name, format_name=fmt.name,
                          files_by_rank=PlannedRanks(model, layout, fmt.extension))
