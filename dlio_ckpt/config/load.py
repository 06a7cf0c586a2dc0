"""Compose the Hydra config, check the user's overrides, and build the RunConfig.

Hydra composes conf/ (the root config and groups) with the workload library (registered as the
`workload` group). Before Hydra runs the job, every override is checked here so that a typo or a
wrong value gives one line naming the key and what is allowed, exit code 2, and nothing written.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import os
from typing import Any, Iterable, Iterator, Sequence

from omegaconf import DictConfig, OmegaConf

from dlio_ckpt.checkpoint.encoded import check_encoding
from dlio_ckpt.checkpoint.registry import check_names
from dlio_ckpt.config.accelerators import apply_accelerator
from dlio_ckpt.config.groups import (GROUPS, conf_dir, group_options, override_values, parse_overrides,
                                     register_workloads, workloads_named)
from dlio_ckpt.config.limits import check_memory
from dlio_ckpt.config.needs import check_storage_needs, writes_checkpoints
from dlio_ckpt.config.paths import _file_in_the_way, check_paths
from dlio_ckpt.config.scale import apply_scale
from dlio_ckpt.schema import MAX_PLAN_RANKS, RunConfig
from dlio_ckpt.config.space import FREE_BYTES_VARIABLE, check_free_space
from dlio_ckpt.typed import all_keys, build
from dlio_ckpt.config.workload_files import resolve
from dlio_ckpt.engine.plan_mode import plan_world_size
from dlio_ckpt.engine.workers import can_fork
from dlio_ckpt.errors import ConfigError, close_match
from dlio_ckpt.formats import DATASET_FORMATS
from dlio_ckpt.formats.jpeg import JPEG_MIN_BYTES
from dlio_ckpt.formats.parquet import parse_columns
from dlio_ckpt.optional import available, check_installed
from dlio_ckpt.plan.checkpoint_formats import format_spec
from dlio_ckpt.plan.durability import check_flat_layout, resolve_durability
from dlio_ckpt.plan.layouts import get_layout
from dlio_ckpt.plan.model import resolve_parallelism
from dlio_ckpt.plan.read import last_training_step
from dlio_ckpt.plan.replay import check_replay_space
from dlio_ckpt.plan.replay_log import check_replay_log as check_log
from dlio_ckpt.state.trajectory import trajectory_steps
from dlio_ckpt.storage import BACKENDS, make_backend
from dlio_ckpt.storage.base import CAPABILITY_MEANING
from dlio_ckpt.local_fs import nearest_existing, system_folder


def _override_key(override) -> str:
    return override.key_or_group


def check_override_keys(overrides: Sequence[str]) -> None:
    """Reject unknown keys and unknown group options before Hydra sees them."""
    known = set(all_keys(RunConfig)) - {"run_dir"}
    for override in parse_overrides(overrides):
        key = _override_key(override)
        if key.startswith("hydra") or key.startswith("+hydra"):
            continue
        if key in GROUPS:
            options = group_options(key)
            for value in override_values(override):
                if str(value) not in options:
                    raise ConfigError(
                        f"{key}: unknown {key} '{value}'{close_match(str(value), options)}; "
                        f"choose one of: {', '.join(options)}"
                    )
            continue
        if key not in known:
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            siblings = [k for k in known if (k.rsplit(".", 1)[0] if "." in k else "") == parent]
            leaf_hint = close_match(key, known)
            raise ConfigError(
                f"unknown config key '{key}'{leaf_hint}; "
                + (f"keys under {parent or 'the top level'}: {', '.join(sorted(k.rsplit('.', 1)[-1] for k in siblings))}"
                   if siblings else "see `dlio_ckpt --cfg job` for every key")
            )


def expand_sweep(overrides: Sequence[str]) -> list[list[str]]:
    """The job overrides of a multirun: the cartesian product of every comma/range sweep."""
    choices: list[list[str]] = []
    for override in parse_overrides(overrides):
        key = override.get_key_element()
        if override.is_sweep_override():
            choices.append([f"{key}={value}" for value in override_values(override)])
        else:
            choices.append([override.input_line])
    return [list(job) for job in itertools.product(*choices)]


def explicit_keys(overrides: Iterable[str]) -> set[str]:
    """Keys the user set on the command line: scale caps never override them."""
    keys = set()
    for override in parse_overrides(list(overrides)):
        keys.add(_override_key(override).lstrip("+~"))
    return keys


def compose(overrides: Sequence[str]) -> DictConfig:
    """Compose conf/ with `overrides` through Hydra's compose API (no run folder, no logging)."""
    with contextlib.closing(compose_each([overrides])) as composed:
        return next(composed)


