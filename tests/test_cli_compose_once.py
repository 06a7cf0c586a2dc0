"""A single run is composed once per process: Hydra's composition for the run is also the one
checked before anything is written (cli.run_single), and what Hydra then writes is what a
composition with `hydra.run.dir=FOLDER` on the command line gives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from conftest import cli_env, run_cli
from dlio_ckpt.config.load import compose

TINY = ["scale=tiny", "workload=unet3d", "train.epochs=1", "checkpoint.enabled=false"]

# Counts Hydra's compositions (ConfigLoaderImpl.load_configuration) in a process that runs the command.
COUNTING_MAIN = """
import sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
original, modes = ConfigLoaderImpl.load_configuration, []
def counting(self, *args, **kwargs):
    modes.append(str(kwargs.get("run_mode")))
    return original(self, *args, **kwargs)
ConfigLoaderImpl.load_configuration = counting
from dlio_ckpt.cli import main
try:
    main(sys.argv[1:])
finally:
    print("compositions:", ",".join(modes), file=sys.stderr)
"""


def run_counting(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    done = subprocess.run([sys.executable, "-c", COUNTING_MAIN, *args], cwd=cwd, env=cli_env(), capture_output=True,
                          text=True, timeout=300)
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("compositions:")]
    return done, [mode for mode in line.split(":", 1)[1].strip().split(",") if mode]


def test_a_run_composes_its_config_once(workdir):
    run = workdir / "run"
    done, modes = run_counting([*TINY, f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    assert modes == ["RunMode.RUN"]
    assert (run / "summary.json").is_file()


def test_a_refused_run_composes_once_and_writes_nothing(workdir):
    run = workdir / "run"
    done, modes = run_counting([*TINY, "reader.batch_size=0", f"storage.root={workdir / 'store'}",
                                f"hydra.run.dir={run}"], workdir / "cwd")
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("dlio_ckpt")] == [
        "dlio_ckpt: error: reader.batch_size: must be at least 1 (got 0)"]
    assert modes == ["RunMode.RUN"]
    assert not run.exists() and not (workdir / "store").exists() and list((workdir / "cwd").iterdir()) == []


def test_a_composition_error_is_one_line_and_writes_nothing(workdir):
    # a group option Hydra cannot find fails inside the composition itself, not in the checks after it
    done = run_cli([*TINY, "hydra/launcher=nope", f"storage.root={workdir / 'store'}"], workdir / "cwd")
    assert done.returncode == 2, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith("dlio_ckpt: error: invalid configuration: In 'hydra/config': Could not find "
                           "'hydra/launcher/nope'")
    assert list((workdir / "cwd").iterdir()) == [] and not (workdir / "store").exists()


def test_hydra_writes_what_a_composition_with_the_run_folder_gives(workdir):
    # the folder is put into the composed config after the checks; .hydra/ must not tell the difference
    run = workdir / "run"
    overrides = [*TINY, "hydra.job.chdir=false", f"storage.root={workdir / 'store'}"]
    done = run_cli([*overrides, f"hydra.run.dir={run}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    hydra = yaml.safe_load((run / ".hydra" / "hydra.yaml").read_text())["hydra"]
    assert hydra["run"]["dir"] == str(run) == hydra["runtime"]["output_dir"]
    assert hydra["overrides"]["hydra"] == ["hydra.job.chdir=false", f"hydra.run.dir={run}", "hydra.mode=RUN"]
    assert hydra["overrides"]["task"] == [o for o in overrides if not o.startswith("hydra.")]
    written = OmegaConf.load(run / ".hydra" / "config.yaml")
    assert OmegaConf.to_container(written) == OmegaConf.to_container(compose(overrides))
