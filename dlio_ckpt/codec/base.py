"""The codec stage between a rank's state and the checkpoint format.

An Encoder turns one checkpoint file's logical bytes (a FileView) into the bytes that are written
(an EncodedFile, a self-describing container), and keeps what it needs across checkpoints (the
incremental first-occurrence table, the lossy reconstructed state). A Decoder rebuilds the logical
bytes from a chain of containers, oldest (a full one) first. Containers are plain bytes, so the
engine writes them with any strategy (sharded, single_writer, async) to any backend, through
formats that store one flat byte stream (raw, npy).

Encoders are per rank and per file (keyed by the file's path template): checkpoint i of a file
may refer only to checkpoints of the same file from the last full one (its chain base) to i.
After a failure and restart the encoder's memory is gone: `reset()` makes the next checkpoint a
full one. What an encode learnt counts only once its checkpoint is committed (`settle`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

from dlio_ckpt.state.base import FileView, MutableFileView


@dataclass
class EncodedFile:
    """One file's container, ready to stream to storage."""

    nbytes: int  # the container's exact size, known before the first byte is written
    chunks: Callable[[int], Iterator[memoryview]]  # chunks(chunk_bytes): the container in order (called once)
    metadata_bytes: int  # of nbytes: headers, tables, references (not tensor data)
    chain: tuple[int, ...]  # checkpoint indices this file needs to restore, oldest first, ending with its own
    state_digest: str  # xxh3_128 hex of the logical bytes a restore of this file yields, bit for bit
    stats: dict[str, Any] = field(default_factory=dict)  # codec figures (see docs/checkpointing.md)
    encode_s: float = 0.0  # time spent encoding (hashing, quantising), not writing


class Encoder(Protocol):
    name: str

    def encode(self, index: int, key: str, view: FileView) -> EncodedFile:
        """Checkpoint `index` of file `key` (its path template). Called once per file per
        checkpoint, in checkpoint order; the chunks of the result are consumed before the next call."""
        ...

    def reset(self) -> None:
        """Forget everything: the next checkpoint of every file is a full one."""
        ...

    def settle(self, index: int, committed: bool) -> None:
        """Called by the engine once the commit of checkpoint `index` is decided, on every rank.
        What `encode` learnt from checkpoint `index` may be built on by the next checkpoints only
        if it was committed: a checkpoint that was not must leave no chain that refers to it
        (incremental: the encoder is again what it was before `index`; lossy: it forgets, and
        the next checkpoints are full ones)."""
        ...


@dataclass(frozen=True)
class ChainLink:
    """One container of a chain, read through the (traced) restore storage."""

    index: int  # checkpoint index
    size: int
    read_at: Callable[[int, int], memoryview]  # (offset, nbytes) -> bytes of the container


class Decoder(Protocol):
    def rebuild(self, links: list[ChainLink], out: MutableFileView) -> None:
        """Make `out` (already `out.size` bytes long, contents undefined) hold the logical bytes of
        the last link's checkpoint, replaying `links` (chain base first, each index once, the
        target last); it may read back what it wrote. Raises ValueError naming the link and what
        is wrong when a container is malformed or the chain does not fit together."""
        ...


@dataclass(frozen=True)
class Stream:
    """One direction of a bytes codec over one container: `update(data)` returns what is ready,
    `finish()` the rest (zlib's and zstd's compressobj shape), so a container passes through a
    pipeline without being held whole."""

    update: Callable[[bytes], bytes]
    finish: Callable[[], bytes]
