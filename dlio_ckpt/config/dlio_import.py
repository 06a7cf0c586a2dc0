"""Import a DLIO benchmark workload YAML as a dlio_ckpt workload (pure: a DLIO mapping in, keys out).

Users arrive with the DLIO benchmark's workload files (argonne-lcf/dlio_benchmark,
configs/workload/*.yaml). `convert` maps every key DLIO 2.0.0 reads, and the newer ones
(`record_length_bytes`, `model.parallelism`, `model.transformer`, ...), onto dlio_ckpt keys so
that a run has the dataset shape, reads, compute time and checkpoint bytes DLIO would produce.
Where a DLIO file leaves a key out, DLIO's own default applies (not dlio_ckpt's): a DLIO file
means what DLIO would do with it. Keys DLIO reads that change no I/O are reported as unused,
with the reason; keys DLIO does not read at all are reported as unknown. Nothing is dropped
silently (dlio_keys.py: DLIO's defaults and the keys it reads that change no I/O). The key-by-key
table is docs/dlio-compat.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from dlio_ckpt.config.dlio_keys import DLIO_DEFAULTS, DTYPE_BYTES, FORMATS, UNUSED
from dlio_ckpt.config.yaml_files import dotted_leaves, file_name, parse_yaml, read_yaml_text
from dlio_ckpt.errors import ConfigError


@dataclass(frozen=True)
class Mapped:
    """One dlio_ckpt key, its value, and where the value came from (a DLIO key, or DLIO's default)."""

    key: str
    value: Any
    origin: str


@dataclass(frozen=True)
class DlioImport:
    name: str
    source: str
    mapped: tuple[Mapped, ...]
    unused: tuple[tuple[str, str], ...]  # DLIO keys read by DLIO that change no emulated I/O, and why
    unknown: tuple[str, ...]  # DLIO keys DLIO itself does not read
    not_mapped: tuple[str, ...] = ()  # values DLIO reads that dlio_ckpt cannot take as they are, and what it did instead

    def values(self) -> dict[str, Any]:
        return {m.key: m.value for m in self.mapped}

    def workload(self) -> dict[str, Any]:
        """The nested mapping of a dlio_ckpt workload file."""
        nested: dict[str, Any] = {}
        for m in self.mapped:
            node = nested
            *parents, leaf = m.key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = m.value
        return nested

    def warning(self) -> str:
        """One line listing the values not taken as they are and the DLIO keys no version of DLIO
        reads (empty when there are none): a value dropped without a word is a silent difference."""
        parts = list(self.not_mapped)
        if self.unknown:
            parts.append(f"DLIO keys that DLIO 2.0.0 does not read, ignored here too: {', '.join(self.unknown)}")
        return f"{self.source}: {'; '.join(parts)}" if parts else ""


class _Reader:
    """Typed access to the DLIO mapping; every key it hands out is marked as seen."""

    def __init__(self, data: Mapping[str, Any], origin: str) -> None:
        self.data = data
        self.origin = origin
        self.seen: set[str] = set()

    def has(self, key: str) -> bool:
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return False
            node = node[part]
        return True

    def raw(self, key: str) -> Any:
        node: Any = self.data
        for part in key.split("."):
            node = node[part]
        self.seen.add(key)
        return node

    def get(self, key: str, kind: Callable[[str, Any], Any], *aliases: str) -> tuple[Any, str]:
        """(value, origin): the first of `key` and its aliases present, else DLIO's default."""
        for name in (key, *aliases):
            if self.has(name):
                return kind(f"{self.origin}: {name}", self.raw(name)), name
        default_key = next((k for k in (key, *aliases) if k in DLIO_DEFAULTS), None)
        if default_key is None:
            raise KeyError(key)
        return kind(f"DLIO default of {default_key}", DLIO_DEFAULTS[default_key]), f"DLIO default of {default_key}"


def _int(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    return int(value)


def _count(where: str, value: Any) -> int:
    number = _int(where, value)
    if number < 0 and number != -1:
        raise ConfigError(f"{where}: cannot be negative (got {value!r})")
    return number


def _float(where: str, value: Any) -> float:
    if isinstance(value, Mapping):  # newer DLIO: {mean: .., stdev: ..}
        return _float(where + ".mean", value.get("mean", 0.0))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}: expected a non-negative number of seconds, got {value!r}")
    return float(value)


def _str(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def _ints(where: str, value: Any) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: expected a list of sizes, got {value!r}")
    return [_count(f"{where}[{i}]", v) for i, v in enumerate(value)]


def _shuffle(where: str, value: Any) -> bool:
    if isinstance(value, bool):  # YAML reads `off` as false
        return value
    text = _str(where, value).lower()
    if text not in ("off", "seed", "random"):
        raise ConfigError(f"{where}: expected off, seed or random, got {value!r}")
    return text != "off"


def _relative_folder(where: str, value: Any) -> str:
    """A DLIO folder as a folder under storage.root; "" for an absolute or escaping one (not mapped)."""
    folder = _str(where, value).strip().rstrip("/")
    if not folder or folder.startswith("/") or ".." in Path(folder).parts:
        return ""
    return folder.removeprefix("./")


def _unwrap(data: Any, origin: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: not a DLIO workload: expected a mapping of sections (model, dataset, reader, ...), "
                          f"got {type(data).__name__}")
    if "workload" in data and isinstance(data["workload"], Mapping) and "dataset" not in data:
        data = data["workload"]  # a DLIO config that nests the workload under `workload:`
    for section in ("dataset", "reader"):
        present = section in data or (section == "reader" and "data_reader" in data)
        if not present:
            raise ConfigError(f"{origin}: {section}: missing; a DLIO workload needs a {section} section "
                              "(dataset: format, num_files_train, record_length, ...; reader: data_loader, batch_size, ...)")
        value = data.get(section, data.get("data_reader"))
        if not isinstance(value, Mapping):
            raise ConfigError(f"{origin}: {section}: expected a mapping of keys, got {value!r}")
    return data


def convert(data: Any, name: str, origin: str = "<dlio>") -> DlioImport:
    """Map a DLIO workload mapping onto dlio_ckpt keys; `origin` names the file in every error."""
    data = _unwrap(data, origin)
    if "data_reader" in data and "reader" not in data:  # DLIO accepts either name
        data = {**data, "reader": data["data_reader"]}
        data.pop("data_reader")
    r = _Reader(data, origin)
    out: list[Mapped] = []
    not_mapped: list[str] = []

    def put(key: str, value: Any, where: str) -> None:
        out.append(Mapped(key, value, where))

    def take(key: str, target: str, kind: Callable[[str, Any], Any], *aliases: str,
             convert_value: Callable[[Any], Any] = lambda v: v) -> Any:
        value, where = r.get(key, kind, *aliases)
        put(target, convert_value(value), where)
        return value

    model_name, framework = _identity(r, data, name, origin, put)
    ckpt_on, eval_on = _workflow(r, put, origin)
    fmt = _dataset(r, put, take, origin, not_mapped)
    _reader(r, put, take, origin, fmt)
    _train(r, put, take, data, origin, eval_on)
    _checkpoint(r, put, take, ckpt_on, model_name, framework, origin, not_mapped)
    unused, unknown = _unread_keys(data, r)
    return DlioImport(name=name, source=origin, mapped=tuple(out), unused=tuple(unused), unknown=tuple(unknown),
                      not_mapped=tuple(not_mapped))


def _identity(r: _Reader, data: Mapping[str, Any], name: str, origin: str, put: Callable) -> tuple[str, str]:
    """The workload's name, description and source; returns (DLIO's model name, framework)."""
    model_name = name
    if r.has("model"):
        model_node = data["model"]
        if isinstance(model_node, str):
            model_name = _str(f"{origin}: model", r.raw("model"))
        elif isinstance(model_node, Mapping) and "name" in model_node:
            model_name = _str(f"{origin}: model.name", r.raw("model.name"))
    framework, _ = r.get("framework", _str)
    framework = framework.lower()
    if framework not in ("tensorflow", "pytorch"):
        raise ConfigError(f"{origin}: framework: expected tensorflow or pytorch, got {framework!r}")
    put("workload", name, "the file name")
    put("description", f"DLIO workload {model_name} ({framework}), imported from {Path(origin).name}", "model, framework")
    put("source", f"DLIO workload YAML {origin}", "the file")
    return model_name, framework


def _workflow(r: _Reader, put: Callable, origin: str) -> tuple[bool, bool]:
    """The mode DLIO's workflow flags amount to; returns (checkpointing on, evaluation on)."""
    train_on = _bool(f"{origin}: workflow.train", r.raw("workflow.train")) if r.has("workflow.train") else True
    generate = _bool(f"{origin}: workflow.generate_data", r.raw("workflow.generate_data")) if r.has("workflow.generate_data") else False
    ckpt_on = _bool(f"{origin}: workflow.checkpoint", r.raw("workflow.checkpoint")) if r.has("workflow.checkpoint") else False
    eval_on = _bool(f"{origin}: workflow.evaluation", r.raw("workflow.evaluation")) if r.has("workflow.evaluation") else False
    if not train_on and not generate and not ckpt_on:
        raise ConfigError(f"{origin}: workflow.train: false with neither workflow.generate_data nor workflow.checkpoint "
                          "leaves nothing to run; set workflow.train: true")
    mode = "train" if train_on else ("checkpoint" if ckpt_on else "generate")
    put("mode", mode, "workflow.train, workflow.generate_data, workflow.checkpoint")
    return ckpt_on, eval_on


def _dataset(r: _Reader, put: Callable, take: Callable, origin: str, not_mapped: list[str]) -> str:
    """The dataset's shape and files; returns DLIO's format name."""
    fmt, fmt_origin = r.get("dataset.format", _str)
    if fmt not in FORMATS:
        raise ConfigError(f"{origin}: dataset.format: '{fmt}' has no dlio_ckpt equivalent; "
                          f"supported: {', '.join(sorted(FORMATS))}")
    put("dataset.format", FORMATS[fmt], fmt_origin)
    if r.has("dataset.data_folder"):
        folder = _relative_folder(f"{origin}: dataset.data_folder", r.raw("dataset.data_folder"))
        if folder:
            put("dataset.folder", folder, "dataset.data_folder (under storage.root)")
        else:
            not_mapped.append(_outside_root_note("dataset.data_folder", r.raw("dataset.data_folder"), "dataset.folder"))
    take("dataset.num_files_train", "dataset.num_files_train", _count)
    take("dataset.num_files_eval", "dataset.num_files_eval", _count)
    take("dataset.num_samples_per_file", "dataset.num_samples_per_file", _count)
    if not r.has("dataset.record_length") and not r.has("dataset.record_length_bytes") and r.has("dataset.record_dims"):
        dims = _ints(f"{origin}: dataset.record_dims", r.raw("dataset.record_dims"))
        element = _count(f"{origin}: dataset.record_element_bytes", r.raw("dataset.record_element_bytes")) \
            if r.has("dataset.record_element_bytes") else 4
        put("dataset.record_length_bytes", max(1, math.prod(dims) * element), "dataset.record_dims x record_element_bytes")
        if r.has("dataset.record_element_type"):
            r.raw("dataset.record_element_type")
    else:
        take("dataset.record_length", "dataset.record_length_bytes", _count, "dataset.record_length_bytes",
             convert_value=lambda v: max(1, v))
    take("dataset.record_length_stdev", "dataset.record_length_bytes_stdev", _count, "dataset.record_length_bytes_stdev")
    take("dataset.num_subfolders_train", "dataset.num_subfolders_train", _count)
    take("dataset.num_subfolders_eval", "dataset.num_subfolders_eval", _count)
    take("dataset.file_prefix", "dataset.file_prefix", _str)
    compression, comp_origin = r.get("dataset.compression", _str)
    if compression not in ("none", "gzip", "lzf"):
        raise ConfigError(f"{origin}: dataset.compression: '{compression}' has no dlio_ckpt equivalent; use none, gzip or lzf")
    put("dataset.compression", compression, comp_origin)
    take("dataset.compression_level", "dataset.compression_level", _count)
    take("dataset.enable_chunking", "dataset.chunking", _bool)
    chunk, chunk_origin = r.get("dataset.chunk_size", _count)
    if chunk:
        put("dataset.chunk_size_bytes", chunk, chunk_origin)
    if r.has("dataset.record_element_type"):
        r.raw("dataset.record_element_type")
    _parquet(r, put, origin)
    return fmt


def _reader(r: _Reader, put: Callable, take: Callable, origin: str, fmt: str) -> None:
    """How the data loader reads (its access pattern follows DLIO's loader and format), and storage."""
    loader, loader_origin = r.get("reader.data_loader", _str)
    loader = loader.lower()
    if loader not in ("tensorflow", "pytorch", "dali", "native_dali"):
        raise ConfigError(f"{origin}: reader.data_loader: '{loader}' has no dlio_ckpt equivalent; "
                          "use tensorflow, pytorch, dali or native_dali")
    # tf.data's TFRecordDataset streams whole files in transfer_size requests; PyTorch's Dataset
    # (and DALI's index-based readers) read one sample per call.
    access = "transfer" if loader == "tensorflow" and FORMATS[fmt] == "tfrecord" else "sample"
    put("reader.name", "native", "dlio_ckpt's reader emulates the access pattern; reader.name=tensorflow runs tf.data itself")
    put("reader.access", access, f"{loader_origin} ({loader}) and dataset.format ({fmt})")
    take("reader.batch_size", "reader.batch_size", _count)
    take("reader.batch_size_eval", "reader.batch_size_eval", _count)
    take("reader.read_threads", "reader.read_threads", _count)
    take("reader.prefetch_size", "reader.prefetch_size", _count)
    take("reader.file_shuffle", "reader.file_shuffle", _shuffle)
    take("reader.sample_shuffle", "reader.sample_shuffle", _shuffle)
    take("reader.shuffle_size", "reader.shuffle_buffer_size", _count, convert_value=lambda v: max(1, v))
    transfer, transfer_origin = r.get("reader.transfer_size", lambda w, v: None if v is None else _count(w, v))
    if transfer is None:
        transfer = 256 * 1024 if access == "transfer" else 0
        transfer_origin += " (tf.data's 256 KiB read buffer)" if access == "transfer" else " (one read per sample)"
    put("reader.transfer_size", transfer, transfer_origin)
    put("reader.drop_last", True, "DLIO drops the last partial batch")
    if r.has("reader.odirect"):
        put("storage.direct_io", _bool(f"{origin}: reader.odirect", r.raw("reader.odirect")), "reader.odirect")
    if r.has("storage.storage_root"):
        put("storage.root", _str(f"{origin}: storage.storage_root", r.raw("storage.storage_root")), "storage.storage_root")


def _train(r: _Reader, put: Callable, take: Callable, data: Mapping[str, Any], origin: str, eval_on: bool) -> None:
    """Epochs, compute time, steps, the seed, evaluation and the AU target."""
    take("train.epochs", "train.epochs", _count, convert_value=lambda v: max(1, v))
    compute, compute_origin = r.get("train.computation_time", _float)
    put("train.computation_time", compute, compute_origin)
    stdev, stdev_origin = r.get("train.computation_time_stdev", _float)
    if r.has("train.computation_time") and isinstance(data["train"]["computation_time"], Mapping) \
            and "stdev" in data["train"]["computation_time"]:
        stdev, stdev_origin = _float(f"{origin}: train.computation_time.stdev", data["train"]["computation_time"]["stdev"]), \
            "train.computation_time.stdev"
    put("train.computation_time_stdev", stdev, stdev_origin)
    put("train.computation_distribution", "normal" if stdev > 0 else "fixed", "DLIO draws a normal when a stdev is given")
    steps, steps_origin = r.get("train.total_training_steps", _count)
    put("train.total_steps", max(0, steps), steps_origin + " (per epoch, as DLIO counts)")
    put("train.step_counting", "dlio", "DLIO: floor(samples / batch / ranks) steps per epoch, steps counted per epoch")
    seed = take("train.seed", "reader.shuffle_seed", _count)
    put("train.seed", seed, "train.seed")
    put("evaluation.enabled", eval_on, "workflow.evaluation")
    take("evaluation.eval_time", "evaluation.computation_time", _float)
    take("evaluation.epochs_between_evals", "evaluation.epochs_between_evals", _count, convert_value=lambda v: max(1, v))
    take("metric.au", "metric.au", lambda w, v: _float(w, v))


def _unread_keys(data: Mapping[str, Any], r: _Reader) -> tuple[list[tuple[str, str]], list[str]]:
    """(unused: DLIO keys that change no I/O, with why; unknown: keys DLIO itself does not read)."""
    known = set(DLIO_DEFAULTS) | set(UNUSED) | {"model", "model.name", "workflow.train", "workflow.checkpoint",
                                               "workflow.evaluation", "dataset.data_folder", "reader.odirect",
                                               "storage.storage_root", "dataset.record_length_bytes",
                                               "dataset.record_length_bytes_stdev", "dataset.record_dims",
                                               "dataset.record_element_bytes", "dataset.record_element_type"}
    unused, unknown = [], []
    for key, _ in dotted_leaves(data, opaque=("checkpoint.ksm", "storage.storage_options", "hydra")):
        if key in r.seen:
            continue
        reason = UNUSED.get(key) or next((why for k, why in UNUSED.items() if key.startswith(k + ".")), None)
        if reason:
            unused.append((key, reason))
        elif key.startswith("hydra"):
            unused.append((key, "Hydra settings of DLIO's own run"))
        elif key not in known:
            unknown.append(key)
    return unused, unknown


def _outside_root_note(key: str, value: Any, target: str) -> str:
    """What happened to a DLIO folder that is absolute or leaves storage.root: dlio_ckpt keeps every
    file it writes under storage.root (so `clean` and the space checks can account for it)."""
    return (f"{key}: {value!r} is absolute or outside storage.root, where dlio_ckpt keeps all its files; "
            f"kept {target} at the workload's default under storage.root (set storage.root= to place it)")


def _parquet(r: Any, put: Any, origin: str) -> None:
    """MLPerf Storage's DLIO parquet keys: `dataset.parquet.columns` (name, dtype, size each) and
    `dataset.parquet.row_group_size` (flux_datagen.yaml) -> dataset.parquet_columns and
    dataset.parquet_row_group_size."""
    if r.has("dataset.parquet.columns"):
        columns = r.raw("dataset.parquet.columns")
        if not isinstance(columns, list) or not all(isinstance(c, Mapping) and {"name", "size"} <= set(c) for c in columns):
            raise ConfigError(f"{origin}: dataset.parquet.columns: expected a list of {{name, dtype, size}}")
        put("dataset.parquet_columns", [f"{c['name']}:{c.get('dtype', 'float32')}:{c['size']}" for c in columns],
            "dataset.parquet.columns")
    if r.has("dataset.parquet.row_group_size"):
        put("dataset.parquet_row_group_size", _count(f"{origin}: dataset.parquet.row_group_size",
                                                     r.raw("dataset.parquet.row_group_size")), "dataset.parquet.row_group_size")


def _checkpoint(r: _Reader, put: Callable, take: Callable, enabled: bool, model_name: str, framework: str, origin: str,
                not_mapped: list[str]) -> None:
    """Checkpoint triggers, the folder, and the model whose bytes DLIO writes (_model)."""
    put("checkpoint.enabled", enabled, "workflow.checkpoint")
    put("checkpoint.strategy", "sharded", "every rank writes the state it owns (DLIO rank_zero: rank 0 owns it all)")
    put("checkpoint.layout", "raw", "DLIO names files model-/optimizer-/layer-<epoch>-<step>-<rank>")
    put("checkpoint.format", "raw", f"the tensor bytes DLIO's {framework} checkpoint holds, without its container")
    if r.has("checkpoint.checkpoint_folder"):
        folder = _relative_folder(f"{origin}: checkpoint.checkpoint_folder", r.raw("checkpoint.checkpoint_folder"))
        if folder:
            put("checkpoint.folder", folder, "checkpoint.checkpoint_folder (under storage.root)")
        else:
            not_mapped.append(_outside_root_note("checkpoint.checkpoint_folder", r.raw("checkpoint.checkpoint_folder"),
                                                 "checkpoint.folder"))
    put("checkpoint.keep_last", 0, "DLIO never deletes a checkpoint it wrote")
    steps_between, steps_origin = r.get("checkpoint.steps_between_checkpoints", _count)
    after, after_origin = r.get("checkpoint.checkpoint_after_epoch", _count)
    every, every_origin = r.get("checkpoint.epochs_between_checkpoints", _count)
    if steps_between >= 0:  # DLIO: step triggers replace epoch triggers
        put("checkpoint.steps_between_checkpoints", steps_between, steps_origin + " (per epoch, as DLIO counts)")
        put("checkpoint.epochs_between_checkpoints", 0, steps_origin + " set: no epoch checkpoints (DLIO)")
        put("checkpoint.checkpoint_after_epoch", 0, steps_origin + " set: no epoch checkpoints (DLIO)")
    else:
        put("checkpoint.steps_between_checkpoints", 0, steps_origin + " (unset: epoch checkpoints)")
        put("checkpoint.epochs_between_checkpoints", max(1, every), every_origin)
        put("checkpoint.checkpoint_after_epoch", max(1, after), after_origin)
    if r.has("checkpoint.time_between_checkpoints"):
        put("checkpoint.seconds_between_checkpoints",
            _float(f"{origin}: checkpoint.time_between_checkpoints", r.raw("checkpoint.time_between_checkpoints")),
            "checkpoint.time_between_checkpoints")
    if r.has("checkpoint.fsync"):
        put("checkpoint.fsync", _bool(f"{origin}: checkpoint.fsync", r.raw("checkpoint.fsync")), "checkpoint.fsync")
    for key in ("num_checkpoints_write", "num_checkpoints_read"):
        if r.has(f"checkpoint.{key}"):
            put(f"checkpoint.{key}", _count(f"{origin}: checkpoint.{key}", r.raw(f"checkpoint.{key}")), f"checkpoint.{key}")
    _model(r, put, model_name, origin)


def _model(r: _Reader, put: Callable, model_name: str, origin: str) -> None:
    """The model whose bytes DLIO writes.

    DLIO 2.0.0 fabricates a `model` tensor of model_size bytes, optimizer groups (two tensors per
    group plus one of their sum: 3 x sum bytes) and num_layers copies of the layer tensors
    (num_layers + tensor_parallelism of them when TP > 1), as int8 (one byte per element).
    dlio_ckpt's explicit model writes the same bytes: one-byte elements, three optimizer states
    per group, one layer tensor per DLIO layer. Newer DLIO files describe a transformer instead
    (model.transformer, model.parallelism), which dlio_ckpt sizes with DLIO's formula.
    """
    put("model.name", model_name, "model")
    tp, tp_origin = r.get("checkpoint.tensor_parallelism", _count, "model.parallelism.tensor")
    pp, pp_origin = r.get("checkpoint.pipeline_parallelism", _count, "model.parallelism.pipeline")
    layers, layers_origin = r.get("checkpoint.num_layers", _count, "model.num_layers")
    if r.has("model.transformer"):
        _transformer_model(r, put, origin, tp, tp_origin, pp, pp_origin, layers, layers_origin)
    else:
        _explicit_model(r, put, origin, tp, tp_origin, pp, pp_origin, layers, layers_origin)


def _transformer_model(r: _Reader, put: Callable, origin: str, tp: int, tp_origin: str, pp: int, pp_origin: str,
                       layers: int, layers_origin: str) -> None:
    """A newer DLIO file's transformer (model.transformer, model.parallelism), sized by DLIO's formula."""
    put("model.kind", "transformer", "model.transformer")
    put("model.num_layers", layers, layers_origin)
    for key in ("hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size"):
        if r.has(f"model.transformer.{key}"):
            put(f"model.{key}", _count(f"{origin}: model.transformer.{key}", r.raw(f"model.transformer.{key}")),
                f"model.transformer.{key}")
    if not r.has("model.transformer.num_kv_heads") and r.has("model.transformer.num_attention_heads"):
        put("model.num_kv_heads", data_value(r, "model.transformer.num_attention_heads"), "model.transformer.num_attention_heads")
    for key, target in (("model.model_datatype", "model.model_dtype_bytes"), ("model.optimizer_datatype", "model.optimizer_dtype_bytes")):
        if r.has(key):
            dtype = _str(f"{origin}: {key}", r.raw(key)).lower()
            if dtype not in DTYPE_BYTES:
                raise ConfigError(f"{origin}: {key}: unknown data type {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
            put(target, DTYPE_BYTES[dtype], key)
    put("model.parallelism.tensor", max(1, tp), tp_origin)
    put("model.parallelism.pipeline", max(1, pp), pp_origin)
    if r.has("model.parallelism.data"):
        put("model.parallelism.data", _count(f"{origin}: model.parallelism.data", r.raw("model.parallelism.data")),
            "model.parallelism.data")
    if r.has("model.parallelism.zero_stage"):
        put("model.parallelism.zero_stage",
            _count(f"{origin}: model.parallelism.zero_stage", r.raw("model.parallelism.zero_stage")),
            "model.parallelism.zero_stage")


def _explicit_model(r: _Reader, put: Callable, origin: str, tp: int, tp_origin: str, pp: int, pp_origin: str,
                    layers: int, layers_origin: str) -> None:
    """DLIO 2.0.0's fabricated tensors: model_size bytes, optimizer groups, layer copies, int8."""
    size, size_origin = r.get("checkpoint.model_size", _count, "model.model_size_bytes", "model.model_size")
    groups, groups_origin = r.get("checkpoint.optimization_groups", _ints, "model.optimization_groups")
    layer_sizes, layer_origin = r.get("checkpoint.layer_parameters", _ints, "model.layer_parameters")
    kind, kind_origin = r.get("checkpoint.type", _str)
    if kind not in ("rank_zero", "all_ranks"):
        raise ConfigError(f"{origin}: checkpoint.type: expected rank_zero or all_ranks, got {kind!r}")
    put("model.kind", "explicit", "checkpoint.model_size (DLIO's explicit sizes)")
    put("model.model_size_bytes", size, size_origin)
    put("model.optimization_groups", groups, groups_origin)
    put("model.optimizer_states", 3, "DLIO writes two tensors per optimizer group and one of their sum")
    put("model.optimizer_dtype_bytes", 1, "DLIO's tensors are int8")
    put("model.model_dtype_bytes", 1, "DLIO's tensors are int8")
    copies = layers + (tp if tp > 1 else 0) if layer_sizes and layers > 0 else 0
    put("model.layer_parameters", [sum(layer_sizes)] * copies,
        f"{layer_origin} summed, x {layers_origin}" + (f" + {tp_origin}" if tp > 1 else ""))
    if kind == "all_ranks":
        put("checkpoint.replicas", "all", f"{kind_origin} ({kind}): every rank writes its own copy of the whole state"
            + (f"; DLIO writes the layer tensors only on ranks that are multiples of {pp_origin}={pp}, "
               "here every rank does (docs/dlio-compat.md)" if pp > 1 else ""))
    else:
        put("checkpoint.replicas", "one", f"{kind_origin} ({kind}): one copy of the state per checkpoint, by rank 0")
    put("model.parallelism.tensor", 1, "DLIO's tensors are not split: each writer writes the whole state")
    put("model.parallelism.pipeline", 1, "as model.parallelism.tensor")
    put("model.parallelism.data", 0, "the world size")
    put("model.parallelism.zero_stage", 0, "the state is replicated, not partitioned")


def data_value(r: _Reader, key: str) -> int:
    return _count(f"{r.origin}: {key}", r.raw(key))


def load_dlio_file(path: str) -> Any:
    """The parsed YAML of a DLIO workload file, or a ConfigError naming the file."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"dlio_config: {path} is not a file; give the path of a DLIO workload YAML "
                          "(DLIO's own are in its source tree, dlio_benchmark/configs/workload/; dlio_ckpt ships none)")
    return parse_yaml(read_yaml_text(file), path)  # bounded in size, depth and values (yaml_files.py)


def import_file(path: str) -> DlioImport:
    """Read and convert a DLIO workload file; the workload is named after the file."""
    return convert(load_dlio_file(path), file_name(path), path)


def to_yaml(result: DlioImport) -> str:
    """A dlio_ckpt workload file: every mapped key with a comment naming its DLIO origin."""
    import yaml

    lines = ["# @package _global_",
             f"# Imported from the DLIO workload {result.source} by dlio_ckpt-import-dlio; see docs/dlio-compat.md."]
    for key, why in result.unused:
        lines.append(f"# DLIO key {key}: not used ({why})")
    if result.unknown:
        lines.append(f"# DLIO keys DLIO 2.0.0 does not read, ignored: {', '.join(result.unknown)}")
    origins = {m.key: m.origin for m in result.mapped}

    def emit(node: Mapping[str, Any], prefix: str, depth: int) -> None:
        for leaf, value in node.items():
            key = f"{prefix}{leaf}"
            if isinstance(value, dict):
                lines.append(f"{'  ' * depth}{leaf}:")
                emit(value, key + ".", depth + 1)
                continue
            text = yaml.safe_dump(value, default_flow_style=True, width=10**9).strip()
            text = text.removesuffix("...").strip()
            lines.append(f"{'  ' * depth}{leaf}: {text}  # {origins[key]}")

    emit(result.workload(), "", 0)
    return "\n".join(lines) + "\n"
