"""When to checkpoint: every N steps, every N epochs after epoch E (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from dlio_ckpt.config.schema import CheckpointConfig


@dataclass(frozen=True)
class Triggers:
    steps_between: int
    epochs_between: int
    after_epoch: int

    @classmethod
    def from_config(cls, config: CheckpointConfig) -> "Triggers":
        return cls(config.steps_between_checkpoints, config.epochs_between_checkpoints, config.checkpoint_after_epoch)

    def at_step(self, step: int) -> bool:
        """Global step numbers count from 1."""
        return self.steps_between > 0 and step % self.steps_between == 0

    def at_epoch_end(self, epoch: int) -> bool:
        """DLIO's rule: from epoch `after_epoch` (or 1), every `epochs_between` epochs."""
        if self.epochs_between <= 0 and self.after_epoch <= 0:
            return False
        first = self.after_epoch or 1
        every = self.epochs_between or 1
        return epoch >= first and (epoch - first) % every == 0
