#!/usr/bin/env python3
"""dlio_ckpt sharded checkpoint write bandwidth against fio writing the same bytes: a ratio.

Why: a checkpoint figure is only as good as the write path behind it. fio, with the same number of
processes each writing the same bytes in the same chunk size and an fsync at the end, is what the
storage can do; dlio_ckpt / fio says how close the emulator's checkpoint engine comes to it, and
so whether `checkpoint.write_gib_per_s` describes the storage or the emulator.

How the two are matched:
- dlio_ckpt: `mpirun -n P dlio_ckpt workload=unet3d mode=checkpoint checkpoint.strategy=sharded
  model.model_size_bytes=S model.parallelism.zero_stage=3`. ZeRO-3 because unet3d is an explicit
  model and, at ZeRO-0, only data-parallel rank 0 owns (and writes) the state: a "sharded"
  checkpoint on P ranks would then be one writer. At ZeRO-3 every rank writes S/P. The per-rank
  bytes come from `mode=plan` first, so fio writes what each rank writes, in whole `bs` blocks
  (up to 4 MiB less a rank: fio_bytes, which also keeps fio from laying the file out first);
  the figures are rates, each tool's bytes over its time.
- fio: one job (a process, as an MPI rank is) per writing rank, `rw=write`, `bs` = dlio_ckpt's
  `checkpoint.write_chunk_bytes`, psync (pwrite), `end_fsync=1` (dlio_ckpt fsyncs every file before
  it counts as written; its `write_s` runs from a rank's first open to its last fsync), each run
  into new files (dlio_ckpt writes every checkpoint into a new folder, so block allocation is part
  of both; the W sets of files are all kept until the round ends, as dlio_ckpt keeps its W
  checkpoints, since later writes on this VM's disk slow down as written data accumulates), and
  `fallocate=none`: fio preallocates its files by default, which dlio_ckpt and the
  frameworks do not, and which made fio's figure look better here.
- Figures: dlio_ckpt `checkpoint.write_gib_per_s` = bytes / mean over checkpoints of the slowest
  rank's time; fio: total bytes / mean over W runs of the slowest job's runtime (fio's runtime for
  a job with end_fsync includes the fsync). Also the MLPerf-style minimum over ranks of per-rank
  rate for both.
- `--direct`: dlio_ckpt `storage.direct_io=true` vs fio `--direct=1`.
- dlio_ckpt checksums each file as it writes (xxh3_128 by default). That CPU work is part of its
  write path; `--checksum none` isolates it.

Runs alternate dlio_ckpt and fio (and which goes first) on a shared machine, after one untimed
warm-up round; the table shows medians over --repeats and the ratio of medians. Files are deleted
after each run, then `sync` and a pause of --pause seconds (default 10), the same before every
run of either tool: one tool's writeback and discards must not land in the other's timing, and on
this VM pages freed by the clean-up stay cheap to write for about a second (until the balloon
driver reports them to the host), which favoured fio, starting within milliseconds, over
dlio_ckpt, starting after a second or two of interpreter and mpirun start-up (_common.SETTLE_S).

    .venv/bin/python benchmarks/checkpoint_vs_fio.py --quick
    .venv/bin/python benchmarks/checkpoint_vs_fio.py                 # 2 ranks, 1 GiB, 3 writes x 3 repeats
    .venv/bin/python benchmarks/checkpoint_vs_fio.py --ranks 1 --model-size 512MiB --direct
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (GIB, MIB, SETTLE_S, Workdir, environment, fio_size, human, load_json, median,  # noqa: E402
                     parse_size, ratio, run, settle, table, tool, write_json)

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small version (256 MiB, 2 writes, 2 repeats, < 1 minute)")
    p.add_argument("--ranks", type=int, default=2, help="MPI ranks = fio jobs (default 2)")
    p.add_argument("--model-size", default="1GiB", help="model.model_size_bytes (default 1GiB)")
    p.add_argument("--writes", type=int, default=3, help="checkpoints per dlio_ckpt run = fio runs per repeat (default 3)")
    p.add_argument("--repeats", type=int, default=3, help="alternating dlio_ckpt/fio rounds (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed fio rounds before the measured ones (default 1)")
    p.add_argument("--chunk", default="4MiB", help="checkpoint.write_chunk_bytes and fio --bs (default 4MiB)")
    p.add_argument("--checksum", default="", help="checkpoint.checksum (default: dlio_ckpt's own, xxh3_128)")
    p.add_argument("--zero-stage", type=int, default=3, help="model.parallelism.zero_stage (3: every rank writes)")
    p.add_argument("--direct", action="store_true", help="O_DIRECT: storage.direct_io=true and fio --direct=1")
    p.add_argument("--pause", type=float, default=SETTLE_S,
                   help=f"seconds after each run's clean-up and sync before the next run (default {SETTLE_S:g}; see _common.SETTLE_S)")
    p.add_argument("--tmp", default=None, help="parent folder for the data (default: the system temp folder)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (checkpoints are still deleted after each run)")
    p.add_argument("--out", default=str(HERE / "results" / "checkpoint_vs_fio.json"), help="JSON results path")
    args = p.parse_args(argv)
    if args.quick:
        args.model_size, args.writes, args.repeats = "256MiB", 2, 2
    args.model_bytes = parse_size(args.model_size)
    args.chunk_bytes = parse_size(args.chunk)
    return args


def overrides(args: argparse.Namespace, root: Path, run_dir: Path, mode: str) -> list[str]:
    o = [
        "workload=unet3d", f"mode={mode}", "progress=false",
        "checkpoint.enabled=true", "checkpoint.strategy=sharded", "checkpoint.layout=raw", "checkpoint.format=raw",
        f"model.model_size_bytes={args.model_bytes}", f"model.parallelism.zero_stage={args.zero_stage}",
        f"checkpoint.write_chunk_bytes={args.chunk_bytes}",
        f"checkpoint.num_checkpoints_write={args.writes}", "checkpoint.num_checkpoints_read=0",
        "checkpoint.sleep_between_s=0", "checkpoint.fsync=true", "checkpoint.keep_last=0",
        f"storage.direct_io={'true' if args.direct else 'false'}",
        f"storage.root={root}", f"hydra.run.dir={run_dir}",
    ]
    if mode == "plan":
        o.append(f"world.size={args.ranks}")
    if args.checksum:
        o.append(f"checkpoint.checksum={args.checksum}")
    return o


def dlio_cmd(args: argparse.Namespace, o: list[str]) -> list[str]:
    if args.ranks > 1:
        return [tool("mpirun"), "-n", str(args.ranks), tool("dlio_ckpt"), *o]
    return [tool("dlio_ckpt"), *o]


def run_dlio(args, work: Path, i: int, log: Path) -> dict:
    run_dir = work / "runs" / f"dlio-{i}"
    root = work / "dlio"
    _, wall = run(dlio_cmd(args, overrides(args, root, run_dir, "checkpoint")), log=log)
    s = load_json(run_dir / "summary.json")
    c = s["checkpoint"]
    per = c.get("per_checkpoint", [])
    result = {
        "writes": c.get("writes"),
        "bytes": c.get("bytes"),
        "write_s_max_mean": c.get("write_s_max"),
        "write_gib_per_s": c.get("write_gib_per_s"),
        "write_gib_per_s_min_rank": c.get("write_gib_per_s_min_rank"),
        "per_checkpoint_write_s_max": [p.get("write_s_max") for p in per],
        "committed": all(p.get("committed", False) for p in per),
        "mlperf": c.get("mlperf"),
        "peak_rss_bytes_max": c.get("peak_rss_bytes_max", s.get("peak_rss_bytes_max")),
        "process_wall_s": wall,
        "warnings": s.get("warnings", []),
    }
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    settle(args.pause)
    return result


def fio_bytes(size: int, bs: int) -> int:
    """The size fio is given for a rank's `size` bytes: whole blocks (what fio writes anyway).
    Given a size that is not a multiple of bs, fio first lays the file out (writes it whole,
    untimed) and the timed job then overwrites allocated blocks: 0.4-0.9 s instead of 1.5 s for
    520 MiB with fsync here, which is not what a checkpoint into a new file does."""
    return max(bs, size // bs * bs)


def fio_jobfile(path: Path, folder: Path, sizes: list[int], bs: int, direct: bool) -> None:
    lines = ["[global]", "rw=write", f"bs={fio_size(bs)}", "ioengine=psync", f"direct={int(direct)}",
             "end_fsync=1",
             # fio preallocates with fallocate() by default; dlio_ckpt (like torch.save) does not.
             "fallocate=none", ""]
    for j, size in enumerate(sizes):
        lines += [f"[rank{j}]", f"filename={folder / f'rank_{j:05d}.bin'}", f"size={fio_bytes(size, bs)}", ""]
    path.write_text("\n".join(lines))


def run_fio(args, work: Path, i: int, sizes: list[int], log: Path) -> dict:
    """W fio runs (as dlio_ckpt writes W checkpoints), each into new files, all kept until the last."""
    runtimes, job_runtimes, walls, io_bytes = [], [], [], []
    for w in range(args.writes):
        folder = work / "fio" / f"{i}-{w}"
        folder.mkdir(parents=True)
        jobfile = work / "ckpt.fio"
        fio_jobfile(jobfile, folder, sizes, args.chunk_bytes, args.direct)
        out = work / f"fio-{i}-{w}.json"
        _, wall = run(["fio", "--output-format=json", f"--output={out}", str(jobfile)], log=log)
        data = load_json(out)
        jobs = [j["write"] for j in data["jobs"]]
        runtimes.append(max(j["runtime"] for j in jobs) / 1000.0)
        job_runtimes.append([j["runtime"] / 1000.0 for j in jobs])
        io_bytes.append(sum(j["io_bytes"] for j in jobs))
        walls.append(wall)
        out.unlink()
    # Kept until all W are written, as dlio_ckpt keeps its W checkpoints (keep_last=0) in one run.
    shutil.rmtree(work / "fio")
    settle(args.pause)
    mean_runtime = sum(runtimes) / len(runtimes)
    # As dlio_ckpt's write_gib_per_s_min_rank: per job, its bytes / its mean time over the W writes; then the minimum.
    per_job_mean = [sum(r[j] for r in job_runtimes) / len(job_runtimes) for j in range(len(sizes))]
    min_job = min(size / t for size, t in zip(sizes, per_job_mean) if t > 0) / GIB
    return {
        "bytes": io_bytes[0],
        "runtime_s_mean": mean_runtime,
        "runtimes_s": runtimes,
        "gib_per_s": io_bytes[0] / mean_runtime / GIB,
        "gib_per_s_min_job_mean": min_job,
        "job_runtimes_s": job_runtimes,
        "process_wall_s_mean": sum(walls) / len(walls),
        "bytes_all_equal": len(set(io_bytes)) == 1,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not shutil.which("fio"):
        sys.exit("fio not found (Debian: apt-get install fio)")
    results: dict = {"benchmark": "checkpoint_vs_fio", "params": {k: v for k, v in vars(args).items() if k != "out"}}
    with Workdir(args.tmp, args.keep, "dlio_ckpt_vs_fio-") as work:
        results["environment"] = environment(str(work))
        log = work / "commands.log"
        plan_dir = work / "runs" / "plan"
        run([tool("dlio_ckpt"), *overrides(args, work / "dlio", plan_dir, "plan")], log=log)
        plan = load_json(plan_dir / "plan.json")["checkpoint"]
        sizes = [b for b in plan["per_rank_bytes"] if b > 0]
        results["plan"] = {"total_bytes": plan["total_bytes"], "per_rank_bytes": plan["per_rank_bytes"]}
        print(f"plan: {human(plan['total_bytes'])} over {args.ranks} ranks, {len(sizes)} writing "
              f"({', '.join(f'{b / MIB:.0f} MiB' for b in sizes)}); {args.writes} writes x {args.repeats} repeats, "
              f"chunk {human(args.chunk_bytes)}, {'O_DIRECT' if args.direct else 'buffered + fsync'}", flush=True)
        if len(sizes) < args.ranks:
            print(f"note: only {len(sizes)} of {args.ranks} ranks own bytes at ZeRO-{args.zero_stage}; fio uses {len(sizes)} jobs")
        # One untimed round first: the first writes after a pause were often the slowest here, and
        # with the alternating order that penalty would fall on dlio_ckpt in round 0.
        for w in range(args.warmup):
            run_fio(args, work, -1 - w, sizes, log)
        dl, fi = [], []
        settle(args.pause)
        for i in range(args.repeats):
            order = ("dlio", "fio") if i % 2 == 0 else ("fio", "dlio")
            for which in order:
                if which == "dlio":
                    dl.append(run_dlio(args, work, i, log))
                    print(f"  dlio_ckpt {i}: {dl[-1]['write_gib_per_s']:.3f} GiB/s (write_s_max {dl[-1]['write_s_max_mean']:.3f} s)", flush=True)
                else:
                    fi.append(run_fio(args, work, i, sizes, log))
                    print(f"  fio       {i}: {fi[-1]['gib_per_s']:.3f} GiB/s (runtime {fi[-1]['runtime_s_mean']:.3f} s)", flush=True)
            write_json(Path(args.out), {**results, "dlio_ckpt": dl, "fio": fi})
        med = {
            "dlio_write_gib_per_s": median([r["write_gib_per_s"] for r in dl]),
            "dlio_write_gib_per_s_min_rank": median([r["write_gib_per_s_min_rank"] for r in dl]),
            "dlio_write_s_max": median([r["write_s_max_mean"] for r in dl]),
            "dlio_peak_rss_bytes": median([r["peak_rss_bytes_max"] or 0 for r in dl]),
            "fio_gib_per_s": median([r["gib_per_s"] for r in fi]),
            "fio_gib_per_s_min_job": median([r["gib_per_s_min_job_mean"] for r in fi]),
            "fio_runtime_s": median([r["runtime_s_mean"] for r in fi]),
        }
        results.update({
            "dlio_ckpt": dl, "fio": fi, "median": med,
            "ratio_write_gib_per_s": ratio(med["dlio_write_gib_per_s"], med["fio_gib_per_s"]),
            "ratio_min_rank": ratio(med["dlio_write_gib_per_s_min_rank"], med["fio_gib_per_s_min_job"]),
            "pair_ratios": [ratio(a["write_gib_per_s"], b["gib_per_s"]) for a, b in zip(dl, fi)],
            "bytes_match": all(r["bytes"] == plan["total_bytes"] for r in dl) and all(r["bytes"] == sum(fio_bytes(b, args.chunk_bytes) for b in sizes) for r in fi),
        })
    rows = [[f"{args.ranks} ranks, {human(args.model_bytes)}", "dlio_ckpt", f"{med['dlio_write_s_max']:.3f}",
             f"{med['dlio_write_gib_per_s']:.3f}", f"{med['dlio_write_gib_per_s_min_rank']:.3f}"],
            ["", "fio", f"{med['fio_runtime_s']:.3f}", f"{med['fio_gib_per_s']:.3f}", f"{med['fio_gib_per_s_min_job']:.3f}"],
            ["", "ratio", "", f"{results['ratio_write_gib_per_s']:.2f}", f"{results['ratio_min_rank']:.2f}"]]
    print()
    print(table(rows, ["case", "tool", "write s (slowest)", "GiB/s aggregate", "GiB/s min rank"]))
    print(f"\nmedians of {args.repeats} alternating rounds of {args.writes} writes; bytes match plan: "
          f"{'yes' if results['bytes_match'] else 'NO'}; dlio_ckpt peak RSS {med['dlio_peak_rss_bytes'] / MIB:.0f} MiB\n"
          f"results: {args.out}")
    write_json(Path(args.out), results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
