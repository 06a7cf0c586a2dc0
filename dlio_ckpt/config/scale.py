"""scale=tiny|small|...: the scale's caps applied to what the command line did not set.

Counts and sizes shrink, the access pattern stays; the training files grow with the world size
where the ranks would otherwise get fewer than the scale's steps an epoch. Part of building a
job's RunConfig (load.to_run_config), apart from the checks that follow it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dlio_ckpt.schema import TENSOR_DTYPES, RunConfig


def _capped(value: int | float, cap: int | float) -> int | float:
    return min(value, cap) if cap else value


def apply_scale(config: RunConfig, explicit: set[str], world_size: int = 1) -> RunConfig:
    """Shrink counts and sizes to the scale's caps, keeping the access pattern; the file cap grows
    with the world size where the ranks would otherwise get fewer than the scale's steps an epoch."""
    scale = config.scale
    if scale.name == "full":
        return config

    def cap(section: Any, prefix: str, **caps: int | float) -> dict[str, Any]:
        changes = {}
        for name, limit in caps.items():
            if f"{prefix}.{name}" in explicit or not limit:
                continue
            current = getattr(section, name)
            new = _capped(current, limit)
            if new != current:
                changes[name] = new
        return changes

    ds = config.dataset
    # A dataset of fewer files than the cap (one big indexed file, say) may keep more samples per
    # file: the scale's budget is max_files x max_samples_per_file samples in all.
    samples_cap = scale.max_samples_per_file
    if samples_cap and scale.max_files:
        samples_cap = max(samples_cap, scale.max_files * scale.max_samples_per_file // max(1, min(ds.num_files_train, scale.max_files)))
    ds_changes = cap(ds, "dataset", num_files_train=scale.max_files, num_files_eval=scale.max_eval_files,
                     num_samples_per_file=samples_cap, record_length_bytes=scale.max_sample_bytes)
    needed = files_for_steps(scale, ds, config.reader, explicit, world_size, samples_cap) if config.workload != "replay" else 0
    if "dataset.num_files_train" not in explicit and needed > ds_changes.get("num_files_train", ds.num_files_train):
        ds_changes["num_files_train"] = needed
    if "record_length_bytes" in ds_changes and "dataset.record_length_bytes_stdev" not in explicit:
        ratio = ds_changes["record_length_bytes"] / ds.record_length_bytes
        ds_changes["record_length_bytes_stdev"] = int(ds.record_length_bytes_stdev * ratio)
        ds_changes["record_length_bytes_min"] = min(ds.record_length_bytes_min, ds_changes["record_length_bytes"])
    dataset = dataclasses.replace(ds, **ds_changes)

    tr = config.train
    tr_changes = cap(tr, "train", epochs=scale.max_epochs, computation_time=scale.max_computation_time,
                     first_step_time=scale.max_computation_time)
    if tr.total_steps and "train.total_steps" not in explicit and scale.max_steps:
        tr_changes["total_steps"] = min(tr.total_steps, scale.max_steps)
    if "computation_time" in tr_changes and "train.computation_time_stdev" not in explicit:
        tr_changes["computation_time_stdev"] = tr.computation_time_stdev * tr_changes["computation_time"] / tr.computation_time
    train = dataclasses.replace(tr, **tr_changes)

    reader = dataclasses.replace(config.reader, **cap(config.reader, "reader", batch_size=scale.max_batch_size,
                                                        batch_size_eval=scale.max_batch_size))
    evaluation = dataclasses.replace(config.evaluation, **cap(config.evaluation, "evaluation",
                                                                computation_time=scale.max_computation_time))

    model = config.model
    explicit_bytes = explicit_checkpoint_bytes(model)
    if scale.max_model_bytes and "model.model_size_bytes" not in explicit and explicit_bytes > scale.max_model_bytes:
        # The whole checkpoint (blob, layers, optimizer state) shrinks by one factor, as a
        # transformer's does in its model plan, so a layered model is capped too.
        ratio = scale.max_model_bytes / explicit_bytes
        model = dataclasses.replace(
            model,
            model_size_bytes=round(model.model_size_bytes * ratio),
            optimization_groups=[int(v * ratio) for v in model.optimization_groups],
            layer_parameters=[int(v * ratio) for v in model.layer_parameters],
        )

    ck = config.checkpoint
    ck_changes = cap(ck, "checkpoint", checkpoint_after_epoch=scale.max_epochs, epochs_between_checkpoints=scale.max_epochs,
                     num_checkpoints_write=scale.max_checkpoints, num_checkpoints_read=scale.max_checkpoints,
                     sleep_between_s=scale.max_checkpoint_sleep_s)
    if ck.steps_between_checkpoints and scale.max_steps and "checkpoint.steps_between_checkpoints" not in explicit:
        every = max(1, scale.max_steps // max(scale.max_checkpoints, 1))
        ck_changes["steps_between_checkpoints"] = min(ck.steps_between_checkpoints, every)
    checkpoint = dataclasses.replace(ck, **ck_changes)
    # A tiny run's dataset and checkpoints are a few MiB: a 64 MiB pool of random bytes (filled at
    # start-up, twice, by the dataset and the checkpoint engine) cost more than the run itself.
    generate = dataclasses.replace(config.generate, **cap(config.generate, "generate", pool_bytes=scale.max_pool_bytes))

    return dataclasses.replace(config, dataset=dataset, train=train, reader=reader, evaluation=evaluation,
                               model=model, checkpoint=checkpoint, generate=generate)


def files_for_steps(scale: Any, ds: Any, reader: Any, explicit: set[str], world_size: int, samples_cap: int) -> int:
    """The training files `world_size` ranks need for the scale's min_steps_per_epoch each (0: no
    minimum). scale=tiny's 8 files gave 8 ranks nothing to read, and small's 64 gave 32 ranks no
    step; a scaled run is no longer the profiled dataset, so it may grow past the workload's
    own count (unet3d's 168 files give 32 ranks 5 samples each), as mode=datasize would."""
    if not scale.min_steps_per_epoch or "reader.batch_size" in explicit:
        return 0  # a batch the user chose is theirs to fit: the dataset is not grown for it
    samples_per_file = ds.num_samples_per_file
    if samples_cap and "dataset.num_samples_per_file" not in explicit:
        samples_per_file = min(samples_per_file, samples_cap)
    batch = min(reader.batch_size, scale.max_batch_size) if scale.max_batch_size else reader.batch_size
    samples_needed = scale.min_steps_per_epoch * max(batch, 1) * max(world_size, 1)
    return -(-samples_needed // max(samples_per_file, 1))


def explicit_checkpoint_bytes(model: Any) -> int:
    """Bytes an explicit model's checkpoint holds: the blob, the layer tensors, the optimizer state."""
    if model.kind != "explicit":
        return 0
    if model.layer_dtypes:
        layers = sum(n * TENSOR_DTYPES[d] for n, d in zip(model.layer_parameters, model.layer_dtypes))
    else:
        layers = sum(model.layer_parameters) * model.model_dtype_bytes
    optimizer = sum(model.optimization_groups) * model.optimizer_states * model.optimizer_dtype_bytes
    return model.model_size_bytes + layers + optimizer
