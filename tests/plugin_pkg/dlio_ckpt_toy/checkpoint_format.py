"""`checkpoint.format=toyckpt`: an 8-byte magic, `TOYCKPT1`, then the tensors back to back."""

from __future__ import annotations

from dataclasses import dataclass

from dlio_ckpt.plan.checkpoint_formats import CheckpointFormatSpec

MAGIC = b"TOYCKPT1"


@dataclass(frozen=True)
class ToyCheckpointFormat(CheckpointFormatSpec):
    def write(self, handle, tensors, chunks) -> None:
        handle.write(MAGIC)
        for tensor in tensors:
            for piece in chunks(tensor):
                handle.write(piece)


TOY_CHECKPOINT = ToyCheckpointFormat("toyckpt", "toyckpt", sequential=True,
                                     writer="dlio_ckpt_toy.checkpoint_format:ToyCheckpointFormat")
