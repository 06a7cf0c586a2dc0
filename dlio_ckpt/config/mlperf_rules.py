"""MLPerf Storage v3.0's training divisions: which runs could be CLOSED, which only OPEN. Pure.

A submission's division is decided by the model, the emulated accelerator and the parameters
changed from the workload file. v3.0's values, from mlcommons/storage main at 5fe6392
(2026-06-25) mlpstorage_py/config.py and mlpstorage_py/rules/run_checkers/training.py:
- CLOSED and OPEN training models: unet3d and retinanet (MODELS_CLOSED = MODELS_OPEN); flux,
  dlrm, cosmoflow and resnet50 run (`mlpstorage training ... whatif`) but are in neither list;
- accelerators, CLOSED and OPEN: b200 and mi355 (ACCELERATORS_CLOSED; h100 and a100 only in what-if);
- CLOSED may change only the dataset's file count, subfolders and folder, the reader's threads,
  transfer size, O_DIRECT (unet3d only) and prefetch, and where things are stored
  (CLOSED_ALLOWED_PARAMS); OPEN may also change the framework, the dataset format, the samples
  per file and the data loader (OPEN_ALLOWED_PARAMS). Here in dlio_ckpt's keys.
The sizing rule (5x the clients' memory, 500 steps an epoch) is mode=datasize's own.
"""

from __future__ import annotations

from typing import Iterable

CLOSED_MODELS = ("unet3d", "retinanet")
CLOSED_ACCELERATORS = ("b200", "mi355")
# dlio_ckpt keys for MLPerf's CLOSED_ALLOWED_PARAMS (data_folder -> dataset.folder, storage_root ->
# storage.root, odirect -> storage.direct_io; computation_threads has no counterpart here).
CLOSED_KEYS = ("dataset.num_files_train", "dataset.num_subfolders_train", "dataset.folder", "reader.read_threads",
               "reader.transfer_size", "storage.direct_io", "reader.prefetch_size", "storage.root")
# OPEN_ALLOWED_PARAMS beyond those: framework and data_loader -> reader.name.
OPEN_KEYS = ("dataset.format", "dataset.num_samples_per_file", "reader.name")
# Keys that choose or describe the run, not the workload's figures.
NEUTRAL_PREFIXES = ("mode", "workload", "accelerator", "datasize.", "hydra.", "progress", "seed", "world.", "scale")


def division(workload: str, accelerator: str, changed: Iterable[str]) -> tuple[str, str]:
    """("closed" | "open" | "none", why) for `workload` on `accelerator` with the config keys in
    `changed` set on the command line."""
    if workload not in CLOSED_MODELS:
        return "none", f"{workload} is not a v3.0 CLOSED/OPEN training model ({', '.join(CLOSED_MODELS)})"
    keys = sorted(k for k in changed if not k.startswith(NEUTRAL_PREFIXES))
    if "storage.direct_io" in keys and workload != "unet3d":
        return "none", "storage.direct_io (reader.odirect) is allowed for unet3d only"
    other = [k for k in keys if k not in CLOSED_KEYS + OPEN_KEYS]
    if other:
        return "none", f"{', '.join(other)} may not change in CLOSED or OPEN"
    if accelerator not in CLOSED_ACCELERATORS:
        return "none", (f"accelerator {accelerator or '(none)'} is not a v3.0 accelerator "
                        f"({', '.join(CLOSED_ACCELERATORS)}; others only in what-if)")
    opened = [k for k in keys if k in OPEN_KEYS]
    if opened:
        return "open", f"{', '.join(opened)} changed (allowed in OPEN only)"
    return "closed", f"{workload} on {accelerator}"
