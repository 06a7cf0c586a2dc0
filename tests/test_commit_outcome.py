"""What a commit's outcome means (checkpoint/engine.py commit, levels.py flushes): a failure after
the manifest (the tag, retention) is reported as a failure after a commit that stands, never as an
uncommitted checkpoint; and an encoder builds on a checkpoint only once it was committed, so a
failed commit leaves it as it was and the checkpoints after it restore bit for bit."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from ckpt_util import make_ctx
from test_encoded_checkpoints import INCREMENTAL, LOSSY, expected_digests, manifest

from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.codec.incremental import IncrementalEncoder
from dlio_ckpt.errors import RunFailure
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME
from dlio_ckpt.state.base import BytesView
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.traced import TracedStorage


def _busy_remove_tree(self, path):
    raise OSError(errno.EBUSY, "Device or resource busy", path)


def test_a_retention_failure_after_the_commit_says_the_checkpoint_is_committed(tmp_path, monkeypatch):
    ctx = make_ctx(tmp_path, ["checkpoint.keep_last=1"])
    engine = make_checkpoint_engine(ctx)
    engine.save(1, 1)
    monkeypatch.setattr(PosixStorage, "remove_tree", _busy_remove_tree)
    with pytest.raises(RunFailure) as failure:
        engine.save(2, 1)
    message = str(failure.value)
    assert "not committed" not in message
    assert message.startswith("checkpoint step_00000002 committed (its manifest is written), but retention "
                              "(checkpoint.keep_last=1) failed to delete an older checkpoint: ")
    assert "Device or resource busy" in message and failure.value.known_everywhere
    root = Path(engine.root)
    assert (root / "step_00000002" / MANIFEST_NAME).is_file()  # the commit stands
    assert (root / "step_00000001" / MANIFEST_NAME).is_file()  # what retention could not delete
    restored = engine.restore()
    assert restored.checkpoint_step == 2 and restored.verified


def test_a_tag_failure_after_the_commit_says_the_checkpoint_is_committed(tmp_path, monkeypatch):
    ctx = make_ctx(tmp_path, ["checkpoint.layout=deepspeed", "checkpoint.keep_last=0"])
    engine = make_checkpoint_engine(ctx)
    real = TracedStorage.write_atomic

    def no_tag(self, path, data):
        if os.path.basename(path) == "latest":
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real(self, path, data)

    monkeypatch.setattr(TracedStorage, "write_atomic", no_tag)
    with pytest.raises(RunFailure, match=r"^checkpoint global_step1 committed \(its manifest is written\), "
                                         r"but its 'latest' tag was not written: .*Read-only file system"):
        engine.save(1, 1)
    assert (Path(engine.root) / "global_step1" / MANIFEST_NAME).is_file()


def test_a_retention_failure_on_a_flush_target_leaves_the_flush_committed(tmp_path, monkeypatch, capsys):
    levels = (f"checkpoint.levels=[{{name:local,path:{tmp_path / 'local'},scope:node,keep_last:0}},"
              f"{{name:shared,every:2,write:flush,keep_last:1}}]")
    ctx = make_ctx(tmp_path, [levels])
    engine = make_checkpoint_engine(ctx)
    for step in (1, 2, 3):
        engine.save(step, 1)
    monkeypatch.setattr(PosixStorage, "remove_tree", _busy_remove_tree)
    engine.save(4, 1)
    engine.finish()
    flush = engine.flushes[-1]
    assert flush.step == 4 and flush.committed and flush.error == ""
    shared = Path(engine.engines[1].root)
    assert (shared / "step_00000004" / MANIFEST_NAME).is_file() and (shared / "step_00000002").is_dir()
    err = capsys.readouterr().err
    assert "flush of step_00000004 to level shared committed (its manifest is written), but retention " \
           "(keep_last=1) failed to delete an older checkpoint on level shared" in err
    assert "failed: " not in err.replace("failed to delete", "")


@pytest.mark.parametrize("encoding", ["incremental", "lossy"])
def test_a_failed_commit_leaves_the_encoder_so_later_checkpoints_restore(tmp_path, monkeypatch, encoding):
    """Checkpoint 2 fails after its file was encoded and written (the fault point), is not
    committed, and its folder is removed; checkpoint 3 must not build on it."""
    ctx = make_ctx(tmp_path, (INCREMENTAL if encoding == "incremental" else LOSSY + ["checkpoint.keep_last=0"]))
    engine = make_checkpoint_engine(ctx)
    engine.save(1, 1)
    monkeypatch.setenv("DLIO_CKPT_FAULT", "checkpoint-step:2@0")
    with pytest.raises(RunFailure, match="step_00000002 not committed"):
        engine.save(2, 1)
    monkeypatch.delenv("DLIO_CKPT_FAULT")
    assert not (Path(engine.root) / "step_00000002").exists()
    engine.save(3, 1)
    engine.finish()
    newest = manifest(Path(engine.root) / "step_00000003")
    restored = engine.restore()
    assert restored.checkpoint_step == 3 and restored.verified and not restored.skipped
    if encoding == "incremental":
        assert [s for _, s in newest["chain"]] == [1, 3] and restored.chain_length == 2
        assert restored.state_digests == expected_digests(engine, (1, 2, 3))  # bit for bit
    else:  # lossy forgets on a failed commit: the next checkpoint is a full one
        assert [s for _, s in newest["chain"]] == [3] and restored.chain_length == 1


def _state(seed: int, size: int = 64 << 10) -> bytearray:
    return bytearray(np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes())


def _container(encoder: IncrementalEncoder, index: int, state: bytearray):
    encoded = encoder.encode(index, "f", BytesView(state))
    return b"".join(bytes(p) for p in encoded.chunks(1 << 16)), encoded.chain


def test_an_incremental_encoder_is_as_it_was_after_an_uncommitted_checkpoint():
    states = [_state(0), _state(0), _state(0)]
    states[1][:4096] = _state(1)[:4096]
    states[2][4096:8192] = _state(2)[:4096]
    failed, clean = IncrementalEncoder(4096), IncrementalEncoder(4096)
    for encoder in (failed, clean):
        _container(encoder, 0, states[0])
        encoder.settle(0, committed=True)
    _container(failed, 1, states[1])
    failed.settle(1, committed=False)
    assert _container(failed, 1, states[2]) == _container(clean, 1, states[2])


def test_an_incremental_encoder_builds_on_checkpoints_in_flight_and_adopts_them_in_order():
    """async with max_in_flight > 1: checkpoint 2 is encoded before checkpoint 1 commits."""
    states = [_state(0), _state(0), _state(0)]
    states[1][:4096] = _state(1)[:4096]
    states[2][4096:8192] = _state(2)[:4096]
    encoder = IncrementalEncoder(4096)
    assert _container(encoder, 0, states[0])[1] == (0,)
    assert _container(encoder, 1, states[1])[1] == (0, 1)
    assert _container(encoder, 2, states[2])[1] == (0, 1, 2)
    encoder.settle(0, committed=True)
    encoder.settle(1, committed=False)  # 1 failed: 2 was built on it and is dropped too
    assert _container(encoder, 1, states[2])[1] == (0, 1)


def test_a_folder_that_cannot_be_fsynced_fails_the_commit_before_the_manifest(tmp_path, monkeypatch):
    """A folder fsync is part of the commit: its failure (EIO) is a checkpoint not committed,
    with no manifest written and the folder removed, like a failed write."""
    ctx = make_ctx(tmp_path, ["checkpoint.keep_last=0"])
    engine = make_checkpoint_engine(ctx)

    def failing(self, path):
        raise OSError(errno.EIO, "Input/output error", path)

    monkeypatch.setattr(PosixStorage, "fsync_dir", failing)
    with pytest.raises(RunFailure, match=r"^checkpoint step_00000001 not committed: .*step_00000001: Input/output error"):
        engine.save(1, 1)
    assert not (Path(engine.root) / "step_00000001").exists()


def test_the_commits_folder_fsyncs_are_traced_in_the_checkpoint_phase_before_the_manifest(tmp_path):
    """They are I/O of the run: one fsync event per folder, in the checkpoint phase (so in the
    trace, Darshan's POSIX_FSYNCS and the commit's time), between the data file's fsync and the
    manifest's open."""
    from dlio_ckpt.storage.events import OP_CODE, PHASE_CODE, RAW_TIMES

    ctx = make_ctx(tmp_path, ["checkpoint.layout=megatron", "checkpoint.keep_last=0"])
    engine = make_checkpoint_engine(ctx)
    engine.save(1, 1)
    events = ctx.recorder.array()
    paths = ctx.recorder.paths
    folder = os.path.join(engine.root, "iter_0000001")
    order = [(int(e["op"]), paths[e["file"]]) for e in events if (int(e["phase"]) & ~RAW_TIMES) == PHASE_CODE["checkpoint"]]
    fsyncs = [p for op, p in order if op == OP_CODE["fsync"]]
    data = os.path.join(folder, "mp_rank_00", "model_optim_rng.pt")
    tmp = str(tmp_path)
    assert fsyncs[0] == data
    above = [os.path.join(folder, "mp_rank_00"), folder, engine.root, os.path.dirname(engine.root), tmp]
    assert fsyncs[1:6] == above  # deepest first: the rank folder ... storage.root
    manifest_open = next(i for i, (op, p) in enumerate(order) if op == OP_CODE["open"] and MANIFEST_NAME in p)
    assert manifest_open > max(i for i, (op, p) in enumerate(order) if op == OP_CODE["fsync"] and p == tmp)
