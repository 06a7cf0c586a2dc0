"""What a framework's save does besides its bytes, in the emulated save (checkpoint/framework_work.py).

- torch.save's container, as the emulation writes it, carries the CRC-32 torch computes of every
  record (read back with zipfile, an independent reader, and zlib);
- checkpoint.framework_cpu_s is spent as CPU on the saving thread, inside the save, and adds no I/O;
- DCP's `_storage_setup` runs inside the first emulated save, as in dcp.save (its fsspec import);
- the summary reports it per save (`framework_s_max`) apart from the write time's split, and the
  save's CPU on its thread (`cpu_s_max`, prepare left out), which fidelity.py compares with the program's.
No time is asserted beyond what the CPU clock guarantees by construction (a thread kept busy until
its clock has advanced by s seconds took at least s seconds).
"""

from __future__ import annotations

import time
import zipfile
import zlib
from pathlib import Path

import pytest

from ckpt_util import make_ctx
from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.checkpoint.framework_work import spend_cpu
from dlio_ckpt.checkpoint.report import checkpoint_summary
from dlio_ckpt.config.load import load_config
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.metrics.checkpoint_rows import writer_rows

FRAMEWORK = ["checkpoint.durability=framework", "checkpoint.format=torch"]


def _checkpoint_ops(ctx) -> dict:
    return {op: n for (phase, op), n in ctx.recorder.op_counts.items() if phase == "checkpoint"}


def test_spending_cpu_advances_the_threads_cpu_clock_by_at_least_the_seconds():
    began = time.thread_time()
    wall = spend_cpu(0.03)
    assert time.thread_time() - began >= 0.03 and wall >= 0.03
    assert spend_cpu(0.0) == 0.0 and spend_cpu(-1.0) == 0.0


def test_the_emulated_torch_save_carries_torchs_crc32_of_every_record(tmp_path):
    """The CRC-32s are computed by torch's own zip writer as the bytes pass (nothing read back):
    each member's CRC field equals zlib.crc32 of the member's bytes, and torch.load reads it."""
    torch = pytest.importorskip("torch")
    ctx = make_ctx(tmp_path, FRAMEWORK)
    engine = make_checkpoint_engine(ctx)
    engine.save(1, 1)
    engine.finish()
    files = [p for p in Path(engine.root).rglob("*") if p.is_file()]
    assert len(files) == 1 and "read" not in _checkpoint_ops(ctx)
    with zipfile.ZipFile(files[0]) as archive:
        members = archive.infolist()
        assert len(members) > 4 and archive.testzip() is None
        for info in members:
            assert info.CRC == zlib.crc32(archive.read(info)), info.filename
    state = torch.load(files[0], weights_only=True)
    assert sum(t.numel() * t.element_size() for t in state.values()) == sum(t.nbytes for pf in engine.plan.files_by_rank[0]
                                                                           for t in pf.tensors)


def test_framework_cpu_is_spent_inside_the_save_and_adds_no_io(tmp_path):
    pytest.importorskip("torch")
    counts, records = [], []
    for seconds in (0.0, 0.05):
        ctx = make_ctx(tmp_path / str(seconds), [*FRAMEWORK, f"checkpoint.framework_cpu_s={seconds}"])
        engine = make_checkpoint_engine(ctx)
        records.append(engine.save(1, 1))
        engine.finish()
        counts.append(_checkpoint_ops(ctx))
    assert counts[0] == counts[1]  # the same opens, writes, closes: nothing added
    plain, busy = records
    assert busy.framework_s >= 0.05  # kept busy until its CPU clock advanced 0.05 s
    # the save's CPU on its thread holds that CPU, prepare left out; one thread uses no more CPU than wall time
    assert 0.05 <= busy.cpu_s <= busy.blocking_s
    assert busy.blocking_s >= busy.framework_s + busy.write_s  # inside the save, apart from the write time
    assert plain.framework_s < busy.framework_s


def test_the_first_save_alone_spends_the_framework_first_time_work(tmp_path):
    """checkpoint.framework_first_cpu_s is CPU in the engine's first save only (TensorFlow traces its
    save functions once), on top of framework_cpu_s; later saves spend framework_cpu_s alone."""
    pytest.importorskip("torch")
    ctx = make_ctx(tmp_path, [*FRAMEWORK, "checkpoint.framework_cpu_s=0.01", "checkpoint.framework_first_cpu_s=0.06"])
    engine = make_checkpoint_engine(ctx)
    first, second = engine.save(1, 1), engine.save(2, 1)
    engine.finish()
    assert first.cpu_s >= 0.07 and first.framework_s >= 0.07
    assert second.cpu_s >= 0.01
    assert first.cpu_s - second.cpu_s >= 0.04  # the second spent no first-time work (CPU: load stretches only wall)


