#!/usr/bin/env python3
"""The DLIO benchmark 2.0.0 and dlio_ckpt side by side on one comparable training config.

Why: dlio_ckpt is meant to be usable where DLIO is used, with figures users can trust. Running the
same shrunk workload through both shows what each tool costs (wall time, peak memory) and how
their headline figures differ in meaning, not only in value:
- bytes read: dlio_ckpt counts bytes returned by the storage layer; DLIO reports a nominal figure
  (samples x record_length, its "I/O MB/s" is in fact MiB/s of nominal bytes).
- checkpoint: dlio_ckpt times the slowest rank from first open to last fsync; DLIO 2.0.0 times
  rank 0 only (its default, rank 0 also writes everything), with torch.save and no fsync, so its
  figure is the speed of the page cache, and rounds the duration to 10 ms. DLIO reports only the
  duration; its throughput here is derived as the bytes of its checkpoint files / that duration.
  DLIO's tensors are all zeros (torch.randint(high=1)), dlio_ckpt's are random bytes.

The config: unet3d (both tools' profiles of the MLPerf Storage workload: 3D U-Net, NPZ, 4 read
threads, 0.323 s compute per step on H100, a 499,153,191-byte model), shrunk to 32 NPZ files of
8 MiB (record stdev 0), batch 4, 2 epochs, a checkpoint after each epoch, 2 MPI ranks. Each tool
generates its own copy of the dataset first (not timed in the comparison); then the training runs
alternate DLIO, dlio_ckpt, ... so noise on the shared machine falls on both. Both read a dataset
just written, so both read from the page cache (no cache drop: it would disturb other users).

Peak memory: the process tree under mpirun is polled with psutil every 100 ms; reported as the
largest RSS of a single process (a rank, or one of DLIO's data-loader workers) and the largest sum
of PSS over the tree at one instant (PSS, not RSS: DLIO's forked PyTorch workers share pages with
their rank, which a sum of RSS would count several times).

DLIO is installed in its own venv (default /tmp/dlio-venv), per ../shared/bench/README.md:
    python3 -m venv /tmp/dlio-venv
    /tmp/dlio-venv/bin/pip install -r ../shared/bench/dlio-2.0.0-requirements-without-dali.txt
    /tmp/dlio-venv/bin/pip install --no-deps dlio-benchmark==2.0.0
(`--install` does those three steps when the venv is missing.)

    .venv/bin/python benchmarks/dlio_vs_dlio_ckpt.py --quick
    .venv/bin/python benchmarks/dlio_vs_dlio_ckpt.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import GIB, MIB, Workdir, environment, load_json, median, ratio, table, tool, write_json  # noqa: E402

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE.parents[1] / "shared" / "bench" / "dlio-2.0.0-requirements-without-dali.txt"  # ../shared beside the repo


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one round, 1 epoch, 16 files, 64 MiB model (< 1 minute)")
    p.add_argument("--dlio-venv", default="/tmp/dlio-venv", help="the DLIO 2.0.0 venv (default /tmp/dlio-venv)")
    p.add_argument("--install", action="store_true", help="create the DLIO venv when it is missing")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--files", type=int, default=32)
    p.add_argument("--record-bytes", type=int, default=8 * MIB)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--model-bytes", type=int, default=499153191, help="unet3d's model size in both profiles")
    p.add_argument("--repeats", type=int, default=2, help="alternating DLIO / dlio_ckpt rounds (default 2)")
    p.add_argument("--tmp", default=None, help="parent folder for the data (default: the system temp folder)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--out", default=str(HERE / "results" / "dlio_vs_dlio_ckpt.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.epochs, args.files, args.model_bytes = 1, 1, 16, 64 * MIB
    return args


def ensure_dlio(venv: Path, install: bool) -> Path:
    exe = venv / "bin" / "dlio_benchmark"
    if exe.exists():
        return exe
    if not install:
        sys.exit(f"DLIO not found at {exe}; install it (see this script's docstring) or pass --install")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = str(venv / "bin" / "pip")
    if subprocess.run([pip, "install", "-r", str(REQUIREMENTS)]).returncode != 0:
        # torchvision / torchaudio may have no wheel matching the local torch: install the rest.
        rest = [l.strip() for l in REQUIREMENTS.read_text().splitlines() if l.strip() and not l.startswith(("torchvision", "torchaudio"))]
        subprocess.run([pip, "install", *rest], check=True)
        print("note: torchvision/torchaudio could not be installed; DLIO's npz/checkpoint path does not need them")
    subprocess.run([pip, "install", "--no-deps", "dlio-benchmark==2.0.0"], check=True)
    return exe


class RssPoller:
    """Peak RSS of a process tree: the largest process and the largest instantaneous sum."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.root = psutil.Process(pid)
        self.interval = interval
        self.max_process = 0
        self.max_process_name = ""
        self.max_tree = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            total = 0
            for proc in procs:
                try:
                    info = proc.memory_full_info()
                except psutil.Error:
                    continue
                rss = info.rss
                total += getattr(info, "pss", rss)
                if rss > self.max_process:
                    self.max_process = rss
                    try:
                        self.max_process_name = " ".join(proc.cmdline()[:2])[-60:]
                    except psutil.Error:
                        pass
            self.max_tree = max(self.max_tree, total)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_polled(cmd: list[str], log: Path, env: dict | None = None) -> dict:
    start = time.perf_counter()
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        poller = RssPoller(proc.pid)
        rc = proc.wait()
        poller.stop()
    wall = time.perf_counter() - start
    if rc != 0:
        sys.stderr.write(f"command failed (rc={rc}): {' '.join(cmd)}\n--- last lines of {log}:\n")
        sys.stderr.write("".join(open(log).readlines()[-40:]))
        raise SystemExit(1)
    return {"wall_s": wall, "peak_rss_process_bytes": poller.max_process, "peak_pss_tree_bytes": poller.max_tree,
            "peak_rss_process": poller.max_process_name}