def compose_each(jobs: Sequence[Sequence[str]]) -> Iterator[DictConfig]:
    """Compose every job's overrides with Hydra initialised once (a sweep of many jobs).

    A sweep's jobs mostly differ in plain values (`reader.batch_size=4,8,...`). Hydra composes
    the defaults and group choices once per distinct set of structural overrides (groups, `+`,
    `~`, hydra.*), then applies a job's plain values the way Hydra does after composition
    (OmegaConf.update with merge): 25 ms a job instead of half a second, so a sweep of a thousand
    jobs is checked whole. A single run is composed by Hydra directly.

    Hydra stays initialised while the generator is open: close it (contextlib.closing) rather
    than leaving that to the garbage collector."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    def composed(overrides: Sequence[str]) -> DictConfig:
        try:
            return hydra_compose(config_name="config", overrides=list(overrides))
        except ConfigError:
            raise
        except Exception as exc:
            raise composition_error(exc) from None

    # one parse of the distinct workload overrides, not one per job (a sweep may have thousands)
    register_workloads(workloads_named(sorted({o for job in jobs for o in job if o.startswith("workload")})))
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    bases: dict[tuple[str, ...], DictConfig] = {}
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for overrides in jobs:
            if len(jobs) == 1:
                yield composed(overrides)
                continue
            parsed = parse_overrides(overrides)
            plain = [o for o in parsed if _is_plain_value(o)]
            structure = tuple(o.input_line for o in parsed if not _is_plain_value(o))
            if structure not in bases:
                bases[structure] = composed(structure)
            job = copy.deepcopy(bases[structure])
            for override in plain:
                try:
                    OmegaConf.update(job, override.key_or_group, override.value(), merge=True)
                except Exception as exc:
                    raise ConfigError(f"cannot override '{override.input_line}': {' '.join(str(exc).split())}") from None
            yield job


def composition_error(exc: Exception) -> ConfigError:
    """What Hydra raised while composing, as the one-line error a user gets for it."""
    if isinstance(exc, ConfigError):
        return exc
    message = " ".join(str(exc).split()) or type(exc).__name__
    return ConfigError(f"invalid configuration: {message}")


def check_run(cfg: DictConfig, overrides: Sequence[str], world_size: int) -> RunConfig:
    """Check a single run (no sweep) from the config Hydra composed for it, hydra node included,
    as validate_command_line checks one composed by itself; the checked RunConfig (no run_dir)."""
    job = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])  # what the task gets: no hydra node
    config = to_run_config(job, explicit_keys(overrides), world_size=world_size)
    check_job(config, world_size)
    return config


def _is_plain_value(override) -> bool:
    """`key=value` of a config key (not a group, hydra.*, `+`, `++` or `~`), with a plain value."""
    key = override.key_or_group
    if override.package is not None or key in GROUPS or key.startswith("hydra") or override.is_add() \
            or override.is_force_add() or override.is_delete():
        return False
    return isinstance(override.value(), (str, int, float, bool, list, dict, type(None)))


def to_run_config(cfg: DictConfig, explicit: set[str], run_dir: str | None = None, world_size: int = 1) -> RunConfig:
    """Validate a composed config and apply the scale caps to what the user did not set, for a job
    of `world_size` ranks (a scale gives every rank enough steps)."""
    try:
        data: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    except Exception as exc:
        raise ConfigError(f"invalid configuration: {' '.join(str(exc).split())}") from None
    data.pop("hydra", None)
    data["run_dir"] = run_dir

    apply_accelerator(data, explicit)
    config = build(RunConfig, data)
    check_update_files(config)
    check_registered_names(config)
    config = apply_scale(config, explicit, world_size)
    check_consistency(config)
    return config


def load_config(overrides: Sequence[str] = (), run_dir: str | None = None, world_size: int = 1) -> RunConfig:
    """The RunConfig for a list of command-line overrides, as the CLI would build it for a job of
    `world_size` ranks."""
    overrides, _ = resolve(overrides)
    register_workloads(workloads_named(overrides))
    check_override_keys(overrides)
    return to_run_config(compose(overrides), explicit_keys(overrides), run_dir, world_size)


def validate_command_line(overrides: Sequence[str], multirun: bool, world_size: int = 1, free_space: bool = True) -> None:
    """Check every job of a run or sweep, for this world size, before anything is written;
    `free_space=False` (a Slurm dry run, printed anywhere) leaves out storage.root's free space."""
    check_override_keys(overrides)
    jobs = expand_sweep(overrides) if multirun else [list(overrides)]
    with contextlib.closing(compose_each(jobs)) as composed_jobs:
        for job, composed in zip(jobs, composed_jobs):
            check_job(to_run_config(composed, explicit_keys(job), world_size=world_size), world_size, free_space)


