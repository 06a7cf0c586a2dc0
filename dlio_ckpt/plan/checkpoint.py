"""CheckpointPlan: per rank, which files it writes and which tensors go in each (pure).

Built from the ModelPlan (who owns which bytes), the layout (file names) and the format
(extension, predictable size). The strategy decides who actually issues the writes: under
`single_writer` rank 0 writes every rank's files, but the files are the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlio_ckpt.checkpoint.formats import get_format_class
from dlio_ckpt.checkpoint.layouts import Layout, get_layout
from dlio_ckpt.config.schema import RunConfig
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
class CheckpointPlan:
    model: ModelPlan
    layout_name: str
    format_name: str
    files_by_rank: tuple[tuple[PlannedFile, ...], ...]  # index: running rank

    @property
    def layout(self) -> Layout:
        return get_layout(self.layout_name)

    @property
    def world_size(self) -> int:
        return len(self.files_by_rank)

    def rank_bytes(self, rank: int) -> int:
        return sum(f.payload_bytes for f in self.files_by_rank[rank])

    def per_rank_bytes(self) -> list[int]:
        return [self.rank_bytes(r) for r in range(self.world_size)]

    @property
    def total_bytes(self) -> int:
        """Payload bytes of one checkpoint over the running ranks (format headers excluded)."""
        return sum(self.per_rank_bytes())

    def encoded_bytes(self) -> int | None:
        """Bytes on disk of the data files, where the format makes that predictable."""
        fmt = get_format_class(self.format_name)()
        total = 0
        for files in self.files_by_rank:
            for f in files:
                size = fmt.encoded_size(f.tensors)
                if size is None:
                    return None
                total += size
        return total

    @property
    def file_count(self) -> int:
        return sum(len(files) for files in self.files_by_rank)

    def file_names(self, step: int) -> list[str]:
        folder = self.layout.folder(step)
        names = [f"{folder}/{f.path_for(step)}" for files in self.files_by_rank for f in files]
        names += [f"{folder}/{name}" for name in self.layout.coordinator_files(step, self.world_size)]
        names.append(f"{folder}/{MANIFEST_NAME}")
        tag = self.layout.tag(step)
        if tag:
            names.append(tag[0])
        return names


def build_checkpoint_plan(config: RunConfig, world_size: int) -> CheckpointPlan:
    """The plan for `world_size` running ranks (pure: plan mode calls this for 1,024 ranks)."""
    ck = config.checkpoint
    layout = get_layout(ck.layout)
    fmt = get_format_class(ck.format)()
    model = build_model_plan(config.model, world_size, config.scale.max_model_bytes)
    files_by_rank = []
    for rank in range(model.world_size):
        tensors = model.rank_tensors(rank)
        grouped = layout.rank_files(model, rank, tensors, fmt.extension)
        files_by_rank.append(tuple(PlannedFile(name, rank, ts) for name, ts in grouped if ts))
    return CheckpointPlan(model=model, layout_name=layout.name, format_name=fmt.name, files_by_rank=tuple(files_by_rank))
