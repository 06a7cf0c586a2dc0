"""FileList: a dataset's files as a lazy sequence of FileSpec, in memory that does not grow with
the file count (pure).

A tuple of FileSpec cost ~300 bytes a file (the object, its path string): 3 GiB for ten million
files, held by every rank for the whole run. A file's path, index and size follow from its
position by arithmetic (the naming rule below), so FileList keeps the rule and, where sizes vary,
their keyed draw (plan/file_sizes.py: a file's size from its block of files alone), and builds a FileSpec
only when one is asked for: `files[i]`, iteration (one at a time) and slices (another FileList,
a range of positions) behave as they did on the tuple.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from dlio_ckpt.formats.base import FileSpec
from dlio_ckpt.plan.file_sizes import KeyedSizes


@dataclass(frozen=True, eq=False)
class SplitFiles:
    """The naming and sizing rule of one split's files (train or eval): file i of `count` is
    `<folder>/<split>/[<i % subfolders>/]<prefix>_<i>_of_<count>.<extension>`, index `first_index + i`."""

    folder: str
    split: str
    count: int
    subfolders: int
    prefix: str
    extension: str
    num_samples: int
    first_index: int
    sample_bytes: int  # every file's sample size where `sizes` is None
    sizes: KeyedSizes | None = None  # per-file sample sizes, computed a block at a time, where they vary

    def __post_init__(self) -> None:
        """The parts every path shares, formatted once (a path is asked for per sample read)."""
        base = os.path.join(self.folder, self.split, "")
        name = f"{{}}{{:0{len(str(self.subfolders))}d}}/" if self.subfolders else "{}"
        name += f"{self.prefix}_{{:0{max(len(str(self.count)), 1)}d}}_of_{self.count}.{self.extension}"
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_name", name.format)

    def path(self, i: int) -> str:
        if self.subfolders:
            return self._name(self._base, i % self.subfolders, i)
        return self._name(self._base, i)

    def folders(self) -> list[str]:
        """The folders this split's files lie in, each once (the subfolders, or the split's folder)."""
        if not self.count:
            return []
        return sorted({os.path.dirname(self.path(i)) for i in range(min(self.count, self.subfolders or 1))})

    def spec(self, i: int) -> FileSpec:
        size = self.sample_bytes if self.sizes is None else self.sizes[i]
        return FileSpec(index=self.first_index + i, path=self.path(i), num_samples=self.num_samples, sample_bytes=size)

    def total_sample_bytes(self) -> int:
        return self.sample_bytes * self.count if self.sizes is None else self.sizes.sum()


class FileList(Sequence):
    """Files of one or more splits, one after another, at `positions` (a range over them all)."""

    __slots__ = ("_splits", "_positions", "_last")

    def __init__(self, splits: tuple[SplitFiles, ...], positions: range | None = None) -> None:
        self._splits = splits
        self._positions = range(sum(s.count for s in splits)) if positions is None else positions
        # The FileSpec last asked for: a reader asks for one file's once per sample, in a row.
        # One tuple, replaced whole, so reader threads never see half of it.
        self._last: tuple[int, FileSpec] | None = None

    def __getstate__(self) -> tuple:
        return self._splits, self._positions

    def __setstate__(self, state: tuple) -> None:
        self._splits, self._positions = state
        self._last = None

    def __len__(self) -> int:
        return len(self._positions)

    def _spec(self, position: int) -> FileSpec:
        last = self._last
        if last is not None and last[0] == position:
            return last[1]
        offset = position
        for split in self._splits:
            if offset < split.count:
                spec = split.spec(offset)
                self._last = (position, spec)
                return spec
            offset -= split.count
        raise IndexError(position)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return FileList(self._splits, self._positions[key])
        return self._spec(self._positions[int(key)])  # range indexing: negatives, IndexError

    def __iter__(self) -> Iterator[FileSpec]:
        return (self._spec(p) for p in self._positions)

    def paths(self) -> Iterator[str]:
        """Each file's path, in order, without building its FileSpec: what a pass over every
        file's name needs (the dataset manifest's stats and entries) at a third of the cost."""
        if self.whole:
            return (split.path(i) for split in self._splits for i in range(split.count))
        return (self._spec(p).path for p in self._positions)

    def __add__(self, other: "FileList") -> "FileList":
        if not (self.whole and other.whole):
            raise TypeError("only whole FileLists are joined")
        return FileList(self._splits + other._splits)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or len(self) != len(other):
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"FileList({len(self)} files)"

    @property
    def whole(self) -> bool:
        """Every file of its splits, in order (not a slice): sums can be taken per split."""
        return self._positions == range(sum(s.count for s in self._splits))

    def total_samples(self) -> int:
        if self.whole:
            return sum(s.num_samples * s.count for s in self._splits)
        return sum(f.num_samples for f in self)

    def total_payload_bytes(self) -> int:
        if self.whole:
            return sum(s.num_samples * s.total_sample_bytes() for s in self._splits)
        return sum(f.payload_bytes for f in self)

    def folders(self) -> list[str]:
        """The folders the files lie in, sorted, each once (computed per split, not per file);
        of a whole list only (a slice's files may leave some of its splits' folders empty)."""
        if not self.whole:
            return sorted({os.path.dirname(f.path) for f in self})
        return sorted({folder for s in self._splits for folder in s.folders()})

    def samples_per_file(self) -> int:
        """The sample count of every file, or 0 where they differ: decided by the splits the
        positions reach (every split's count where the list is a slice, which may say 0 for a
        slice of alike files; the caller then takes the per-file counts, as for differing ones)."""
        counts = {s.num_samples for s in self._splits if s.count} if len(self) else set()
        return counts.pop() if len(counts) == 1 else 0

    def num_samples_at(self, positions: np.ndarray) -> np.ndarray:
        """Samples in the files at `positions` (int64), per split by arithmetic, no FileSpec built."""
        positions = np.asarray(positions, dtype=np.int64)
        absolute = self._positions.start + positions * self._positions.step
        counts = np.empty(len(absolute), dtype=np.int64)
        first = 0
        for split in self._splits:
            counts[(absolute >= first) & (absolute < first + split.count)] = split.num_samples
            first += split.count
        return counts


def sample_counts(files: Sequence[FileSpec], positions: np.ndarray) -> np.ndarray:
    """Samples in the files at `positions`: a FileList's without building its FileSpecs, any other
    sequence's (a tuple, in tests) one by one."""
    if isinstance(files, FileList):
        return files.num_samples_at(positions)
    return np.array([files[int(i)].num_samples for i in positions], dtype=np.int64)


def samples_per_file(files: Sequence[FileSpec]) -> int:
    """The sample count every file has, or 0 where they differ (or none has any): a FileList's
    from its splits' rules, with no array of counts; another sequence's (a tuple, in tests) file
    by file."""
    if isinstance(files, FileList):
        return files.samples_per_file()
    counts = {f.num_samples for f in files}
    return counts.pop() if len(counts) == 1 else 0


def total_samples(files: Sequence[FileSpec]) -> int:
    return files.total_samples() if isinstance(files, FileList) else sum(f.num_samples for f in files)
