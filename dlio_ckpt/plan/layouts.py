"""On-disk layouts named after real frameworks (`checkpoint.layout=`): file names only, pure.

A file system sees a framework's checkpoint as a folder of named files of given sizes written by
given ranks; reproducing the names and the grouping (one file per rank, per layer, per DP
partition) reproduces the metadata load (creates, directory entries) the storage really gets. The
bytes inside each file follow `checkpoint.format`, whatever the names' extensions say.

Under the commit protocol every layout but `flat` puts one checkpoint in one folder (TensorFlow's
flat `ckpt-N.*` files go in a `ckpt-N/` folder), so a checkpoint can be committed by one manifest
and deleted as one unit. Under checkpoint.durability=framework a layout whose framework keeps its
checkpoints side by side (`flat_framework`: TensorFlow's CheckpointManager) writes them so, straight
in the run's checkpoint folder, numbered as the framework numbers them. `flat` is a program that
saves straight into one folder (torch.save(state, "checkpoint_3.pt")): no folder per checkpoint
under any durability, so it runs under `framework` only and deletes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from dlio_ckpt.plan.model import ModelPlan, TensorSpec
from dlio_ckpt.registry import Registry

Grouping = list[tuple[str, tuple[TensorSpec, ...]]]


def _layer_of(name: str) -> int | None:
    match = re.match(r"layers\.(\d+)", name)
    return int(match.group(1)) if match else None


def _group(pairs: Sequence[tuple[str, TensorSpec]]) -> Grouping:
    """Group (file name, tensor) pairs into files, keeping first-seen file order."""
    files: dict[str, list[TensorSpec]] = {}
    for name, tensor in pairs:
        files.setdefault(name, []).append(tensor)
    return [(name, tuple(ts)) for name, ts in files.items()]


@dataclass(frozen=True)
class Layout:
    name: str = "base"
    folder_pattern: str = r"^step_(\d+)$"
    # checkpoint.durability=framework: how the framework writes its coordinator files and tag:
    # "plain" (open, write, close: DeepSpeed's `latest`, Megatron's tracker), "renamed" (a temporary
    # name renamed into place: TensorFlow's `checkpoint`), "renamed_fsync" (temporary name, fsync,
    # rename: DCP's `.metadata`); and whether its writer fsyncs each data file (None: the format decides)
    metadata_write: str = "plain"
    data_fsync: bool | None = None
    tag_writes: int = 1  # how many times the framework writes its tag per checkpoint
    # whether a checkpoint is a folder of its own (made by its first file's write); False: its files
    # go into the run's checkpoint folder itself, whatever the durability (`flat`)
    folder_per_checkpoint: bool = True
    # under checkpoint.durability=framework, whether the framework keeps every checkpoint's files
    # straight in its directory (TensorFlow's CheckpointManager: ckpt-N.index beside ckpt-M.index and
    # the `checkpoint` state, which names each by its prefix relative to the directory); the folder
    # per checkpoint is then the commit protocol's alone (one manifest, deleted as one unit)
    flat_framework: bool = False

    def flat(self, commit: bool) -> bool:
        """Whether checkpoints' files lie straight in the run's checkpoint folder, numbered by the
        save (from 1), under the commit protocol (`commit`) or the framework's own calls: the one
        rule the engine, plan mode and the plan's names follow."""
        return not self.folder_per_checkpoint or (self.flat_framework and not commit)

    def checkpoint_files(self, step: int, names: list[str]) -> list[str]:
        """Of `names` (a flat directory's entries), those that belong to checkpoint `step`, in the
        order the framework deletes them (a flat layout's; others keep a folder per checkpoint)."""
        return []

    def folder(self, step: int) -> str:
        return f"step_{step:08d}"

    def parse_step(self, folder: str) -> int | None:
        match = re.match(self.folder_pattern, folder)
        return int(match.group(1)) if match else None

    def rank_files(self, model: ModelPlan, rank: int, tensors: tuple[TensorSpec, ...], ext: str) -> Grouping:
        raise NotImplementedError

    def rank_tensors(self, model: ModelPlan, rank: int) -> tuple[TensorSpec, ...]:
        """What rank `rank` saves: the model's DP/ZeRO rule, unless the framework decides itself (DCP)."""
        return model.rank_tensors(rank)

    def rank_bytes(self, model: ModelPlan, rank: int) -> tuple[int, int]:
        """(model bytes, optimizer bytes) of `rank_tensors`."""
        return model.rank_bytes(rank)

    def coordinator_files(self, step: int, world: int) -> list[str]:
        """Small metadata files rank 0 writes after the data and before the manifest."""
        return []

    def tag(self, step: int) -> tuple[str, str] | None:
        """A framework's "latest" pointer (file name at the checkpoint root, contents)."""
        return None

    def tag_texts(self, step: int, saves: Sequence[tuple[int, float]], keep_last: int, preserved: float,
                  flat: bool = False) -> list[str]:
        """The contents of each of the framework's `tag_writes` writes of its tag at checkpoint
        `step`: the same pointer each time, unless the layout's tag lists more than the newest
        checkpoint. `saves`: this run's checkpoints so far, (step, time.time() when written), the
        newest last; `keep_last`: how many the framework keeps (0: all); `preserved`: when the
        framework's checkpoint keeper started; `flat`: the checkpoints' files lie straight in the
        directory (`flat_framework` under durability=framework)."""
        tag = self.tag(step)
        return [tag[1]] * self.tag_writes if tag else []


