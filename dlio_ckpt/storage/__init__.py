"""Storage backends, chosen by name (`storage.backend=`), and the tracing wrapper.

The contract every backend meets is storage/base.py; a backend class is registered here by
"module:Class" and offers `from_config(storage_config, root)`, which reads and validates its own
options (`storage.<backend>.*`).
"""

from __future__ import annotations

from typing import Any

from dlio_ckpt.registry import Registry
from dlio_ckpt.storage.base import Capabilities, StorageBackend, StorageFile

BACKENDS = Registry(
    key="storage.backend",
    noun="backend",
    entries={
        "posix": "dlio_ckpt.storage.posix:PosixStorage",
        "s3": "dlio_ckpt.storage.s3:S3Storage",
    },
    install_hints={"s3": "pip install 'dlio_ckpt[s3]'"},
    group="dlio_ckpt.storage_backends",
)


def backend_class(name: str) -> Any:
    """The class of backend `name` (imported now; MissingDependency names the extra to install)."""
    return BACKENDS.load(name)


def make_backend(config: Any, root: str | None = None) -> StorageBackend:
    """The backend `config.backend` (a StorageConfig) built from its own options, for `root`
    (default: config.root)."""
    return backend_class(config.backend).from_config(config, config.root if root is None else root)


__all__ = ["BACKENDS", "Capabilities", "StorageBackend", "StorageFile", "backend_class", "make_backend"]