def check_job(config: RunConfig, world_size: int, free_space: bool = True) -> None:
    """Everything about one job that can be known before it runs, for this world size."""
    check_world_fit(config, world_size)
    check_failure_steps(config, world_size)
    check_model_fit(config, world_size)
    check_checkpoint_folders(config)
    check_memory(config, world_size)
    check_dependencies(config)
    check_paths(config)
    check_level_paths(config)
    check_storage(config)
    if free_space:
        check_free_space(config, world_size)
    check_replay_log(config, free_space)


def validate_for_display(overrides: Sequence[str], multirun: bool) -> None:
    """`--cfg job` and friends: the keys, group options and values are checked as for a run
    (world size, storage and memory are not: nothing runs)."""
    check_override_keys(overrides)
    jobs = expand_sweep(overrides) if multirun else [list(overrides)]
    with contextlib.closing(compose_each(jobs)) as composed_jobs:
        for job, composed in zip(jobs, composed_jobs):
            to_run_config(composed, explicit_keys(job))


def check_update_files(config: RunConfig) -> None:
    """checkpoint.update=files: the folder holds a training run's saved states, one per step. Here,
    not in the schema: the schema holds types and reads no folder."""
    if config.checkpoint.update != "files":
        return
    try:
        trajectory_steps(config.checkpoint.update_files)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None  # names checkpoint.update_files and what to do


def check_registered_names(config: RunConfig) -> None:
    """Names the registries own, and the pairs of them that work together (the schema only
    holds types, so it does not import the registries)."""
    BACKENDS.canonical(config.storage.backend)
    ds = config.dataset
    offered = DATASET_FORMATS.load(ds.format).compressions
    if ds.compression not in offered:
        raise ConfigError(f"dataset.compression: '{ds.compression}' is not offered by dataset.format={ds.format}; "
                          f"choose one of: {', '.join(offered)}")
    check_dataset_format_fit(ds)
    ck = config.checkpoint
    check_names(ck)
    check_encoding(ck)
    needs_layout = format_spec(ck.format).needs_layout
    if needs_layout and ck.layout != needs_layout:
        raise ConfigError(
            f"checkpoint.layout: checkpoint.format={ck.format} writes {needs_layout} files, which the '{ck.layout}' layout "
            f"cannot name; set checkpoint.layout={needs_layout} (or choose another checkpoint.format)"
        )


