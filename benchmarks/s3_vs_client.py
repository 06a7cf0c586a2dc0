"""dlio_ckpt on S3 against the client's own best bulk transfer, on the same local server, alternating.

The client is obstore (chosen in benchmarks/s3_clients.py). In each round, in turn:
- dataset read: a one-epoch `dlio_ckpt` training run (storage.backend=s3, train.computation_time=0:
  unet3d's 0.323 s steps would pace the last batches' reads and stretch the span) reads the
  dataset with `--concurrency` reader threads; then obstore issues exactly the same ranged GETs
  (offsets and lengths taken from the run's own events) from a pool of the same size. Rate:
  bytes / wall time from the first request's start to the last one's end.
- checkpoint write: `dlio_ckpt mode=checkpoint` writes one 512 MiB shard (an explicit model of
  512 MiB, one rank, storage.s3.concurrency parts in flight); then obstore's `put` uploads a
  512 MiB file with the same part size and concurrency. Rate: dlio_ckpt's checkpoint write_gib_per_s
  (open to the end of the upload) against bytes / wall of the put of a 512 MiB file.
- the same reads and the same 512 MiB upload through dlio_ckpt's S3 backend alone (storage/s3.py
  driven directly, no engine), which tells the backend's cost from the engine's.
- peak RSS of the dlio_ckpt rank while it writes the 512 MiB shard (summary.json
  checkpoint.peak_rss_bytes_max; target < 1 GiB: parts are streamed, the shard is never held).

moto is a Python server: the absolute rates are the server's; the ratio is what this measures.
The machine is shared, so medians and the spread over rounds are printed.

    .venv/bin/python benchmarks/s3_vs_client.py [--rounds 3] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from s3_server import TEST_REGION, S3Server, credential_env  # noqa: E402

MiB = 1 << 20
BUCKET = "bench-vs-client"
PART = 16 * MiB
SHARD = 512 * MiB
BIN = Path(sys.executable).parent


def s3_options(server: S3Server, root: str, concurrency: int) -> list[str]:
    return ["storage.backend=s3", f"storage.s3.bucket={BUCKET}", f"storage.s3.endpoint_url={server.endpoint_url}",
            "storage.s3.prefix=bench", f"storage.s3.part_size={PART // MiB}MiB", f"storage.s3.concurrency={concurrency}",
            f"storage.root={root}", "progress=false"]


DATASET = ["workload=unet3d", "dataset.format=raw", "dataset.num_files_train=32", "dataset.num_samples_per_file=4",
           "dataset.record_length_bytes=2MiB", "dataset.record_length_bytes_stdev=0", "dataset.num_subfolders_train=0"]


def dlio(args: list[str], run_dir: Path) -> dict:
    done = subprocess.run([str(BIN / "dlio_ckpt"), *args, f"hydra.run.dir={run_dir}"], capture_output=True, text=True,
                          cwd=run_dir.parent, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"dlio_ckpt failed: {done.stderr[-2000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def train_reads(run_dir: Path) -> tuple[list[tuple[str, int, int]], float, int]:
    """(path, offset, length) of every training read, their wall span, and their bytes."""
    with np.load(run_dir / "events" / "rank-00000.npz") as data:
        events, paths = data["events"], [str(p) for p in data["paths"]]
        phases = json.loads(str(data["meta"]))["phases"]
    reads = events[(events["phase"] == phases.index("train")) & (events["op"] == 2) & (events["length"] > 0)]
    span = float(reads["end"].max() - reads["start"].min())
    return [(paths[e["file"]], int(e["offset"]), int(e["length"])) for e in reads], span, int(reads["length"].sum())


def client_read(store, requests: list[tuple[str, int, int]], key_of, concurrency: int) -> float:
    import obstore

    def one(request):
        path, offset, length = request
        return len(obstore.get_range(store, key_of(path), start=offset, length=length))

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        moved = sum(pool.map(one, requests))
    return moved / MiB / (time.perf_counter() - start)


def client_write(store, source: Path, concurrency: int) -> float:
    """obstore's put of a 512 MiB file (page-cached after the first round), as `aws s3 cp` would.
    Not from a bytes object: a parent that ever held 512 MiB would pass its RSS high-water mark to
    every dlio_ckpt it starts afterwards (Linux keeps ru_maxrss across fork and exec)."""
    import obstore

    start = time.perf_counter()
    obstore.put(store, "bench/client/shard.bin", source, chunk_size=PART, max_concurrency=concurrency)
    seconds = time.perf_counter() - start
    obstore.delete(store, "bench/client/shard.bin")
    return SHARD / MiB / seconds


def backend_read(backend, requests: list[tuple[str, int, int]], concurrency: int) -> float:
    """The same GETs through dlio_ckpt's S3 backend alone (a handle per request, read_at_into a
    buffer), without the engine: separates the backend's cost from the reader's."""

    def one(request):
        path, offset, length = request
        handle = backend.open_read(path)
        try:
            return handle.read_at_into(bytearray(length), offset)
        finally:
            handle.close()

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        moved = sum(pool.map(one, requests))
    return moved / MiB / (time.perf_counter() - start)


def backend_write(backend, source: Path, root: str) -> float:
    """The 512 MiB file through the backend's streaming upload in 4 MiB writes (as the checkpoint
    writer's chunks), open to fsync, without the engine."""
    start = time.perf_counter()
    handle = backend.open_staged(f"{root}/backend/shard.bin")
    with open(source, "rb") as data:
        while chunk := data.read(4 * MiB):
            handle.write(chunk)
    handle.fsync()
    handle.close()
    seconds = time.perf_counter() - start
    backend.remove(f"{root}/backend/shard.bin")
    return SHARD / MiB / seconds


