"""The S3 backend's options table: the keys under `storage.s3.*`, their types and their limits.

The backend owns its options, as an IOR backend owns its options table: this table is the
section's schema (schema.py's StorageConfig only points at it, conf/config.yaml holds its
defaults), `validate` checks each value when the config is built, and S3Storage.from_config
(storage/s3.py) reads it and checks what only matters when s3 is the chosen backend (the bucket).
It is apart from storage/s3.py so the loader reads it without the optional S3 client libraries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dlio_ckpt.option_types import Bytes, require


@dataclass(frozen=True)
class S3Options:
    """storage.s3.*: read by the s3 backend (storage/s3.py), which also checks the bucket is set."""

    bucket: str
    prefix: str
    endpoint_url: str  # empty: AWS; else MinIO, Ceph RGW or any S3-compatible endpoint
    region: str
    part_size: Bytes
    concurrency: int
    addressing_style: Literal["auto", "path", "virtual"]

    def validate(self, key: str) -> None:
        require(5 << 20 <= self.part_size <= 5 << 30, f"{key}part_size: S3 multipart parts are 5MiB to 5GiB (got {self.part_size})")
        require(self.concurrency >= 1, f"{key}concurrency: must be at least 1 (got {self.concurrency})")
