"""Codecs by name (`checkpoint.codecs=[...]`, or the one `checkpoint.encoding` names), and what
a checkpoint config asks of them.

A codec is one of two kinds, as in zarr v3's codec pipeline:
- a state codec (`kind = "state"`: incremental, lossy) turns a file's logical bytes into a
  container and remembers earlier checkpoints (a chain); it comes first, at most one;
- a bytes codec (`kind = "bytes"`: zstd) turns a container into another, with no memory across
  checkpoints; any number follow, applied in order (codec/pipeline.py).
`checkpoint.codecs=[incremental,zstd]` is incremental's container compressed by zstd;
`[zstd]` alone compresses the file's plain bytes. Each entry is an object with `name`, `kind`
and, for a state codec, `encoder(cfg, tensors_of)` and `decoder(tensors)`; for a bytes codec,
`compressor()` and `decompressor()` (streams with `update(data) -> bytes` and `finish() -> bytes`).
Adding a codec is one module and one line here (or one entry point in `dlio_ckpt.codecs`).
"""

from __future__ import annotations

from typing import Any

from dlio_ckpt.errors import ConfigError, MissingDependency
from dlio_ckpt.registry import Registry

CODECS = Registry(
    key="checkpoint.codecs",
    noun="codec",
    entries={
        "incremental": "dlio_ckpt.codec.incremental:CODEC",
        "lossy": "dlio_ckpt.codec.lossy:CODEC",
        "zstd": "dlio_ckpt.codec.zstd:CODEC",
    },
    group="dlio_ckpt.codecs",
)

PIPE = "+"  # joins a pipeline's names into its one label (manifests, records, the report)


def codec_names(cfg: Any) -> tuple[str, ...]:
    """The codecs a checkpoint file passes through, in order: `checkpoint.codecs`, else the one
    `checkpoint.encoding` names (none for `full`)."""
    if cfg.codecs:
        return tuple(cfg.codecs)
    return () if cfg.encoding == "full" else (cfg.encoding,)


def encoding_label(cfg: Any) -> str:
    """What manifests, records and the report call the encoding: `full`, one codec's name (as
    `checkpoint.encoding` always did), or a pipeline's names joined by '+'."""
    return PIPE.join(codec_names(cfg)) or "full"


def ratio_name(label: str) -> str:
    """The summary's name for logical over written bytes under encoding `label`: what its first
    codec declares (`ratio_name`: incremental's "dedup_ratio"), else "compression_ratio" (also for
    a codec not installed where the summary is read)."""
    try:
        return getattr(CODECS.load(label.split(PIPE)[0]), "ratio_name", "compression_ratio")
    except (ConfigError, MissingDependency):
        return "compression_ratio"


def codec_setting(cfg: Any) -> str:
    """The setting that chose the codecs, as a message names it."""
    return f"checkpoint.codecs=[{','.join(cfg.codecs)}]" if cfg.codecs else f"checkpoint.encoding={cfg.encoding}"
