"""End-to-end runs on S3 (storage.backend=s3) against a real server process (moto), serially and
under `mpirun -n 2`: the POSIX end-to-end checks, with the bytes counted against the objects the
server holds, listed through boto3 (a client independent of the backend's)."""

from __future__ import annotations

import json

import pytest

from cli_fork import run_main_forked
from conftest import load_summary, run_cli
from test_event_file import read_independently

PREFIX = "e2e"
TINY_CKPT = ["workload=llama3_8b", "scale=tiny", "progress=false", "checkpoint.drop_caches=false"]


def s3_args(server, bucket: str, root) -> list[str]:
    return ["storage.backend=s3", f"storage.s3.bucket={bucket}", f"storage.s3.endpoint_url={server.endpoint_url}",
            f"storage.s3.prefix={PREFIX}", "storage.s3.part_size=5MiB", "storage.s3.concurrency=2", f"storage.root={root}"]


def server_objects(server, bucket: str, under: str = "") -> dict[str, int]:
    """Key -> size of every object below `PREFIX/under`, listed by the server; the run's ownership
    markers (for `dlio_ckpt clean`, not the emulated program's I/O, so not traced) left out."""
    from dlio_ckpt.engine.ownership import OWNER_MARKER

    found = {}
    for page in server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{PREFIX}/{under}"):
        found.update({o["Key"]: o["Size"] for o in page.get("Contents", []) if not o["Key"].endswith(OWNER_MARKER)})
    return found


def run_ok(args, cwd, ranks=0):
    done = run_cli(args, cwd, mpi_ranks=ranks)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_train_run_counts_the_bytes_the_server_holds(workdir, s3_server, s3_bucket):
    root, run = workdir / "store", workdir / "run"
    run_ok(["workload=unet3d", "scale=tiny", "dataset.format=raw", "progress=false", "checkpoint.drop_caches=false",
            "checkpoint.durability=commit", "trace.chrome=true", *s3_args(s3_server, s3_bucket, root), f"hydra.run.dir={run}"], workdir / "cwd")
    summary = load_summary(run)
    data = server_objects(s3_server, s3_bucket, "data/unet3d/")
    train = {k: v for k, v in data.items() if "/train/" in k}
    checkpoints = server_objects(s3_server, s3_bucket, "checkpoints/")
    assert len(train) == 8
    assert summary["train"]["bytes_read"] == 2 * sum(train.values())  # two epochs, every byte once each
    assert summary["dataset"]["bytes_on_disk"] == sum(train.values())
    assert summary["io"]["by_phase"]["generate"]["bytes_written"] == sum(data.values())  # files + dataset manifest
    assert summary["io"]["by_phase"]["checkpoint"]["bytes_written"] == sum(checkpoints.values()) > 0
    assert any(k.endswith("dlio_ckpt_manifest.json") for k in checkpoints)
    assert not root.exists()  # nothing of the dataset or checkpoints on the local file system
    assert summary["dataset"]["page_cache_risk"] is False  # no local page cache in front of S3
    assert not any("page cache" in warning for warning in summary.get("warnings", []))
    _, paths, _ = read_independently(run / "events" / "rank-00000.npz")
    assert any(p.startswith(str(root)) and "/train/" in p for p in paths)

    # The S3 requests are in the Chrome trace (ranged GETs as reads, upload completions as fsyncs)
    # and in the analysis, with the same bytes.
    slices = json.loads((run / "trace.chrome.json").read_text())["traceEvents"]
    assert sum(e["args"]["length"] for e in slices if e.get("name") == "read" and e.get("cat") == "train") == summary["train"]["bytes_read"]
    assert any(e.get("name") == "fsync" and e.get("cat") == "checkpoint" for e in slices)
    analysis = run_main_forked("dlio_ckpt-analyze", ["--json", "--no-plots", str(run)], run.parent, timeout=120)
    assert analysis.returncode == 0, analysis.stderr[-2000:]
    assert json.loads(analysis.stdout)["bytes_read"] == summary["io"]["bytes_read"]


@pytest.mark.parametrize("strategy, ranks", [
    ("sharded", 0),
    pytest.param("sharded", 2, marks=pytest.mark.mpi),
    pytest.param("single_writer", 2, marks=pytest.mark.mpi),
    pytest.param("async", 2, marks=pytest.mark.mpi),
])
def test_every_strategy_writes_objects_and_restores_them(workdir, s3_server, s3_bucket, strategy, ranks):
    run = workdir / "run"
    run_ok(TINY_CKPT + [*s3_args(s3_server, s3_bucket, workdir / "store"), f"checkpoint.strategy={strategy}",
                        f"hydra.run.dir={run}"], workdir / "cwd", ranks=ranks)
    summary = load_summary(run)
    objects = server_objects(s3_server, s3_bucket, "checkpoints/")
    manifests = [k for k in objects if k.endswith("dlio_ckpt_manifest.json")]
    assert summary["world_size"] == max(ranks, 1)
    ckpt = summary["checkpoint"]
    assert len(manifests) == ckpt["writes"] >= 1
    assert ckpt["restore_verified"] is True
    # The DeepSpeed layout's `latest` pointer object is rewritten at every checkpoint (same length each time).
    rewritten = sum(size * (ckpt["writes"] - 1) for key, size in objects.items() if key.endswith("/latest"))
    assert summary["io"]["by_phase"]["checkpoint"]["bytes_written"] == sum(objects.values()) + rewritten
    listed = json.loads(s3_server.client().get_object(Bucket=s3_bucket, Key=sorted(manifests)[-1])["Body"].read())
    assert ckpt["restore_bytes"] == sum(f["size"] for f in listed["files"])
    assert s3_server.client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


