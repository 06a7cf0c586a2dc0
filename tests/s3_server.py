"""A real S3 HTTP server for tests and benchmarks: moto's standalone server in its own process.

It listens on 127.0.0.1 on a free port and keeps objects in its memory, so every test talks HTTP
to a separate process, exactly as a run talks to MinIO or AWS; nothing is mocked in-process.
Used by the `s3_server` fixture (tests/conftest.py) and by benchmarks/s3_*.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

TEST_ACCESS_KEY = "testing"
TEST_SECRET_KEY = "testing"
TEST_REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def credential_env(endpoint_url: str) -> dict[str, str]:
    """The standard AWS variables a run (and its mpirun ranks) reads: the credential chain's first link."""
    return {
        "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY,
        "AWS_DEFAULT_REGION": TEST_REGION,
        "AWS_REGION": TEST_REGION,
        # A profile or config file on the machine must not change what the tests see.
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@dataclass
class S3Server:
    """One moto server process; `start()` returns once it answers HTTP."""

    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> "S3Server":
        env = {**os.environ, **self.extra_env}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto server exited with code {self.process.returncode} before answering")
            try:
                urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto server did not answer on {self.endpoint_url} within {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def client(self):
        """A boto3 client on this server with the test credentials."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=TEST_REGION,
            aws_access_key_id=TEST_ACCESS_KEY,
            aws_secret_access_key=TEST_SECRET_KEY,
        )

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def start_with_user(allowed_actions: list[str], bucket: str) -> tuple[S3Server, dict[str, str]]:
    """A server that checks signatures and IAM policies, with `bucket` and one user allowed only
    `allowed_actions` (e.g. ["s3:ListBucket", "s3:GetObject"]); returns the server and the user's
    credential variables. moto enforces authentication once INITIAL_NO_AUTH_ACTION_COUNT requests
    are spent: the four below (user, key, policy, bucket)."""
    import json

    import boto3

    server = S3Server(extra_env={"INITIAL_NO_AUTH_ACTION_COUNT": "4"}).start()
    try:
        iam = boto3.client("iam", endpoint_url=server.endpoint_url, region_name=TEST_REGION,
                           aws_access_key_id="setup", aws_secret_access_key="setup")
        iam.create_user(UserName="limited")
        key = iam.create_access_key(UserName="limited")["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": allowed_actions, "Resource": "*"}]}
        iam.put_user_policy(UserName="limited", PolicyName="limited", PolicyDocument=json.dumps(policy))
        server.client().create_bucket(Bucket=bucket)
    except BaseException:
        server.stop()
        raise
    return server, {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
