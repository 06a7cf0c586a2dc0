"""Retention: which of this run's checkpoints to delete, and deleting only those.

Deleting is the one step that can lose a checkpoint a restart needs, so it is kept apart from
writing and committing, with its choice a pure function (`doomed`) of what is on disk:

- commit durability: keep the newest `keep_last` complete checkpoints and every checkpoint their
  chains (encoded checkpoints) need; delete older folders, and only folders directly inside this
  run's checkpoint root (`CheckpointFolders.own`), never through a link.
- framework durability (no manifest to tell complete from torn): keep the newest `keep_last`
  checkpoints this run wrote, as the framework's own rotation does.
"""

from __future__ import annotations

from dlio_ckpt.checkpoint.folders import CheckpointFolders


def doomed(folders: list[tuple[int, str, bool]], keep_last: int, needed: set[int]) -> list[str]:
    """The names in `folders` ((step, name, complete), oldest first) that retention deletes: those
    older than the newest `keep_last` complete ones, except the steps in `needed`."""
    complete = [step for step, _, ok in folders if ok]
    if len(complete) <= keep_last:
        return []
    oldest_kept = complete[-keep_last]
    return [name for step, name, _ in folders if step < oldest_kept and step not in needed]


def kept_steps(folders: list[tuple[int, str, bool]], keep_last: int) -> list[int]:
    """The steps of the newest `keep_last` complete checkpoints, when older ones exist to delete."""
    complete = [step for step, _, ok in folders if ok]
    return complete[-keep_last:] if len(complete) > keep_last else []


class Retention:
    """checkpoint.keep_last over the checkpoints of `folders` (keep_last 0: keep every one)."""

    def __init__(self, folders: CheckpointFolders, keep_last: int) -> None:
        self.folders = folders
        self.keep_last = keep_last
        self._framework_steps: list[int] = []  # framework durability: the checkpoints written, oldest first

    def apply(self) -> list[str]:
        """Delete checkpoints older than the newest `keep_last` complete ones; only in our root."""
        listing = self.folders.listing()
        kept = kept_steps(listing, self.keep_last)
        if not kept:
            return []
        deleted = []
        for name in doomed(listing, self.keep_last, self.chain_steps(kept)):
            path = self.folders.own(name)
            if path is not None:
                self.folders.storage.remove_tree(path)
                deleted.append(name)
        return deleted

    def chain_steps(self, steps: list[int]) -> set[int]:
        """Steps of the checkpoints that the checkpoints at `steps` need to be restored (their
        chains): retention never deletes one. A manifest that cannot be read protects nothing
        (its checkpoint cannot be restored anyway)."""
        needed: set[int] = set()
        for step in steps:
            manifest = self.folders.read_manifest(self.folders.path(step), step)
            if isinstance(manifest, dict):
                needed.update(int(s) for _, s in manifest.get("chain", []))
        return needed

    def framework_written(self, step: int) -> None:
        """checkpoint.durability=framework: checkpoint `step` is written; delete the oldest this run
        wrote beyond `keep_last` (the framework's own rotation: no manifest, no chains)."""
        self._framework_steps.append(step)
        while self.keep_last and len(self._framework_steps) > self.keep_last:
            self.folders.remove(self._framework_steps.pop(0))