def test_restore_rejects_a_corrupted_object(workdir, s3_server, s3_bucket):
    root = workdir / "store"
    common = TINY_CKPT + s3_args(s3_server, s3_bucket, root) + ["checkpoint.checksum=blake3", "checkpoint.durability=commit"]
    run_ok(common + ["mode=train", "train.total_steps=2", "checkpoint.steps_between_checkpoints=1",
                     f"hydra.run.dir={workdir / 'first'}"], workdir / "cwd")
    objects = server_objects(s3_server, s3_bucket, "checkpoints/")
    folders = sorted({k.rsplit("/", 2)[0] for k in objects if k.endswith("dlio_ckpt_manifest.json")})
    assert len(folders) == 1
    steps = sorted({k.rsplit("/", 2)[1] for k in objects if k.endswith("dlio_ckpt_manifest.json")})
    assert len(steps) == 2
    victim = sorted(k for k in objects if f"/{steps[-1]}/" in k and not k.endswith(".json"))[0]
    client = s3_server.client()
    body = bytearray(client.get_object(Bucket=s3_bucket, Key=victim)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    client.put_object(Bucket=s3_bucket, Key=victim, Body=bytes(body))  # same size, one byte flipped

    run = workdir / "restore"
    folder = root / folders[0].removeprefix(f"{PREFIX}/")
    run_ok(common + ["mode=restore", f"checkpoint.restore_from={folder}", f"hydra.run.dir={run}"], workdir / "cwd")
    ckpt = load_summary(run)["checkpoint"]
    assert ckpt["restore_verified"] is True
    assert any(steps[-1] in s and "blake3 checksum mismatch" in s for s in ckpt["restore_skipped"]), ckpt["restore_skipped"]
    assert steps[0].endswith(str(ckpt["restore_step"]))


def test_unusable_bucket_exits_2_before_anything_is_written(workdir, s3_server):
    from s3_server import free_port

    for endpoint, bucket, expected in [
        (s3_server.endpoint_url, "no-such-bucket", "bucket does not exist"),
        (f"http://127.0.0.1:{free_port()}", "any-bucket", "cannot reach the endpoint"),
    ]:
        run = workdir / f"run-{bucket}"
        args = TINY_CKPT + ["storage.backend=s3", f"storage.s3.bucket={bucket}", f"storage.s3.endpoint_url={endpoint}",
                            f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}"]
        done = run_cli(args, workdir / "cwd")
        assert done.returncode == 2, done.stderr[-2000:]
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and expected in lines[0] and endpoint in lines[0] and bucket in lines[0], done.stderr
        assert not run.exists()


def test_missing_bucket_option_is_named(workdir):
    done = run_cli(TINY_CKPT + ["storage.backend=s3", f"hydra.run.dir={workdir / 'run'}"], workdir / "cwd")
    assert done.returncode == 2 and "storage.s3.bucket" in done.stderr
    assert not (workdir / "run").exists()


@pytest.mark.mpi
def test_a_write_refused_mid_run_fails_in_one_line_per_rank(workdir, monkeypatch):
    """check() passes (the user may list), then the first PUT is denied: each rank reports it in
    one line naming the object, the run exits non-zero, and nothing is published."""
    from s3_server import start_with_user

    server, user = start_with_user(["s3:ListBucket", "s3:GetObject"], "no-writes")
    try:
        for name, value in user.items():
            monkeypatch.setenv(name, value)
        args = ["workload=unet3d", "scale=tiny", "dataset.format=raw", "progress=false", "checkpoint.enabled=false",
                *s3_args(server, "no-writes", workdir / "store"), f"hydra.run.dir={workdir / 'run'}"]
        done = run_cli(args, workdir / "cwd", mpi_ranks=2)
        import boto3

        lister = boto3.client("s3", endpoint_url=server.endpoint_url, region_name="us-east-1",
                              aws_access_key_id=user["AWS_ACCESS_KEY_ID"], aws_secret_access_key=user["AWS_SECRET_ACCESS_KEY"])
        objects = lister.list_objects_v2(Bucket="no-writes").get("KeyCount")
    finally:
        server.stop()
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("dlio_ckpt: error")]
    assert 1 <= len(errors) <= 2, done.stderr[-2000:]
    assert all("s3://no-writes/e2e/data/unet3d/" in line and "access denied" in line for line in errors), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert objects == 0