def write_source(path: Path) -> Path:
    """512 MiB of random bytes in a file, written 16 MiB at a time (this process stays small)."""
    with open(path, "wb") as out:
        for _ in range(SHARD // PART):
            out.write(os.urandom(PART))
    return path


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "samples": values}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "s3_vs_client.json"))
    args = parser.parse_args()
    c = args.concurrency

    with tempfile.TemporaryDirectory() as scratch, S3Server() as server:
        os.environ.update(credential_env(server.endpoint_url))
        server.client().create_bucket(Bucket=BUCKET)
        from obstore.store import S3Store

        store = S3Store(BUCKET, endpoint=server.endpoint_url, region=TEST_REGION, virtual_hosted_style_request=False,
                        client_options={"allow_http": True})
        root = f"{scratch}/root"
        key_of = lambda path: "bench/" + os.path.relpath(path, root)  # noqa: E731 (the backend's mapping)
        options = s3_options(server, root, c)
        dlio(DATASET + options + ["mode=generate"], Path(scratch) / "generate")
        source = write_source(Path(scratch) / "client-shard.bin")
        from dlio_ckpt.storage.s3 import S3Storage

        backend = S3Storage(bucket=BUCKET, prefix="bench", endpoint_url=server.endpoint_url, part_size=PART, concurrency=c, root=root)
        read_dlio, read_client, write_dlio, write_client, rss = [], [], [], [], []
        read_backend, write_backend = [], []
        for round_index in range(args.rounds):
            run = Path(scratch) / f"read-{round_index}"
            dlio(DATASET + options + ["train.epochs=1", "train.computation_time=0", "checkpoint.enabled=false",
                                      f"reader.read_threads={c}", "reader.prefetch_size=4"], run)
            requests, span, moved = train_reads(run)
            read_dlio.append(moved / MiB / span)
            read_client.append(client_read(store, requests, key_of, c))
            read_backend.append(backend_read(backend, requests, c))

            def write_with_dlio(run=Path(scratch) / f"write-{round_index}"):
                summary = dlio(options + ["mode=checkpoint", "model.kind=explicit", f"model.model_size_bytes={SHARD // MiB}MiB",
                                          "checkpoint.num_checkpoints_write=1", "checkpoint.num_checkpoints_read=0",
                                          "checkpoint.checksum=none"], run)
                write_dlio.append(summary["checkpoint"]["write_gib_per_s"] * 1024)
                rss.append(summary["checkpoint"]["peak_rss_bytes_max"] / MiB)
                for page in server.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="bench/checkpoints/"):
                    keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                    if keys:
                        server.client().delete_objects(Bucket=BUCKET, Delete={"Objects": keys})

            # The three uploads take turns going first: a fixed order would charge one of them
            # with whatever the server (moto, in Python) is still doing after the previous one.
            writers = [write_with_dlio, lambda: write_client.append(client_write(store, source, c)),
                       lambda: write_backend.append(backend_write(backend, source, root))]
            for writer in writers[round_index % 3:] + writers[: round_index % 3]:
                writer()
            print(f"round {round_index + 1}/{args.rounds}: read {read_dlio[-1]:.0f} vs {read_client[-1]:.0f} MiB/s "
                  f"(backend alone {read_backend[-1]:.0f}), write {write_dlio[-1]:.0f} vs {write_client[-1]:.0f} MiB/s "
                  f"(backend alone {write_backend[-1]:.0f}), peak RSS {rss[-1]:.0f} MiB", file=sys.stderr)

    result = {
        "what": "dlio_ckpt (storage.backend=s3) against obstore's own bulk transfer on moto (benchmarks/s3_vs_client.py)",
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, shared with other jobs (noisy); moto is a Python server",
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip(),
        "concurrency": c,
        "part_size": PART,
        "dataset": DATASET,
        "read_mib_s": {"dlio_ckpt": spread(read_dlio), "obstore": spread(read_client), "backend_alone": spread(read_backend)},
        "write_mib_s": {"dlio_ckpt": spread(write_dlio), "obstore": spread(write_client), "backend_alone": spread(write_backend)},
        "read_ratio_median": statistics.median(a / b for a, b in zip(read_dlio, read_client)),
        "write_ratio_median": statistics.median(a / b for a, b in zip(write_dlio, write_client)),
        "backend_read_ratio_median": statistics.median(a / b for a, b in zip(read_backend, read_client)),
        "backend_write_ratio_median": statistics.median(a / b for a, b in zip(write_backend, write_client)),
        "peak_rss_mib_writing_512mib_shard": spread(rss),
    }
    print(f"dataset read     dlio_ckpt {result['read_mib_s']['dlio_ckpt']['median']:.0f} MiB/s, obstore "
          f"{result['read_mib_s']['obstore']['median']:.0f} MiB/s, ratio {result['read_ratio_median']:.2f} (target >= 0.9)")
    print(f"checkpoint write dlio_ckpt {result['write_mib_s']['dlio_ckpt']['median']:.0f} MiB/s, obstore "
          f"{result['write_mib_s']['obstore']['median']:.0f} MiB/s, ratio {result['write_ratio_median']:.2f} (target >= 0.9)")
    print(f"backend alone    read ratio {result['backend_read_ratio_median']:.2f}, write ratio {result['backend_write_ratio_median']:.2f} "
          "(the same requests through storage/s3.py without the engine)")
    print(f"peak RSS while writing a 512 MiB shard: {max(rss):.0f} MiB (target < 1024)")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