@dataclass(frozen=True)
class RawLayout(Layout):
    """One file per rank: the plainest thing a storage benchmark can write."""

    name: str = "raw"

    def rank_files(self, model, rank, tensors, ext):
        return [(f"rank_{rank:05d}.{ext}", tensors)] if tensors else []


@dataclass(frozen=True)
class FlatLayout(Layout):
    """A program saving each checkpoint straight into one folder, as a plain PyTorch loop does
    (`torch.save(state, f"checkpoint_{epoch}.pt")`, the ImageNet example's `checkpoint.pth.tar`):
    no folder per checkpoint, which such a program never makes. A rank's file is
    `checkpoint_<n>.<ext>` (`_rank<r>` added when several ranks write), n the save's number from 1
    (the engine numbers a flat folder's checkpoints so: a loop saving each epoch names its epoch).
    With no folder there is no manifest, so the engine accepts it only with
    checkpoint.durability=framework and keeps every file (keep_last=0): a checkpoint is its files."""

    name: str = "flat"
    folder_per_checkpoint: bool = False

    def folder(self, step: int) -> str:
        return ""

    def parse_step(self, folder: str) -> int | None:
        return None  # no folder is a checkpoint

    def rank_files(self, model, rank, tensors, ext):
        own = f"_rank{rank:05d}" if model.world_size > 1 else ""
        return [(f"checkpoint_{{step}}{own}.{ext}", tensors)] if tensors else []


@dataclass(frozen=True)
class DeepSpeedLayout(Layout):
    """DeepSpeed: global_stepN/ with mp_rank model states, zero_pp_rank optimizer partitions,
    per-layer files under pipeline parallelism, and a `latest` tag."""

    name: str = "deepspeed"
    folder_pattern: str = r"^global_step(\d+)$"

    def folder(self, step: int) -> str:
        return f"global_step{step}"

    def rank_files(self, model, rank, tensors, ext):
        c = model.coords(rank)
        mp = model.mp_rank(rank)
        zero_model = f"zero_pp_rank_{c.dp}_mp_rank_{mp:02d}_model_states.pt"
        zero_optim = f"zero_pp_rank_{c.dp}_mp_rank_{mp:02d}_optim_states.pt"
        replica = _replica_tag(model, c.dp)
        mp_states = f"mp_rank_{mp:02d}{replica}_model_states.pt"
        pairs = []
        for t in tensors:
            if t.kind == "optimizer":
                pairs.append((zero_optim if model.zero_stage >= 1 else mp_states, t))
            elif model.zero_stage >= 3:
                pairs.append((zero_model, t))
            elif model.pp > 1:
                layer = _layer_of(t.name)
                if layer is not None:
                    pairs.append((f"layer_{layer + 1:02d}-model_{c.tp:02d}{replica}-model_states.pt", t))
                elif t.name.startswith("embed"):
                    pairs.append((f"layer_00-model_{c.tp:02d}{replica}-model_states.pt", t))
                elif t.name in ("norm.weight", "lm_head.weight"):
                    pairs.append((f"layer_{_last_layer(model) + 2:02d}-model_{c.tp:02d}{replica}-model_states.pt", t))
                else:
                    pairs.append((mp_states, t))
            else:
                pairs.append((mp_states, t))
        return _group(pairs)

    def tag(self, step):
        return "latest", f"global_step{step}"


