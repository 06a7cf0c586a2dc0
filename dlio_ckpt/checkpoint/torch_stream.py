"""The stream torch.save writes the `torch` format's file through: the one place that decides
between the C TorchStream (checkpoint/_torch_stream_c.c) and the Python pair it stands for,
filebuf.FilebufStream under torch_archive.ArchiveNamed.

Both issue the same system calls with the same bytes (tests/test_torch_stream_c.py); the C one
because the Python pair's ~600 calls a save (five per zip record, each through pybind11) are the
emulator's time inside the timed save, which torch.save into a path spends in C++. Where the
extension is not built (an install without a compiler), the Python pair runs.
"""

from __future__ import annotations

from typing import Any

from dlio_ckpt.checkpoint.filebuf import FilebufStream
from dlio_ckpt.checkpoint.torch_archive import ArchiveNamed


def _load_torch_stream_c():
    """The C TorchStream's module, or None where it is not built."""
    try:
        from dlio_ckpt.checkpoint import _torch_stream_c
    except ImportError:
        return None
    return _torch_stream_c


_torch_stream_c = _load_torch_stream_c()


def torch_stream(handle: Any, stem: str, alignment: int) -> Any:
    """A write-only stream for torch.save over `handle` issuing libstdc++ basic_filebuf's calls,
    its records renamed from `archive/` to `<stem>/` when `stem` is given (torch_archive.py)."""
    if _torch_stream_c is not None:
        return _torch_stream_c.TorchStream(handle, stem, alignment)
    stream = FilebufStream(handle)
    return ArchiveNamed(stream, stem, alignment) if stem else stream