def check_dataset_format_fit(ds: Any) -> None:
    """What the jpeg and parquet formats ask of the dataset's keys (formats/jpeg.py, parquet.py)."""
    if ds.parquet_columns or ds.parquet_row_group_size:
        if ds.format != "parquet":
            raise ConfigError(f"dataset.parquet_columns: applies to dataset.format=parquet (it is '{ds.format}'); "
                              "clear it or set dataset.format=parquet")
        try:
            parse_columns(ds.parquet_columns)
        except ValueError as exc:
            raise ConfigError(f"dataset.parquet_columns: {exc}") from None
    if ds.format != "jpeg":
        return
    if ds.num_samples_per_file != 1:
        raise ConfigError(f"dataset.num_samples_per_file: a jpeg file holds one image (got {ds.num_samples_per_file}); "
                          "set dataset.num_samples_per_file=1")
    smallest = ds.record_length_bytes_min if ds.record_length_bytes_stdev else ds.record_length_bytes
    if smallest < JPEG_MIN_BYTES:
        key = "record_length_bytes_min" if ds.record_length_bytes_stdev else "record_length_bytes"
        raise ConfigError(f"dataset.{key}: a JPEG file takes at least {JPEG_MIN_BYTES} bytes (got {smallest}); "
                          f"set dataset.{key}={JPEG_MIN_BYTES} or more")


def uses_checkpoints(config: RunConfig) -> bool:
    return config.workload != "replay" and (config.mode in ("checkpoint", "restore", "plan") or config.checkpoint.enabled)


def check_checkpoint_folders(config: RunConfig) -> None:
    """A layout without a folder per checkpoint (`flat`) refused where the run needs one (a manifest,
    retention), before the run's checkpoint folder is made; the engine checks the same."""
    if uses_checkpoints(config) and config.mode != "plan":
        check_flat_layout(get_layout(config.checkpoint.layout), resolve_durability(config), config.checkpoint.keep_last)


def check_model_fit(config: RunConfig, world_size: int) -> None:
    """A run that checkpoints needs a model, split the way its parallelism says, on these ranks."""
    if config.train.gradient_sync == "allreduce" and config.model.kind == "none" and config.mode == "train":
        raise ConfigError(
            f"train.gradient_sync: allreduce sends the model's gradients, and workload {config.workload} has no model "
            "(model.kind=none); set train.gradient_sync=barrier, or describe the model (model.kind=explicit)"
        )
    if not uses_checkpoints(config):
        return
    model = config.model
    if model.kind == "none" and config.mode != "plan":
        raise ConfigError(
            f"checkpoint.enabled: workload {config.workload} has no model to checkpoint (model.kind=none); "
            "choose a workload with a model (unet3d, bert, llama3_8b, ...), set model.kind=explicit with "
            "model.model_size_bytes, or set checkpoint.enabled=false"
        )
    par = model.parallelism
    if model.kind == "transformer":
        for name in ("num_attention_heads", "num_kv_heads"):
            heads = getattr(model, name)
            if heads % par.tensor:
                raise ConfigError(
                    f"model.parallelism.tensor: {par.tensor} does not divide model.{name} ({heads}); "
                    "tensor parallelism splits the attention heads evenly: choose a divisor of both head counts"
                )
        if par.pipeline > model.num_layers:
            raise ConfigError(
                f"model.parallelism.pipeline: {par.pipeline} stages but only {model.num_layers} layers (model.num_layers); "
                "use at most one stage per layer"
            )

    ranks = plan_world_size(config) if config.mode == "plan" else world_size
    if ranks > MAX_PLAN_RANKS:
        raise ConfigError(
            f"model.parallelism.data: tensor x pipeline x data = {par.tensor}x{par.pipeline}x{par.data} = {ranks:,} ranks; "
            f"at most {MAX_PLAN_RANKS:,} can be planned: lower model.parallelism.data or set world.size"
        )
    resolve_parallelism(model, ranks)


def check_replay_log(config: RunConfig, free_space: bool = True) -> None:
    """workload=replay: the log is an undamaged Darshan log with DXT_POSIX traces or POSIX counters, and
    what the replay writes fits storage.root's free space (before the run folder exists)."""
    if config.workload != "replay" or config.mode == "plan":
        return

    plan = check_log(config.replay.log)
    if free_space:
        root = os.path.abspath(config.storage.root)
        given = os.environ.get(FREE_BYTES_VARIABLE, "")
        free = int(given) if given.isdigit() else make_backend(config.storage, root).free_bytes(root)
        check_replay_space(plan, root, free)


