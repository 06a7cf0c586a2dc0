"""A manifest is never trusted blindly: every malformed or altered one rejects its checkpoint, with a
reason, and restore falls back to the previous complete checkpoint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ckpt_util import data_files
from dlio_ckpt.checkpoint.fileio import verify_file
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME
from test_checkpoint_engine import _two_checkpoints


def two_checkpoints(tmp_path, extra=()):
    """Checkpoints at steps 1 and 2; returns the engine and step 2's folder."""
    _, engine = _two_checkpoints(tmp_path, extra)
    return engine, Path(engine.root) / engine.layout.folder(2)


def rewrite(folder: Path, change, resign: bool = True) -> None:
    """Apply `change` to the manifest's fields; with `resign`, recompute its own checksum as the
    documented format says (SHA-256 of the canonical JSON of every other field), as an editor who
    knows the format would."""
    path = folder / MANIFEST_NAME
    body = json.loads(path.read_text())
    digest = body.pop("manifest_sha256", None)
    body = change(body)
    if isinstance(body, dict) and digest is not None:
        body["manifest_sha256"] = (hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
                                   if resign else digest)
    path.write_text(json.dumps(body))


def flip_a_data_byte(folder: Path) -> None:
    victim = data_files(folder)[0]
    with open(victim, "r+b") as handle:
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 0xFF]))


def first_file(change):
    def apply(body):
        change(body["files"][0])
        return body
    return apply


def with_key(key, value):
    def apply(body):
        body[key] = value
        return body
    return apply


def renamed(old, new):
    def apply(body):
        body[new] = body.pop(old)
        return body
    return apply


CASES = {
    "unknown algorithm": (with_key("checksum", "md5"), True, "unknown checksum algorithm 'md5'"),
    "unknown algorithm, not re-signed": (with_key("checksum", "md5"), False, "manifest altered or damaged"),
    "empty checksum": (first_file(lambda f: f.update(checksum="")), True, "empty xxh3_128 checksum"),
    "no files": (lambda b: {**b, "files": [], "data_bytes": 0}, True, "manifest lists no files"),
    "renamed key": (renamed("files", "file"), True, "manifest lacks files"),
    "renamed file key": (first_file(lambda f: f.update(length=f.pop("size"))), True, "lacks size"),
    "json list": (lambda b: [b], True, "manifest is a JSON list, not an object"),
    "tampered size": (first_file(lambda f: f.update(size=f["size"] + 1)), False, "manifest altered or damaged"),
    "size of the wrong type": (first_file(lambda f: f.update(size=str(f["size"]))), True, "size is not of type int"),
    "path traversal": (first_file(lambda f: f.update(path="../step_00000001/" + f["path"])), True, "leaves the checkpoint folder"),
    "absolute path": (first_file(lambda f: f.update(path="/etc/hostname")), True, "leaves the checkpoint folder"),
    "another step": (with_key("step", 1), True, "manifest is for step 1"),
    "no checksum of its own": (lambda b: b, None, "without its own checksum"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_manifest_rejects_its_checkpoint(tmp_path, case):
    change, resign, reason = CASES[case]
    engine, folder = two_checkpoints(tmp_path)
    flip_a_data_byte(folder)  # whatever the manifest says, these bytes are not the ones written
    if resign is None:
        body = json.loads((folder / MANIFEST_NAME).read_text())
        del body["manifest_sha256"]
        (folder / MANIFEST_NAME).write_text(json.dumps(body))
    else:
        rewrite(folder, change, resign)
    restored = engine.restore()
    assert restored.verified and restored.checkpoint_step == 1
    assert len(restored.skipped) == 1 and restored.skipped[0].startswith("step_00000002: ")
    assert reason in restored.skipped[0]


def test_an_intact_manifest_still_catches_a_flipped_byte(tmp_path):
    engine, folder = two_checkpoints(tmp_path)
    flip_a_data_byte(folder)
    restored = engine.restore()
    assert restored.checkpoint_step == 1 and "xxh3_128 checksum mismatch" in restored.skipped[0]


def test_no_checkpoint_left_is_not_restored(tmp_path):
    engine, folder = two_checkpoints(tmp_path)
    rewrite(folder, with_key("checksum", "md5"))
    rewrite(folder.parent / engine.layout.folder(1), lambda b: {**b, "files": [], "data_bytes": 0})
    restored = engine.restore()
    assert not restored.verified and restored.checkpoint_step == -1 and restored.bytes == 0
    assert str(folder.parent) in restored.message
    assert "step_00000002: manifest names an unknown checksum algorithm" in restored.message
    assert "step_00000001: manifest lists no files" in restored.message


def test_checksum_none_restores_unverified(tmp_path):
    engine, folder = two_checkpoints(tmp_path, ["checkpoint.checksum=none"])
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    assert manifest["checksum"] == "none" and all(f["checksum"] == "" for f in manifest["files"])
    restored = engine.restore()
    assert restored.checkpoint_step == 2 and restored.bytes > 0
    assert restored.verified is False
    assert "unverified:" in restored.message and " verified" not in restored.message


def test_verify_file_refuses_unknown_algorithms_and_empty_checksums(tmp_path):
    engine, folder = two_checkpoints(tmp_path)
    victim = data_files(folder)[0]
    buffer = memoryview(bytearray(4096))
    size = victim.stat().st_size
    assert verify_file(engine.restore_storage, str(victim), size, "abc", "md5", buffer)[1] == "unknown checksum algorithm 'md5'"
    assert verify_file(engine.restore_storage, str(victim), size, "", "xxh3_128", buffer)[1] == "no xxh3_128 checksum recorded"
    assert verify_file(engine.restore_storage, str(victim), size, "", "none", buffer) == (size, None)


def test_a_deleted_data_file_rejects_its_checkpoint(tmp_path):
    engine, folder = two_checkpoints(tmp_path)
    victim = data_files(folder)[0]
    victim.unlink()
    restored = engine.restore()
    assert restored.verified and restored.checkpoint_step == 1
    assert restored.skipped == [f"step_00000002: {victim.name}: missing"]
