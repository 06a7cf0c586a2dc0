"""RunConfig: the user's inputs as frozen dataclasses, the only thing plans are built from.

Types and constraints live here; default values live in conf/*.yaml (one source for each).
Every `validate` names the key it rejects and what would be allowed. Names that registries own
(formats, backends, checkpoint strategies and layouts) are checked by the loader
(config/load.py), so this module imports nothing but the type helpers and the options tables
that backends declare for their own sections (storage.s3.*: storage/s3_options.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Optional

from dlio_ckpt.typed import Bytes, require
from dlio_ckpt.storage.s3_options import S3Options

# Seeds feed numpy's SeedSequence, which takes non-negative integers.
MAX_SEED = 2**63 - 1
# mode=plan sizes a job of up to this many ranks (131,072: beyond the largest training jobs run);
# a plan's time and memory grow with the rank count (about 15 ms a rank for a 70B transformer).
MAX_PLAN_RANKS = 1 << 17
# Times a run actually waits (a step's compute, the sleep between checkpoints) stay under 1e6 s
# (11.6 days); past ~9.2e9 s time.sleep itself overflows (a traceback after the run folder was
# made). Times that are only compared (an interval, an MTBF) stay under 1e9 s (31.7 years).
MAX_WAIT_S = 1e6
MAX_INTERVAL_S = 1e9


@dataclass(frozen=True)
class StorageConfig:
    backend: str  # a name of dlio_ckpt.storage.BACKENDS
    root: str
    direct_io: bool
    fsync: bool
    drop_caches: bool
    allow_outside_root_dataset: bool  # dataset.folder may leave storage.root (a shared, pre-generated dataset)
    # A backend's own options: one section per backend that has any, its table in the backend's module.
    s3: S3Options  # storage.s3.*: storage/s3_options.py

    def validate(self, key: str) -> None:
        require(self.root != "", f"{key}root: must be a folder path")


@dataclass(frozen=True)
class DatasetConfig:
    format: str  # a name of dlio_ckpt.formats.DATASET_FORMATS
    folder: str
    num_files_train: int
    num_files_eval: int
    num_samples_per_file: int
    record_length_bytes: Bytes
    record_length_bytes_stdev: Bytes
    record_length_bytes_min: Bytes
    num_subfolders_train: int
    num_subfolders_eval: int
    file_prefix: str
    compression: str  # one of the format's `compressions` (checked with the format's registry entry)
    compression_level: int
    chunking: bool
    chunk_size_bytes: Bytes
    content: Literal["random", "zeros"]
    seed: int
    parquet_columns: list[str]  # format=parquet: name:dtype:count per column; empty = one uint8 column
    parquet_row_group_size: int  # format=parquet: rows per row group; 0 = one per file

    def validate(self, key: str) -> None:
        require(self.parquet_row_group_size >= 0, f"{key}parquet_row_group_size: cannot be negative (0 = one row group per file)")
        require(self.num_files_train >= 1, f"{key}num_files_train: must be at least 1 (got {self.num_files_train})")
        require(self.num_files_eval >= 0, f"{key}num_files_eval: cannot be negative (got {self.num_files_eval})")
        require(self.num_samples_per_file >= 1, f"{key}num_samples_per_file: must be at least 1 (got {self.num_samples_per_file})")
        require(self.record_length_bytes >= 1, f"{key}record_length_bytes: must be at least 1 byte (got {self.record_length_bytes})")
        require(self.num_subfolders_train >= 0, f"{key}num_subfolders_train: cannot be negative")
        require(self.num_subfolders_eval >= 0, f"{key}num_subfolders_eval: cannot be negative")
        require(self.record_length_bytes_min >= 1, f"{key}record_length_bytes_min: must be at least 1 byte")
        if self.compression == "gzip":
            require(0 <= self.compression_level <= 9,
                    f"{key}compression_level: gzip levels are 0 (none) to 9 (best) (got {self.compression_level})")
        require_seed(self.seed, f"{key}seed")


@dataclass(frozen=True)
class GenerateConfig:
    enabled: bool
    force: bool
    write_chunk_bytes: Bytes
    pool_bytes: Bytes

    def validate(self, key: str) -> None:
        require(self.write_chunk_bytes >= 4096, f"{key}write_chunk_bytes: must be at least 4096")
        require(self.pool_bytes >= 1 << 20, f"{key}pool_bytes: must be at least 1MiB")


@dataclass(frozen=True)
class ReaderConfig:
    name: Literal["native", "tensorflow"]
    batch_size: int
    batch_size_eval: int
    read_threads: int
    prefetch_size: int
    file_shuffle: bool
    sample_shuffle: bool
    shuffle_seed: int
    shuffle_buffer_size: int
    transfer_size: Bytes
    drop_last: bool
    access: Literal["sample", "transfer"]  # sample: a read per sample (PyTorch); transfer: whole files in transfer_size reads (tf.data)
    workers: Literal["processes", "threads"] = "processes"  # access=sample: forked worker processes per epoch, as torch's DataLoader; or threads
    persistent_workers: bool = False  # workers=processes: keep the workers across epochs (DataLoader persistent_workers)
    decode: Literal["none", "numpy", "torch", "pillow"] = "none"  # per-sample decode in the worker, timed apart (engine/batch_fetch.py)
    npz_reads: Literal["np_load", "zip_pread"] = "np_load"  # npz: np.load(path)'s buffered reads and seeks, or one pread per zipfile read

    def validate(self, key: str) -> None:
        require(self.batch_size >= 1, f"{key}batch_size: must be at least 1 (got {self.batch_size})")
        require(self.batch_size_eval >= 1, f"{key}batch_size_eval: must be at least 1 (got {self.batch_size_eval})")
        require(self.read_threads >= 0, f"{key}read_threads: cannot be negative (0 reads in the training thread)")
        require(self.prefetch_size >= 0, f"{key}prefetch_size: cannot be negative")
        require(self.shuffle_buffer_size >= 1, f"{key}shuffle_buffer_size: must be at least 1")
        require_seed(self.shuffle_seed, f"{key}shuffle_seed")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int
    total_steps: int
    computation_time: float
    computation_time_stdev: float
    computation_distribution: Literal["fixed", "normal", "uniform", "lognormal"]
    seed: int
    step_counting: Literal["global", "dlio"]  # dlio: floor(samples/batch/ranks) steps per epoch; steps counted per epoch
    gradient_sync: Literal["none", "barrier", "allreduce"]  # the ranks meet after each step's compute (DDP's all-reduce)
    first_step_time: float = 0.0  # once per process start: a framework's tracing/compilation on its first step

    def validate(self, key: str) -> None:
        require(self.epochs >= 1, f"{key}epochs: must be at least 1 (got {self.epochs})")
        require(self.total_steps >= 0, f"{key}total_steps: cannot be negative (0 means every step of every epoch)")
        require(self.computation_time >= 0, f"{key}computation_time: cannot be negative (got {self.computation_time})")
        require(self.computation_time_stdev >= 0, f"{key}computation_time_stdev: cannot be negative")
        require_seconds(self.computation_time, f"{key}computation_time", MAX_WAIT_S)
        require_seconds(self.computation_time_stdev, f"{key}computation_time_stdev", MAX_WAIT_S)
        require(self.first_step_time >= 0, f"{key}first_step_time: cannot be negative (got {self.first_step_time})")
        require_seconds(self.first_step_time, f"{key}first_step_time", MAX_WAIT_S)
        require_seed(self.seed, f"{key}seed")


@dataclass(frozen=True)
class EvaluationConfig:
    enabled: bool
    computation_time: float
    epochs_between_evals: int

    def validate(self, key: str) -> None:
        require(self.computation_time >= 0, f"{key}computation_time: cannot be negative")
        require_seconds(self.computation_time, f"{key}computation_time", MAX_WAIT_S)
        require(self.epochs_between_evals >= 1, f"{key}epochs_between_evals: must be at least 1")


@dataclass(frozen=True)
class ParallelismConfig:
    tensor: int
    pipeline: int
    data: int  # 0: whatever is left of the world after tensor x pipeline
    zero_stage: int

    def validate(self, key: str) -> None:
        require(self.tensor >= 1, f"{key}tensor: must be at least 1")
        require(self.pipeline >= 1, f"{key}pipeline: must be at least 1")
        require(self.data >= 0, f"{key}data: cannot be negative (0 derives it from the world size)")
        require(self.zero_stage in (0, 1, 2, 3), f"{key}zero_stage: must be 0, 1, 2 or 3 (got {self.zero_stage})")


# Element types a tensor of an explicit model may have (model.layer_dtypes), and their sizes.
TENSOR_DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
                 "int32": 4, "int64": 8, "bool": 1}


@dataclass(frozen=True)
class StateEntry:
    """model.extra_state[i]: one non-tensor entry of the state a framework saves beside the tensors
    (torch.save's epoch and param_groups, DCP's pickled bytes items, TensorFlow's object graph),
    so that a checkpoint holds what the program's does, byte for byte. Either `value` (the entry's
    plain value: number, string, bool, null, list or mapping; the format serializes it as the
    framework does) or `bytes` (an opaque serialized blob of that many bytes, e.g. TensorFlow's
    _CHECKPOINTABLE_OBJECT_GRAPH, whose contents the emulation need not reproduce)."""

    name: str  # the entry's key as the framework records it (app.optim.param_groups.0.lr, _CHECKPOINTABLE_OBJECT_GRAPH)
    value: Any = None
    bytes: int = -1  # >= 0: an opaque blob of this many bytes (then no value); -1: the entry is `value`

    def validate(self, key: str) -> None:
        require(self.name != "", f"{key}name: give the entry's name as the framework records it")
        require(self.bytes >= -1, f"{key}bytes: a blob's size cannot be negative (got {self.bytes})")
        require(self.bytes < 0 or self.value is None, f"{key}: give either value or bytes, not both")


def _check_shapes(key: str, shapes: list[list[int]], counts: list[int], counted: str) -> None:
    """Shapes, where given, one per counted tensor, each holding exactly its element count (a
    scalar is [], one element)."""
    if not shapes:
        return
    require(len(shapes) == len(counts), f"{key}: {len(shapes)} shapes for {len(counts)} {counted}; give one per "
                                        "entry (or none: flat tensors)")
    for i, (shape, count) in enumerate(zip(shapes, counts)):
        require(all(d >= 0 for d in shape), f"{key}[{i}]: a dimension cannot be negative (got {shape})")
        require(math.prod(shape) == count, f"{key}[{i}]: shape {shape} holds {math.prod(shape)} elements, "
                                           f"but {counted}[{i}] is {count}; give the tensor's own shape")


@dataclass(frozen=True)
class ModelConfig:
    name: str
    kind: Literal["none", "transformer", "explicit"]
    model_size_bytes: Bytes
    optimization_groups: list[int]
    layer_parameters: list[int]
    layer_dtypes: list[str]  # explicit models: one element type per layer_parameters entry; empty: model_dtype_bytes
    extra_state: list[StateEntry]  # non-tensor entries saved beside the tensors (torch, DCP, TensorFlow formats)
    layer_names: list[str]  # explicit models: one name per layer_parameters entry (the state dict's key); empty: layers.<i>
    optimization_group_names: list[str]  # one name per optimization_groups entry (optimizer_states 1); empty: optimizer.group<g>.<state>
    # the tensors' shapes as the framework records them (torch's pickle, DCP's .metadata, TF's index),
    # one per layer_parameters / optimization_groups entry, each the entry's element count; empty: flat
    layer_shapes: list[list[int]]
    optimization_group_shapes: list[list[int]]
    # the order the framework appends the tensors (and extra_state entries) to its data file, by name,
    # where it is not the state dict's: TensorFlow's SaveV2 takes them in its object graph's order,
    # which its index records as each tensor's offset; empty: layers, optimizer groups, extra_state
    write_order: list[str]
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    vocab_size: int
    model_dtype_bytes: int
    optimizer_dtype_bytes: int
    optimizer_states: int
    parallelism: ParallelismConfig

    def validate(self, key: str) -> None:
        if self.kind == "transformer":
            for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size"):
                require(getattr(self, name) >= 1, f"{key}{name}: must be at least 1 for a transformer model")
        require(self.model_dtype_bytes in (1, 2, 4, 8), f"{key}model_dtype_bytes: must be 1, 2, 4 or 8")
        require(self.optimizer_dtype_bytes in (1, 2, 4, 8), f"{key}optimizer_dtype_bytes: must be 1, 2, 4 or 8")
        require(all(v >= 0 for v in self.optimization_groups), f"{key}optimization_groups: sizes cannot be negative")
        require(all(v >= 0 for v in self.layer_parameters), f"{key}layer_parameters: sizes cannot be negative")
        for dtype in self.layer_dtypes:
            require(dtype in TENSOR_DTYPES, f"{key}layer_dtypes: unknown element type {dtype!r}; choose from "
                                            f"{', '.join(TENSOR_DTYPES)}")
        require(not self.layer_dtypes or len(self.layer_dtypes) == len(self.layer_parameters),
                f"{key}layer_dtypes: {len(self.layer_dtypes)} types for {len(self.layer_parameters)} layer_parameters; "
                "give one per layer (or none: model_dtype_bytes for all)")
        names = [entry.name for entry in self.extra_state]
        require(len(set(names)) == len(names), f"{key}extra_state: an entry name is given twice; names must be unique")
        require(not self.layer_names or len(self.layer_names) == len(self.layer_parameters),
                f"{key}layer_names: {len(self.layer_names)} names for {len(self.layer_parameters)} layer_parameters; "
                "give one per layer (or none: layers.<i>)")
        require(not self.optimization_group_names or (len(self.optimization_group_names) == len(self.optimization_groups)
                                                      and self.optimizer_states == 1),
                f"{key}optimization_group_names: give one name per optimization_groups entry, with optimizer_states 1 "
                f"(got {len(self.optimization_group_names)} names, {len(self.optimization_groups)} groups, "
                f"{self.optimizer_states} states)")
        _check_shapes(f"{key}layer_shapes", self.layer_shapes, self.layer_parameters, "layer_parameters")
        _check_shapes(f"{key}optimization_group_shapes", self.optimization_group_shapes, self.optimization_groups,
                      "optimization_groups")
        require(not self.optimization_group_shapes or self.optimizer_states == 1,
                f"{key}optimization_group_shapes: shapes need optimizer_states 1 (each group one tensor); got "
                f"{self.optimizer_states}")
        every = [*self.layer_names, *self.optimization_group_names, *names]
        require(len(set(every)) == len(every), f"{key}layer_names: a name is given twice (layer, optimization group "
                                               "and extra_state names must all differ)")
        require(len(set(self.write_order)) == len(self.write_order), f"{key}write_order: a name is given twice")
        unknown = [n for n in self.write_order if n not in set(every)][:1]
        require(not unknown, f"{key}write_order: {''.join(unknown)!r} is not a name of layer_names, "
                             "optimization_group_names or extra_state; list only the model's own names")


@dataclass(frozen=True)
class IncrementalOptions:
    """checkpoint.incremental.*: the Merkle-tree incremental encoding (Tan et al., ICPP'23)."""

    chunk_bytes: Bytes  # leaf size of the tree (the last chunk of a file may be shorter); 0: chosen from checkpoint.update
    hash: Literal["xxh3_128", "blake3"]
    full_every: int  # every n-th checkpoint is a full one (starts a new chain); 0: only the first

    def validate(self, key: str) -> None:
        require(self.chunk_bytes == 0 or 64 <= self.chunk_bytes <= 1 << 30,
                f"{key}chunk_bytes: must be 64 bytes to 1GiB, or 0 to choose it from checkpoint.update (got {self.chunk_bytes})")
        require(self.full_every >= 0, f"{key}full_every: cannot be negative (got {self.full_every})")


@dataclass(frozen=True)
class LossyOptions:
    """checkpoint.lossy.*: LC-Checkpoint's delta quantisation (Chen et al., 2020)."""

    bits: int  # 2^bits - 1 buckets kept by priority promotion
    coder: Literal["huffman", "zstd"]
    full_every: int  # every n-th checkpoint stores the state in full; 0: only the first
    mantissa_bits: int  # 0: buckets are (sign, exponent) as published; m: also the top m mantissa bits
    half: Literal["float16", "bfloat16"] = "float16"  # what 2-byte float tensors hold: float16 (IEEE) or bfloat16 (the top 16 bits of a float32)

    def validate(self, key: str) -> None:
        require(1 <= self.bits <= 8, f"{key}bits: must be 1 to 8 (got {self.bits})")
        require(0 <= self.mantissa_bits <= 10, f"{key}mantissa_bits: must be 0 to 10 (got {self.mantissa_bits})")
        require(self.full_every >= 0, f"{key}full_every: cannot be negative (got {self.full_every})")


@dataclass(frozen=True)
class LevelConfig:
    """One item of checkpoint.levels: a checkpoint tier (SCR / VeloC levels; docs/levels.md).

    A list item has no place in conf/config.yaml for its defaults, so the optional keys carry
    theirs here (and docs/levels.md names them)."""

    name: str  # in summary.json and in restore messages
    path: str = ""  # the tier's folder (the run's checkpoints go in <path>/<run id>); "": storage.root/checkpoint.folder
    every: int = 1  # interval in checkpoints: checkpoint n goes to the level with the largest `every` dividing n (SCR)
    write: Literal["direct", "flush"] = "direct"  # flush: copied from the first level in the background (fast-then-PFS)
    scope: Literal["node", "shared"] = "shared"  # node: node-local, lost with its node (failures.kind=node)
    backend: str = ""  # a name of dlio_ckpt.storage.BACKENDS; "": storage.backend
    keep_last: int = -1  # newest complete checkpoints kept on this level; -1: checkpoint.keep_last; 0: all

    def validate(self, key: str) -> None:
        require(bool(self.name.strip()), f"{key}name: every level needs a name")
        require(self.every >= 1, f"{key}every: an interval in checkpoints, at least 1 (got {self.every})")
        require(self.keep_last >= -1, f"{key}keep_last: -1 (checkpoint.keep_last), 0 (all) or a count (got {self.keep_last})")


@dataclass(frozen=True)
class CheckpointConfig:
    enabled: bool
    strategy: str
    layout: str
    format: str
    # torch: the folder name torch.save's zip records (torch.save(obj, path) takes the file's name
    # without its extension); empty: the emulated file's own, as torch.save into it would record
    archive_name: str
    checksum: Literal["xxh3_128", "blake3", "none"]
    durability: Literal["framework", "commit"]  # framework: the framework's own calls only; commit: manifest, fsyncs, checksums (plan/durability.py)
    replicas: Literal["one", "all"]
    folder: str
    steps_between_checkpoints: int
    epochs_between_checkpoints: int
    checkpoint_after_epoch: int
    seconds_between_checkpoints: float
    fsync: bool
    content: Literal["random", "zeros"]
    write_chunk_bytes: Bytes
    staging_buffer_bytes: Bytes
    max_in_flight: int
    keep_last: int
    restore: bool
    restore_from: str
    num_checkpoints_write: int
    num_checkpoints_read: int
    sleep_between_s: float
    drop_caches: bool
    framework_cpu_s: float  # CPU seconds per save of the framework's walk of the program's objects (checkpoint/framework_work.py)
    framework_first_cpu_s: float  # CPU seconds more in the process's first save (the framework's first-time work)
    flat_numbers: Literal["counter", "step"]  # a flat layout's checkpoint numbers: the save counter from 1, or the global step
    update: Literal["random", "sparse", "sgd", "trace", "files"]  # how the state evolves per training step (dlio_ckpt/state)
    update_fraction: float  # sparse: fraction of update chunks that change per training step
    update_moves: float  # sparse: fraction of update chunks that move to another offset per training step
    update_chunk_bytes: Bytes  # sparse: the unit that changes or moves (an embedding row)
    learning_rate: float  # sgd: initial step scale, relative to the weights' magnitude
    update_files: str  # files: the folder of a training run's saved states (state/trajectory.py)
    state_dir: str  # where a state larger than memory lives (scratch, untraced); empty: the system temp folder
    encoding: Literal["full", "incremental", "lossy"]
    codecs: list[str]  # a codec pipeline (codec_registry.py), state codec first: [lossy, zstd]; empty: checkpoint.encoding's one
    incremental: IncrementalOptions
    lossy: LossyOptions
    policy: Literal["fixed", "young_daly", "checkfreq"]  # when to checkpoint (checkpoint/policy.py, docs/failures.md)
    overhead_bound: float  # checkfreq: the blocking overhead the interval is tuned to stay under
    profile_steps: int  # checkfreq: the probe checkpoint's step; the steps before it (from the 5th) give t_i
    levels: list[LevelConfig]  # multi-level tiers, fastest first (docs/levels.md); empty: one level, the folder above

    def validate(self, key: str) -> None:
        require(0.0 <= self.update_fraction <= 1.0, f"{key}update_fraction: must be 0 to 1 (got {self.update_fraction})")
        require(0.0 <= self.update_moves <= 1.0, f"{key}update_moves: must be 0 to 1 (got {self.update_moves})")
        require(self.update_chunk_bytes >= 8 and self.update_chunk_bytes % 8 == 0,
                f"{key}update_chunk_bytes: must be a multiple of 8 bytes (got {self.update_chunk_bytes})")
        require(self.learning_rate > 0, f"{key}learning_rate: must be positive (got {self.learning_rate})")
        require(0 < self.overhead_bound < 1, f"{key}overhead_bound: a fraction of training time, between 0 and 1 (got {self.overhead_bound})")
        require(self.profile_steps >= 2, f"{key}profile_steps: the probe needs at least one timed step before it (got {self.profile_steps})")
        for name in ("steps_between_checkpoints", "epochs_between_checkpoints", "checkpoint_after_epoch",
                     "keep_last", "num_checkpoints_write", "num_checkpoints_read"):
            require(getattr(self, name) >= 0, f"{key}{name}: cannot be negative (got {getattr(self, name)})")
        require(self.seconds_between_checkpoints >= 0, f"{key}seconds_between_checkpoints: cannot be negative")
        require(self.sleep_between_s >= 0, f"{key}sleep_between_s: cannot be negative")
        require_seconds(self.sleep_between_s, f"{key}sleep_between_s", MAX_WAIT_S)
        require(self.framework_cpu_s >= 0, f"{key}framework_cpu_s: CPU seconds per save, cannot be negative "
                f"(got {self.framework_cpu_s})")
        require_seconds(self.framework_cpu_s, f"{key}framework_cpu_s", MAX_WAIT_S)
        require(self.framework_first_cpu_s >= 0, f"{key}framework_first_cpu_s: CPU seconds, cannot be negative "
                f"(got {self.framework_first_cpu_s})")
        require_seconds(self.framework_first_cpu_s, f"{key}framework_first_cpu_s", MAX_WAIT_S)
        require_seconds(self.seconds_between_checkpoints, f"{key}seconds_between_checkpoints", MAX_INTERVAL_S)
        require(self.max_in_flight >= 1, f"{key}max_in_flight: must be at least 1")
        require(self.write_chunk_bytes >= 4096, f"{key}write_chunk_bytes: must be at least 4096")
        require(self.write_chunk_bytes % 8 == 0, f"{key}write_chunk_bytes: must be a multiple of 8 (whole elements)")
        require("/" not in self.archive_name and self.archive_name.isascii(),
                f"{key}archive_name: give the name of the program's checkpoint file without its folder or extension, "
                f"ASCII only (got {self.archive_name!r})")


@dataclass(frozen=True)
class FailuresConfig:
    """failures.*: injected failures and the restart (engine/failures.py, docs/failures.md)."""

    at_steps: list[int]  # a failure right after each of these steps (consumed in order)
    mtbf_s: float  # mean time between failures, seconds of training wall time; 0: none drawn
    seed: int
    kind: Literal["process", "node"]  # process: the ranks' memory is lost; node: also the failed node's local tier
    restart: Literal["in_process", "exit"]  # exit: clean shutdown, exit code 75, a relaunch resumes

    def validate(self, key: str) -> None:
        require(all(step >= 1 for step in self.at_steps), f"{key}at_steps: steps count from 1 (got {self.at_steps})")
        require(self.mtbf_s >= 0, f"{key}mtbf_s: must be a finite positive number of seconds, or 0 for no drawn "
                f"failures (got {self.mtbf_s})")
        require_seconds(self.mtbf_s, f"{key}mtbf_s", MAX_INTERVAL_S)
        require_seed(self.seed, f"{key}seed")


@dataclass(frozen=True)
class MetricConfig:
    au: float

    def validate(self, key: str) -> None:
        require(0 <= self.au <= 1, f"{key}au: an accelerator-utilisation target lies in [0, 1] (got {self.au})")


@dataclass(frozen=True)
class TraceConfig:
    events: bool
    darshan: bool
    chrome: bool


@dataclass(frozen=True)
class ReplayConfig:
    log: str
    gaps: bool


@dataclass(frozen=True)
class ScaleConfig:
    """Caps that shrink a workload while keeping its access pattern; 0 means no cap."""

    name: str
    max_files: int
    max_eval_files: int
    max_samples_per_file: int
    max_sample_bytes: Bytes
    max_epochs: int
    max_steps: int
    max_model_bytes: Bytes
    max_computation_time: float
    max_checkpoints: int
    max_batch_size: int
    max_checkpoint_sleep_s: float
    max_pool_bytes: Bytes  # generate.pool_bytes: the random pool is filled at start-up, ~0.3 s per 64 MiB here
    min_steps_per_epoch: int = 0  # max_files grows (up to the workload's own count) so each rank gets this many steps


@dataclass(frozen=True)
class WorldConfig:
    size: int  # plan mode: the job size to plan for; 0 = the real world
    ranks_per_node: int  # node boundaries for node-local checkpoint levels: blocks of this many ranks; 0 = by host name

    def validate(self, key: str) -> None:
        require(self.size >= 0, f"{key}size: cannot be negative")
        require(self.ranks_per_node >= 0, f"{key}ranks_per_node: cannot be negative (0: ranks on one host share a node)")
        require(self.size <= MAX_PLAN_RANKS, f"{key}size: at most {MAX_PLAN_RANKS:,} ranks can be planned (got {self.size:,})")


@dataclass(frozen=True)
class DatasizeConfig:
    """mode=datasize: the MLPerf Storage sizing rule (dataset >= memory_multiple x the clients' memory)."""

    client_memory_bytes: Bytes  # one client host's memory; 0 = this host's total memory
    clients: int
    memory_multiple: float
    ranks: int  # reader ranks over all clients for the steps rule; 0 = one per client
    min_steps_per_epoch: int
    json: bool

    def validate(self, key: str) -> None:
        require(self.client_memory_bytes >= 0, f"{key}client_memory_bytes: cannot be negative (0 = this host's memory)")
        require(self.clients >= 1, f"{key}clients: must be at least 1 (got {self.clients})")
        require(self.memory_multiple > 0, f"{key}memory_multiple: must be positive (got {self.memory_multiple})")
        require(self.ranks >= 0, f"{key}ranks: cannot be negative (0 = one per client)")
        require(self.min_steps_per_epoch >= 0, f"{key}min_steps_per_epoch: cannot be negative")


MAX_REPEATS = 1000  # run.repeats: beyond this a typo (an extra digit) is likelier than a wish


@dataclass(frozen=True)
class RunOptions:
    """run.*: how often the job runs (engine/repeats.py). Storage figures vary from run to run,
    so IOR (-i), fio (--loops) and MLPerf Storage (5 runs) repeat a job and report the spread."""

    repeats: int

    def validate(self, key: str) -> None:
        require(1 <= self.repeats <= MAX_REPEATS, f"{key}repeats: runs the job N times, from 1 to {MAX_REPEATS} (got {self.repeats})")


@dataclass(frozen=True)
class RunConfig:
    workload: str
    accelerator: str  # "" = the workload's own figures; else a name of its `accelerators` table
    description: str
    source: str
    mode: Literal["train", "plan", "generate", "checkpoint", "restore", "datasize"]
    seed: int
    progress: bool
    world: WorldConfig
    storage: StorageConfig
    dataset: DatasetConfig
    generate: GenerateConfig
    reader: ReaderConfig
    train: TrainConfig
    evaluation: EvaluationConfig
    model: ModelConfig
    checkpoint: CheckpointConfig
    failures: FailuresConfig
    metric: MetricConfig
    trace: TraceConfig
    replay: ReplayConfig
    scale: ScaleConfig
    datasize: DatasizeConfig
    run: RunOptions = RunOptions(repeats=1)
    run_dir: Optional[str] = None

    def validate(self, key: str) -> None:
        require_seed(self.seed, f"{key}seed")
        require(self.checkpoint.policy != "young_daly" or self.failures.mtbf_s > 0,
                f"{key}checkpoint.policy=young_daly: derives the interval from the mean time between failures; "
                f"set failures.mtbf_s (seconds)")
        if self.run.repeats > 1:
            require(self.mode != "plan", f"{key}run.repeats: mode=plan does no I/O, so there is nothing to repeat (leave run.repeats=1)")
            require(self.mode != "generate" or self.generate.force,
                    f"{key}run.repeats: with mode=generate every repeat after the first reuses the dataset; "
                    "add generate.force=true to generate it again each time")
            require(self.failures.restart != "exit",
                    f"{key}run.repeats: failures.restart=exit ends the process at the first failure; "
                    "repeat such runs by relaunching, or use failures.restart=in_process")
            require(not self.checkpoint.levels,
                    f"{key}run.repeats: not available with checkpoint.levels yet; repeat the job with a shell loop")


def require_seconds(value: float, key: str, limit: float) -> None:
    require(value <= limit, f"{key}: at most {limit:g} seconds (got {value:g})")


def require_seed(value: int, key: str) -> None:
    require(0 <= value <= MAX_SEED, f"{key}: a seed is an integer from 0 to 2**63-1 (got {value})")
