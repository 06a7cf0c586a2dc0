"""A codec pipeline: one state codec, then bytes codecs in order (zarr v3's array-to-bytes then
bytes-to-bytes), built from `checkpoint.codecs` through the codec registry (codec_registry.py).

A single state codec is returned as it is, so `checkpoint.encoding=incremental` (or
`codecs=[incremental]`) writes exactly the container it always did. Bytes stages stream a
container through their compressors into a spool (memory up to SPOOL_MEMORY_BYTES, then an
untraced temporary file), because a checkpoint file's size must be known before its first byte is
written; a restore streams each chain link back through the decompressors, last stage first,
before the state codec replays the chain. A pipeline that starts with a bytes codec compresses
the file's plain bytes: every checkpoint a full one, its own chain.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any, Callable, Iterator

import xxhash

from dlio_ckpt.codec.base import ChainLink, Decoder, EncodedFile, Encoder, Stream
from dlio_ckpt.codec_registry import CODECS, PIPE, codec_names, encoding_label
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.base import FileView, MutableFileView

PIPE_CHUNK_BYTES = 4 << 20  # what one update() of a stage is handed
SPOOL_MEMORY_BYTES = 64 << 20  # a spool beyond this lives in a temporary file


def make_encoder(cfg: Any, tensors_of: Callable[[str], tuple[TensorSpec, ...]]) -> Encoder | None:
    """The rank's encoder for the configured codecs (None: no codec, the format writes the tensors)."""
    names = codec_names(cfg)
    if not names:
        return None
    first, stages = _split([CODECS.load(name) for name in names])
    encoder = first.encoder(cfg, tensors_of) if first is not None else PlainEncoder()
    return PipelineEncoder(encoder, stages, encoding_label(cfg), cfg.state_dir) if stages else encoder


def make_decoder(label: str, tensors: tuple[TensorSpec, ...], folder: str = "") -> Decoder:
    """The decoder of a manifest's `codec` (a pipeline's label); ValueError when a name is unknown here."""
    try:
        codecs = [CODECS.load(name) for name in label.split(PIPE)]
    except ConfigError:
        raise ValueError(f"unknown encoding {label!r} in the manifest") from None
    first, stages = _split(codecs)
    decoder = first.decoder(tensors) if first is not None else PlainDecoder()
    return PipelineDecoder(decoder, stages, folder) if stages else decoder


def _split(codecs: list[Any]) -> tuple[Any, list[Any]]:
    """(the state codec or None, the bytes codecs after it); the config check put a state codec first."""
    if codecs[0].kind == "state":
        return codecs[0], codecs[1:]
    return None, codecs


class PlainEncoder:
    """The state stage of a pipeline that starts with a bytes codec: the file's bytes as they are."""

    name = "plain"

    def encode(self, index: int, key: str, view: FileView) -> EncodedFile:
        started = time.perf_counter()
        hasher = xxhash.xxh3_128()
        for piece in view.stream(PIPE_CHUNK_BYTES):
            hasher.update(piece)
        return EncodedFile(nbytes=view.size, chunks=view.stream, metadata_bytes=0, chain=(index,),
                           state_digest=hasher.hexdigest(), encode_s=time.perf_counter() - started,
                           stats={"logical_bytes": view.size, "bytes_written": view.size, "metadata_bytes": 0, "chain_length": 1})

    def reset(self) -> None:
        pass

    def settle(self, index: int, committed: bool) -> None:
        pass


class PlainDecoder:
    def rebuild(self, links: list[ChainLink], out: MutableFileView) -> None:
        link = links[-1]
        if link.size != out.size:
            raise ValueError(f"checkpoint {link.index}: {link.size} plain bytes for a file of {out.size}")
        for at in range(0, link.size, PIPE_CHUNK_BYTES):
            out.write_at(at, link.read_at(at, min(PIPE_CHUNK_BYTES, link.size - at)))


class PipelineEncoder:
    """A state encoder whose containers pass through bytes codecs before they are written."""

    def __init__(self, first: Encoder, stages: list[Any], name: str, folder: str) -> None:
        self.first = first
        self.stages = stages
        self.name = name
        self.folder = folder

    def encode(self, index: int, key: str, view: FileView) -> EncodedFile:
        started = time.perf_counter()
        inner = self.first.encode(index, key, view)
        spool = _spool(self.folder)
        streams = [stage.compressor() for stage in self.stages]
        for piece in inner.chunks(PIPE_CHUNK_BYTES):
            spool.write(_through(streams, bytes(piece)))
        spool.write(_finish(streams))
        size = spool.tell()
        stats = dict(inner.stats, bytes_written=size, state_codec_bytes=inner.nbytes)
        return EncodedFile(nbytes=size, chunks=lambda chunk_bytes: _drain(spool, chunk_bytes), metadata_bytes=inner.metadata_bytes,
                           chain=inner.chain, state_digest=inner.state_digest, stats=stats, encode_s=time.perf_counter() - started)

    def reset(self) -> None:
        self.first.reset()

    def settle(self, index: int, committed: bool) -> None:
        self.first.settle(index, committed)


class PipelineDecoder:
    """Each chain link through the bytes codecs' decompressors (last stage first), then the state decoder."""

    def __init__(self, first: Decoder, stages: list[Any], folder: str) -> None:
        self.first = first
        self.stages = stages
        self.folder = folder

    def rebuild(self, links: list[ChainLink], out: MutableFileView) -> None:
        spools: list[Any] = []
        try:
            self.first.rebuild([self._decoded(link, spools) for link in links], out)
        finally:
            for spool in spools:
                spool.close()

    def _decoded(self, link: ChainLink, spools: list[Any]) -> ChainLink:
        spool = _spool(self.folder)
        spools.append(spool)
        streams = [stage.decompressor() for stage in reversed(self.stages)]
        try:
            for at in range(0, link.size, PIPE_CHUNK_BYTES):
                spool.write(_through(streams, bytes(link.read_at(at, min(PIPE_CHUNK_BYTES, link.size - at)))))
            spool.write(_finish(streams))
        except ValueError:
            raise
        except Exception as exc:  # each library has its own error (zstandard.ZstdError, zlib.error)
            names = PIPE.join(stage.name for stage in self.stages)
            raise ValueError(f"checkpoint {link.index}: {names} cannot decode its container ({exc})") from None
        size = spool.tell()

        def read_at(offset: int, nbytes: int) -> memoryview:
            spool.seek(offset)
            return memoryview(spool.read(max(0, min(nbytes, size - offset))))

        return ChainLink(index=link.index, size=size, read_at=read_at)


def _spool(folder: str) -> Any:
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES, dir=folder or None)


def _through(streams: list[Stream], data: bytes) -> bytes:
    for stream in streams:
        data = stream.update(data)
    return data


def _finish(streams: list[Stream]) -> bytes:
    """What is left in every stage: each one's output goes through the stages after it."""
    data = b""
    for stream in streams:
        data = (stream.update(data) if data else b"") + stream.finish()
    return data


def _drain(spool: Any, chunk_bytes: int) -> Iterator[memoryview]:
    """The spooled container in order, once; the spool is closed after its last piece."""
    spool.seek(0)
    try:
        while piece := spool.read(chunk_bytes):
            yield memoryview(piece)
    finally:
        spool.close()