def test_the_summary_reports_the_framework_work_per_save_apart_from_the_write_split(tmp_path):
    pytest.importorskip("torch")
    ctx = make_ctx(tmp_path, [*FRAMEWORK, "checkpoint.framework_cpu_s=0.02"])
    engine = make_checkpoint_engine(ctx)
    records = [engine.save(1, 1).as_dict(), engine.save(2, 1).as_dict()]
    engine.finish()
    summary = checkpoint_summary([records], [None], 10.0, ctx.config)
    assert summary["framework_cpu_s"] == 0.02 and summary["writer"] == "zero-copy writev"
    for row, record in zip(summary["per_checkpoint"], records):
        assert row["framework_s_max"] == record["framework_s"] >= 0.02
        assert row["cpu_s_max"] == record["cpu_s"] >= 0.02
        # the write time's split is unchanged by it: write calls + serialization = the write time
        assert row["write_calls_s"] + row["fsync_s"] + row["serialize_s"] == pytest.approx(row["write_s_max"])
        assert row["blocking_s_max"] >= row["framework_s_max"] + row["write_s_max"]
    (line,) = writer_rows(summary)
    assert "framework work before the bytes" in line[1] and "checkpoint.framework_cpu_s 0.02 s CPU" in line[1]


def test_each_emulated_dcp_save_runs_dcps_storage_setup_before_its_files(tmp_path, monkeypatch):
    """dcp.save(checkpoint_id=...) picks its storage writer inside the call, before planning (the
    first time importing the fsspec writer among the candidates); the emulated save runs DCP's own
    `_storage_setup` there, once per save, with the checkpoint's folder, before any file of it."""
    pytest.importorskip("torch")
    from torch.distributed.checkpoint import _storage_utils

    seen = []
    real = _storage_utils._storage_setup

    def recording(storage, checkpoint_id, reader=False):
        seen.append((checkpoint_id, Path(checkpoint_id).exists(), reader))
        return real(storage, checkpoint_id, reader)

    monkeypatch.setattr(_storage_utils, "_storage_setup", recording)
    ctx = make_ctx(tmp_path, ["checkpoint.durability=framework", "checkpoint.format=torch", "checkpoint.layout=pytorch_dcp"])
    engine = make_checkpoint_engine(ctx)
    engine.save(1, 1)
    engine.save(2, 1)
    engine.finish()
    assert seen == [(engine.folder_path(1), False, False), (engine.folder_path(2), False, False)]
    assert sorted(p.name for p in Path(engine.folder_path(2)).iterdir()) == [".metadata", "__0_0.distcp"]


@pytest.mark.parametrize("value,message", [
    ("-0.1", "checkpoint.framework_cpu_s: CPU seconds per save, cannot be negative"),
    ("2e6", "checkpoint.framework_cpu_s: at most 1e+06 seconds"),
    ("first:-1", "checkpoint.framework_first_cpu_s: CPU seconds, cannot be negative"),
])
def test_a_bad_framework_cpu_is_refused_naming_the_key(value, message):
    key = "framework_first_cpu_s" if value.startswith("first:") else "framework_cpu_s"
    with pytest.raises(ConfigError) as info:
        load_config([f"checkpoint.{key}={value.removeprefix('first:')}"])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_one_piece_tensor_is_handed_to_the_framework_without_a_copy():
    """A program's tensors are in memory already: a tensor that comes as one writable piece is
    that piece's memory (no copy before the save), even unaligned for its element type; a
    read-only piece, or several, are assembled into a copy with the same bytes."""
    import numpy as np

    from dlio_ckpt.checkpoint.formats import whole_tensor
    from dlio_ckpt.plan.model import TensorSpec

    pool = np.arange(4099, dtype=np.uint8)
    tensor = TensorSpec("w", 1024, 4, "model")
    one = whole_tensor(tensor, lambda t: iter([memoryview(pool[1:4097])]))
    assert np.shares_memory(one, pool) and one.dtype == np.float32 and one.tobytes() == pool[1:4097].tobytes()
    frozen = pool[1:4097].copy()
    frozen.flags.writeable = False
    copied = whole_tensor(tensor, lambda t: iter([memoryview(frozen)]))
    assert not np.shares_memory(copied, frozen) and copied.tobytes() == frozen.tobytes()
    parts = whole_tensor(tensor, lambda t: iter([memoryview(pool[1:1001]), memoryview(pool[1001:4097])]))
    assert not np.shares_memory(parts, pool) and parts.tobytes() == pool[1:4097].tobytes()