def test_a_darshan_log_is_refused_on_s3(workdir, s3_server, s3_bucket):
    """Darshan has no S3 module: a log would claim POSIX calls on local files that never existed."""
    done = run_cli(TINY_CKPT + [*s3_args(s3_server, s3_bucket, workdir / "store"), "trace.darshan=true",
                                f"hydra.run.dir={workdir / 'run'}"], workdir / "cwd")
    assert done.returncode == 2 and "trace.darshan=true" in done.stderr and "no S3 module" in done.stderr
    assert not (workdir / "run").exists() and s3_server.client().list_objects_v2(Bucket=s3_bucket)["KeyCount"] == 0


def test_retention_deletes_only_this_runs_older_checkpoints(workdir, s3_server, s3_bucket):
    client = s3_server.client()
    decoy = f"{PREFIX}/checkpoints/another-run/global_step1/keep.me"
    client.put_object(Bucket=s3_bucket, Key=decoy, Body=b"x")
    # storage.root reached through a local link: on S3 the path is a key as written, never resolved.
    (workdir / "real").mkdir()
    (workdir / "link").symlink_to(workdir / "real")
    run_ok(TINY_CKPT + [*s3_args(s3_server, s3_bucket, workdir / "link" / "store"), "mode=train", "train.total_steps=3",
                        "checkpoint.durability=commit",
                        "checkpoint.steps_between_checkpoints=1", "checkpoint.keep_last=1", f"hydra.run.dir={workdir / 'run'}"],
           workdir / "cwd")
    objects = server_objects(s3_server, s3_bucket, "checkpoints/")
    manifests = sorted(k for k in objects if k.endswith("dlio_ckpt_manifest.json"))
    assert len(manifests) == 1 and "global_step3" in manifests[0], manifests
    assert decoy in objects
    assert not any("global_step1" in k or "global_step2" in k for k in objects if k != decoy)
    # The deletions are S3 operations too: one unlink event per object removed, none for the decoy.
    events, paths, meta = read_independently(workdir / "run" / "events" / "rank-00000.npz")
    unlink = meta["ops"].index("unlink")
    unlinked = sorted(paths[i] for i in events[events["op"] == unlink]["file"])
    kept = sorted(k.split("/global_step3/", 1)[1] for k in objects if "/global_step3/" in k)
    for step in (1, 2):
        assert sorted(p.split(f"/global_step{step}/", 1)[1] for p in unlinked if f"/global_step{step}/" in p) == kept
    assert not any("another-run" in p for p in unlinked)


@pytest.mark.mpi
def test_an_async_checkpoint_upload_refused_fails_without_a_hang(workdir, monkeypatch):
    """The upload fails in async's background persist: every rank still ends, in one line each,
    and no manifest (no checkpoint) appears."""
    from s3_server import start_with_user

    server, user = start_with_user(["s3:ListBucket", "s3:GetObject"], "no-ckpt-writes")
    try:
        for name, value in user.items():
            monkeypatch.setenv(name, value)
        done = run_cli(TINY_CKPT + [*s3_args(server, "no-ckpt-writes", workdir / "store"), "checkpoint.strategy=async",
                                    f"hydra.run.dir={workdir / 'run'}"], workdir / "cwd", mpi_ranks=2, timeout=120)
    finally:
        server.stop()
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("dlio_ckpt: error")]
    assert 1 <= len(errors) <= 2 and all("s3://no-ckpt-writes/e2e/checkpoints/" in line for line in errors), done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_incremental_checkpoints_on_s3_restore_bit_exact(workdir, s3_server, s3_bucket):
    """The codec stage composes with the object store: containers uploaded as objects, chains
    listed in manifests, the restore reads every link back from the server and rebuilds the state."""
    root, run = workdir / "store", workdir / "run"
    run_ok(["mode=checkpoint", "progress=false", "model.kind=explicit", "model.model_size_bytes=8MiB",
            "checkpoint.num_checkpoints_write=3", "checkpoint.num_checkpoints_read=3", "checkpoint.keep_last=0",
            "checkpoint.update=sparse", "checkpoint.encoding=incremental", "checkpoint.incremental.chunk_bytes=64KiB",
            "checkpoint.update_moves=0.01", *s3_args(s3_server, s3_bucket, root), f"hydra.run.dir={run}"], workdir / "cwd")
    ck = load_summary(run)["checkpoint"]
    objects = server_objects(s3_server, s3_bucket, "checkpoints/")
    data = sorted(size for key, size in objects.items() if key.endswith(".bin"))
    assert len(data) == 3 and data[0] < data[-1] / 4  # the later checkpoints hold only what changed
    assert [r["chain_length"] for r in ck["per_read"]] == [1, 2, 3]
    assert all(r["verified"] for r in ck["per_read"]) and ck["per_checkpoint"][-1]["dedup_ratio"] > 4
    assert not root.exists()
