"""summary.json `resume`: every rank's resume checks (engine/resume_checks.py) gathered into one section.

Here, with the other failure sections (goodput.py), because it only reads what the ranks report:
the first divergence of any rank, the counts, and one digest per checkpointed step over all ranks.
"""

from __future__ import annotations

from typing import Any

import xxhash


def resume_section(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json `resume`, from every rank's ResumeChecks.local()."""
    found = [r["divergence"] for r in ranks if r["divergence"]]
    first = min(found, key=lambda d: (d["step"], d["rank"])) if found else None
    restored = any(r["restores"] for r in ranks)
    steps = sorted({int(s) for r in ranks for s in r["state_digests"]})
    combined = {}
    for step in steps:
        hasher = xxhash.xxh3_128()
        for r in ranks:
            hasher.update(f"{r['state_digests'].get(str(step), '')};".encode())
        combined[str(step)] = hasher.hexdigest()
    return {
        "deterministic": (first is None) if restored else None,  # None: no restart happened, nothing to check
        "first_divergence": first,
        "samples_checked": sum(r["samples_checked"] for r in ranks),
        "states_checked": sum(r["states_checked"] for r in ranks),
        "sample_order_digests": [r["sample_order_digest"] for r in ranks],
        "checkpoint_state_digests": combined,
    }
