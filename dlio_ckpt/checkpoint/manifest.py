"""The checkpoint manifest: what a commit writes last, and the only thing restore trusts.

A manifest that was edited, truncated or damaged must never let a checkpoint through, so restore
accepts one only when (1) it is a JSON object with exactly the fields below, each of its type;
(2) its own SHA-256 (`manifest_sha256`, over the canonical JSON of every other field) matches;
(3) its checksum algorithm is one this program computes, every file has a checksum in it (or the
run chose `none`, and restore then says "unverified"), it lists at least one file, and every file
path stays inside the checkpoint folder. Anything else is a rejected checkpoint with a reason.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

MANIFEST_VERSION = 2
CHECKSUM_ALGORITHMS = ("xxh3_128", "blake3")  # "none": sizes only, and restore says "unverified"
DIGEST_KEY = "manifest_sha256"

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "version": int,
    "index": int,
    "step": int,
    "epoch": int,
    "run_id": str,
    "strategy": str,
    "layout": str,
    "format": str,
    "checksum": str,
    "world_size": int,
    "data_bytes": int,
    "files": list,
    "written_at": (int, float),
}
_FILE_FIELDS: dict[str, type] = {"path": str, "size": int, "checksum": str, "owner": int, "writer": int}
# Present only where they apply: an encoded checkpoint (checkpoint.encoding=incremental|lossy) names
# its encoding and the chain of earlier checkpoints it needs ([index, step] pairs, oldest first);
# `resume` is the training's resume point (data-loader position) when the loop gave one.
_OPTIONAL_FIELDS: dict[str, type | tuple[type, ...]] = {"encoding": str, "chain": list, "resume": dict}
# An encoded file: codec, checkpoint index, file key (path template), container offset and size in
# the file, logical bytes, the restored state's xxh3_128 and the indices it needs.
_OPTIONAL_FILE_FIELDS: dict[str, type] = {"encoding": dict}
_ENCODING_FIELDS: dict[str, type | tuple[type, ...]] = {
    "codec": str, "index": int, "key": str, "offset": int, "container_bytes": int, "logical_bytes": int,
    "state_digest": str, "chain": list}


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def encode_manifest(fields: dict[str, Any]) -> bytes:
    """The manifest file's bytes: `fields` (with `version`) plus the digest that protects them."""
    body = {"version": MANIFEST_VERSION, **fields}
    body[DIGEST_KEY] = hashlib.sha256(_canonical(body)).hexdigest()
    return json.dumps(body, indent=1).encode()


def _typed(value: Any, kind: type | tuple[type, ...]) -> bool:
    return isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)


def _schema_problem(found: dict[str, Any], expected: dict[str, Any], where: str,
                    optional: dict[str, Any] | None = None) -> str | None:
    """Exactly the expected fields (and any of the optional ones), each of its type; else what is wrong."""
    optional = optional or {}
    missing = sorted(set(expected) - set(found))
    unknown = sorted(set(found) - set(expected) - set(optional))
    if missing:
        return f"{where} lacks {', '.join(missing)}"
    if unknown:
        return f"{where} has unknown fields {', '.join(unknown)}"
    for key, kind in {**expected, **{k: v for k, v in optional.items() if k in found}}.items():
        if not _typed(found[key], kind):
            return f"{where}: {key} is not of type {getattr(kind, '__name__', 'number')}"
    return None


def _file_problem(entry: Any, number: int, folder: str, algorithm: str, world_size: int) -> str | None:
    where = f"manifest file entry {number}"
    if not isinstance(entry, dict):
        return f"{where} is not an object"
    problem = _schema_problem(entry, _FILE_FIELDS, where, _OPTIONAL_FILE_FIELDS)
    if problem:
        return problem
    if "encoding" in entry:
        problem = _encoding_problem(entry["encoding"], entry, f"{where} ({entry['path']})")
        if problem:
            return problem
    path = entry["path"]
    if not path or os.path.isabs(path) or ".." in path.replace("\\", "/").split("/"):
        return f"{where}: path {path!r} leaves the checkpoint folder"
    root = os.path.realpath(folder)
    if not os.path.realpath(os.path.join(root, path)).startswith(root + os.sep):
        return f"{where}: path {path!r} leaves the checkpoint folder"
    if entry["size"] < 0 or entry["owner"] < 0 or not 0 <= entry["writer"] < world_size:
        return f"{where} ({path}): negative size or owner, or a writer outside the {world_size} ranks"
    if algorithm != "none" and not entry["checksum"]:
        return f"{where} ({path}): empty {algorithm} checksum"
    return None


