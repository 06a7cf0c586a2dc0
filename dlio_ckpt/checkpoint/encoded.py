"""The codec stage inside the checkpoint engine: from a file's state to what a file holds.

With `checkpoint.encoding=full` a file holds its tensors as the format lays them out (today's
path, untouched). With a codec (`checkpoint.encoding=incremental` or `lossy`, or a pipeline
`checkpoint.codecs=[...]`, codec/pipeline.py) the rank's Encoder turns the file's logical bytes
into a container (codec/), and the format stores the container as one flat byte vector: `raw`
writes it as is, `npy` after a numpy header; those are the formats whose payload is one byte
stream a restore can find again (`container_offset`). The manifest entry of an encoded file says
where its container lies, what it restores to (the state's xxh3_128) and which earlier checkpoints
it needs; restore replays that chain through the traced storage, so every byte it reads is counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from dlio_ckpt.codec import pipeline
from dlio_ckpt.codec.base import EncodedFile
from dlio_ckpt.codec_registry import CODECS, codec_names, codec_setting
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.plan.checkpoint_formats import CHECKPOINT_FORMATS, format_spec
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.base import stream_by_reads

CONTAINER_TENSOR = "container"


def check_encoding(cfg: Any) -> None:
    """The codecs are known and in order, and an encoded checkpoint or an evolving state has a
    format that stores one byte stream."""
    check_codec_order(cfg)
    names = codec_names(cfg)
    one_stream = format_spec(cfg.format).one_stream
    if names and not one_stream:
        raise ConfigError(f"{codec_setting(cfg)} stores a container of its own; "
                          f"use checkpoint.format={one_stream_formats()} (not {cfg.format})")
    if cfg.update != "random" and not one_stream:
        raise ConfigError(f"checkpoint.update={cfg.update} restores its state from one byte stream per file; "
                          f"use checkpoint.format={one_stream_formats()} (not {cfg.format})")
    problem = names and getattr(CODECS.load(names[0]), "random_update_problem", "")
    if problem and cfg.update == "random":
        raise ConfigError(f"{codec_setting(cfg)} {problem}, and checkpoint.update=random "
                          "replaces every byte with noise; set checkpoint.update=sgd, trace or sparse")


def check_codec_order(cfg: Any) -> None:
    """checkpoint.codecs names known codecs, a state codec only first, and is not set beside
    checkpoint.encoding."""
    if not cfg.codecs:
        return
    if cfg.encoding != "full":
        raise ConfigError(f"checkpoint.codecs=[{','.join(cfg.codecs)}] and checkpoint.encoding={cfg.encoding} both choose "
                          "the codecs; set one (checkpoint.codecs=[...] with checkpoint.encoding=full)")
    for position, name in enumerate(cfg.codecs):
        if position and CODECS.load(name).kind == "state":
            raise ConfigError(f"checkpoint.codecs: {name} keeps the state across checkpoints and must come first "
                              f"(got [{','.join(cfg.codecs)}])")


def one_stream_formats() -> str:
    """The checkpoint formats that store one byte stream, for a message: "raw or npy"."""
    return " or ".join(name for name in CHECKPOINT_FORMATS.names() if CHECKPOINT_FORMATS.load(name).one_stream)


def payload_offset(format_name: str, nbytes: int) -> int:
    """Where a file's single byte stream of `nbytes` starts (raw: 0; npy: after its header)."""
    return format_spec(format_name).encoded_size((container_tensor(nbytes),)) - nbytes


def make_encoder(cfg: Any, files: tuple[PlannedFile, ...]) -> Any:
    """The rank's encoder for the configured codecs (None for `full`), over the files it owns."""
    tensors = {pf.relpath: pf.tensors for pf in files}
    return pipeline.make_encoder(cfg, tensors.__getitem__)


def make_decoder(codec: str, tensors: tuple[TensorSpec, ...]) -> Any:
    return pipeline.make_decoder(codec, tensors)


