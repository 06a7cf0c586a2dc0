#!/usr/bin/env python3
"""dlio_ckpt dataset generation against fio's sequential write of the same files: a ratio.

How the two are matched:
- Files: dlio_ckpt `mode=generate` of N raw files of one sample each (no header: the bytes on
  disk are the payload) vs one fio job writing N files of the same size one after the other
  (`nrfiles=N`, `filesize`, `file_service_type=sequential`).
- Calls: dlio_ckpt writes `generate.write_chunk_bytes` per call (default 4 MiB) vs fio `bs` of the
  same size, psync engine (pwrite), one writer.
- Durability: dlio_ckpt fsyncs each file (`storage.fsync=true`), each folder once and the
  dataset manifest last (engine/generate.py) vs fio `fsync_on_close=1`; fio does not preallocate
  (`fallocate=none`), as dlio_ckpt does not.
- `--baseline BIN` adds a third tool to every round: another dlio_ckpt (an older checkout's, say
  ../older-checkout/.venv/bin/dlio_ckpt), so a change is measured against its predecessor and fio under
  the same noise.
- Figures: dlio_ckpt bytes written / `generate_s` from summary.json (the rank's generation
  time, without start-up) vs fio's bandwidth (io_bytes / runtime).

Runs alternate (and swap which goes first) so noise on a shared machine falls on both; the table
shows medians, the ratio of medians and the per-pair ratios (the spread). Every run, of either
tool, starts after the previous run's files are deleted, a `sync` and a pause of --pause seconds
(default 10): on this VM pages freed by a deletion stay cheap to write for about a second, until
the balloon driver reports them to the host, and fio starts within milliseconds while dlio_ckpt
takes a second or two to start, so without the pause fio wrote into warm pages and dlio_ckpt into
cold ones (_common.SETTLE_S).

    .venv/bin/python benchmarks/generate_vs_fio.py --quick
    .venv/bin/python benchmarks/generate_vs_fio.py --files 48 --file-size 32MiB --repeats 5
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (MIB, SETTLE_S, Workdir, environment, fio_size, human, load_json, median,  # noqa: E402
                     parse_size, ratio, run, settle, table, tool, write_json)

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="16 x 8 MiB, 3 repeats")
    p.add_argument("--files", type=int, default=48)
    p.add_argument("--file-size", default="32MiB")
    p.add_argument("--bs", default="4MiB", help="generate.write_chunk_bytes and fio --bs (default 4MiB)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--pause", type=float, default=SETTLE_S,
                   help=f"seconds after each run's clean-up and sync before the next run (default {SETTLE_S:g}; see _common.SETTLE_S)")
    p.add_argument("--baseline", default="", help="another dlio_ckpt executable run in every round too (before/after)")
    p.add_argument("--tmp", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--out", default=str(HERE / "results" / "generate_vs_fio.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.file_size, args.repeats = 16, "8MiB", 3
    args.file_bytes, args.bs_bytes = parse_size(args.file_size), parse_size(args.bs)
    return args


def run_dlio(args, work: Path, i: int, log: Path, binary: str = "") -> dict:
    root, run_dir = work / f"dlio-{i}", work / f"run-{i}"
    proc, wall = run([binary or tool("dlio_ckpt"), "workload=unet3d", "mode=generate", "progress=false", "dataset.format=raw",
                      f"dataset.num_files_train={args.files}", "dataset.num_files_eval=0", "dataset.num_samples_per_file=1",
                      f"dataset.record_length_bytes={args.file_bytes}", "dataset.record_length_bytes_stdev=0",
                      "dataset.folder=data", "checkpoint.enabled=false", f"generate.write_chunk_bytes={human(args.bs_bytes)}",
                      f"storage.root={root}", f"hydra.run.dir={run_dir}"], log=log)
    if proc.returncode != 0:
        sys.exit(f"dlio_ckpt failed; see {log}")
    dataset = load_json(run_dir / "summary.json")["dataset"]
    written = args.files * args.file_bytes
    shutil.rmtree(root)
    shutil.rmtree(run_dir)
    settle(args.pause)
    return {"seconds": dataset["generate_s"], "mib_per_s": written / MIB / dataset["generate_s"], "wall_s": wall,
            "bytes_written": dataset.get("generate_bytes_written")}


def run_fio(args, work: Path, i: int, log: Path) -> dict:
    folder = work / f"fio-{i}"
    folder.mkdir()
    out = work / f"fio-{i}.json"
    proc, wall = run(["fio", "--output-format=json", f"--output={out}", "--name=generate", f"--directory={folder}",
                      "--rw=write", f"--bs={fio_size(args.bs_bytes)}", "--ioengine=psync", f"--nrfiles={args.files}",
                      f"--filesize={fio_size(args.file_bytes)}", f"--size={fio_size(args.files * args.file_bytes)}",
                      "--file_service_type=sequential", "--fsync_on_close=1", "--fallocate=none", "--numjobs=1"], log=log)
    if proc.returncode != 0:
        sys.exit(f"fio failed; see {log}")
    job = load_json(out)["jobs"][0]["write"]
    shutil.rmtree(folder)
    settle(args.pause)
    return {"seconds": job["runtime"] / 1000, "mib_per_s": job["io_bytes"] / MIB / (job["runtime"] / 1000), "wall_s": wall,
            "bytes_written": job["io_bytes"]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not shutil.which("fio"):
        sys.exit("fio not found (Debian: apt-get install fio)")
    dl, fi, base = [], [], []
    with Workdir(args.tmp, args.keep, "dlio_generate_vs_fio-") as work:
        log = work / "log.txt"
        env = environment(str(work))
        print(f"{args.files} x {human(args.file_bytes)} raw files, {human(args.bs_bytes)} per write, fsync per file; "
              f"{args.repeats} alternating rounds, {args.pause:g} s pause before each run", flush=True)
        settle(args.pause)
        tools = ("dlio", "fio", "baseline") if args.baseline else ("dlio", "fio")
        for i in range(args.repeats):
            shift = i % len(tools)  # rotate who goes first
            for who in tools[shift:] + tools[:shift]:
                if who == "dlio":
                    dl.append(run_dlio(args, work, i, log))
                elif who == "baseline":
                    base.append(run_dlio(args, work, i, log, args.baseline))
                else:
                    fi.append(run_fio(args, work, i, log))
            extra = f", baseline {base[-1]['mib_per_s']:.0f} MiB/s" if base else ""
            print(f"  round {i}: dlio_ckpt {dl[-1]['mib_per_s']:.0f} MiB/s, fio {fi[-1]['mib_per_s']:.0f} MiB/s{extra}"
                  f" (ratio {ratio(dl[-1]['mib_per_s'], fi[-1]['mib_per_s']):.2f})", flush=True)
    pairs = [ratio(d["mib_per_s"], f["mib_per_s"]) for d, f in zip(dl, fi)]
    base_pairs = [ratio(b["mib_per_s"], f["mib_per_s"]) for b, f in zip(base, fi)]
    med = {"dlio_mib_per_s": median([d["mib_per_s"] for d in dl]), "fio_mib_per_s": median([f["mib_per_s"] for f in fi])}
    result = {"benchmark": "generate_vs_fio", "params": {k: v for k, v in vars(args).items() if k != "out"},
              "environment": env, "dlio_ckpt": dl, "fio": fi, "median": med,
              "ratio": ratio(med["dlio_mib_per_s"], med["fio_mib_per_s"]), "pair_ratios": pairs}
    if base:
        med["baseline_mib_per_s"] = median([b["mib_per_s"] for b in base])
        result.update(baseline=base, baseline_ratio=ratio(med["baseline_mib_per_s"], med["fio_mib_per_s"]),
                      baseline_pair_ratios=base_pairs)
    write_json(Path(args.out), result)
    print(table([["dlio_ckpt generate", f"{med['dlio_mib_per_s']:.0f}"], ["fio sequential write", f"{med['fio_mib_per_s']:.0f}"]],
                ["tool", "MiB/s (median)"]))
    print(f"ratio of medians {result['ratio']:.2f}; per pair {min(pairs):.2f}..{max(pairs):.2f}; results: {args.out}")
    if base:
        print(f"baseline ({args.baseline}): ratio of medians {result['baseline_ratio']:.2f}; "
              f"per pair {min(base_pairs):.2f}..{max(base_pairs):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