def _encoding_problem(encoding: dict, entry: dict, where: str) -> str | None:
    problem = _schema_problem(encoding, _ENCODING_FIELDS, f"{where} encoding")
    if problem:
        return problem
    if not all(_typed(i, int) and i >= 0 for i in encoding["chain"]) or encoding["chain"] != sorted(set(encoding["chain"])):
        return f"{where}: encoding chain is not a rising list of checkpoint indices"
    if not encoding["chain"] or encoding["chain"][-1] != encoding["index"]:
        return f"{where}: encoding chain does not end with its own checkpoint index"
    if encoding["offset"] < 0 or encoding["container_bytes"] < 0 or encoding["offset"] + encoding["container_bytes"] > entry["size"]:
        return f"{where}: encoded container lies outside the file"
    return None


def _chain_problem(manifest: dict[str, Any]) -> str | None:
    chain = manifest.get("chain", [])
    pairs = [c for c in chain if isinstance(c, list) and len(c) == 2 and all(_typed(x, int) and x >= 0 for x in c)]
    if len(pairs) != len(chain) or [c[0] for c in chain] != sorted({c[0] for c in chain}):
        return "manifest chain is not a rising list of [index, step] pairs"
    needed = {i for entry in manifest["files"] for i in entry.get("encoding", {}).get("chain", [])}
    if not needed <= {c[0] for c in chain}:
        return "manifest chain lacks checkpoints its files need"
    return None


def parse_manifest(raw: bytes, folder: str, step: int) -> dict[str, Any] | str:
    """The manifest of checkpoint `step` in `folder`, or why it must be rejected."""
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        return f"unreadable manifest ({exc})"
    if not isinstance(manifest, dict):
        return f"manifest is a JSON {type(manifest).__name__}, not an object"
    version = manifest.get("version")
    if version != MANIFEST_VERSION:
        return f"manifest version {version!r} (this program reads version {MANIFEST_VERSION}, which carries its own checksum)"
    digest = manifest.pop(DIGEST_KEY, None)
    if not isinstance(digest, str) or not digest:
        return f"manifest without its own checksum ({DIGEST_KEY})"
    if hashlib.sha256(_canonical(manifest)).hexdigest() != digest:
        return f"manifest altered or damaged: its {DIGEST_KEY} does not match its contents"
    problem = _schema_problem(manifest, _FIELDS, "manifest", _OPTIONAL_FIELDS)
    if problem:
        return problem
    algorithm = manifest["checksum"]
    if algorithm not in CHECKSUM_ALGORITHMS + ("none",):
        return f"manifest names an unknown checksum algorithm {algorithm!r} (known: {', '.join(CHECKSUM_ALGORITHMS)}, none)"
    if manifest["step"] != step:
        return f"manifest is for step {manifest['step']}, not for this folder's step {step}"
    if manifest["world_size"] < 1:
        return "manifest world_size is below 1"
    files = manifest["files"]
    if not files:
        return "manifest lists no files"
    for number, entry in enumerate(files):
        problem = _file_problem(entry, number, folder, algorithm, manifest["world_size"])
        if problem:
            return problem
    if manifest["data_bytes"] != sum(entry["size"] for entry in files):
        return f"manifest data_bytes {manifest['data_bytes']} is not the sum of its file sizes"
    problem = _chain_problem(manifest)
    if problem:
        return problem
    return manifest
