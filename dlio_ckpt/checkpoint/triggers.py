"""When to checkpoint: every N steps, every N epochs after epoch E, every N seconds (pure: the
seconds rule's one decision for all ranks is the caller's `agree`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dlio_ckpt.schema import CheckpointConfig


@dataclass(frozen=True)
class Triggers:
    steps_between: int
    epochs_between: int
    after_epoch: int
    seconds_between: float = 0.0

    @classmethod
    def from_config(cls, config: CheckpointConfig) -> "Triggers":
        return cls(config.steps_between_checkpoints, config.epochs_between_checkpoints, config.checkpoint_after_epoch,
                   config.seconds_between_checkpoints)

    def due(self, step: int, epoch: int, epoch_end: bool, seconds_since_last: float,
            agree: Callable[[bool], bool]) -> bool:
        """The rules together: at an epoch's end the epoch rule alone, otherwise the step rule
        (`step` as the step trigger counts it) or the seconds rule. Clocks differ between ranks,
        so the seconds rule is one rank's answer passed through `agree` (World.bcast: rank 0
        decides, every rank follows)."""
        if epoch_end:
            return self.at_epoch_end(epoch)
        if self.at_step(step):
            return True
        return self.seconds_between > 0 and bool(agree(seconds_since_last >= self.seconds_between))

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
