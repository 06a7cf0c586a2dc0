"""The contents of a checkpoint's metadata files, as pure values: the manifest and a layout's
coordinator file (DCP's `.metadata`).

Kept apart from writing them so that what a commit says about a checkpoint (which files, their
sizes and checksums, the chain an encoded checkpoint needs, the resume point) can be built and
checked without storage, and so that the commit module holds only the order of writes and
fsyncs. The manifest's fields are listed in manifest.py, which also validates them on restore.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from dlio_ckpt.checkpoint.fileio import new_hasher
from dlio_ckpt.plan.checkpoint import PlannedFile


@dataclass(frozen=True)
class CheckpointIdentity:
    """What every manifest of one engine says about who wrote it and how."""

    run_id: str
    strategy: str
    layout: str
    format: str
    checksum: str
    world_size: int


def manifest_fields(identity: CheckpointIdentity, index: int, step: int, epoch: int, files: list[dict],
                    encoding: str, chain_steps: dict[int, int], resume: dict | None,
                    written_at: float) -> dict[str, Any]:
    """The manifest of checkpoint `index` at `step` listing `files` (encode_manifest writes it).
    An encoded checkpoint names its encoding and the [index, step] of every checkpoint its files'
    chains need (`chain_steps`: index -> step); `resume` is the loop's resume point, if any."""
    fields: dict[str, Any] = {}
    needed = sorted({i for f in files for i in f.get("encoding", {}).get("chain", [])})
    if needed:
        fields.update(encoding=encoding, chain=[[i, chain_steps[i]] for i in needed])
    if resume is not None:
        fields["resume"] = resume
    return {
        **fields,
        "index": index,
        "step": step,
        "epoch": epoch,
        "run_id": identity.run_id,
        "strategy": identity.strategy,
        "layout": identity.layout,
        "format": identity.format,
        "checksum": identity.checksum,
        "world_size": identity.world_size,
        "data_bytes": sum(f["size"] for f in files),
        "files": files,
        "written_at": written_at,
    }


def without_records(files: list[dict]) -> list[dict]:
    """The manifest's file entries: each file's records (DCP: tensor, offset, length) travel to the
    coordinator's own index, never into the manifest."""
    return [{k: v for k, v in f.items() if k != "records"} for f in files]


def metadata_entry(name: str, content: bytes, checksum: str) -> dict:
    """The manifest entry of a coordinator file rank 0 wrote."""
    return {"path": name, "size": len(content), "checksum": content_digest(content, checksum), "owner": 0, "writer": 0}


def coordinator_content(fmt: Any, layout_name: str, files_by_rank: Sequence[tuple[PlannedFile, ...]], step: int,
                        files: list[dict], folder: str) -> bytes:
    """A layout's coordinator file (DCP's `.metadata`): where every tensor of the checkpoint is;
    the framework's own where the format writes it (torch under DCP: its pickled Metadata),
    else a JSON list of the files and their tensors."""
    own = getattr(fmt, "coordinator_content", None)
    if own is not None:
        tensors = {pf.path_for(step): pf.tensors for rank_files in files_by_rank for pf in rank_files}
        return own(files, tensors, folder)
    return json.dumps({
        "step": step,
        "layout": layout_name,
        "files": [{"path": f["path"], "owner": f["owner"], "size": f["size"]} for f in files],
        "tensors": {pf.path_for(step): [[t.name, t.numel, t.framework_dtype] for t in pf.tensors]
                    for rank_files in files_by_rank for pf in rank_files},
    }).encode()


def content_digest(data: bytes, algorithm: str) -> str:
    """`data`'s checksum under `algorithm` ("" for none)."""
    hasher = new_hasher(algorithm)
    if hasher is None:
        return ""
    hasher.update(data)
    return hasher.hexdigest()
