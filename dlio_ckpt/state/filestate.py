"""One checkpoint file's evolving state: where its tensors sit, its seeded draws, its store.

Every draw an update model makes comes from a generator seeded by (run seed, owner, file, a, b,
purpose), so the same sequence of advance() calls gives the same bytes on any rank count and in
any run; nothing depends on the order files are visited in.

Float tensors must always hold finite values (a lossy codec computes deltas of them): bytes taken
from the random pool are made finite by `make_finite`, which forces the top exponent bits so that
every element is a normal number of magnitude below 2 (2^-7..2 for float16, 2^-15..2 for
float32/float64), keeping sign and mantissa (and the low exponent bits) random.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.plan.model import TensorSpec

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_FLOAT = {2: np.float16, 4: np.float32, 8: np.float64}
# dtype_bytes -> (bits kept: sign, mantissa, low exponent bits; bits set: exponent just below the bias)
_FINITE_BITS = {2: (0x9FFF, 0x2000), 4: (0x87FFFFFF, 0x38000000), 8: (0x80FFFFFFFFFFFFFF, 0x3F00000000000000)}
_SEED_MASK = (1 << 64) - 1


def float_dtype(dtype_bytes: int) -> type:
    """The numpy float type a tensor of `dtype_bytes` holds (float16 stands in for bf16)."""
    return _FLOAT[dtype_bytes]


def make_finite(raw: np.ndarray, dtype_bytes: int, select: np.ndarray | None = None) -> None:
    """Make the float elements in `raw` (uint8, whole elements) finite in place; only the
    elements where `select` is true when given. Idempotent."""
    if dtype_bytes == 1 or not len(raw):
        return
    words = raw.view(_UINT[dtype_bytes])
    keep, force = (_UINT[dtype_bytes](v) for v in _FINITE_BITS[dtype_bytes])
    if select is None:
        np.bitwise_and(words, keep, out=words)
        np.bitwise_or(words, force, out=words)
    else:
        words[select] = (words[select] & keep) | force


@dataclass
class FileState:
    """The state of one PlannedFile: tensor offsets, the seed of its draws, its store (None
    until a stored model fills it, or for `random` until a restore loads bytes into it) and the
    step its bytes are at."""

    pf: PlannedFile
    seed: int
    starts: np.ndarray = field(init=False)  # file offset of each tensor, plus the file size at the end
    store: object = None
    step: int = 0
    exact: bool = False  # the store holds the model's closed form at `step` bit for bit (not a lossy restore's bytes)
    float_offset: int = 0  # global index of its first float element over the layout (all ranks' files in rank order)

    def __post_init__(self) -> None:
        sizes = np.array([t.nbytes for t in self.pf.tensors], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._index = {t.name: i for i, t in enumerate(self.pf.tensors)}
        self._file_key = zlib.crc32(self.pf.relpath.encode())

    @property
    def file_key(self) -> int:
        """A hash of the file's path: part of every seed of its draws."""
        return self._file_key

    @property
    def size(self) -> int:
        return int(self.starts[-1])

    def start_of(self, tensor: TensorSpec) -> int:
        index = self._index.get(tensor.name)
        if index is None:
            raise KeyError(f"tensor {tensor.name} is not in {self.pf.relpath}")
        return int(self.starts[index])

    def overlapping(self, lo: int, hi: int) -> range:
        """Indices of the tensors with bytes in [lo, hi)."""
        first = int(np.searchsorted(self.starts, lo, side="right")) - 1
        last = int(np.searchsorted(self.starts, hi, side="left"))
        return range(max(first, 0), min(last, len(self.pf.tensors)))

    def rng(self, a: int, b: int, purpose: int) -> np.random.Generator:
        """The generator for one kind of draw (`purpose`) of the update from step a to b."""
        entropy = [self.seed & _SEED_MASK, self.pf.owner, self._file_key, a, b, purpose]
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))

    def make_finite_range(self, raw: np.ndarray, at: int, changed: np.ndarray | None = None) -> None:
        """Make finite the float elements of the file bytes [at, at + len(raw)) held in `raw`,
        only those with a changed byte when `changed` (bool per byte of raw) is given. Elements cut
        by either end of the range are left alone: the caller reads a few bytes of margin."""
        for i in self.overlapping(at, at + len(raw)):
            tensor = self.pf.tensors[i]
            width = tensor.dtype_bytes
            if width == 1:
                continue
            start = int(self.starts[i])
            first = max(0, -(-(at - start) // width))  # first element wholly inside
            last = min(tensor.numel, (at + len(raw) - start) // width)
            if last <= first:
                continue
            lo, hi = start + first * width - at, start + last * width - at
            select = None if changed is None else changed[lo:hi].view(_UINT[width]) != 0  # any byte of the element
            make_finite(raw[lo:hi], width, select)
