"""S3Storage against a real S3 server process (moto, tests/s3_server.py); bytes are read back
through boto3, a client independent of the one the backend uses."""

from __future__ import annotations

import json
import os
import random

import pytest

from dlio_ckpt.errors import UserError
from dlio_ckpt.storage.s3 import S3Storage

PART = 5 << 20  # the smallest part S3 allows
ROOT = "/data/root"


def storage(server, bucket: str, **options) -> S3Storage:
    return S3Storage(bucket=bucket, prefix="runs/p", endpoint_url=server.endpoint_url, part_size=PART, concurrency=2, root=ROOT, **options)


def server_objects(server, bucket: str) -> dict[str, int]:
    listed = server.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"]: o["Size"] for o in listed}


def pending_uploads(server, bucket: str) -> list[str]:
    return [u["Key"] for u in server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


@pytest.mark.parametrize("size", [0, 1, PART - 1, PART, PART + 1, 2 * PART + 3])
def test_streamed_object_is_exact_and_multipart_from_one_part_up(s3_server, s3_bucket, size):
    backend = storage(s3_server, s3_bucket)
    data = random.Random(size).randbytes(size)
    handle = backend.open_staged(f"{ROOT}/ckpt/shard.bin")
    for start in range(0, size, 777_777):  # odd pieces: parts are cut from the stream, not per write
        handle.write(data[start : start + 777_777])
    assert server_objects(s3_server, s3_bucket) == {}  # nothing visible before close
    handle.close()

    got = s3_server.client().get_object(Bucket=s3_bucket, Key="runs/p/ckpt/shard.bin")
    assert got["Body"].read() == data
    parts = -(-size // PART)
    etag = got["ETag"].strip('"')
    assert etag.endswith(f"-{parts}") if size >= PART else "-" not in etag
    assert pending_uploads(s3_server, s3_bucket) == []


def test_ranged_reads_return_exactly_the_range(s3_server, s3_bucket):
    backend = storage(s3_server, s3_bucket)
    data = random.Random(1).randbytes(3 * 1024 * 1024 + 5)
    s3_server.client().put_object(Bucket=s3_bucket, Key="runs/p/ds/f.npz", Body=data)
    handle = backend.open_read(f"{ROOT}/ds/f.npz")
    assert handle.size() == len(data)
    for offset, size in [(0, 256 << 10), (1 << 20, 1 << 20), (len(data) - 10, 256), (len(data), 4), (17, 0)]:
        assert handle.read_at(offset, size) == data[offset : offset + size]
        assert handle.last_moved == len(data[offset : offset + size])
    buffer = bytearray(1000)
    assert handle.read_at_into(buffer, 12345) == 1000 and bytes(buffer) == data[12345:13345]
    handle.seek(len(data) - 3)
    assert handle.read() == data[-3:]
    handle.close()
    fresh = backend.open_read(f"{ROOT}/ds/f.npz")  # size not asked for: the server clips the range
    assert fresh.read_at(len(data) - 3, 10) == data[-3:] and fresh.last_moved == 3
    assert fresh.read_at(len(data), 4) == b"" and fresh.read_at(len(data) + 9, 4) == b"" and fresh.last_moved == 0


def test_abort_leaves_no_object_and_no_pending_upload(s3_server, s3_bucket):
    backend = storage(s3_server, s3_bucket)
    big = backend.open_write(f"{ROOT}/ckpt/big.bin")
    big.write(b"x" * (2 * PART + PART // 2))  # two parts handed to the upload already
    small = backend.open_staged(f"{ROOT}/ckpt/small.bin")
    small.write(b"y" * 100)
    big.abort()
    small.abort()
    big.abort()  # a second abort is a no-op
    assert server_objects(s3_server, s3_bucket) == {}
    assert pending_uploads(s3_server, s3_bucket) == []


def test_write_handle_cannot_seek_back(s3_server, s3_bucket):
    handle = storage(s3_server, s3_bucket).open_write(f"{ROOT}/f.bin")
    handle.write(b"abc")
    assert not handle.seekable() and handle.seek(0, os.SEEK_END) == 3
    with pytest.raises(OSError, match="written in order"):
        handle.seek(0)
    handle.abort()


def test_names_listing_and_removal_stay_under_the_prefix(s3_server, s3_bucket):
    backend = storage(s3_server, s3_bucket)
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="outside/keep.bin", Body=b"1")
    client.put_object(Bucket=s3_bucket, Key="runs/p2/keep.bin", Body=b"1")  # shares a string prefix only
    backend.write_atomic(f"{ROOT}/ckpt/step-1/manifest.json", json.dumps({"ok": 1}).encode())
    backend.write_atomic(f"{ROOT}/ckpt/step-1/shard-0.bin", b"abc")
    backend.write_atomic(f"{ROOT}/ckpt/step-2/shard-0.bin", b"abcd")
    backend.write_atomic(f"{ROOT}/ckpt/latest", b"2")

    assert backend.listdir(f"{ROOT}/ckpt") == ["latest", "step-1", "step-2"]
    assert backend.listdir(f"{ROOT}/ckpt/step-1") == ["manifest.json", "shard-0.bin"]
    assert backend.listdir(f"{ROOT}/none") == []
    assert backend.isdir(f"{ROOT}/ckpt/step-1") and not backend.isdir(f"{ROOT}/ckpt/latest")
    assert backend.exists(f"{ROOT}/ckpt/latest") and backend.exists(f"{ROOT}/ckpt") and not backend.exists(f"{ROOT}/ckpt/step-3")
    assert backend.file_size(f"{ROOT}/ckpt/step-2/shard-0.bin") == 4
    assert json.loads(backend.read_whole(f"{ROOT}/ckpt/step-1/manifest.json")) == {"ok": 1}
    assert backend.free_bytes(ROOT) is None

    backend.remove_tree(f"{ROOT}/ckpt/step-1")
    backend.remove(f"{ROOT}/ckpt/latest")
    assert server_objects(s3_server, s3_bucket) == {"outside/keep.bin": 1, "runs/p2/keep.bin": 1, "runs/p/ckpt/step-2/shard-0.bin": 4}
    with pytest.raises(FileNotFoundError, match=f"s3://{s3_bucket}/runs/p/ckpt/latest"):
        backend.remove(f"{ROOT}/ckpt/latest")
    with pytest.raises(OSError, match="outside storage.root"):
        backend.open_write("/data/other/x.bin")


def test_errors_name_the_object(s3_server, s3_bucket):
    backend = storage(s3_server, s3_bucket)
    missing = backend.open_read(f"{ROOT}/ds/missing.npz")  # opening sends no request
    with pytest.raises(FileNotFoundError, match=f"s3://{s3_bucket}/runs/p/ds/missing.npz"):
        missing.read_at(0, 10)
    with pytest.raises(FileNotFoundError, match=f"s3://{s3_bucket}/runs/p/ds/missing.npz"):
        missing.size()
    s3_server.client().put_object(Bucket=s3_bucket, Key="runs/p/ds/gone.npz", Body=b"x" * 100)
    handle = backend.open_read(f"{ROOT}/ds/gone.npz")
    s3_server.client().delete_object(Bucket=s3_bucket, Key="runs/p/ds/gone.npz")
    with pytest.raises(OSError, match=f"s3://{s3_bucket}/runs/p/ds/gone.npz"):
        handle.read_at(0, 10)
    missing_bucket = storage(s3_server, "no-such-bucket-here")
    with pytest.raises(OSError, match="s3://no-such-bucket-here/runs/p/m.json"):
        missing_bucket.write_atomic(f"{ROOT}/m.json", b"{}")


def test_check_passes_on_a_usable_bucket(s3_server, s3_bucket):
    storage(s3_server, s3_bucket).check()


def test_check_names_endpoint_and_bucket(s3_server, s3_bucket):
    with pytest.raises(UserError, match=rf"bucket does not exist \(endpoint {s3_server.endpoint_url}, bucket no-such-bucket\)"):
        storage(s3_server, "no-such-bucket").check()
    from s3_server import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UserError, match=rf"cannot reach the endpoint .*\(endpoint {dead}, bucket {s3_bucket}\)") as caught:
        S3Storage(bucket=s3_bucket, endpoint_url=dead, root=ROOT).check()
    assert "\n" not in str(caught.value)


def test_check_without_credentials(s3_server, s3_bucket, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UserError, match="no AWS credentials found"):
        storage(s3_server, s3_bucket).check()


@pytest.fixture(scope="module")
def auth_server():
    """A second server that checks signatures and IAM policies: a user allowed only s3:GetObject."""
    from s3_server import start_with_user

    server, user = start_with_user(["s3:GetObject"], "guarded")
    yield server, user
    server.stop()


def test_check_wrong_credentials_and_access_denied(auth_server, monkeypatch):
    server, user = auth_server
    backend = S3Storage(bucket="guarded", endpoint_url=server.endpoint_url, root=ROOT)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(UserError, match=rf"access denied \(InvalidAccessKeyId\) \(endpoint {server.endpoint_url}, bucket guarded\)"):
        backend.check()
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=rf"access denied \(AccessDenied\) \(endpoint {server.endpoint_url}, bucket guarded\)"):
        backend.check()


def test_fsync_completes_the_upload_and_abort_after_it_deletes(s3_server, s3_bucket):
    """fsync is where an S3 write becomes durable (the upload completes), so its time is the write's."""
    backend = storage(s3_server, s3_bucket)
    handle = backend.open_staged(f"{ROOT}/ckpt/a.bin")
    handle.write(b"a" * (PART + 10))
    handle.fsync()
    assert server_objects(s3_server, s3_bucket) == {"runs/p/ckpt/a.bin": PART + 10}
    with pytest.raises(ValueError, match="already complete"):
        handle.write(b"more")
    handle.close()
    assert server_objects(s3_server, s3_bucket) == {"runs/p/ckpt/a.bin": PART + 10}
    late = backend.open_staged(f"{ROOT}/ckpt/b.bin")
    late.write(b"b" * 10)
    late.fsync()
    late.abort()
    assert server_objects(s3_server, s3_bucket) == {"runs/p/ckpt/a.bin": PART + 10}


def test_a_missing_client_names_the_extra(monkeypatch):
    import sys

    from dlio_ckpt.errors import MissingDependency
    from dlio_ckpt.storage import BACKENDS

    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore now raises ImportError
    monkeypatch.delitem(sys.modules, "dlio_ckpt.storage.s3")
    with pytest.raises(MissingDependency, match=r"storage.backend=s3 .*install it with: pip install 'dlio_ckpt\[s3\]'"):
        BACKENDS.load("s3")