@dataclass
class Payload:
    """What the format writes for one planned file: tensors and their chunks, plus, for an encoded
    file, the container's description (for the manifest) and what encoding it cost."""

    tensors: tuple[TensorSpec, ...]
    chunks: Callable[[TensorSpec], Iterator[memoryview]]
    encoding: dict | None = None  # the manifest entry's "encoding" (offset filled in by the engine)
    stats: dict = field(default_factory=dict)
    encode_s: float = 0.0


def encoded_payload(encoder: Any, index: int, pf: PlannedFile, view: Any, format_name: str, chunk_bytes: int) -> Payload:
    """Encode checkpoint `index` of `pf` from `view` (its logical bytes) into a Payload."""
    start = time.perf_counter()
    encoded: EncodedFile = encoder.encode(index, pf.relpath, view)
    encode_s = encoded.encode_s or (time.perf_counter() - start)
    return Payload(
        tensors=(container_tensor(encoded.nbytes),),
        chunks=lambda _t: encoded.chunks(chunk_bytes),
        encoding=encoding_entry(encoder.name, index, pf.relpath, format_name, encoded, view.size),
        stats=dict(encoded.stats), encode_s=encode_s,
    )


def encoding_entry(codec: str, index: int, key: str, format_name: str, encoded: EncodedFile, logical: int) -> dict:
    return {"codec": codec, "index": index, "key": key, "offset": payload_offset(format_name, encoded.nbytes),
            "container_bytes": encoded.nbytes, "logical_bytes": logical, "state_digest": encoded.state_digest,
            "chain": list(encoded.chain)}


def container_tensor(nbytes: int) -> TensorSpec:
    """The one uint8 "tensor" a format writes for an encoded file: its container."""
    return TensorSpec(CONTAINER_TENSOR, nbytes, 1, "model")


def tensor_chunks_of(view: Any, pf: PlannedFile, chunk_bytes: int) -> Callable[[TensorSpec], Iterator[memoryview]]:
    """Each tensor's bytes from a view of the whole file (tensors back to back, in plan order)."""
    starts = {}
    position = 0
    for tensor in pf.tensors:
        starts[tensor.name] = position
        position += tensor.nbytes

    def chunks(tensor: TensorSpec) -> Iterator[memoryview]:
        first = starts[tensor.name]
        for at in range(first, first + tensor.nbytes, chunk_bytes):
            yield view.read_at(at, min(chunk_bytes, first + tensor.nbytes - at))

    return chunks


SETTING_STATS = ("bits", "mantissa_bits", "leaf_bytes")  # codec stats that echo a setting: never added up


def merge_stats(stats: list[dict]) -> dict:
    """One rank's codec figures over its files: sizes and counts add up, errors and chain lengths
    take the worst file, ratios are left to be recomputed from the sums (docs/metrics.md); settings
    (lossy `bits`, `mantissa_bits`, like `coder`) are the first file's."""
    merged: dict[str, Any] = {}
    for one in stats:
        for key, value in (one or {}).items():
            if "ratio" in key:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or key in SETTING_STATS:
                merged.setdefault(key, value)
            elif "error" in key or "bound" in key or key == "chain_length":
                merged[key] = max(merged.get(key, value), value)
            else:
                merged[key] = merged.get(key, 0) + value
    return merged


class Window:
    """A FileView of `size` bytes of another view from `offset` on: a container inside a file, a
    payload after a format's header."""

    def __init__(self, view: Any, offset: int, size: int) -> None:
        if offset < 0 or offset + size > view.size:
            raise ValueError(f"a window of {size} bytes at {offset} does not fit in {view.size} bytes")
        self._view = view
        self._offset = offset
        self.size = size

    def read_at(self, offset: int, nbytes: int) -> memoryview:
        return self._view.read_at(self._offset + offset, max(0, min(nbytes, self.size - offset)))

    def stream(self, chunk_bytes: int) -> Iterator[memoryview]:
        return stream_by_reads(self, chunk_bytes)


def digest_view(view: Any, chunk_bytes: int) -> str:
    """xxh3_128 of a view's bytes: what a restored state is compared with."""
    import xxhash

    hasher = xxhash.xxh3_128()
    for piece in view.stream(chunk_bytes):
        hasher.update(piece)
    return hasher.hexdigest()
