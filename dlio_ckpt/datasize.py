"""mode=datasize: how many files a workload's dataset needs so that reads cannot be served from memory.

MLPerf Storage sizes a closed submission's dataset by two rules: it must be at least five times
the total memory of the client hosts (so the page cache cannot hold it), and an epoch must take at
least 500 steps on all the accelerators. This answers that question for any workload and writes
nothing: no run folder, no data, one line (or one JSON object) on stdout. The line also says which
MLPerf Storage v3.0 division would accept the run (config/mlperf_rules.py: model, accelerator and
the keys the command line changed). A command beside the loader it composes with, not part of the
engine: it runs nothing.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Sequence

from dlio_ckpt.config.groups import override_values, parse_overrides
from dlio_ckpt.config.load import check_override_keys, compose_each, expand_sweep, explicit_keys, to_run_config
from dlio_ckpt.config.mlperf_rules import division
from dlio_ckpt.schema import RunConfig
from dlio_ckpt.errors import ConfigError


DIVISION_WORDS = {"closed": "CLOSED", "open": "OPEN only", "none": "neither CLOSED nor OPEN"}


@dataclass(frozen=True)
class DatasizeAnswer:
    workload: str
    client_memory_bytes: int
    clients: int
    memory_multiple: float
    required_bytes: int  # memory_multiple x clients x client_memory_bytes
    file_bytes: int  # samples per file x mean sample bytes
    files_for_memory: int
    ranks: int
    batch_size: int
    min_steps_per_epoch: int
    files_for_steps: int
    num_files_train: int  # the larger of the two rules
    dataset_bytes: int
    mlperf_v3_division: str = "none"  # closed | open | none: what MLPerf Storage v3.0 would accept this run as
    mlperf_v3_why: str = ""

    def line(self) -> str:
        gib = 1 << 30
        return (
            f"datasize: {self.workload} needs dataset.num_files_train={self.num_files_train} "
            f"({self.dataset_bytes / gib:,.1f} GiB of {self.file_bytes:,} B files) for >= {self.memory_multiple:g} x "
            f"{self.clients} client(s) x {self.client_memory_bytes / gib:,.1f} GiB = {self.required_bytes / gib:,.1f} GiB "
            f"({self.files_for_memory} files) and >= {self.min_steps_per_epoch} steps per epoch at batch "
            f"{self.batch_size} on {self.ranks} rank(s) ({self.files_for_steps} files); "
            f"MLPerf Storage v3.0: {DIVISION_WORDS[self.mlperf_v3_division]} ({self.mlperf_v3_why})"
        )


def size_dataset(config: RunConfig, host_memory_bytes: int, changed: Sequence[str] = ()) -> DatasizeAnswer:
    """The answer for `config`; `host_memory_bytes` stands in when datasize.client_memory_bytes is 0;
    `changed`: the config keys the command line set (they decide the v3.0 division)."""
    rule, ds = config.datasize, config.dataset
    memory = rule.client_memory_bytes or host_memory_bytes
    required = math.ceil(rule.memory_multiple * rule.clients * memory)
    file_bytes = ds.num_samples_per_file * ds.record_length_bytes
    files_for_memory = math.ceil(required / file_bytes)
    ranks = rule.ranks or rule.clients
    samples_for_steps = rule.min_steps_per_epoch * ranks * config.reader.batch_size
    files_for_steps = math.ceil(samples_for_steps / ds.num_samples_per_file)
    files = max(1, files_for_memory, files_for_steps)
    return DatasizeAnswer(
        workload=config.workload, client_memory_bytes=memory, clients=rule.clients, memory_multiple=rule.memory_multiple,
        required_bytes=required, file_bytes=file_bytes, files_for_memory=files_for_memory, ranks=ranks,
        batch_size=config.reader.batch_size, min_steps_per_epoch=rule.min_steps_per_epoch, files_for_steps=files_for_steps,
        num_files_train=files, dataset_bytes=files * file_bytes,
        **dict(zip(("mlperf_v3_division", "mlperf_v3_why"), division(config.workload, config.accelerator, changed))),
    )


def host_memory_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def datasize_requested(overrides: Sequence[str]) -> bool:
    """True when the command line asks for mode=datasize (a sweep may not mix it with other modes)."""
    for override in parse_overrides(overrides):
        if override.key_or_group != "mode":
            continue
        values = [str(v) for v in override_values(override)]
        if "datasize" in values and len(set(values)) > 1:
            raise ConfigError("mode: datasize prints a size and runs nothing, so it cannot share a sweep with other modes; "
                              "run it on its own")
        return values[0] == "datasize"
    return False


def run_datasize_mode(overrides: Sequence[str], multirun: bool) -> list[str]:
    """The line (or JSON object) for every job of the command line; checks every key first."""
    check_override_keys(overrides)
    jobs = expand_sweep(overrides) if multirun else [list(overrides)]
    memory = host_memory_bytes()
    out = []
    with contextlib.closing(compose_each(jobs)) as composed_jobs:
        for job, composed in zip(jobs, composed_jobs):
            explicit = explicit_keys(job)
            config = to_run_config(composed, explicit)
            answer = size_dataset(config, memory, sorted(explicit))
            out.append(json.dumps(asdict(answer)) if config.datasize.json else answer.line())
    return out
