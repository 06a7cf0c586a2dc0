"""Power-loss durability of every commit, per layout, format, strategy, encoding and level, from
`strace -f` of real command-line runs (docs/checkpointing.md, "Atomic commit").

Each case is one `dlio_ckpt` run (bert, scale=tiny: dataset generation, training, checkpoints)
traced by `strace -f -y` for the calls that create names and make them durable (openat with
O_CREAT, mkdir, rename, fsync). Every commit found (a rename onto a checkpoint or dataset
manifest) is checked as tests/test_commit_durability.py checks it: before the manifest's rename,
every file it lists had its data fsynced and its folder fsynced after the file got its name, every
folder created below storage.root had its entry (its parent) fsynced, the manifest was fsynced;
its folder was fsynced after the rename. The table gives, per case, the commits and for each kind
(checkpoint, dataset) the files listed, the folder and file fsyncs from the creation of the
manifest's folder to its rename, and the problems found (none expected). It times nothing (strace
slows every call it traces).

    .venv/bin/python benchmarks/commit_durability.py            # every case, ~2 min
    .venv/bin/python benchmarks/commit_durability.py --quick    # raw, megatron, tensorflow
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import REPO, tool

sys.path.insert(0, str(REPO / "tests"))
from syscall_order import check_commits, strace_calls  # noqa: E402

BASE = ["workload=bert", "scale=tiny", "progress=false", "checkpoint.enabled=true", "checkpoint.durability=commit", "checkpoint.keep_last=0",
        "train.epochs=1", "checkpoint.steps_between_checkpoints=2", "train.computation_time=0"]
SPARSE = ["checkpoint.update=sparse", "checkpoint.update_fraction=0.01"]
CASES = {
    "raw/raw": ["checkpoint.layout=raw"],
    "raw/npy": ["checkpoint.layout=raw", "checkpoint.format=npy"],
    "raw/npz": ["checkpoint.layout=raw", "checkpoint.format=npz"],
    "raw/hdf5": ["checkpoint.layout=raw", "checkpoint.format=hdf5"],
    "deepspeed/torch": ["checkpoint.layout=deepspeed", "checkpoint.format=torch"],
    "pytorch_dcp/torch": ["checkpoint.layout=pytorch_dcp", "checkpoint.format=torch"],
    "megatron/torch": ["checkpoint.layout=megatron", "checkpoint.format=torch"],
    "tensorflow/tensorflow": ["checkpoint.layout=tensorflow", "checkpoint.format=tensorflow"],
    "raw/raw async": ["checkpoint.strategy=async"],
    "megatron/raw incremental": ["checkpoint.layout=megatron", "checkpoint.encoding=incremental", *SPARSE],
    "raw/raw lossy": ["checkpoint.encoding=lossy", "checkpoint.update=sgd"],
    "megatron/raw 2 levels (flush)": ["checkpoint.layout=megatron",
                                      "checkpoint.levels=[{name:local,path:LOCAL,scope:node},{name:shared,every:2,write:flush}]"],
    "raw/raw mpirun -n 2": ["checkpoint.layout=raw", "model.parallelism.zero_stage=3"],
}
QUICK = ("raw/raw", "megatron/torch", "tensorflow/tensorflow")


def run_case(name: str, args: list[str], folder: Path, strace: str) -> dict:
    store, log, run = folder / "store", folder / "strace.log", folder / "run"
    args = [a.replace("LOCAL", str(folder / "local")) for a in args]
    command = [tool("dlio_ckpt"), *BASE, *args, f"storage.root={store}", f"hydra.run.dir={run}"]
    if "mpirun" in name:
        command = [tool("mpirun"), "-n", "2", *command]
    traced = [strace, "-f", "-y", "-qq", "-o", str(log), "-e",
              "trace=open,openat,mkdir,mkdirat,rename,renameat,renameat2,fsync,fdatasync", *command]
    done = subprocess.run(traced, cwd=folder, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"case": name, "error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    calls = strace_calls(log.read_text(), str(folder))
    tops = [str(store)] + ([str(folder / "local")] if "levels" in name else [])
    commits = []
    for top in tops:
        real = os.path.realpath(top)
        commits += [c for c in check_commits(calls, top) if c.manifest.startswith(real + os.sep)
                    and not (top == str(store) and len(tops) > 1 and c.manifest.startswith(os.path.realpath(tops[1])))]
    out = {"case": name, "commits": len(commits), "problems": [p for c in commits for p in c.problems]}
    for kind, manifest in (("checkpoint", "dlio_ckpt_manifest.json"), ("dataset", ".dlio_ckpt_dataset.json")):
        mine = [c for c in commits if os.path.basename(c.manifest) == manifest]
        out[kind] = {"commits": len(mine), "files": [c.files for c in mine],
                     "folder_fsyncs_before": [c.folders_before for c in mine],
                     "file_fsyncs_before": [c.file_fsyncs_before for c in mine],
                     "folder_fsynced_after": all(c.folder_after for c in mine)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "commit_durability.json"))
    options = parser.parse_args()
    strace = shutil.which("strace")
    if strace is None:
        sys.exit("strace not found: apt-get install -y strace")
    results = []
    for name, args in CASES.items():
        if (options.quick and name not in QUICK) or (options.only and options.only not in name):
            continue
        folder = Path(tempfile.mkdtemp(prefix="commit-durability-", dir=options.tmp))
        try:
            results.append(run_case(name, args, folder, strace))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        row = results[-1]
        if "error" in row:
            print(f"{name:32} ERROR {row['error']}")
            continue
        ck, ds = row["checkpoint"], row["dataset"]
        print(f"{name:32} checkpoints {ck['commits']}: files {ck['files']} folder fsyncs before {ck['folder_fsyncs_before']} "
              f"file fsyncs before {ck['file_fsyncs_before']} folder after {ck['folder_fsynced_after']}; "
              f"dataset: files {ds['files']} folder fsyncs {ds['folder_fsyncs_before']}; "
              f"problems {len(row['problems'])}")
    Path(options.out).write_text(json.dumps({"strace": subprocess.run([strace, "-V"], capture_output=True, text=True).stdout.splitlines()[0],
                                             "results": results}, indent=1))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