def check_dependencies(config: RunConfig) -> None:
    """Optional libraries the chosen features need, checked before anything is written."""
    if config.reader.name == "tensorflow":
        check_installed("tensorflow")
    dataset_needs = getattr(DATASET_FORMATS.load(config.dataset.format), "requires", "")
    if dataset_needs and config.mode not in ("plan", "checkpoint", "datasize"):
        check_installed(dataset_needs)
    check_loader(config)
    if config.checkpoint.enabled or config.mode == "checkpoint":
        needs = format_spec(config.checkpoint.format).requires
        if needs:
            check_installed(needs)


def check_loader(config: RunConfig) -> None:
    """What reader.workers and reader.decode need of the platform and the dataset format."""
    reader = config.reader
    if reader.decode == "pillow":
        raise ConfigError(f"reader.decode: pillow decodes jpeg/png samples, and dataset.format "
                          f"{config.dataset.format} holds none (dlio_ckpt has no jpeg/png format); "
                          "set reader.decode=numpy or none")
    if reader.decode == "torch":
        if not available("torch"):
            raise ConfigError("reader.decode: torch decodes and collates each sample with torch, which is not installed; "
                              "install it (pip install torch) or set reader.decode=numpy or none")
    if reader.name == "native" and reader.access == "sample" and reader.workers == "processes" and reader.read_threads > 0:
        if not can_fork():
            raise ConfigError("reader.workers: processes forks worker processes, which this platform cannot do "
                              "(no fork start method); set reader.workers=threads or reader.read_threads=0")


def check_storage(config: RunConfig) -> None:
    """The backend can be built from its options, serves every format and feature the run uses
    (its capabilities), and is usable (storage.root writable, bucket reachable): all without writing."""
    if config.mode == "plan":
        return

    backend = make_backend(config.storage, os.path.abspath(config.storage.root))
    check_storage_needs(config, config.storage.backend, backend.capabilities)
    backend.check()
    if config.mode == "restore" and not backend.isdir(os.path.abspath(config.checkpoint.restore_from)):
        raise ConfigError(
            f"checkpoint.restore_from: '{config.checkpoint.restore_from}' is not a folder; mode=restore needs the checkpoint "
            "folder of an earlier run (storage.root/checkpoints/<run id>)"
        )