def _replica_tag(model: ModelPlan, dp: int) -> str:
    """`_dpDDD` in the names of a replicated file under checkpoint.replicas=all, where every DP
    replica writes its own copy of a file the framework names once per model-parallel rank."""
    return f"_dp{dp:03d}" if model.replicas == "all" else ""


def _last_layer(model: ModelPlan) -> int:
    last = -1
    for shard in model.mp_shards[-model.tp:]:
        for t in shard[0]:
            layer = _layer_of(t.name)
            if layer is not None:
                last = max(last, layer)
    return last


@dataclass(frozen=True)
class PytorchDcpLayout(Layout):
    """PyTorch distributed checkpoint: __{rank}_0.distcp per rank, `.metadata` by the coordinator.

    Who saves what is DCP's DefaultSavePlanner's decision, not a ZeRO setting: every rank plans
    the tensors it holds, and the coordinator's dedup (torch/distributed/checkpoint/
    _dedup_save_plans.py) gives each tensor that several ranks hold (the data-parallel replicas of
    the state DDP replicates) to the one whose plan is smallest so far, in the order the plans list
    them: whole tensors, spread over the replicas (`dcp_assignment`). Partitioned state (ZeRO /
    FSDP shards) is unique to its rank and stays there. `checkpoint.replicas=all` keeps every
    replica's copy, as asked.
    """

    name: str = "pytorch_dcp"
    folder_pattern: str = r"^step_(\d+)$"
    metadata_write: str = "renamed_fsync"  # FileSystemWriter.finish: `.metadata.tmp`, fsync, rename
    data_fsync: bool | None = True  # FileSystemWriter(sync_files=True), the default: every .distcp fsynced
    # one-entry memo (as TensorflowLayout's): the dedup of the model planned last, for every rank's files
    _dedup: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def rank_files(self, model, rank, tensors, ext):
        return [(f"__{rank}_0.distcp", tensors)] if tensors else []

    def held_tensors(self, model: ModelPlan, rank: int) -> tuple[TensorSpec, ...]:
        """What rank `rank` puts in its local save plan before the dedup (every replica's copy)."""
        return _held_by(model, rank)

    def rank_tensors(self, model, rank):
        if model.replicas == "all" or model.dp == 1:
            return model.rank_tensors(rank)
        kept = self._assignment(model)
        return tuple(t for t in _held_by(model, rank) if kept.get((model.mp_rank(rank), t.name), rank) == rank)

    def rank_bytes(self, model, rank):
        if model.replicas == "all" or model.dp == 1:
            return model.rank_bytes(rank)
        tensors = self.rank_tensors(model, rank)
        return (sum(t.nbytes for t in tensors if t.kind == "model"), sum(t.nbytes for t in tensors if t.kind != "model"))

    def _assignment(self, model: ModelPlan) -> dict:
        if self._dedup.get("model") is not model:
            self._dedup.clear()
            self._dedup.update(model=model, kept=dcp_assignment(model))
        return self._dedup["kept"]

    def coordinator_files(self, step, world):
        return [".metadata"]


@dataclass(frozen=True)
class MegatronLayout(Layout):
    """Megatron (legacy): iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt and a tracker file.

    Megatron's distributed optimizer gathers each model-parallel rank's optimizer partitions to
    DP rank 0; here every DP rank writes its own partition (distrib_optim_dpDDD.pt) so the
    sharded strategy can spread the writes, and single_writer shows the gathered case.
    """

    name: str = "megatron"
    folder_pattern: str = r"^iter_(\d+)$"

    def folder(self, step: int) -> str:
        return f"iter_{step:07d}"

    def rank_files(self, model, rank, tensors, ext):
        c = model.coords(rank)
        sub = f"mp_rank_{c.tp:02d}" if model.pp == 1 else f"mp_rank_{c.tp:02d}_{c.pp:03d}"
        pairs = []
        for t in tensors:
            if t.kind == "optimizer" and model.zero_stage >= 1:
                pairs.append((f"{sub}/distrib_optim_dp{c.dp:03d}.pt", t))
            elif model.zero_stage >= 3:
                pairs.append((f"{sub}/model_optim_rng_dp{c.dp:03d}.pt", t))
            else:
                pairs.append((f"{sub}/model_optim_rng{_replica_tag(model, c.dp)}.pt", t))
        return _group(pairs)

    def tag(self, step):
        return "latest_checkpointed_iteration.txt", str(step)


