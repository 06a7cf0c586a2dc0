"""`storage.backend=toy_posix`: POSIX storage that also keeps a journal of the files it creates
(`<storage.root>/toy_posix.journal`, one path a line), to show a plugin backend at work."""

from __future__ import annotations

import os
from dataclasses import dataclass

from dlio_ckpt.storage.posix import PosixStorage

JOURNAL = "toy_posix.journal"


@dataclass(frozen=True)
class ToyPosixStorage(PosixStorage):
    name = "toy_posix"

    def _note(self, path: str) -> None:
        if self.root:
            with open(os.path.join(self.root, JOURNAL), "a", encoding="utf-8") as journal:
                journal.write(f"{os.path.relpath(path, self.root)}\n")

    def open_write(self, path, *args, **kwargs):
        self._note(path)
        return super().open_write(path, *args, **kwargs)

    def open_staged(self, path, *args, **kwargs):
        self._note(path)
        return super().open_staged(path, *args, **kwargs)
