"""mode=datasize: MLPerf Storage's sizing rule (>= 5x the clients' memory, >= 500 steps per epoch),
one line or one JSON object, exit 0, nothing written."""

from __future__ import annotations

import json
import math

import pytest

from conftest import run_cli
from dlio_ckpt.config.load import load_config
from dlio_ckpt.datasize import size_dataset

GIB = 1 << 30


def meminfo_total_bytes() -> int:
    with open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def test_memory_rule_gives_the_fewest_files_that_reach_five_times_the_memory():
    config = load_config(["workload=unet3d", "mode=datasize", "datasize.client_memory_bytes=1GiB", "datasize.clients=2",
                          "datasize.min_steps_per_epoch=0"])
    answer = size_dataset(config, host_memory_bytes=999)
    file_bytes = 146_600_628  # unet3d: one sample of 146,600,628 B per file
    assert answer.required_bytes == 5 * 2 * GIB
    assert answer.num_files_train == math.ceil(5 * 2 * GIB / file_bytes) == 74
    assert answer.dataset_bytes >= 5 * 2 * GIB > (answer.num_files_train - 1) * file_bytes


def test_steps_rule_wins_when_many_ranks_read_small_files():
    config = load_config(["workload=unet3d", "mode=datasize", "datasize.client_memory_bytes=1GiB", "datasize.ranks=4"])
    answer = size_dataset(config, host_memory_bytes=999)
    assert answer.files_for_steps == 500 * 4 * 7  # 500 steps x 4 ranks x batch 7, one sample per file
    assert answer.num_files_train == 14_000


def test_cli_prints_json_for_this_hosts_memory_and_writes_nothing(workdir):
    done = run_cli(["workload=resnet", "mode=datasize", "datasize.json=true", "datasize.clients=3"], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.strip().splitlines()
    answer = json.loads(line)
    memory = meminfo_total_bytes()
    file_bytes = 1251 * 114_660  # resnet: 1,251 samples of 114,660 B per file
    assert answer["client_memory_bytes"] == memory
    assert answer["num_files_train"] == max(math.ceil(5 * 3 * memory / file_bytes), math.ceil(500 * 3 * 400 / 1251))
    assert list((workdir / "cwd").iterdir()) == []


def test_cli_line_names_the_override_to_use(workdir):
    done = run_cli(["workload=unet3d", "mode=datasize", "datasize.client_memory_bytes=1GiB", "datasize.min_steps_per_epoch=0"],
                   workdir / "cwd")
    assert done.returncode == 0, done.stderr
    assert "dataset.num_files_train=37 " in done.stdout  # ceil(5 GiB / 146,600,628 B)
    assert list((workdir / "cwd").iterdir()) == []


@pytest.mark.parametrize("args,message", [
    (["mode=datasize", "datasize.clients=0"], "datasize.clients: must be at least 1"),
    (["-m", "mode=datasize,train"], "cannot share a sweep"),
])
def test_bad_datasize_input_is_one_line_exit_2(workdir, args, message):
    done = run_cli(args, workdir / "cwd")
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert list((workdir / "cwd").iterdir()) == []
