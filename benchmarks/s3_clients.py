"""Which S3 client should dlio_ckpt use? The candidates on one local server, alternating in one run.

Starts moto's S3 server (tests/s3_server.py) on 127.0.0.1 on a free port, then for each round and
each client, in turn: PUT N objects of each size (multipart above the part size), GET them whole,
and GET ranges of 256 KiB and 1 MiB at random offsets. Every client gets the same concurrency: a
pool of `--concurrency` threads, one request (or one object's upload) per thread at a time; each
client's own multipart upload runs its parts one after another inside that slot.

moto is a Python server, so the absolute MiB/s are mostly the server's; what differs between
clients is their per-request cost on the client side (CPU, GIL) and their upload path. The machine
this ran on is shared, so the spread over rounds is printed with the medians.

    .venv/bin/python benchmarks/s3_clients.py [--rounds 3] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from s3_server import TEST_REGION, S3Server, credential_env  # noqa: E402

MiB = 1 << 20
BUCKET = "bench-clients"
PART = 8 * MiB
# (object size, count): small objects (per-request cost), medium, and multipart ones.
SIZES = [(256 * 1024, 64), (4 * MiB, 16), (24 * MiB, 4)]
RANGES = [(256 * 1024, 128), (1 * MiB, 48)]


class Boto3:
    name = "boto3"

    def __init__(self, endpoint: str, concurrency: int) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.client = boto3.client("s3", endpoint_url=endpoint, region_name=TEST_REGION,
                                   config=Config(max_pool_connections=concurrency * 2, s3={"addressing_style": "path"}))
        # The transfer manager (s3transfer) is boto3's bulk path: multipart above the threshold.
        self.transfer = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=1, use_threads=False)

    def put(self, key: str, data: bytes) -> None:
        self.client.upload_fileobj(io.BytesIO(data), BUCKET, key, Config=self.transfer)

    def get(self, key: str) -> int:
        return len(self.client.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    def get_range(self, key: str, offset: int, size: int) -> int:
        return len(self.client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={offset}-{offset + size - 1}")["Body"].read())


class Obstore:
    name = "obstore"

    def __init__(self, endpoint: str, concurrency: int) -> None:
        import obstore
        from obstore.store import S3Store

        self.ob = obstore
        self.store = S3Store(BUCKET, endpoint=endpoint, region=TEST_REGION, virtual_hosted_style_request=False,
                             client_options={"allow_http": True, "pool_max_idle_per_host": str(concurrency * 2)})

    def put(self, key: str, data: bytes) -> None:
        self.ob.put(self.store, key, data, chunk_size=PART, max_concurrency=1)

    def get(self, key: str) -> int:
        return len(self.ob.get(self.store, key).bytes())

    def get_range(self, key: str, offset: int, size: int) -> int:
        return len(self.ob.get_range(self.store, key, start=offset, length=size))


class S3TorchConnector:
    name = "s3torchconnector"

    def __init__(self, endpoint: str, concurrency: int) -> None:
        from s3torchconnector._s3client import S3Client, S3ClientConfig

        self.client = S3Client(region=TEST_REGION, endpoint=endpoint,
                               s3client_config=S3ClientConfig(part_size=PART, force_path_style=True))

    def put(self, key: str, data: bytes) -> None:
        writer = self.client.put_object(BUCKET, key)
        writer.write(data)
        writer.close()

    def get(self, key: str) -> int:
        return len(self.client.get_object(BUCKET, key).read())

    def get_range(self, key: str, offset: int, size: int) -> int:
        # What its RangedS3Reader issues per read: one GET of [start, end).
        return sum(len(chunk) for chunk in self.client._get_object_stream(BUCKET, key, offset, offset + size))


class S3dlio:
    name = "s3dlio"

    def __init__(self, endpoint: str, concurrency: int) -> None:
        import s3dlio

        s3dlio.configure_s3(endpoint_url=endpoint, region=TEST_REGION)
        self.s3 = s3dlio

    def put(self, key: str, data: bytes) -> None:
        uri = f"s3://{BUCKET}/{key}"
        if len(data) <= PART:
            self.s3.put_bytes(uri, data)
            return
        writer = self.s3.MultipartUploadWriter.from_uri(uri, part_size=PART, max_in_flight=1)
        writer.write(data)
        writer.close()

    def get(self, key: str) -> int:
        return len(self.s3.get(f"s3://{BUCKET}/{key}"))

    def get_range(self, key: str, offset: int, size: int) -> int:
        return len(self.s3.get_range(f"s3://{BUCKET}/{key}", offset, size))


CANDIDATES = [Boto3, Obstore, S3TorchConnector, S3dlio]


def timed(pool: ThreadPoolExecutor, calls) -> tuple[float, float]:
    """Wall seconds, and CPU seconds this process (the client; the server is another process) spent."""
    cpu, start = time.process_time(), time.perf_counter()
    for future in [pool.submit(call) for call in calls]:
        future.result()
    return time.perf_counter() - start, time.process_time() - cpu


def figures(total_bytes: int, count: int, seconds: float, cpu: float) -> dict:
    return {"mib_s": total_bytes / MiB / seconds, "req_s": count / seconds, "client_cpu_ms_per_req": 1000 * cpu / count}


def one_round(client, pool: ThreadPoolExecutor, payloads: dict[int, bytes], rng: random.Random) -> dict[str, dict]:
    """MiB/s and requests/s of each operation for one client."""
    results: dict[str, dict] = {}
    for size, count in SIZES:
        keys = [f"{client.name}/{size}/{i}" for i in range(count)]
        results[f"put {size // 1024} KiB"] = figures(size * count, count, *timed(pool, [lambda k=k: client.put(k, payloads[size]) for k in keys]))
        results[f"get {size // 1024} KiB"] = figures(size * count, count, *timed(pool, [lambda k=k: client.get(k) for k in keys]))
    big, big_count = SIZES[-1]
    for length, count in RANGES:
        picks = [(f"{client.name}/{big}/{rng.randrange(big_count)}", rng.randrange(0, big - length)) for _ in range(count)]
        calls = [lambda k=k, o=o: client.get_range(k, o, length) for k, o in picks]
        results[f"range {length // 1024} KiB"] = figures(length * count, count, *timed(pool, calls))
    return results


def make_clients(endpoint: str, concurrency: int) -> tuple[list, dict[str, str]]:
    clients, missing = [], {}
    for candidate in CANDIDATES:
        try:
            clients.append(candidate(endpoint, concurrency))
        except Exception as error:  # an uninstallable candidate is a result, not a crash
            missing[candidate.name] = f"{type(error).__name__}: {error}"
    return clients, missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "s3_clients.json"))
    args = parser.parse_args()

    with S3Server() as server:
        os.environ.update(credential_env(server.endpoint_url))
        server.client().create_bucket(Bucket=BUCKET)
        clients, missing = make_clients(server.endpoint_url, args.concurrency)
        rng = random.Random(7)
        payloads = {size: rng.randbytes(size) for size, _ in SIZES}
        samples: dict[str, dict[str, list[dict]]] = {c.name: {} for c in clients}
        with ThreadPoolExecutor(args.concurrency) as pool:
            for round_index in range(args.rounds):
                order = clients if round_index % 2 == 0 else clients[::-1]
                for client in order:
                    for op, figures in one_round(client, pool, payloads, rng).items():
                        samples[client.name].setdefault(op, []).append(figures)
                print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)

    table = summarize(samples)
    print_table(table, args)
    for name, why in missing.items():
        print(f"not measured: {name}: {why}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip()
    record = {
        "what": "S3 client comparison on moto's local server (benchmarks/s3_clients.py)",
        "machine": f"{platform.node()} {os.cpu_count()} CPUs, shared with other jobs (noisy)",
        "commit": commit,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "part_size": PART,
        "sizes": SIZES,
        "ranges": RANGES,
        "versions": versions(),
        "median": table,
        "samples": samples,
        "not_measured": missing,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


def summarize(samples: dict) -> dict:
    table: dict[str, dict[str, dict]] = {}
    for client, ops in samples.items():
        for op, runs in ops.items():
            rates = [r["mib_s"] for r in runs]
            table.setdefault(op, {})[client] = {
                "mib_s": statistics.median(rates),
                "min": min(rates),
                "max": max(rates),
                "req_s": statistics.median(r["req_s"] for r in runs),
                "client_cpu_ms_per_req": statistics.median(r["client_cpu_ms_per_req"] for r in runs),
            }
    return table


def print_table(table: dict, args) -> None:
    clients = sorted({c for per_op in table.values() for c in per_op})
    base = "boto3" if "boto3" in clients else clients[0]
    print(f"median MiB/s over {args.rounds} rounds (min-max), concurrency {args.concurrency}; ratio to {base} in []")
    print(f"{'operation':<16}" + "".join(f"{c:>30}" for c in clients))
    for op, per_client in table.items():
        cells = []
        for c in clients:
            f = per_client.get(c)
            if f is None:
                cells.append(f"{'-':>30}")
                continue
            ratio = f["mib_s"] / per_client[base]["mib_s"]
            cells.append(f"{f['mib_s']:>8.1f} ({f['min']:.0f}-{f['max']:.0f}) [{ratio:.2f}]".rjust(30))
        print(f"{op:<16}" + "".join(cells))
    print("median client CPU ms per request (this process only; lower is better)")
    for op, per_client in table.items():
        print(f"{op:<16}" + "".join(f"{per_client[c]['client_cpu_ms_per_req']:>30.2f}" if c in per_client else f"{'-':>30}" for c in clients))


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("boto3", "obstore", "s3torchconnector", "s3dlio", "moto"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


if __name__ == "__main__":
    main()
