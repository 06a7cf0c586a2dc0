"""What a PyTorch DataLoader does for one batch, in whichever process fetches it.

A DataLoader's fetcher calls the Dataset for each index of the batch (read, then decode or
transform the sample) and collates the samples into one batch tensor (default_collate stacks
them, in a worker into shared memory). Each step here happens for real and is timed on its own,
so the summary can say how much of a worker's time was storage and how much CPU work a real
program pays too (docs/metrics.md, `loader`):

- fetch: the format's reader returns the sample's payload (opens, reads: the traced storage I/O);
- decode (`reader.decode`): `numpy` turns the payload into the float32 array a model takes, as
  `torch.from_numpy(x).float().div(255)` does after np.load; `torch` does it with those very torch
  calls and collates with torch.cat, so the framework's own cost is paid (in a busy 2-core
  machine torch's per-sample conversion took 7 ms where numpy's took 0.15 ms); `none` leaves the
  bytes as read;
- collate: the samples copied, one after another, into the batch buffer (a stack).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable

import numpy as np

from dlio_ckpt.formats.base import DatasetFormat, FileSpec, FormatOptions, SampleReader, Scratch

DECODES = ("none", "numpy", "torch", "pillow")  # reader.decode values; pillow needs a jpeg/png dataset format
SCALE = np.float32(1 / 255)


@dataclass
class FetchTimes:
    """Seconds a fetcher spent per kind of work (summed over batches)."""

    fetch_s: float = 0.0  # the format reading samples: storage calls and the format's own parsing
    decode_s: float = 0.0
    collate_s: float = 0.0
    batches: int = 0

    def add(self, other: "FetchTimes") -> None:
        self.fetch_s += other.fetch_s
        self.decode_s += other.decode_s
        self.collate_s += other.collate_s
        self.batches += other.batches

    def as_dict(self) -> dict[str, float]:
        return {"fetch_s": self.fetch_s, "decode_s": self.decode_s, "collate_s": self.collate_s,
                "batches": self.batches}


def batch_dtype(decode: str) -> np.dtype:
    return np.dtype(np.float32) if decode in ("numpy", "torch") else np.dtype(np.uint8)


def batch_nbytes(files: tuple[FileSpec, ...], rows: np.ndarray, decode: str) -> int:
    """Bytes of the collated batch of `rows` ((file position, sample) pairs)."""
    return sum(files[int(position)].sample_bytes for position, _ in rows) * batch_dtype(decode).itemsize


class OpenFiles:
    """One fetcher's LRU of open SampleReaders (a format's reader object is not shared)."""

    def __init__(self, storage: Any, fmt: DatasetFormat, options: FormatOptions, capacity: int) -> None:
        self._storage, self._fmt, self._options, self._capacity = storage, fmt, options, capacity
        self._cache: OrderedDict[int, SampleReader] = OrderedDict()
        self._scratch = Scratch()

    def get(self, spec: FileSpec) -> SampleReader:
        reader = self._cache.get(spec.index)
        if reader is not None:
            self._cache.move_to_end(spec.index)
            return reader
        reader = self._fmt.open(lambda suffix: self._storage.open_read(spec.path + suffix), spec, self._options,
                                self._scratch)
        self._cache[spec.index] = reader
        while len(self._cache) > self._capacity:
            _, old = self._cache.popitem(last=False)
            old.close()
        return reader

    def close_all(self) -> None:
        while self._cache:
            _, reader = self._cache.popitem(last=False)
            reader.close()


class BatchFetcher:
    """Fetches, decodes and collates batches into buffers it is given (module doc)."""

    def __init__(self, files: tuple[FileSpec, ...], open_files: OpenFiles, decode: str) -> None:
        self._files = files
        self._open = open_files
        self.decode = decode
        self.times = FetchTimes()
        self._torch = None
        if decode == "torch":
            import torch  # imported before training starts (ProcessReader), so this is a look-up

            self._torch = torch

    def fill(self, rows: np.ndarray, out: Callable[[int], memoryview]) -> tuple[int, int]:
        """Collate the batch `rows` into `out(nbytes)`; returns (samples, payload bytes)."""
        dtype = batch_dtype(self.decode)
        target = np.frombuffer(out(batch_nbytes(self._files, rows, self.decode)), dtype=dtype)
        at = payload = 0
        fetch = decode = collate = 0.0
        decoded_samples = []
        for position, sample in rows:
            spec = self._files[int(position)]
            start = perf_counter()
            view = self._open.get(spec).fetch(int(sample))
            fetched = perf_counter()
            if self._torch is not None:  # torch.from_numpy(x).float().div_(255), the sample kept for torch.cat
                decoded_samples.append(self._torch.frombuffer(view, dtype=self._torch.uint8).float().div_(255))
                decoded = done = perf_counter()
            else:
                if self.decode == "numpy":
                    values = np.frombuffer(view, dtype=np.uint8).astype(np.float32)
                    values *= SCALE
                    decoded = perf_counter()
                else:
                    values = np.frombuffer(view, dtype=np.uint8)
                    decoded = fetched
                target[at: at + values.size] = values  # the collate: each sample copied into the batch
                done = perf_counter()
                at += values.size
            payload += spec.sample_bytes
            fetch += fetched - start
            decode += decoded - fetched
            collate += done - decoded
        if decoded_samples:  # default_collate's stack, into the batch's buffer
            start = perf_counter()
            self._torch.cat(decoded_samples, out=self._torch.from_numpy(target))
            collate += perf_counter() - start
        self.times.fetch_s += fetch
        self.times.decode_s += decode
        self.times.collate_s += collate
        self.times.batches += 1
        return len(rows), payload

    def close(self) -> None:
        self._open.close_all()
