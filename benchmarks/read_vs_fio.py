#!/usr/bin/env python3
"""dlio_ckpt training-read bandwidth against fio reading the same files: a ratio, not a score.

Why: dlio_ckpt claims its read figures are what the storage did. The check is to let fio, the
reference I/O generator, read exactly the same files with the same block size and the same
number of concurrent readers, and to report dlio_ckpt / fio. A ratio near 1 says dlio_ckpt's
Python reader is not the bottleneck and its figure can be trusted as a storage figure; a ratio
well below 1 says how much of the storage's bandwidth an emulated training loop leaves unused.

How the two are matched:
- Data: dlio_ckpt generates the dataset (raw format by default: one sample per file, no header, so
  the bytes fio reads are exactly the bytes dlio_ckpt reads). Both tools then read the same files.
- Block size: dlio_ckpt `reader.transfer_size=BS` (one pread per BS) vs fio `--bs=BS`, psync engine
  (pread), queue depth 1 per worker, as dlio_ckpt's reader threads issue one read at a time.
- Parallelism: dlio_ckpt `reader.read_threads=N` (x `--ranks` MPI ranks) vs N fio threads
  (`thread=1`); each fio job reads its own share of the files sequentially
  (file_service_type=sequential), as each dlio_ckpt reader thread reads whole samples.
  `reader.batch_size=1` (default here) so each dlio_ckpt thread reads one file at a time.
- Volume: dlio_ckpt `train.epochs=E` vs fio `loops=E`; both counts are checked against the bytes on disk.
- Compute: `train.computation_time=0`, so dlio_ckpt reads as fast as it can.

Two modes:
- buffered: a cache-warming pass first, then both tools read from the page cache (fio with
  `invalidate=0`; by default fio drops a file's cached pages before reading it, which would make
  fio read the disk while dlio_ckpt read memory). The residency of the files in the page cache is
  checked with fincore before and after and reported. This measures the per-byte CPU cost of each
  tool's read path, not the storage.
- direct: `storage.direct_io=true` vs fio `--direct=1`. The honest storage comparison: both bypass
  the page cache, whatever the dataset's size relative to memory.

dlio_ckpt reports two figures, both compared with fio's bandwidth (io_bytes / runtime):
- `train.read_mib_per_s`: bytes read / time inside read calls (the union over threads): the
  storage-side figure.
- bytes read / `train.wall_s`: end to end, including the reader's Python work between reads
  (opening files, batching, the training loop).

Runs alternate dlio_ckpt and fio (and which goes first) so that noise from other work on a shared
machine falls on both; the table shows medians over --repeats and the ratio of medians.

    .venv/bin/python benchmarks/read_vs_fio.py --quick
    .venv/bin/python benchmarks/read_vs_fio.py                      # ~1.5 GiB, buffered and O_DIRECT
    .venv/bin/python benchmarks/read_vs_fio.py --direct --threads 1,2,4 --bs 4MiB
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (MIB, Workdir, environment, fio_size, human, load_json, median, parse_size,  # noqa: E402
                     ratio, resident_bytes, run, table, tool, write_json)

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small version (16 x 8 MiB, 3 repeats, < 1 minute)")
    p.add_argument("--files", type=int, default=48, help="dataset files (default 48)")
    p.add_argument("--file-size", default="32MiB", help="bytes per file = one sample (default 32MiB)")
    p.add_argument("--format", default="raw", choices=["raw", "npy"],
                   help="dataset format; raw reads exactly the file's bytes (npy adds a 128-byte header fio also reads)")
    p.add_argument("--bs", default="1MiB", help="transfer size: reader.transfer_size and fio --bs (default 1MiB)")
    p.add_argument("--threads", default="1,2", help="comma list of reader threads = fio jobs (default 1,2)")
    p.add_argument("--ranks", type=int, default=1, help="MPI ranks for dlio_ckpt (fio jobs = ranks x threads)")
    p.add_argument("--batch-size", type=int, default=1, help="reader.batch_size (default 1: one file per thread at a time)")
    p.add_argument("--epochs", type=int, default=0, help="read passes per run (default: 3 buffered, 1 direct)")
    p.add_argument("--repeats", type=int, default=5, help="alternating dlio_ckpt/fio pairs per case (default 5)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--direct", action="store_true", help="only O_DIRECT (storage.direct_io=true, fio --direct=1)")
    mode.add_argument("--buffered", action="store_true", help="only buffered reads from a warm page cache")
    p.add_argument("--tmp", default=None, help="parent folder for the data (default: the system temp folder)")
    p.add_argument("--keep", action="store_true", help="keep the data folder")
    p.add_argument("--out", default=str(HERE / "results" / "read_vs_fio.json"), help="JSON results path")
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.file_size, args.repeats, args.threads = 16, "8MiB", 3, "2"
    args.file_bytes = parse_size(args.file_size)
    args.bs_bytes = parse_size(args.bs)
    args.thread_list = [int(t) for t in str(args.threads).split(",") if t]
    args.modes = ["direct"] if args.direct else ["buffered"] if args.buffered else ["buffered", "direct"]
    return args


def dlio_overrides(args: argparse.Namespace, root: Path, run_dir: Path, *, direct: bool, threads: int, epochs: int,
                   mode: str = "train") -> list[str]:
    return [
        "workload=unet3d", f"mode={mode}", "progress=false",
        f"dataset.format={args.format}", f"dataset.num_files_train={args.files}", "dataset.num_files_eval=0",
        "dataset.num_samples_per_file=1", f"dataset.record_length_bytes={args.file_bytes}",
        "dataset.record_length_bytes_stdev=0", "dataset.folder=data",
        "checkpoint.enabled=false", "evaluation.enabled=false",
        "train.computation_time=0", "train.computation_time_stdev=0", f"train.epochs={epochs}",
        f"reader.read_threads={threads}", f"reader.transfer_size={args.bs_bytes}", f"reader.batch_size={args.batch_size}",
        f"storage.direct_io={'true' if direct else 'false'}", f"storage.root={root}", f"hydra.run.dir={run_dir}",
    ]


def dlio_cmd(args: argparse.Namespace, overrides: list[str]) -> list[str]:
    if args.ranks > 1:
        return [tool("mpirun"), "-n", str(args.ranks), tool("dlio_ckpt"), *overrides]
    return [tool("dlio_ckpt"), *overrides]


def fio_jobfile(path: Path, files: list[str], jobs: int, bs: int, direct: bool, loops: int) -> None:
    """One fio job per dlio_ckpt reader thread, each with its own share of the files."""
    lines = [
        "[global]", "rw=read", f"bs={fio_size(bs)}", "ioengine=psync", "iodepth=1", f"direct={int(direct)}",
        # Buffered: keep the warm cache (fio's default invalidate=1 would drop it before reading).
        f"invalidate={int(direct)}", "thread=1", "group_reporting=1", f"loops={loops}",
        "file_service_type=sequential", "",
    ]
    for j in range(jobs):
        share = files[j::jobs]
        lines += [f"[reader{j}]", "filename=" + ":".join(share), ""]
    path.write_text("\n".join(lines))


def warm(files: list[str]) -> None:
    """Read every file once through the page cache."""
    buf = bytearray(8 * MIB)
    for name in files:
        with open(name, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def run_dlio(args, work: Path, case: str, i: int, direct: bool, threads: int, epochs: int, expect: int, log: Path) -> dict:
    run_dir = work / "runs" / f"{case}-dlio-{i}"
    proc, wall = run(dlio_cmd(args, dlio_overrides(args, work, run_dir, direct=direct, threads=threads, epochs=epochs)), log=log)
    s = load_json(run_dir / "summary.json")
    t = s["train"]
    result = {
        "bytes_read": t["bytes_read"],
        "read_s_max": t["read_s_max"],
        "read_mib_per_s": t["read_mib_per_s"],
        "train_wall_s": t["wall_s"],
        "wall_mib_per_s": t["bytes_read"] / t["wall_s"] / MIB if t["wall_s"] else None,
        "process_wall_s": wall,
        "reads": t.get("reads"),
        "dataset_reused": s["dataset"]["reused"],
        "bytes_match_disk": t["bytes_read"] == expect,
        "warnings": s.get("warnings", []),
    }
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def run_fio(work: Path, case: str, i: int, files: list[str], jobs: int, bs: int, direct: bool, loops: int,
            expect: int, log: Path) -> dict:
    jobfile = work / f"{case}.fio"
    fio_jobfile(jobfile, files, jobs, bs, direct, loops)
    out = work / f"{case}-fio-{i}.json"
    _, wall = run(["fio", "--output-format=json", f"--output={out}", str(jobfile)], log=log)
    data = load_json(out)
    read = data["jobs"][0]["read"]
    out.unlink()
    return {
        "bytes_read": read["io_bytes"],
        "runtime_s": read["runtime"] / 1000.0,
        "bw_mib_per_s": read["bw_bytes"] / MIB,
        "process_wall_s": wall,
        "bytes_match_disk": read["io_bytes"] == expect,
        "clat_mean_us": read.get("clat_ns", {}).get("mean", 0) / 1000.0,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not shutil.which("fio"):
        sys.exit("fio not found (Debian: apt-get install fio)")
    results: dict = {"benchmark": "read_vs_fio", "params": {k: v for k, v in vars(args).items() if k not in ("out",)}, "cases": []}
    rows = []
    with Workdir(args.tmp, args.keep, "dlio_read_vs_fio-") as work:
        results["environment"] = environment(str(work))
        log = work / "commands.log"
        print(f"data in {work}; generating {args.files} x {human(args.file_bytes)} {args.format} files with dlio_ckpt ...", flush=True)
        gen_dir = work / "runs" / "generate"
        run(dlio_cmd(args, dlio_overrides(args, work, gen_dir, direct=False, threads=1, epochs=1, mode="generate")), log=log)
        gen = load_json(gen_dir / "summary.json")["dataset"]
        folder = Path(gen["folder"])
        files = sorted(str(p) for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
        on_disk = sum(Path(f).stat().st_size for f in files)
        results["dataset"] = {"folder_files": len(files), "bytes_on_disk": on_disk, "generate_s": gen["generate_s"],
                              "generate_mib_per_s": gen["bytes_on_disk"] / gen["generate_s"] / MIB}
        print(f"dataset: {len(files)} files, {on_disk / MIB:.1f} MiB on disk, generated at "
              f"{results['dataset']['generate_mib_per_s']:.0f} MiB/s", flush=True)
        # dlio_ckpt reads the sample bytes; for raw that is the whole file, npy skips its header.
        sample_bytes = args.files * args.file_bytes
        for mode in args.modes:
            direct = mode == "direct"
            epochs = args.epochs or (1 if direct else 3)
            if not direct:
                warm(files)
            for threads in args.thread_list:
                jobs = threads * args.ranks
                case = f"{mode}-t{threads}"
                print(f"{case}: {args.repeats} x (dlio_ckpt, fio), {epochs} pass(es) of {sample_bytes / MIB:.0f} MiB, "
                      f"bs {human(args.bs_bytes)}, {jobs} reader(s) ...", flush=True)
                cached_before = resident_bytes(files)
                dl, fi = [], []
                for i in range(args.repeats):
                    order = ("dlio", "fio") if i % 2 == 0 else ("fio", "dlio")
                    for which in order:
                        if which == "dlio":
                            dl.append(run_dlio(args, work, case, i, direct, threads, epochs, sample_bytes * epochs, log))
                        else:
                            fi.append(run_fio(work, case, i, files, jobs, args.bs_bytes, direct, epochs, on_disk * epochs, log))
                cached_after = resident_bytes(files)
                med = {
                    "dlio_read_mib_per_s": median([r["read_mib_per_s"] for r in dl]),
                    "dlio_wall_mib_per_s": median([r["wall_mib_per_s"] for r in dl]),
                    "dlio_train_wall_s": median([r["train_wall_s"] for r in dl]),
                    "dlio_process_wall_s": median([r["process_wall_s"] for r in dl]),
                    "fio_bw_mib_per_s": median([r["bw_mib_per_s"] for r in fi]),
                    "fio_runtime_s": median([r["runtime_s"] for r in fi]),
                    "fio_process_wall_s": median([r["process_wall_s"] for r in fi]),
                }
                case_result = {
                    "case": case, "mode": mode, "threads": threads, "ranks": args.ranks, "fio_jobs": jobs,
                    "bs_bytes": args.bs_bytes, "epochs": epochs, "bytes_per_run": sample_bytes * epochs,
                    "page_cache_resident_bytes_before": cached_before, "page_cache_resident_bytes_after": cached_after,
                    "dlio_ckpt": dl, "fio": fi, "median": med,
                    "ratio_read_mib_per_s": ratio(med["dlio_read_mib_per_s"], med["fio_bw_mib_per_s"]),
                    "ratio_wall_mib_per_s": ratio(med["dlio_wall_mib_per_s"], med["fio_bw_mib_per_s"]),
                    "pair_ratios_read": [ratio(a["read_mib_per_s"], b["bw_mib_per_s"]) for a, b in zip(dl, fi)],
                    "bytes_match": all(r["bytes_match_disk"] for r in dl) and all(r["bytes_match_disk"] for r in fi),
                }
                results["cases"].append(case_result)
                cache = "n/a" if cached_before is None else f"{cached_before / on_disk:.0%}->{cached_after / on_disk:.0%}"
                rows.append([case, str(jobs), human(args.bs_bytes),
                             f"{med['dlio_read_mib_per_s']:.0f}", f"{med['dlio_wall_mib_per_s']:.0f}", f"{med['fio_bw_mib_per_s']:.0f}",
                             f"{case_result['ratio_read_mib_per_s']:.2f}", f"{case_result['ratio_wall_mib_per_s']:.2f}",
                             cache, "yes" if case_result["bytes_match"] else "NO"])
                write_json(Path(args.out), results)  # partial results survive an interrupted run
    header = ["case", "jobs", "bs", "dlio read MiB/s", "dlio wall MiB/s", "fio MiB/s",
              "ratio read", "ratio wall", "cached", "bytes ok"]
    print()
    print(table(rows, header))
    print(f"\nmedians of {args.repeats} alternating runs; ratio = dlio_ckpt / fio; 'cached' = share of the files in the "
          f"page cache before -> after the case (fincore).\nresults: {args.out}")
    write_json(Path(args.out), results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