def dlio_cmd(args, exe: Path, work: Path, out_dir: Path, generate: bool) -> list[str]:
    mpirun = exe.parent / "mpirun"
    return [
        str(mpirun), "-n", str(args.ranks), str(exe), "workload=unet3d_h100",
        f"++workload.workflow.generate_data={generate}", f"++workload.workflow.train={not generate}",
        f"++workload.workflow.checkpoint={not generate}",
        f"++workload.dataset.data_folder={work / 'dlio' / 'data'}",
        f"++workload.dataset.num_files_train={args.files}", "++workload.dataset.num_files_eval=0",
        f"++workload.dataset.record_length={args.record_bytes}", "++workload.dataset.record_length_stdev=0",
        f"++workload.reader.batch_size={args.batch_size}", f"++workload.train.epochs={args.epochs}",
        f"++workload.checkpoint.checkpoint_folder={work / 'dlio' / 'ckpt'}",
        "++workload.checkpoint.checkpoint_after_epoch=1", "++workload.checkpoint.epochs_between_checkpoints=1",
        f"++workload.checkpoint.model_size={args.model_bytes}",
        f"hydra.run.dir={out_dir}",
    ]


def ckpt_cmd(args, work: Path, run_dir: Path, generate: bool) -> list[str]:
    cmd = [tool("mpirun"), "-n", str(args.ranks), tool("dlio_ckpt"), "workload=unet3d", "progress=false",
           f"mode={'generate' if generate else 'train'}", "dataset.format=npz",
           f"dataset.num_files_train={args.files}", "dataset.num_files_eval=0",
           f"dataset.record_length_bytes={args.record_bytes}", "dataset.record_length_bytes_stdev=0",
           f"reader.batch_size={args.batch_size}", f"train.epochs={args.epochs}",
           "checkpoint.enabled=true", "checkpoint.checkpoint_after_epoch=1", "checkpoint.epochs_between_checkpoints=1",
           f"model.model_size_bytes={args.model_bytes}",
           f"storage.root={work / 'ckpt'}", f"hydra.run.dir={run_dir}"]
    return cmd


CKPT_NAME = re.compile(r"^(?P<kind>[a-z]+)(?:-\d+)?-(?P<epoch>\d+)-(?P<step>\d+)-(?P<rank>\d+)\.pt$")


