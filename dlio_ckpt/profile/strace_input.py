"""`--strace FILES`: the bytes each file was written, from `strace -f -y` output, for the files
darshan-runtime saw opened but counted no writes of (a log whose POSIX records ran out: partial).

Only what the Darshan log lacks is taken, and only write-side byte counts: a checkpoint's size per
save when the log is partial and the files are gone from disk. The lines are what
`strace -f -y -s 0 -e trace=write,writev,pwrite64,pwritev,pwritev2 -o PREFIX [-ff]` writes:
`writev(5</ckpt/checkpoint_1.pt>, [...], 3) = 9216`; `-y` puts each descriptor's path beside it,
so no open has to be followed. A file that holds no such line is bad input (one line, exit 2).
"""

from __future__ import annotations

import re
from pathlib import Path

from dlio_ckpt.errors import UserError

_WRITE = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?(write|writev|pwrite64|pwritev|pwritev2)\(\d+<([^>]*)>.*\)\s+=\s+(\d+)")


def written_bytes(paths: list[Path]) -> dict[str, int]:
    """Bytes written per file path over all the strace outputs given."""
    out: dict[str, int] = {}
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            raise UserError(f"--strace {path}: cannot be read ({exc.strerror})") from None
        found = 0
        for line in text.splitlines():
            match = _WRITE.match(line.strip())
            if match:
                found += 1
                out[match.group(2)] = out.get(match.group(2), 0) + int(match.group(3))
        if not found and "(" not in text:
            raise UserError(f"--strace {path}: holds no strace lines; record with strace -f -y -o FILE")
    return out
