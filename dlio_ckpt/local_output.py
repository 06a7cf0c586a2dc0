"""The command-line tools' own output files (an imported workload, a described model, a profiled
workload): written whole or not at all, so an interrupted tool never leaves half a YAML behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_whole(out: Path, text: str) -> None:
    """`text` at `out`: a temporary name beside it, fsynced, renamed over it."""
    fd, temp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent.resolve())
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o644)  # as an ordinary new file (mkstemp's are private)
        os.replace(temp, out)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