def dlio_round(args, exe: Path, work: Path, i: int, log: Path) -> dict:
    out_dir = work / "dlio" / f"run-{i}"
    env = dict(os.environ, DFTRACER_ENABLE="0")
    proc = run_polled(dlio_cmd(args, exe, work, out_dir, generate=False), log, env)
    summary = load_json(out_dir / "summary.json")
    stats = load_json(out_dir / "per_epoch_stats.json")
    ckpt_folder = work / "dlio" / "ckpt"
    by_epoch: dict[int, int] = {}
    for f in ckpt_folder.iterdir() if ckpt_folder.exists() else []:
        m = CKPT_NAME.match(f.name)
        if m:
            by_epoch[int(m["epoch"])] = by_epoch.get(int(m["epoch"]), 0) + f.stat().st_size
    durations = [float(v["duration"]) for e in stats.values() for k, v in e.items() if k.startswith("ckpt") and "duration" in v]
    ckpt_bytes = median(list(by_epoch.values())) if by_epoch else 0
    mean_dur = sum(durations) / len(durations) if durations else float("nan")
    metric = summary["metric"]
    # DLIO reads floor(files x samples per file / batch / ranks) steps per rank per epoch.
    steps_per_rank = args.files // args.batch_size // args.ranks
    samples = steps_per_rank * args.batch_size * args.ranks * args.epochs
    nominal = samples * args.record_bytes
    result = {
        **proc,
        "train_au_mean_percentage": metric.get("train_au_mean_percentage"),
        "train_throughput_mean_samples_per_second": metric.get("train_throughput_mean_samples_per_second"),
        "train_io_mean_MB_per_second_nominal": metric.get("train_io_mean_MB_per_second"),
        "bytes_read_nominal": nominal,
        "checkpoints": len(durations),
        "checkpoint_duration_s_rank0": durations,
        "checkpoint_duration_s_mean": mean_dur,
        "checkpoint_bytes_on_disk": ckpt_bytes,
        "checkpoint_gib_per_s_derived": ckpt_bytes / mean_dur / GIB if durations and mean_dur > 0 else None,
        "epoch_durations_s": [float(e["duration"]) for e in stats.values() if "duration" in e],
        "samples_nominal": samples,
    }
    shutil.rmtree(ckpt_folder, ignore_errors=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.sync()
    return result


def ckpt_round(args, work: Path, i: int, log: Path) -> dict:
    run_dir = work / "runs" / f"ckpt-{i}"
    proc = run_polled(ckpt_cmd(args, work, run_dir, generate=False), log)
    s = load_json(run_dir / "summary.json")
    t, c = s["train"], s["checkpoint"]
    result = {
        **proc,
        "summary_wall_s": s["wall_s"],
        "train_wall_s": t["wall_s"],
        "au": t["au"],
        "samples_per_s": t["samples_per_s"],
        "bytes_read": t["bytes_read"],
        "read_mib_per_s": t["read_mib_per_s"],
        "dlio_io_mib_per_s_nominal": t.get("dlio_io_mib_per_s_nominal"),
        "checkpoints": c["writes"],
        "checkpoint_bytes": c["bytes"],
        "checkpoint_write_s_max": c["write_s_max"],
        "checkpoint_write_gib_per_s": c["write_gib_per_s"],
        "checkpoint_blocking_s_max": c.get("blocking_s_max"),
        "peak_rss_bytes_max_reported": s.get("peak_rss_bytes_max"),
        "dataset_reused": s["dataset"]["reused"],
    }
    shutil.rmtree(work / "ckpt" / "checkpoints", ignore_errors=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.sync()
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exe = ensure_dlio(Path(args.dlio_venv), args.install)
    results: dict = {"benchmark": "dlio_vs_dlio_ckpt", "params": {k: v for k, v in vars(args).items() if k != "out"}}
    with Workdir(args.tmp, args.keep, "dlio_vs_dlio_ckpt-") as work:
        results["environment"] = environment(str(work))
        results["environment"]["dlio_benchmark"] = subprocess.run(
            [str(exe.parent / "pip"), "show", "dlio-benchmark"], capture_output=True, text=True).stdout.split("\n")[1:2]
        log = work / "commands.log"
        print(f"work folder {work}; generating both datasets ({args.files} x {args.record_bytes / MIB:.0f} MiB npz) ...", flush=True)
        gen_dlio = run_polled(dlio_cmd(args, exe, work, work / "dlio" / "gen", generate=True), log, dict(os.environ, DFTRACER_ENABLE="0"))
        gen_ckpt = run_polled(ckpt_cmd(args, work, work / "runs" / "gen", generate=True), log)
        dlio_files = sorted((work / "dlio" / "data").rglob("*.npz"))
        results["generate"] = {
            "dlio": {**gen_dlio, "files": len(dlio_files), "bytes_on_disk": sum(f.stat().st_size for f in dlio_files)},
            "dlio_ckpt": {**gen_ckpt, **load_json(work / "runs" / "gen" / "summary.json")["dataset"]},
        }
        print(f"  DLIO generate {gen_dlio['wall_s']:.1f} s, dlio_ckpt generate {gen_ckpt['wall_s']:.1f} s", flush=True)
        dl, ck = [], []
        for i in range(args.repeats):
            order = ("dlio", "ckpt") if i % 2 == 0 else ("ckpt", "dlio")
            for which in order:
                if which == "dlio":
                    dl.append(dlio_round(args, exe, work, i, log))
                    print(f"  DLIO      {i}: wall {dl[-1]['wall_s']:.1f} s, ckpt (rank 0, no fsync) {dl[-1]['checkpoint_duration_s_mean']:.2f} s", flush=True)
                else:
                    ck.append(ckpt_round(args, work, i, log))
                    print(f"  dlio_ckpt {i}: wall {ck[-1]['wall_s']:.1f} s, ckpt (slowest rank, fsync) {ck[-1]['checkpoint_write_s_max']:.2f} s", flush=True)
            write_json(Path(args.out), {**results, "dlio": dl, "dlio_ckpt": ck})
        if args.keep:
            shutil.copy(log, Path(args.out).with_suffix(".commands.log"))
    med = {
        "dlio_wall_s": median([r["wall_s"] for r in dl]),
        "ckpt_wall_s": median([r["wall_s"] for r in ck]),
        "dlio_ckpt_s": median([r["checkpoint_duration_s_mean"] for r in dl]),
        "ckpt_ckpt_s": median([r["checkpoint_write_s_max"] for r in ck]),
        "dlio_ckpt_gib_per_s": median([r["checkpoint_gib_per_s_derived"] for r in dl]),
        "ckpt_ckpt_gib_per_s": median([r["checkpoint_write_gib_per_s"] for r in ck]),
        "dlio_rss_process": median([r["peak_rss_process_bytes"] for r in dl]),
        "ckpt_rss_process": median([r["peak_rss_process_bytes"] for r in ck]),
        "dlio_pss_tree": median([r["peak_pss_tree_bytes"] for r in dl]),
        "ckpt_pss_tree": median([r["peak_pss_tree_bytes"] for r in ck]),
        "dlio_au": median([r["train_au_mean_percentage"] / 100 for r in dl]),
        "ckpt_au": median([r["au"] for r in ck]),
    }
    results.update({"dlio": dl, "dlio_ckpt": ck, "median": med,
                    "ratio_wall_dlio_ckpt_over_dlio": ratio(med["ckpt_wall_s"], med["dlio_wall_s"])})
    d0, c0 = dl[0], ck[0]
    rows = [
        ["wall time, whole mpirun (s)", f"{med['dlio_wall_s']:.1f}", f"{med['ckpt_wall_s']:.1f}"],
        ["bytes read (MiB)", f"{d0['bytes_read_nominal'] / MIB:.1f} nominal", f"{c0['bytes_read'] / MIB:.1f} at storage"],
        ["train I/O MiB/s", f"{median([r['train_io_mean_MB_per_second_nominal'] for r in dl]):.0f} nominal ('MB/s')",
         f"{median([r['read_mib_per_s'] for r in ck]):.0f} in reads; {median([r['dlio_io_mib_per_s_nominal'] for r in ck]):.0f} DLIO-style"],
        ["AU", f"{med['dlio_au']:.3f}", f"{med['ckpt_au']:.3f}"],
        ["checkpoint bytes (MiB)", f"{d0['checkpoint_bytes_on_disk'] / MIB:.1f} (torch.save, zeros)", f"{c0['checkpoint_bytes'] / MIB:.1f} (raw, random)"],
        ["checkpoint time (s)", f"{med['dlio_ckpt_s']:.2f} rank 0, no fsync", f"{med['ckpt_ckpt_s']:.2f} slowest rank, fsync"],
        ["checkpoint GiB/s", f"{med['dlio_ckpt_gib_per_s']:.3f} (derived)", f"{med['ckpt_ckpt_gib_per_s']:.3f}"],
        ["peak RSS, largest process (MiB)", f"{med['dlio_rss_process'] / MIB:.0f}", f"{med['ckpt_rss_process'] / MIB:.0f}"],
        ["peak PSS sum, whole tree (MiB)", f"{med['dlio_pss_tree'] / MIB:.0f}", f"{med['ckpt_pss_tree'] / MIB:.0f}"],
    ]
    print()
    print(table(rows, ["figure (median of %d)" % args.repeats, "DLIO 2.0.0", "dlio_ckpt"]))
    print(f"\nresults: {args.out}")
    write_json(Path(args.out), results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
