"""Storage backends, chosen by name (`storage.backend=`), and the tracing wrapper."""

from __future__ import annotations

from dlio_ckpt.config.schema import StorageConfig
from dlio_ckpt.errors import ConfigError, close_match
from dlio_ckpt.storage.posix import PosixStorage

_BACKENDS = {"posix": PosixStorage}


def make_backend(config: StorageConfig) -> PosixStorage:
    factory = _BACKENDS.get(config.backend)
    if factory is None:
        raise ConfigError(f"storage.backend: unknown backend '{config.backend}'{close_match(config.backend, _BACKENDS)}; choose one of: {', '.join(_BACKENDS)}")
    return factory(direct_io=config.direct_io, block_size=config.block_size)
