"""Does dlio_ckpt's own cost grow linearly with the work? Time and peak memory per case.

Cases (each a dlio_ckpt command, measured from outside with /usr/bin/time: wall seconds and the
peak resident memory of the process it starts; under mpirun that process is mpirun, so those rows
give time only):

- plan-ckpt  : mode=plan of llama3_70b (ZeRO-3) for N ranks (the per-rank checkpoint plan)
- plan-data  : mode=plan of a dataset of N tiny files
- generate   : mode=generate of N tiny files (64-byte records, raw format, one rank)
- generate-nosync: the same with storage.fsync=false (the emulator's cost, not the disk's)
- small-np8  : generate + one epoch of reads of N x 4 KiB files under mpirun -np 8
- gen-4k     : mode=generate of N x 4 KiB files (raw, one rank, storage.fsync=false, 100 folders)
- read-4k    : the same generation, then one epoch of reads of them on one rank (mode=train, no
               compute): its peak RSS is the process's own, the read epoch's time is summary.json's train.wall_s
- apart-4k   : the same two in two processes: mode=generate, then mode=train over the dataset it
               left (not generated again): the row's peak and time are the reading process's, with the
               generating process's beside them (generate_s, generate_peak_rss_mib), so one
               generation gives both phases' peaks
- fio-gen-4k : fio writing N x 4 KiB files over 100 folders, one after another (psync, no fsync):
               the C baseline of gen-4k (`directory=a:b:...` spreads fio's files over them)
- fio-read-4k: fio reading those files (psync, one open file at a time): the baseline of read-4k's epoch

read-4k's reader is unet3d's (4 worker processes, a batch of 8 files handed to the training
process through shared memory, as torch's DataLoader does); `--read-threads 0` reads in the
training process itself, one file after another as fio's one job does: the like-for-like of the
emulator's own cost per file against fio's.

Per-file costs are compared as marginal costs, (time at n2 - time at n1) / (n2 - n1), so that the
start-up of each (the interpreter and imports, fio's set-up) drops out.

Each figure is divided by N: a flat per-unit column is linear growth. Nothing is asserted;
the table and benchmarks/results/scaling_costs.json are the output.

Peak RSS against N is the check of issue 26's constant memory (10M files within 1.2x of 10k for
plan, generate and one epoch of reads). Nothing a rank holds grows with N now: the event recorder
spills its events and paths a block at a time (storage/event_spill.py), the manifest's sizes go
through a scratch file, the read order is computed a block at a time from keyed permutations
(plan/permutation.py), and reader worker processes send each message's paths with it instead of
a table per worker (engine/workers.py). What fills with N up to a bound: the recorder's path cache
(2^14 to 2^15 paths) and each worker's last 2^15 + 4096 names, reached near 36k files.
benchmarks/README.md, "Constant memory", has the measurements.

10M files of 4 KiB are 40 GB: more than this machine's tmpfs holds, and on its disk the reading
process's first stat of each cold inode took hours. Files of 128 bytes or less fit in an ext4
inode with the inline_data feature, so a file system of 10M such files is its inode table (2.6 GB)
and folders, and can live in memory (as root; `--direct-io` keeps the loop device from caching
the image a second time):

    truncate -s 20G /dev/shm/m10.img
    mkfs.ext4 -q -O inline_data,^has_journal -I 256 -N 10500000 /dev/shm/m10.img
    mount "$(losetup -f --show --direct-io=on /dev/shm/m10.img)" /mnt/m10
    .venv/bin/python benchmarks/scaling_costs.py --kinds apart-4k --apart-4k 10000,10000000 \
        --file-size 128 --dir /mnt/m10

    .venv/bin/python benchmarks/scaling_costs.py                  # the default sizes
    .venv/bin/python benchmarks/scaling_costs.py --generate 10000,100000,1000000 --rounds 1
    .venv/bin/python benchmarks/scaling_costs.py --kinds apart-4k,plan-data --apart-4k 10000,1000000 \
        --plan-files 10000,10000000 --dir /dev/shm     # the constant-memory check, per phase
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, environment, median, table, tool, write_json  # noqa: E402

TIME = shutil.which("time") or "/usr/bin/time"


def measured(command: list[str], cwd: str) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one command, from GNU time; exits on failure."""
    import subprocess

    report = Path(cwd) / "time.txt"
    done = subprocess.run([TIME, "-f", "%e %M", "-o", str(report), *command], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    wall, rss_kib = report.read_text().split()[-2:]
    return float(wall), int(rss_kib) * 1024


def case_command(kind: str, n: int, root: Path, file_size: str = "4KiB", read_threads: int | None = None) -> tuple[list[str], list[str]]:
    """(launcher prefix, dlio_ckpt arguments) for one case of size n; `file_size`: the gen-4k, read-4k
    and apart-4k cases' file size (4 KiB unless --file-size says otherwise); `read_threads`: their
    reader's (None: unet3d's 4 worker processes; 0: the training process reads, as fio's one job)."""
    common = [f"storage.root={root}/store", f"hydra.run.dir={root}/run", "progress=false"]
    if kind == "plan-ckpt":
        return [], ["workload=llama3_70b", "mode=plan", f"world.size={n}", "model.parallelism.data=0", *common]
    tiny = ["dataset.format=raw", f"dataset.num_files_train={n}", "dataset.record_length_bytes=64",
            "dataset.record_length_bytes_stdev=0", "dataset.record_length_bytes_min=1",
            "dataset.num_subfolders_train=100", "checkpoint.enabled=false"]
    if kind == "plan-data":
        return [], ["workload=unet3d", "mode=plan", *tiny, *common]
    if kind == "generate":
        return [], ["workload=unet3d", "mode=generate", *tiny, *common]
    if kind == "generate-nosync":  # the emulator's own cost per file, without the file system's fsync
        return [], ["workload=unet3d", "mode=generate", "storage.fsync=false", *tiny, *common]
    if kind in ("gen-4k", "read-4k", "apart-4k"):
        four_k = ["dataset.format=raw", f"dataset.num_files_train={n}", f"dataset.record_length_bytes={file_size}",
                  "dataset.record_length_bytes_stdev=0", "dataset.record_length_bytes_min=1",
                  "dataset.num_subfolders_train=100", "checkpoint.enabled=false", "storage.fsync=false", *common]
        if kind == "gen-4k":
            return [], ["workload=unet3d", "mode=generate", *four_k]
        if kind == "apart-4k":  # the reading process's command; run_case generates first
            four_k = [f"hydra.run.dir={root}/run-read" if a.startswith("hydra.run.dir=") else a for a in four_k]
        threads = [] if read_threads is None else [f"reader.read_threads={read_threads}"]
        return [], ["workload=unet3d", "mode=train", "train.epochs=1", "train.computation_time=0",
                    "reader.batch_size=8", *threads, *four_k]
    if kind == "small-np8":
        return [tool("mpirun"), "-np", "8"], [
            "workload=unet3d", "dataset.format=raw", f"dataset.num_files_train={n}", "dataset.record_length_bytes=4KiB",
            "dataset.record_length_bytes_stdev=0", "dataset.record_length_bytes_min=1",
            "dataset.num_subfolders_train=0", "checkpoint.enabled=false", "train.epochs=1", "train.computation_time=0",
            "reader.batch_size=8", *common]
    raise ValueError(kind)


def fio_command(kind: str, n: int, root: Path) -> list[str]:
    """fio over n x 4 KiB files spread over 100 folders (fio-gen-4k writes them, fio-read-4k writes
    them in an untimed first command, then reads them)."""
    folders = [root / "fio" / f"{i:02d}" for i in range(100)]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    return ["fio", "--name=small", "--directory=" + ":".join(map(str, folders)), f"--nrfiles={n}",
            "--filesize=4k", "--bs=4k", "--ioengine=psync", "--openfiles=1", "--file_service_type=sequential",
            "--fallocate=none", "--create_on_open=1", "--rw=write" if kind == "fio-gen-4k" else "--rw=read",
            "--output-format=terse"]


def run_case(kind: str, n: int, root: Path, file_size: str = "4KiB",
             read_threads: int | None = None) -> tuple[float, int, float | None, tuple[float, int] | None]:
    """(wall s, peak RSS bytes, the read epoch's s where the case reads after generating, the
    generating process's (wall s, peak RSS bytes) where that is a process of its own) of one run."""
    if kind.startswith("fio-"):
        if kind == "fio-read-4k":  # the files to read, written first (untimed)
            measured(fio_command("fio-gen-4k", n, root), str(root))
        wall, peak = measured(fio_command(kind, n, root), str(root))
        return wall, peak, None, None
    generated = None
    if kind == "apart-4k":  # the dataset first, by a process of its own
        generated = measured([tool("dlio_ckpt"), *case_command("gen-4k", n, root, file_size)[1]], str(root))
    prefix, arguments = case_command(kind, n, root, file_size, read_threads)
    wall, peak = measured([*prefix, tool("dlio_ckpt"), *arguments], str(root))
    epoch = None
    if kind in ("read-4k", "apart-4k"):
        summary = json.loads(next((root / ("run" if kind == "read-4k" else "run-read")).rglob("summary.json")).read_text())
        epoch = float(summary["train"]["wall_s"]) if "train" in summary else None
    return wall, peak, epoch, generated


def sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan-ranks", default="1024,4096,16384")
    parser.add_argument("--plan-files", default="10000,100000,1000000")
    parser.add_argument("--generate", default="10000,100000")
    parser.add_argument("--generate-nosync", default="10000,100000,1000000")
    parser.add_argument("--small-np8", default="5000,20000,80000")
    parser.add_argument("--small-4k", default="", help="counts for gen-4k, read-4k and their fio baselines "
                        "(e.g. 10000,100000)")
    parser.add_argument("--apart-4k", default="", help="counts for apart-4k (generate, then read, in two processes)")
    parser.add_argument("--kinds", default="", help="only these cases (comma-separated, e.g. gen-4k,fio-gen-4k)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each case (median reported)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the files go (a disk's folder, "
                        "or /dev/shm to see the programs' own cost without the file system's)")
    parser.add_argument("--file-size", default="4KiB", help="the file size of gen-4k, read-4k and apart-4k "
                        "(e.g. 128 for 10M files that an ext4 with inline_data keeps in its inodes; the fio cases stay 4 KiB)")
    parser.add_argument("--read-threads", type=int, default=None, help="read-4k and apart-4k: reader.read_threads "
                        "(default: unet3d's 4 worker processes; 0: the training process reads each file itself, as fio's one job does)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "scaling_costs.json"))
    args = parser.parse_args()
    cases = [("plan-ckpt", n) for n in sizes(args.plan_ranks)] + [("plan-data", n) for n in sizes(args.plan_files)]
    cases += [("generate", n) for n in sizes(args.generate)]
    cases += [("generate-nosync", n) for n in sizes(args.generate_nosync)] + [("small-np8", n) for n in sizes(args.small_np8)]
    cases += [(kind, n) for n in sizes(args.small_4k) for kind in ("gen-4k", "fio-gen-4k", "read-4k", "fio-read-4k")]
    cases += [("apart-4k", n) for n in sizes(args.apart_4k)]
    if args.kinds:
        cases = [(kind, n) for kind, n in cases if kind in args.kinds.split(",")]
    results = []
    env = environment(args.dir)  # the load before the first case
    base = tempfile.mkdtemp(prefix="scaling_costs-", dir=args.dir)
    try:
        for kind, n in cases:
            walls, peaks, epochs, generations = [], [], [], []
            for _ in range(args.rounds):
                root = Path(tempfile.mkdtemp(dir=base))
                os.sync()  # the last case's files and their removal written back first, not during this one
                wall, peak, epoch, generated = run_case(kind, n, root, args.file_size, args.read_threads)
                generations.append(generated)
                walls.append(wall)
                peaks.append(peak)
                epochs.append(epoch)
                shutil.rmtree(root, ignore_errors=True)
            row = {"case": kind, "n": n, "wall_s": walls, "peak_rss_bytes": peaks, "median_s": median(walls),
                   "us_per_unit": median(walls) / n * 1e6, "peak_rss_mib": max(peaks) / (1 << 20),
                   "mpirun": kind == "small-np8"}
            if kind in ("read-4k", "apart-4k") and None not in epochs:
                row["epoch_s"] = median(epochs)
            if kind == "apart-4k":
                row["generate_s"] = median([g[0] for g in generations])
                row["generate_peak_rss_mib"] = max(g[1] for g in generations) / (1 << 20)
            results.append(row)
            print(f"{kind:15s} n={n:>9,}  {row['median_s']:8.2f} s  {row['us_per_unit']:9.1f} us/unit  "
                  f"peak {row['peak_rss_mib']:7.1f} MiB"
                  + (f"  (generating: {row['generate_s']:.2f} s, peak {row['generate_peak_rss_mib']:.1f} MiB)"
                     if "generate_s" in row else ""), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows = [[r["case"], f"{r['n']:,}", f"{r['median_s']:.2f}", f"{r['us_per_unit']:.1f}",
             "(mpirun)" if r["mpirun"] else f"{r['peak_rss_mib']:.0f}"] for r in results]
    print(table(rows, ["case", "n", "wall s (median)", "us per unit", "peak RSS MiB"]))
    marginal = marginal_costs(results)
    if marginal:
        print(table([[kind, f"{a:,} -> {b:,}", f"{us:.1f}"] for kind, a, b, us in marginal],
                    ["case", "n", "marginal us a file"]))
    write_json(Path(args.out), {"environment": env, "loadavg_at_end": os.getloadavg(),
                                "rounds": args.rounds, "file_size": args.file_size, "read_threads": args.read_threads,
                                "results": results,
                                "marginal_us_per_file": [dict(zip(("case", "n1", "n2", "us"), m)) for m in marginal]})


def marginal_costs(results: list[dict]) -> list[tuple[str, int, int, float]]:
    """(case, n1, n2, microseconds a file between them) for each case measured at two or more
    sizes (the smallest and the largest); read-4k gives its read epoch's (train_wall_s) as well."""
    out = []
    for kind in dict.fromkeys(r["case"] for r in results):
        rows = sorted((r for r in results if r["case"] == kind), key=lambda r: r["n"])
        if len(rows) < 2:
            continue
        low, high = rows[0], rows[-1]
        out.append((kind, low["n"], high["n"], (high["median_s"] - low["median_s"]) / (high["n"] - low["n"]) * 1e6))
        if "epoch_s" in low and "epoch_s" in high:
            out.append((f"{kind} epoch", low["n"], high["n"],
                        (high["epoch_s"] - low["epoch_s"]) / (high["n"] - low["n"]) * 1e6))
    return out


if __name__ == "__main__":
    main()
