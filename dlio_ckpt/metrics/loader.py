"""summary.train.loader: where a PyTorch-style loader's time went besides the storage calls.

The training loop only sees `data_wait_s`. Behind it, the loader's workers (reader.workers=processes,
engine/workers.py) spend time starting, in the format's reads (storage calls and the format's own
parsing), decoding (reader.decode) and collating: each happens for real and is timed where it
happens, so a wait can be told apart from storage time (docs/metrics.md). Durations take the
slowest rank, as every duration in the summary does.
"""

from __future__ import annotations

from typing import Any

FIGURES = ("worker_start_s", "fetch_s", "decode_s", "collate_s")


def loader_section(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    loaders = [r.get("loader") or {} for r in ranks]
    if not any(loaders):
        return None
    section: dict[str, Any] = {"workers": loaders[0].get("workers"),
                               "worker_starts": max(int(l.get("worker_starts", 0)) for l in loaders)}
    for figure in FIGURES:
        section[figure] = max(float(l.get(figure, 0.0)) for l in loaders)
    # storage time inside the fetch: the train phase's read calls (their union, slowest rank)
    section["storage_read_s"] = max(r["io"].get("train", {}).get("read_s", 0.0) for r in ranks)
    return section