def check_world_fit(config: RunConfig, world_size: int) -> None:
    """Constraints that depend on the number of ranks (plan mode plans for world.size instead)."""
    if config.mode in ("plan", "checkpoint", "restore") or config.workload == "replay":
        return
    ds = config.dataset
    samples = ds.num_files_train * ds.num_samples_per_file
    ranks = f"{world_size} rank{'s' if world_size != 1 else ''}"
    if samples < world_size:
        raise ConfigError(
            f"{world_size} ranks but only {samples} training samples (dataset.num_files_train x dataset.num_samples_per_file); "
            "raise dataset.num_files_train or run fewer ranks"
        )
    if config.reader.drop_last and samples // world_size < config.reader.batch_size:
        raise ConfigError(
            f"reader.batch_size: {config.reader.batch_size} is larger than a rank's share of the dataset "
            f"({samples} samples over {ranks}) and reader.drop_last=true would leave no step; "
            "lower reader.batch_size, add files, or set reader.drop_last=false"
        )
    if config.train.step_counting == "dlio" and samples // config.reader.batch_size // world_size < 1:
        raise ConfigError(
            f"train.step_counting: dlio runs floor({samples} samples / batch {config.reader.batch_size} / {ranks}) "
            "= 0 steps per epoch; lower reader.batch_size, add files, or run fewer ranks"
        )
    eval_samples = ds.num_files_eval * ds.num_samples_per_file
    if (config.evaluation.enabled and config.train.step_counting == "dlio"
            and eval_samples // config.reader.batch_size_eval // world_size < 1):
        raise ConfigError(
            f"evaluation.enabled: train.step_counting=dlio evaluates floor({eval_samples} samples / batch "
            f"{config.reader.batch_size_eval} / {ranks}) = 0 steps; lower reader.batch_size_eval, raise "
            "dataset.num_files_eval, or set train.step_counting=global"
        )
    if config.reader.access == "transfer" and config.reader.name != "tensorflow" and ds.num_files_train < world_size:
        raise ConfigError(
            f"reader.access: transfer reads whole files: {world_size} ranks need dataset.num_files_train >= {world_size} "
            f"(it is {ds.num_files_train}); raise it, run fewer ranks or set reader.access=sample"
        )
    if config.reader.name == "tensorflow" and ds.num_files_train < world_size:
        raise ConfigError(
            f"reader.name=tensorflow reads whole files: {world_size} ranks need dataset.num_files_train >= {world_size} "
            f"(it is {ds.num_files_train}); raise it or run fewer ranks"
        )


def check_failure_steps(config: RunConfig, world_size: int) -> None:
    """failures.at_steps within the run: a step after its last one would inject nothing, silently.
    With failures.mtbf_s set, steps past the end are the documented way to inject no failure while
    mtbf_s feeds the checkpoint policy's interval (docs/failures.md): allowed."""
    steps = config.failures.at_steps
    if not steps or config.failures.mtbf_s > 0 or config.mode != "train" or config.workload == "replay":
        return

    ds, reader, train = config.dataset, config.reader, config.train
    whole = config.reader.name == "tensorflow" or config.reader.access == "transfer"  # engine/train.py whole_files
    last = last_training_step(ds.num_files_train, ds.num_samples_per_file, reader.batch_size, reader.drop_last,
                              world_size, whole, train.step_counting == "dlio", train.epochs, train.total_steps)
    beyond = sorted(step for step in steps if step > last)
    if beyond:
        ranks = f"{world_size} rank{'s' if world_size != 1 else ''}"
        raise ConfigError(f"failures.at_steps: step {beyond[0]} is after the run's last step ({last:,} with {ranks}, "
                          f"after the scale's caps), so no failure would be injected there; give steps from 1 to {last:,} "
                          "or lengthen the run (train.epochs, train.total_steps)")


# Formats whose containers hold non-tensor entries (model.extra_state): torch.save's pickle (DCP's
# bytes items under pytorch_dcp) and TensorFlow's bundle (string tensors).
EXTRA_STATE_FORMATS = ("torch", "tensorflow")


def check_consistency(config: RunConfig) -> None:
    """Constraints that span sections (a single section checks itself in `validate`)."""
    ds, reader = config.dataset, config.reader
    total = ds.num_files_train * ds.num_samples_per_file
    if reader.batch_size > total:
        raise ConfigError(
            f"reader.batch_size: {reader.batch_size} is larger than the dataset "
            f"({ds.num_files_train} files x {ds.num_samples_per_file} samples = {total}); "
            f"lower reader.batch_size or raise dataset.num_files_train"
        )
    if reader.name == "tensorflow" and ds.format != "tfrecord":
        raise ConfigError(f"reader.name: 'tensorflow' reads tfrecord datasets; dataset.format is '{ds.format}' (use reader.name=native)")
    if ds.record_length_bytes_min > ds.record_length_bytes:
        raise ConfigError("dataset.record_length_bytes_min: larger than dataset.record_length_bytes")
    if config.mode == "restore" and not config.checkpoint.restore_from:
        raise ConfigError("checkpoint.restore_from: mode=restore needs the checkpoint folder of an earlier run "
                          "(storage.root/checkpoints/<run id>)")
    if config.checkpoint.restore_from and config.mode != "restore":
        raise ConfigError("checkpoint.restore_from: applies to mode=restore only (set mode=restore, or clear it)")
    if config.mode == "checkpoint" and config.checkpoint.num_checkpoints_write < 1:
        raise ConfigError("checkpoint.num_checkpoints_write: 0 with mode=checkpoint leaves nothing to do; "
                          "set it to 1 or more")
    if config.evaluation.enabled and ds.num_files_eval < 1:
        raise ConfigError("evaluation.enabled: needs dataset.num_files_eval >= 1")
    if config.model.extra_state and config.checkpoint.format not in EXTRA_STATE_FORMATS:
        raise ConfigError(f"model.extra_state: non-tensor entries are written by checkpoint.format "
                          f"{' or '.join(EXTRA_STATE_FORMATS)} only (got '{config.checkpoint.format}'); "
                          "remove the entries or use one of those formats")
    check_levels(config)


def check_levels(config: RunConfig) -> None:
    """checkpoint.levels: a usable tier list (docs/levels.md): the first level takes every
    checkpoint and is written by the ranks, intervals rise, names and folders differ."""
    levels = config.checkpoint.levels
    if not levels:
        return
    key = "checkpoint.levels"
    if config.mode in ("checkpoint", "restore"):
        raise ConfigError(f"{key}: mode={config.mode} measures one checkpoint folder; clear {key} (levels apply to training runs)")
    if levels[0].every != 1 or levels[0].write != "direct":
        raise ConfigError(f"{key}[0]: the first (fastest) level takes every checkpoint: set every: 1 and write: direct "
                          f"(got every: {levels[0].every}, write: {levels[0].write})")

    names: set[str] = set()
    folders: set[str] = set()
    for number, level in enumerate(levels):
        if number and level.every <= levels[number - 1].every:
            raise ConfigError(f"{key}[{number}].every: intervals rise from the fastest level to the slowest "
                              f"({level.every} after {levels[number - 1].every}); list the levels fastest first")
        if level.name in names:
            raise ConfigError(f"{key}[{number}].name: '{level.name}' names two levels; give each its own name")
        folder = os.path.realpath(level.path or os.path.join(config.storage.root, config.checkpoint.folder))
        if folder in folders:
            raise ConfigError(f"{key}[{number}].path: '{level.path or 'storage.root/checkpoint.folder'}' is already "
                              "another level's folder; give each level its own folder")
        if level.backend:
            dataclasses.replace(BACKENDS, key=f"{key}[{number}].backend").canonical(level.backend)
            if not level.path and level.backend != config.storage.backend:
                raise ConfigError(f"{key}[{number}].backend: a level without a path is the run's own folder, on "
                                  f"storage.backend={config.storage.backend}; give the level a path for backend {level.backend}")
        names.add(level.name)
        folders.add(folder)


def check_level_paths(config: RunConfig) -> None:
    """Each level with a folder or backend of its own can serve the run's checkpoints: a local
    folder can be made and written, another backend is reachable and offers what the checkpoint
    format needs (nothing written)."""
    for number, level in enumerate(config.checkpoint.levels if writes_checkpoints(config) else ()):
        key = f"checkpoint.levels[{number}]"
        name = level.backend or config.storage.backend
        if not level.path:
            continue  # the run's own folder: check_paths and check_storage
        path = os.path.abspath(level.path)
        backend = make_backend(dataclasses.replace(config.storage, backend=name, root=path), path)
        needs = format_spec(config.checkpoint.format).write_needs | ({"direct_io"} if config.storage.direct_io else set())
        lacking = backend.capabilities.missing(needs)
        if lacking:
            raise ConfigError(f"{key}.backend: checkpoint.format={config.checkpoint.format} (or storage.direct_io) needs "
                              f"{' and '.join(CAPABILITY_MEANING[n] for n in lacking)}, which backend {name} does not offer; "
                              "choose another backend for the level")
        if not backend.capabilities.local_paths:
            backend.check()  # reachability and credentials, as storage.backend's
            continue
        kernel = system_folder(os.path.realpath(path))
        if kernel is not None:
            raise ConfigError(f"{key}.path: '{level.path}' is under {kernel}, a kernel file system, not storage; "
                              "choose a folder on a disk, a parallel file system or /dev/shm")
        blocker = _file_in_the_way(path)
        if blocker is not None:
            raise ConfigError(f"{key}.path: '{level.path}' cannot be a folder: {blocker} is a file; choose a folder path")
        if not os.access(nearest_existing(path), os.W_OK | os.X_OK):
            raise ConfigError(f"{key}.path: no permission to write in {nearest_existing(path)}; choose a writable folder")