def _held_by(model: ModelPlan, rank: int) -> tuple[TensorSpec, ...]:
    """Every tensor rank `rank` holds in memory and puts in its DCP save plan, in state-dict order:
    its model-parallel shard's replicated state whole, its own ZeRO partitions."""
    c = model.coords(rank)
    model_part, optimizer = model.mp_shards[c.pp * model.tp + c.tp]
    # every replica of shard 0 holds the non-tensor entries (its own param groups, epoch), listed last
    objects = model.objects if model.mp_rank(rank) == 0 else ()
    if model.zero_stage == 0:
        return model_part + optimizer + objects
    if model.zero_stage >= 3:
        return tuple(t for t in model.rank_tensors(rank) if not t.is_object) + objects
    return model_part + tuple(t for t in model.rank_tensors(rank) if t.kind == "optimizer") + objects


def dcp_assignment(model: ModelPlan) -> dict[tuple[int, str], int]:
    """DCP's dedup_save_plans over the running ranks: (model-parallel shard, tensor name) -> the
    rank that saves it. Keys go in the order the plans first list them (rank order, each plan in
    state-dict order); each goes to the holder with the least bytes planned so far, the lowest rank
    on a tie (torch's `min` over a set of small ints); every key, unique ones too, adds its bytes to
    the plan that keeps it. Holders of a key share a model-parallel shard, so each shard's group of
    ranks is deduplicated on its own, which is the same order restricted to the group."""
    groups: dict[int, list[int]] = {}
    for rank in range(model.world_size):
        groups.setdefault(model.mp_rank(rank), []).append(rank)
    kept: dict[tuple[int, str], int] = {}
    for shard, ranks in groups.items():
        holders: dict[str, list[int]] = {}
        sizes: dict[str, int] = {}
        for rank in ranks:
            for tensor in _held_by(model, rank):
                holders.setdefault(tensor.name, []).append(rank)
                sizes[tensor.name] = tensor.nbytes or 1
        planned = dict.fromkeys(ranks, 0)
        for name, holding in holders.items():
            chosen = min(holding, key=lambda r: (planned[r], r))
            planned[chosen] += sizes[name]
            kept[(shard, name)] = chosen
    return kept


def writing_ranks(model: ModelPlan) -> np.ndarray:
    """Which running ranks own any tensor (bool per rank), in O(tensors + ranks).

    ModelPlan.rank_tensors answers this for one rank; asking it for every rank from every rank
    would cost ranks^2 (plan mode plans 1,024 ranks). The ZeRO rule makes DP rank d of a
    model-parallel shard a writer exactly when d < n for a per-shard n, because a 1/DP partition of
    a tensor of `numel` elements is empty only for d >= numel: ZeRO-3 partitions everything,
    ZeRO-1/2 the optimizer state (DP rank 0 also writes the model), ZeRO-0 leaves DP rank 0;
    under checkpoint.replicas=all every replica writes what DP rank 0 writes of the replicated state.
    tests/test_checkpoint_formats.py checks this against rank_tensors.
    """
    replicas = model.dp if model.replicas == "all" else 1
    limits = []
    for model_part, optimizer in model.mp_shards:
        model_max = max((t.numel for t in model_part), default=0)
        optimizer_max = max((t.numel for t in optimizer), default=0)
        if model.zero_stage >= 3:
            n = max(model_max, optimizer_max)
        elif model.zero_stage >= 1:
            n = max(replicas if model_max else 0, optimizer_max)
        else:
            n = replicas if (model_max or optimizer_max) else 0
        limits.append(min(n, model.dp))
    ranks = np.arange(model.world_size)
    pp, rest = np.divmod(ranks, model.dp * model.tp)
    dp, tp = np.divmod(rest, model.tp)
    return dp < np.asarray(limits, dtype=np.int64)[pp * model.tp + tp]


