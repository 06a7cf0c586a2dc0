"""What a restore reads, as pure values: which checkpoints to try, which files each rank reads,
where a restored file's tensors belong in this run's plan.

The reader (restore.py) does the reading and checking; every choice it makes about *what* to read
is here, a function of the folders found, the manifest and the CheckpointPlan, so it can be
tested without storage or MPI (DCP's load planner, apart from its StorageReader).
"""

from __future__ import annotations

from typing import Sequence

from dlio_ckpt.plan.checkpoint import PlannedFile


def candidates(listing: list[tuple[int, str, bool]], step: int | None) -> list[int]:
    """The steps to try, newest first: every checkpoint folder found (complete or not: a torn one
    is tried and reported as skipped), or only `step`'s."""
    return [s for s, _, _ in reversed(listing) if step is None or s == step]


def reads_entry(entry: dict, rank: int, world_size: int, load_state: bool) -> bool:
    """Whether `rank` reads the manifest `entry`: a restart loads each rank's own state, whoever
    wrote it; a restore check reads what each rank wrote (a rank of a smaller run reads the files
    of the ranks beyond it, round robin)."""
    reader = entry["owner"] if load_state else entry["writer"]
    return reader % world_size == rank


def planned_file(files_by_rank: Sequence[tuple[PlannedFile, ...]], owner: int, key: str,
                 step: int | None) -> PlannedFile | str:
    """The planned file of rank `owner` whose path template is `key` (or, given `step`, whose
    path at that step is `key`): where a restored file's tensors and state belong; or why there
    is none in this run's plan."""
    if not 0 <= owner < len(files_by_rank):
        return f"written by rank {owner}, outside this run's {len(files_by_rank)} ranks"
    for pf in files_by_rank[owner]:
        if (pf.path_for(step) if step is not None else pf.relpath) == key:
            return pf
    return f"not a file of this run's plan for rank {owner} (written with another model, layout or world size)"


def same_file(manifest: dict, key: str, owner: int) -> dict | None:
    """The entry of `manifest` holding the encoded file `key` of rank `owner`."""
    for entry in manifest["files"]:
        if entry.get("owner") == owner and entry.get("encoding", {}).get("key") == key:
            return entry
    return None


def chain_length(entry: dict) -> int:
    """How many checkpoints are read to rebuild `entry`'s file (1: a full checkpoint)."""
    return len(entry.get("encoding", {}).get("chain", [1]))


def state_key(entry: dict) -> str:
    """The key of `entry`'s restored state digest: the encoded file's key, else its path."""
    return entry.get("encoding", {}).get("key", entry["path"])
