"""Dropping the page cache (storage.drop_caches=true), so that reads start from a cold cache: before
the run's phases (phases.py) and before a restart's restore (failures.py)."""

from __future__ import annotations

import subprocess


def drop_page_cache() -> str | None:
    """Write back dirty pages and drop the page cache; returns why it failed, or None."""
    try:
        subprocess.run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as control:
            control.write("3\n")
    except OSError as exc:
        return f"could not drop the page cache ({exc.strerror}; it needs root): reads may be served from memory"
    return None