@dataclass(frozen=True)
class TensorflowLayout(Layout):
    """TensorFlow: ckpt-N.data-0000k-of-0000K shards plus ckpt-N.index and a `checkpoint` file.

    k counts only the ranks that write (K of them): TF's MergeV2Checkpoints numbers the merged
    shards densely, and the index records K, so a rank with nothing to save (a DP replica under
    ZeRO-0) must not leave a gap in the names for `format=tensorflow` to produce a readable bundle.
    """

    name: str = "tensorflow"
    folder_pattern: str = r"^ckpt-(\d+)$"
    metadata_write: str = "renamed"  # update_checkpoint_state: atomic_write_string_to_file, no fsync
    # tf.train.CheckpointManager.save updates the checkpoint state twice per save (strace of TF 2.21:
    # two `checkpoint.tmp<hex>` writes and renames per save)
    tag_writes: int = 2
    flat_framework: bool = True
    # The plan asks for every rank's files in turn with one layout and one model; the running
    # count of writers is kept for that model only (a one-entry memo on this instance, holding the
    # model itself so it is never confused with another), so planning 1,024 ranks stays linear.
    _writers: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def folder(self, step: int) -> str:
        return f"ckpt-{step}"

    def _shard_numbers(self, model: ModelPlan) -> tuple[np.ndarray, int]:
        if self._writers.get("model") is not model:
            writers = writing_ranks(model)
            self._writers.clear()
            self._writers.update(model=model, before=np.cumsum(writers) - writers, total=int(writers.sum()))
        return self._writers["before"], self._writers["total"]

    def rank_files(self, model, rank, tensors, ext):
        if not tensors:
            return []
        before, shards = self._shard_numbers(model)
        shard = int(before[rank])
        if model.write_order:  # SaveV2 appends in the order it is given: the program's (its object graph's)
            place = {name: i for i, name in enumerate(model.write_order)}
            tensors = tuple(sorted(tensors, key=lambda t: place.get(t.name, len(place))))  # stable: the rest after
        # The step is part of TF's names; the folder name carries it, so `{step}` is filled later.
        return [(f"ckpt-{{step}}.data-{shard:05d}-of-{shards:05d}", tensors)]

    def coordinator_files(self, step, world):
        return [f"ckpt-{step}.index"]

    def checkpoint_files(self, step, names):
        """CheckpointManager's deletion of a checkpoint past max_to_keep (`remove_checkpoint`): its
        `.index`, then its data files (`.data-?????-of-?????`); and a save's staging folder."""
        prefix = f"ckpt-{step}"
        data = sorted(n for n in names if re.fullmatch(re.escape(prefix) + r"\.data-\d{5}-of-\d{5}", n))
        return [n for n in [f"{prefix}.index", *data, f"{prefix}_temp"] if n in names]

    def tag(self, step):
        return "checkpoint", self._state(step, [(step, None)], None)

    def tag_texts(self, step, saves, keep_last, preserved, flat=False):
        """CheckpointManager.save's two writes of its state (`_record_and_sweep_state` in TF's
        checkpoint_management.py): every checkpoint it tracks, oldest first, with the time each was
        written, first with the new one added, then again after the sweep that leaves max_to_keep;
        `last_preserved_timestamp` is when the manager was made, less a second. Text as protobuf's
        text_format writes a CheckpointState (doubles as Python's repr). Each checkpoint is named by
        its prefix relative to the directory (save_relative_paths): `ckpt-N` where its files lie in
        the directory (`flat`, the framework's layout), `ckpt-N/ckpt-N` in a folder of its own."""
        tracked = list(saves)
        kept = tracked[-keep_last:] if keep_last else tracked
        return [self._state(step, tracked, preserved, flat), self._state(step, kept, preserved, flat)]

    @staticmethod
    def _state(step: int, saves: Sequence[tuple[int, float | None]], preserved: float | None, flat: bool = False) -> str:
        def path(s: int) -> str:
            return f"ckpt-{s}" if flat else f"ckpt-{s}/ckpt-{s}"

        lines = [f'model_checkpoint_path: "{path(step)}"']
        lines += [f'all_model_checkpoint_paths: "{path(s)}"' for s, _ in saves]
        lines += [f"all_model_checkpoint_timestamps: {t!r}" for _, t in saves if t is not None]
        if preserved is not None:
            lines.append(f"last_preserved_timestamp: {preserved!r}")
        return "\n".join(lines) + "\n"


LAYOUTS = Registry(
    key="checkpoint.layout",
    noun="layout",
    entries={
        "raw": "dlio_ckpt.plan.layouts:RawLayout",
        "flat": "dlio_ckpt.plan.layouts:FlatLayout",
        "deepspeed": "dlio_ckpt.plan.layouts:DeepSpeedLayout",
        "pytorch_dcp": "dlio_ckpt.plan.layouts:PytorchDcpLayout",
        "megatron": "dlio_ckpt.plan.layouts:MegatronLayout",
        "tensorflow": "dlio_ckpt.plan.layouts:TensorflowLayout",
    },
)


def get_layout(name: str) -> Layout:
    return LAYOUTS.load(name)()
