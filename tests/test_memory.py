"""Peak memory is this program's own, not that of the process that started it."""

from __future__ import annotations

import subprocess
import sys

PARENT = """
import os, sys
big = bytearray(600 << 20)
big[::4096] = b"x" * len(big[::4096])  # touch every page: resident
del big
os.execv(sys.executable, [sys.executable, "-c",
         "from dlio_ckpt.memory import peak_rss_bytes; print(peak_rss_bytes())"])
"""


def test_peak_rss_does_not_inherit_the_peak_of_the_process_that_execed_us():
    done = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, check=True, timeout=60)
    peak = int(done.stdout.strip())
    assert 0 < peak < 300 << 20  # a fresh interpreter with dlio_ckpt imported; the parent held 600 MiB
