"""ModelPlan: which tensors a model's checkpoint holds and which rank owns each byte (pure).

A checkpoint's cost is decided by bytes and by who writes them, not by what a model computes, so a
model is reduced to named tensors (element count and element size) and an ownership rule:

- Tensor parallelism (TP) splits every layer matrix along its first dimension; layer norms are
  replicated on every TP rank (as Megatron and DeepSpeed store them).
- Pipeline parallelism (PP) gives each stage a contiguous run of layers; stage 0 also holds the
  embedding, the last stage the output head and the final norm, so per-rank bytes are uneven.
- Data parallelism (DP) with ZeRO decides how the replicas share the writing:
  ZeRO-0 (plain DDP): DP rank 0 of each model-parallel group writes model and optimizer state;
  ZeRO-1/2: DP rank 0 writes the model, every DP rank its 1/DP partition of the optimizer state;
  ZeRO-3: every DP rank writes its 1/DP partition of both.
  `checkpoint.replicas=all` has every DP replica write its own copy of the state that is
  replicated rather than partitioned (the model below ZeRO-3, the optimizer at ZeRO-0), as DLIO's
  `checkpoint.type: all_ranks` does; the default `one` leaves that to DP rank 0.

Ranks are laid out as Megatron does: rank = pp * (DP * TP) + dp * TP + tp.

Transformer parameter counts follow DLIO (docs/checkpoint-techniques.md):
params = 2*V*H + L*(2*H + H*(H + 2*d_kv) + H*H + 3*H*F) + H, with d_kv = H * kv_heads / heads.
Optimizer state is `optimizer_states` flat fp32 tensors (master weights, Adam m and v) the size of
each model-parallel rank's parameters, as DeepSpeed flattens them.

A scale cap (scale.max_model_bytes) shrinks every tensor by one uniform factor, so a tiny run keeps
the shape of the ownership (who writes how much relative to whom) and the unscaled figures are
reported beside the scaled ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable

import numpy as np

from dlio_ckpt.schema import TENSOR_DTYPES, ModelConfig
from dlio_ckpt.errors import ConfigError

OPTIMIZER_STATE_NAMES = ("fp32_master", "exp_avg", "exp_avg_sq")


def split(count: int, parts: int, index: int) -> int:
    """Elements of part `index` when `count` is cut into `parts` parts differing by at most one."""
    base, extra = divmod(count, parts)
    return base + (1 if index < extra else 0)


def split_start(count: int, parts: int, index: int) -> int:
    base, extra = divmod(count, parts)
    return index * base + min(index, extra)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor (or one rank's partition of one) as it is saved."""

    name: str
    numel: int
    dtype_bytes: int
    kind: str  # "model" | "optimizer" | "object" (a non-tensor entry of model.extra_state: no elements)
    dtype_name: str = ""  # the element type a framework records (model.layer_dtypes); "": by dtype_bytes
    value: str = ""  # kind "object": the entry's value as JSON text (hashable, as a plan's values are)
    blob: int = -1  # kind "object": >= 0, an opaque blob of this many bytes instead of a value
    # the tensor's shape as the framework records it (model.layer_shapes); None: flat, (numel,).
    # A tensor cut into parts (tensor parallelism, ZeRO) is flat: its part has no shape of its own
    shape: tuple[int, ...] | None = None

    @property
    def is_object(self) -> bool:
        return self.kind == "object"

    def object_value(self):
        """A non-tensor entry's value as the program holds it: the plain value, or a blob of
        `blob` bytes."""
        return bytes(self.blob) if self.blob >= 0 else json.loads(self.value)

    @property
    def dims(self) -> tuple[int, ...]:
        """The shape a format records: the given one, else flat."""
        return (self.numel,) if self.shape is None else self.shape

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype_bytes

    @property
    def framework_dtype(self) -> str:
        """The element type as the framework names it (torch.bfloat16, tf.int64, ...)."""
        return self.dtype_name or {1: "uint8", 2: "float16", 4: "float32", 8: "float64"}[self.dtype_bytes]

    @property
    def dtype(self) -> str:
        """A numpy dtype name, for formats that record one (bfloat16, which numpy lacks, as its
        16-bit patterns: uint16)."""
        return "uint16" if self.framework_dtype == "bfloat16" else self.framework_dtype


@dataclass(frozen=True)
class RankCoords:
    rank: int
    tp: int
    pp: int
    dp: int


@dataclass(frozen=True)
class ModelPlan:
    """The model state of one job: per model-parallel shard tensors, and the DP/ZeRO rule."""

    name: str
    kind: str
    tp: int
    pp: int
    dp: int
    zero_stage: int
    world_size: int  # ranks actually running (<= tp*pp*dp: MLPerf "subset" mode when smaller)
    parameters: int  # unscaled parameter count of the whole model (0 when not known)
    scale_factor: float  # 1.0 unless scale.max_model_bytes shrank the tensors
    unscaled_model_bytes: int
    unscaled_optimizer_bytes: int
    # mp_shards[pp * tp_size + tp]: (model tensors, optimizer tensors) before DP/ZeRO partitioning
    mp_shards: tuple[tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]], ...]
    replicas: str = "one"  # checkpoint.replicas: "all" = every DP replica writes its copy of replicated state
    # model.extra_state: non-tensor entries (kind "object"), held by the ranks of model-parallel
    # shard 0 that write its replicated state (a process's epoch counter and param groups), saved
    # after its tensors as a state dict lists them
    objects: tuple[TensorSpec, ...] = ()
    # model.write_order: the names in the order the framework appends them to its data file
    # (TensorFlow's SaveV2); empty: the order above (model tensors, optimizer tensors, objects)
    write_order: tuple[str, ...] = ()

    # ranks ------------------------------------------------------------------------------------
    @property
    def logical_ranks(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def subset(self) -> bool:
        return self.world_size < self.logical_ranks

    def coords(self, rank: int) -> RankCoords:
        pp, rest = divmod(rank, self.dp * self.tp)
        dp, tp = divmod(rest, self.tp)
        return RankCoords(rank=rank, tp=tp, pp=pp, dp=dp)

    def mp_rank(self, rank: int) -> int:
        c = self.coords(rank)
        return c.pp * self.tp + c.tp

    # ownership --------------------------------------------------------------------------------
    @cached_property
    def _dp_splits(self) -> tuple[tuple[_DpSplit, _DpSplit], ...]:
        """Per model-parallel shard, the 1/DP split of its model and of its optimizer tensors, as
        columns: a rank's share is then one numpy expression, not a Python loop per tensor
        (plan mode and the free-space check size 16,384 ranks)."""
        return tuple((_DpSplit.of(model, self.dp), _DpSplit.of(optimizer, self.dp)) for model, optimizer in self.mp_shards)

    def writes_replica(self, dp: int) -> bool:
        """Whether DP rank `dp` writes the replicated (unpartitioned) state: the first replica
        always, every replica under checkpoint.replicas=all."""
        return dp == 0 or self.replicas == "all"

    def rank_tensors(self, rank: int) -> tuple[TensorSpec, ...]:
        """What logical rank `rank` writes, after the DP/ZeRO rule."""
        c = self.coords(rank)
        shard = c.pp * self.tp + c.tp
        model, optimizer = self.mp_shards[shard]
        model_split, optimizer_split = self._dp_splits[shard]
        out: list[TensorSpec] = []
        if self.zero_stage >= 3:
            out.extend(model_split.partition(model, c.dp))
        elif self.writes_replica(c.dp):
            out.extend(model)
        if self.zero_stage >= 1:
            out.extend(optimizer_split.partition(optimizer, c.dp))
        elif self.writes_replica(c.dp):
            out.extend(optimizer)
        return tuple(t for t in out if t.numel > 0) + self.rank_objects(rank)

    def rank_objects(self, rank: int) -> tuple[TensorSpec, ...]:
        """The non-tensor entries rank `rank` holds: those of model-parallel shard 0, on the ranks
        that write its replicated state."""
        return self.objects if self.mp_rank(rank) == 0 and self.writes_replica(self.coords(rank).dp) else ()

    def rank_bytes(self, rank: int) -> tuple[int, int]:
        """(model bytes, optimizer bytes) that rank `rank` writes (the bytes of rank_tensors, without
        building them)."""
        c = self.coords(rank)
        model_split, optimizer_split = self._dp_splits[c.pp * self.tp + c.tp]
        whole = self.writes_replica(c.dp)
        model = model_split.part_bytes(c.dp) if self.zero_stage >= 3 else (model_split.whole_bytes if whole else 0)
        optimizer = (optimizer_split.part_bytes(c.dp) if self.zero_stage >= 1
                     else (optimizer_split.whole_bytes if whole else 0))
        return model, optimizer

    def per_rank_bytes(self) -> list[int]:
        """Bytes per running rank (the first world_size logical ranks)."""
        return [sum(self.rank_bytes(r)) for r in range(self.world_size)]

    # totals (all logical ranks) ---------------------------------------------------------------
    def _totals(self) -> tuple[int, int]:
        """One copy of the state, summed over the logical job; ZeRO partitioning changes who writes,
        not how much (checkpoint.replicas=all writes more: CheckpointPlan sums what each rank writes)."""
        model = sum(t.nbytes for shard in self.mp_shards for t in shard[0])
        optimizer = sum(t.nbytes for shard in self.mp_shards for t in shard[1])
        return model, optimizer

    @property
    def model_bytes(self) -> int:
        return self._totals()[0]

    @property
    def optimizer_bytes(self) -> int:
        return self._totals()[1]

    @property
    def total_bytes(self) -> int:
        return sum(self._totals())

    @property
    def unscaled_total_bytes(self) -> int:
        return self.unscaled_model_bytes + self.unscaled_optimizer_bytes

    def describe(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "parameters": self.parameters,
            "tensor_parallel": self.tp,
            "pipeline_parallel": self.pp,
            "data_parallel": self.dp,
            "zero_stage": self.zero_stage,
            "replicas": self.replicas,
            "logical_ranks": self.logical_ranks,
            "world_size": self.world_size,
            "subset": self.subset,
            "model_bytes": self.model_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "total_bytes": self.total_bytes,
            "scale_factor": self.scale_factor,
            "unscaled_model_bytes": self.unscaled_model_bytes,
            "unscaled_optimizer_bytes": self.unscaled_optimizer_bytes,
            "unscaled_total_bytes": self.unscaled_total_bytes,
        }


@dataclass(frozen=True, eq=False)
class _DpSplit:
    """Tensors cut into `parts` near-equal parts (as `split`), as numpy columns: part d of tensor i
    holds base[i] + (d < extra[i]) elements."""

    parts: int
    base: np.ndarray
    extra: np.ndarray
    dtype_bytes: np.ndarray
    whole_bytes: int
    base_bytes: int

    @classmethod
    def of(cls, tensors: Iterable[TensorSpec], parts: int) -> "_DpSplit":
        tensors = tuple(tensors)
        numel = np.array([t.numel for t in tensors], dtype=np.int64)
        dtype_bytes = np.array([t.dtype_bytes for t in tensors], dtype=np.int64)
        base, extra = np.divmod(numel, parts)
        return cls(parts, base, extra, dtype_bytes, sum(t.nbytes for t in tensors),
                   sum(b * d for b, d in zip(base.tolist(), dtype_bytes.tolist())))

    def part_bytes(self, index: int) -> int:
        return self.base_bytes + int(self.dtype_bytes[self.extra > index].sum())

    def partition(self, tensors: tuple[TensorSpec, ...], index: int) -> list[TensorSpec]:
        if self.parts == 1:
            return list(tensors)
        sizes = (self.base + (index < self.extra)).tolist()
        return [TensorSpec(f"{t.name}.part{index}", n, t.dtype_bytes, t.kind, t.dtype_name) for t, n in zip(tensors, sizes)]


def transformer_parameters(cfg: ModelConfig) -> int:
    """DLIO's parameter count (docs/checkpoint-techniques.md)."""
    V, H, F, L = cfg.vocab_size, cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_layers
    d_kv = H * cfg.num_kv_heads // cfg.num_attention_heads
    return 2 * V * H + L * (2 * H + H * (H + 2 * d_kv) + H * H + 3 * H * F) + H


def resolve_parallelism(cfg: ModelConfig, world_size: int) -> tuple[int, int, int]:
    """(TP, PP, DP) for `world_size` running ranks, or a ConfigError naming the key."""
    par = cfg.parallelism
    tp, pp = par.tensor, par.pipeline
    mp = tp * pp
    if par.data:
        dp = par.data
        if world_size > mp * dp:
            raise ConfigError(
                f"model.parallelism.data: tensor x pipeline x data = {tp}x{pp}x{dp} = {mp * dp} ranks, "
                f"fewer than the {world_size} running; raise model.parallelism.data or set it to 0"
            )
        return tp, pp, dp
    if world_size % mp:
        raise ConfigError(
            f"model.parallelism: tensor x pipeline = {tp}x{pp} = {mp} does not divide the world size "
            f"{world_size}; run a multiple of {mp} ranks or set model.parallelism.data for a subset run"
        )
    return tp, pp, world_size // mp


def _transformer_shards(cfg: ModelConfig, tp: int, pp: int, factor: float):
    V, H, F, L = cfg.vocab_size, cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_layers
    d_kv = H * cfg.num_kv_heads // cfg.num_attention_heads
    mdt, odt = cfg.model_dtype_bytes, cfg.optimizer_dtype_bytes
    states = _state_names(cfg.optimizer_states)

    def n(count: int) -> int:
        return count if factor == 1.0 else max(1, int(count * factor))

    shards = []
    for stage in range(pp):
        first = split_start(L, pp, stage)
        layers = range(first, first + split(L, pp, stage))
        for t in range(tp):
            model: list[TensorSpec] = []
            if stage == 0:
                model.append(TensorSpec("embed_tokens.weight", n(split(V, tp, t) * H), mdt, "model"))
            for i in layers:
                p = f"layers.{i}."
                model += [
                    TensorSpec(p + "input_layernorm.weight", n(H), mdt, "model"),
                    TensorSpec(p + "self_attn.qkv_proj.weight", n(split(H + 2 * d_kv, tp, t) * H), mdt, "model"),
                    TensorSpec(p + "self_attn.o_proj.weight", n(H * split(H, tp, t)), mdt, "model"),
                    TensorSpec(p + "post_attention_layernorm.weight", n(H), mdt, "model"),
                    TensorSpec(p + "mlp.gate_up_proj.weight", n(2 * split(F, tp, t) * H), mdt, "model"),
                    TensorSpec(p + "mlp.down_proj.weight", n(H * split(F, tp, t)), mdt, "model"),
                ]
            if stage == pp - 1:
                model.append(TensorSpec("norm.weight", n(H), mdt, "model"))
                model.append(TensorSpec("lm_head.weight", n(split(V, tp, t) * H), mdt, "model"))
            params = sum(x.numel for x in model)
            optimizer = tuple(TensorSpec(f"optimizer.{s}", params, odt, "optimizer") for s in states)
            shards.append((tuple(model), optimizer))
    return tuple(shards)


def _state_names(count: int) -> tuple[str, ...]:
    if count == len(OPTIMIZER_STATE_NAMES):
        return OPTIMIZER_STATE_NAMES
    return tuple(f"state{k}" for k in range(count))


def _explicit_shards(cfg: ModelConfig, tp: int, pp: int):
    """DLIO's explicit model: a `model` blob of model_size_bytes, layer tensors, optimizer groups.

    Layer i's element type is `layer_dtypes[i]` where given (its size then replaces
    model_dtype_bytes for that layer), so a state dict of mixed types (bf16 weights, int64 step
    counters) is saved with the types the framework records.

    The blob and the optimizer groups are split over all model-parallel ranks; layers go to
    pipeline stages in contiguous runs and are split over tensor ranks.
    """
    mdt, odt = cfg.model_dtype_bytes, cfg.optimizer_dtype_bytes
    states = _state_names(cfg.optimizer_states)
    mp = tp * pp
    L = len(cfg.layer_parameters)
    shards = []
    for stage in range(pp):
        first = split_start(L, pp, stage)
        layers = range(first, first + split(L, pp, stage))
        for t in range(tp):
            index = stage * tp + t
            model: list[TensorSpec] = []
            if cfg.model_size_bytes:
                model.append(TensorSpec("model", split(cfg.model_size_bytes, mp, index), 1, "model"))
            for i in layers:
                dtype = cfg.layer_dtypes[i] if cfg.layer_dtypes else ""
                size = TENSOR_DTYPES[dtype] if dtype else mdt
                name = cfg.layer_names[i] if cfg.layer_names else f"layers.{i}"
                numel = split(cfg.layer_parameters[i], tp, t)
                model.append(TensorSpec(name, numel, size, "model", dtype,
                                        shape=_shape(cfg.layer_shapes, i, numel, cfg.layer_parameters[i])))
            optimizer = [
                TensorSpec(cfg.optimization_group_names[g] if cfg.optimization_group_names else f"optimizer.group{g}.{s}",
                           split(size, mp, index), odt, "optimizer",
                           shape=_shape(cfg.optimization_group_shapes, g, split(size, mp, index), size))
                for g, size in enumerate(cfg.optimization_groups)
                for s in states
            ]
            shards.append((tuple(m for m in model if m.numel), tuple(o for o in optimizer if o.numel)))
    return tuple(shards)


def _shape(shapes: list[list[int]], i: int, numel: int, whole: int) -> tuple[int, ...] | None:
    """Entry i's given shape (model.layer_shapes, optimization_group_shapes) where this rank holds
    the whole tensor; None (flat) where none is given or the tensor is cut into parts."""
    return tuple(shapes[i]) if shapes and numel == whole else None


def object_specs(cfg: ModelConfig) -> tuple[TensorSpec, ...]:
    """model.extra_state as TensorSpecs of kind "object" (no elements, no payload bytes)."""
    return tuple(TensorSpec(e.name, 0, 1, "object", value="" if e.bytes >= 0 else json.dumps(e.value), blob=e.bytes)
                 for e in cfg.extra_state)


def build_model_plan(cfg: ModelConfig, world_size: int, max_total_bytes: int = 0, replicas: str = "one") -> ModelPlan:
    """The ModelPlan for `world_size` running ranks; `max_total_bytes` is scale.max_model_bytes,
    `replicas` checkpoint.replicas."""
    world_size = max(1, world_size)
    tp, pp, dp = resolve_parallelism(cfg, world_size)
    if cfg.kind == "transformer":
        params = transformer_parameters(cfg)
        shards = _transformer_shards(cfg, tp, pp, 1.0)
    else:
        params = 0
        shards = _explicit_shards(cfg, tp, pp) if cfg.kind == "explicit" else tuple(((), ()) for _ in range(tp * pp))
    unscaled_model = sum(t.nbytes for s in shards for t in s[0])
    unscaled_opt = sum(t.nbytes for s in shards for t in s[1])
    factor = 1.0
    total = unscaled_model + unscaled_opt
    if cfg.kind == "transformer" and max_total_bytes and total > max_total_bytes:
        factor = max_total_bytes / total
        shards = _transformer_shards(cfg, tp, pp, factor)
    return ModelPlan(
        name=cfg.name, kind=cfg.kind, tp=tp, pp=pp, dp=dp, zero_stage=cfg.parallelism.zero_stage,
        world_size=world_size, parameters=params, scale_factor=factor,
        unscaled_model_bytes=unscaled_model, unscaled_optimizer_bytes=unscaled_opt, mp_shards=shards,
        replicas=replicas, objects=object_specs(cfg), write_order=tuple(cfg.write_order),
    )
