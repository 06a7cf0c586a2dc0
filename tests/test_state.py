"""The evolving state (dlio_ckpt/state): scratch store, update models, RankState."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import xxhash

from ckpt_util import make_ctx
from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.content import tensor_key
from dlio_ckpt.config.load import load_config
from dlio_ckpt.schema import CheckpointConfig
from dlio_ckpt.content import ByteSource
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.base import BytesView
from dlio_ckpt.state.models import UPDATE_MODELS
from dlio_ckpt.state.rank_state import RankState
from dlio_ckpt.state.store import ScratchStore

REPO = Path(__file__).resolve().parents[1]
SOURCE = ByteSource(seed=5, pool_bytes=4 << 20)
# A file whose float tensors start off their element alignment (an odd uint8 tensor first).
MIXED = PlannedFile("mixed/{step}.bin", 0, (TensorSpec("bytes", 1001, 1, "model"), TensorSpec("half", 30001, 2, "model"),
                                            TensorSpec("single", 70003, 4, "optimizer"), TensorSpec("double", 9000, 8, "optimizer")))
# 4,096 units of 256 bytes, every unit inside one float32 tensor.
ALIGNED = PlannedFile("aligned/{step}.bin", 1, (TensorSpec("w", 4096 * 64, 4, "model"),))


@pytest.fixture(scope="module")
def base_cfg() -> CheckpointConfig:
    return load_config([]).checkpoint


def state(cfg, files, seed=7, **changes) -> RankState:
    return RankState(files, dataclasses.replace(cfg, **changes), seed, SOURCE)


def file_bytes(st: RankState, pf: PlannedFile) -> bytes:
    return b"".join(bytes(p) for p in st.view(pf).stream(1 << 16))


def units_of(data: bytes, unit: int) -> list[bytes]:
    return [data[i : i + unit] for i in range(0, len(data), unit)]


def floats_finite(data: bytes, pf: PlannedFile) -> bool:
    at = 0
    for t in pf.tensors:
        if t.dtype_bytes > 1 and not np.isfinite(np.frombuffer(data[at : at + t.nbytes], dtype=t.dtype)).all():
            return False
        at += t.nbytes
    return True


# scratch store ------------------------------------------------------------------------------
@pytest.mark.parametrize("memory_limit", [1 << 20, 0])
def test_scratch_store_round_trip_in_memory_and_in_an_unlinked_file(tmp_path, memory_limit):
    data = np.random.default_rng(1).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    with ScratchStore(len(data), str(tmp_path), memory_limit=memory_limit) as store:
        assert store.in_memory == (memory_limit > 0)
        assert os.listdir(tmp_path) == []  # the file is unlinked at once: a crash leaves nothing
        assert bytes(store.read_at(0, 10)) == bytes(10)
        store.write_at(0, data[:1000])
        store.write_at(1000, data[1000:])
        assert bytes(store.read_at(123_456, 1000)) == data[123_456:124_456]
        assert bytes(store.read_at(len(data) - 5, 100)) == data[-5:]
        assert b"".join(bytes(p) for p in store.stream(65536)) == data
        with pytest.raises(ValueError):
            store.write_at(len(data) - 1, b"ab")


# random -------------------------------------------------------------------------------------
def test_random_state_is_the_bytes_the_engine_writes(tmp_path):
    ctx = make_ctx(tmp_path)
    engine = make_checkpoint_engine(ctx)
    engine.save(3, 1)
    engine.finish()
    files = engine.plan.files_by_rank[0]
    st = RankState(files, ctx.config.checkpoint, ctx.config.seed, engine.source)
    st.advance(3)
    assert files
    for pf in files:
        on_disk = (Path(engine.folder_path(3)) / pf.path_for(3)).read_bytes()
        assert file_bytes(st, pf) == on_disk
        assert st.digest(pf) == xxhash.xxh3_128_hexdigest(on_disk)


def test_random_tensor_chunks_are_the_source_items_piece_for_piece(base_cfg):
    st = state(base_cfg, (MIXED,))
    st.advance(9)
    for t in MIXED.tensors:
        ours = [bytes(p) for p in st.tensor_chunks(MIXED, t, 4096)]
        theirs = [bytes(p) for p in SOURCE.chunks(tensor_key(MIXED.owner, t.name, 9), t.nbytes, 4096)]
        assert ours == theirs


def test_random_read_at_across_tensors_matches_the_stream(base_cfg):
    st = state(base_cfg, (MIXED,))
    whole = file_bytes(st, MIXED)
    view = st.view(MIXED)
    for offset, n in [(0, 10), (995, 20), (1001, 60002), (50_000, 300_000), (len(whole) - 7, 100)]:
        assert bytes(view.read_at(offset, n)) == whole[offset : offset + n]


# sparse -------------------------------------------------------------------------------------
def test_sparse_is_deterministic_whatever_else_the_rank_holds(base_cfg):
    a = state(base_cfg, (MIXED, ALIGNED), update="sparse", update_chunk_bytes=512, update_fraction=0.1, update_moves=0.1)
    b = state(base_cfg, (ALIGNED, MIXED), update="sparse", update_chunk_bytes=512, update_fraction=0.1, update_moves=0.1)
    alone = state(base_cfg, (MIXED,), update="sparse", update_chunk_bytes=512, update_fraction=0.1, update_moves=0.1)
    other_seed = state(base_cfg, (MIXED,), seed=8, update="sparse", update_chunk_bytes=512, update_fraction=0.1,
                       update_moves=0.1)
    for st in (a, b, alone, other_seed):
        st.advance(2)
        st.advance(5)
    assert a.digest(MIXED) == b.digest(MIXED) == alone.digest(MIXED) != other_seed.digest(MIXED)
    assert a.digest(ALIGNED) == b.digest(ALIGNED)


def test_sparse_changes_the_expected_fraction_of_units(base_cfg):
    fraction, steps, unit = 0.02, 5, 256
    st = state(base_cfg, (ALIGNED,), update="sparse", update_chunk_bytes=unit, update_fraction=fraction)
    before = units_of(file_bytes(st, ALIGNED), unit)
    st.advance(steps)
    after = units_of(file_bytes(st, ALIGNED), unit)
    changed = sum(x != y for x, y in zip(before, after))
    n = len(before)
    p = 1 - (1 - fraction) ** steps
    assert abs(changed - n * p) < 5 * (n * p * (1 - p)) ** 0.5, (changed, n * p)
    st.advance(steps)  # no-op: same step
    assert units_of(file_bytes(st, ALIGNED), unit) == after


def test_sparse_moves_keep_the_multiset_of_units(base_cfg):
    unit = 256
    st = state(base_cfg, (ALIGNED,), update="sparse", update_chunk_bytes=unit, update_fraction=0.0, update_moves=0.25)
    before = units_of(file_bytes(st, ALIGNED), unit)
    st.advance(1)
    after = units_of(file_bytes(st, ALIGNED), unit)
    assert Counter(before) == Counter(after)
    assert sum(x != y for x, y in zip(before, after)) == round(0.25 * len(before))


def test_sparse_units_larger_than_a_block_change_and_move_whole(base_cfg):
    unit = 3 << 20  # larger than units.BLOCK_BYTES: handled a block at a time
    big = PlannedFile("big/{step}.bin", 0, (TensorSpec("w", (unit * 4 + 4096) // 4, 4, "model"),))
    st = state(base_cfg, (big,), update="sparse", update_chunk_bytes=unit, update_fraction=1.0)
    before = units_of(file_bytes(st, big), unit)
    st.advance(1)
    after = units_of(file_bytes(st, big), unit)
    assert all(x[:8] != y[:8] and x[-8:] != y[-8:] for x, y in zip(before, after))  # every unit, end to end
    assert floats_finite(b"".join(after), big)
    mover = state(base_cfg, (big,), update="sparse", update_chunk_bytes=unit, update_fraction=0.0, update_moves=0.5)
    before = units_of(file_bytes(mover, big), unit)
    mover.advance(1)
    after = units_of(file_bytes(mover, big), unit)
    assert Counter(before) == Counter(after) and sum(x != y for x, y in zip(before, after)) == 2


def test_sparse_floats_stay_finite_and_change_only_in_chosen_units(base_cfg):
    st = state(base_cfg, (MIXED,), update="sparse", update_chunk_bytes=64, update_fraction=0.3, update_moves=0.2)
    assert floats_finite(file_bytes(st, MIXED), MIXED)
    for step in (1, 2, 4, 8):
        st.advance(step)
        assert floats_finite(file_bytes(st, MIXED), MIXED)


def test_load_round_trip_and_resume_equality(base_cfg):
    kw = dict(update="sparse", update_chunk_bytes=512, update_fraction=0.05, update_moves=0.05)
    run = state(base_cfg, (MIXED,), **kw)
    run.advance(4)
    saved = file_bytes(run, MIXED)
    resumed = state(base_cfg, (MIXED,), **kw)
    resumed.load(MIXED, BytesView(bytearray(saved)), 4)
    assert resumed.step == 4 and resumed.digest(MIXED) == run.digest(MIXED)
    run.advance(9)
    resumed.advance(9)
    assert resumed.digest(MIXED) == run.digest(MIXED) != xxhash.xxh3_128_hexdigest(saved)


def test_random_load_holds_the_restored_bytes_until_the_next_step(base_cfg):
    st = state(base_cfg, (MIXED,))
    fresh = state(base_cfg, (MIXED,))
    restored = bytes(MIXED.payload_bytes)
    st.load(MIXED, BytesView(bytearray(restored)), 6)
    assert file_bytes(st, MIXED) == restored
    st.advance(7)
    fresh.advance(7)
    assert file_bytes(st, MIXED) == file_bytes(fresh, MIXED)
    with pytest.raises(ValueError):
        st.advance(6)


# sgd and trace -------------------------------------------------------------------------------
def floats_of(data: bytes, pf: PlannedFile) -> list[np.ndarray]:
    out, at = [], 0
    for t in pf.tensors:
        if t.dtype_bytes > 1:
            out.append(np.frombuffer(data[at : at + t.nbytes], dtype=t.dtype).astype(np.float64))
        at += t.nbytes
    return out


@pytest.mark.parametrize("model", ["sgd", "trace"])
def test_float_models_are_deterministic_finite_and_change_every_float(base_cfg, model):
    a = state(base_cfg, (MIXED,), update=model, update_chunk_bytes=64, update_fraction=0.1)
    b = state(base_cfg, (ALIGNED, MIXED), update=model, update_chunk_bytes=64, update_fraction=0.1)
    before = file_bytes(a, MIXED)
    for st in (a, b):
        st.advance(3)
        st.advance(40)
    after = file_bytes(a, MIXED)
    assert a.digest(MIXED) == b.digest(MIXED)
    assert floats_finite(before, MIXED) and floats_finite(after, MIXED)
    for x, y in zip(floats_of(before, MIXED), floats_of(after, MIXED)):
        assert np.mean(x != y) > 0.9  # float16 may round a small step away
    changed_bytes = np.mean(np.frombuffer(before[:1001], np.uint8) != np.frombuffer(after[:1001], np.uint8))
    assert 0.8 < changed_bytes < 1.0  # uint8 units: 1 - 0.9^40 of them, as under sparse


def test_sgd_deltas_are_random_walks_that_grow_with_the_interval_and_decay_with_the_learning_rate(base_cfg):
    from dlio_ckpt.state.values import NOISE_DF, decay_rss

    st = state(base_cfg, (ALIGNED,), update="sgd", learning_rate=0.001)
    x0 = floats_of(file_bytes(st, ALIGNED), ALIGNED)[0]
    assert abs(x0.std() - 0.02) < 0.001
    st.advance(1)
    one = floats_of(file_bytes(st, ALIGNED), ALIGNED)[0] - x0
    st.advance(10)
    early = floats_of(file_bytes(st, ALIGNED), ALIGNED)[0] - x0
    st.advance(990)
    x990 = floats_of(file_bytes(st, ALIGNED), ALIGNED)[0]
    st.advance(1000)
    late = floats_of(file_bytes(st, ALIGNED), ALIGNED)[0] - x990
    rms = lambda d: np.sqrt(np.mean(d ** 2))
    t_sd = np.sqrt(NOISE_DF / (NOISE_DF - 2))  # a Student-t's standard deviation
    assert np.mean(one ** 4) / rms(one) ** 4 > 6  # one step: heavy tails (a normal distribution gives 3)
    assert abs(rms(one) / (0.001 * 0.02 * decay_rss(0, 1) * t_sd) - 1) < 0.1
    # ten steps add up as a random walk: sqrt(10) times one step (not ten times, not one)
    assert abs(rms(early) / (0.001 * 0.02 * decay_rss(0, 10) * t_sd) - 1) < 0.1
    assert np.corrcoef(one, early)[0, 1] > 0.2  # the first step is part of the first ten
    assert abs(rms(late) / rms(early) / (decay_rss(990, 1000) / decay_rss(0, 10)) - 1) < 0.1


def test_trace_holds_the_mlps_parameters_tiled_and_scaled(base_cfg):
    import zlib

    from dlio_ckpt.state.mlp_trace import MlpTrace

    trace = MlpTrace(7)
    assert trace.loss(300) < 0.6 * trace.loss(0)  # it really learns
    params = trace.params_at(12).astype(np.float64)
    st = state(base_cfg, (ALIGNED,), update="trace")
    st.advance(5)
    st.advance(12)
    values = floats_of(file_bytes(st, ALIGNED), ALIGNED)[0]
    position = zlib.crc32(f"{ALIGNED.owner}/{ALIGNED.relpath}/w".encode()) % len(params)
    tile = values[: len(params) - position]
    ratio = tile / params[position:]
    assert 2**-0.5 <= ratio[0] < 2**0.5 and np.allclose(ratio, ratio[0], rtol=1e-6)
    next_tile = values[len(params) - position : 2 * len(params) - position] / params
    assert np.allclose(next_tile, next_tile[0], rtol=1e-6) and not np.isclose(next_tile[0], ratio[0])
    direct = state(base_cfg, (ALIGNED,), update="trace")
    direct.advance(12)  # the parameters depend on the step only, not on the checkpoint steps before it
    assert direct.digest(ALIGNED) == st.digest(ALIGNED)


def test_update_model_names_come_from_one_registry():
    assert set(UPDATE_MODELS.names()) == set(typing.get_args(typing.get_type_hints(CheckpointConfig)["update"]))
    with pytest.raises(ConfigError, match="sparse"):
        UPDATE_MODELS.canonical("sprase")


def test_many_small_files_share_one_memory_budget(base_cfg, tmp_path):
    from dlio_ckpt.state.store import MEMORY_LIMIT_BYTES

    files = tuple(PlannedFile(f"layer_{i}/{{step}}.bin", 0, (TensorSpec("w", 5 << 20, 4, "model"),)) for i in range(5))
    st = state(base_cfg, files, update="sgd", state_dir=str(tmp_path))
    st.advance(1)
    stores = [st.view(pf) for pf in files]
    assert sum(s.size for s in stores if s.in_memory) <= MEMORY_LIMIT_BYTES
    assert [s.in_memory for s in stores] == [True, True, True, False, False]
    for pf in files:
        st.digest(pf)
    assert sum(s.buffer_bytes for s in stores) <= 4 << 20  # one file's read buffer at a time, not one per file
    st.close()


MEMORY_SCRIPT = """
import dataclasses, sys
from dlio_ckpt.config.load import load_config
from dlio_ckpt.content import ByteSource
from dlio_ckpt.plan.checkpoint import PlannedFile
from dlio_ckpt.plan.model import TensorSpec
from dlio_ckpt.state.rank_state import RankState

def rss(field):
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) * 1024 for l in status if l.startswith(field))

cfg = dataclasses.replace(load_config([]).checkpoint, update=sys.argv[1], state_dir=sys.argv[2],
                          update_fraction=0.05, update_moves=0.01)
source = ByteSource(seed=1, pool_bytes=4 << 20)
pf = PlannedFile("big/{step}.bin", 0, (TensorSpec("w", 32 << 20, 4, "model"), TensorSpec("o", 16 << 20, 8, "optimizer")))
st = RankState((pf,), cfg, 3, source)
base = rss("VmRSS:")
st.advance(2)
st.advance(5)
st.digest(pf)
print(rss("VmHWM:") - base)
"""


@pytest.mark.parametrize("model", ["sparse", "sgd", "trace"])
def test_a_256_mib_state_keeps_memory_bounded(tmp_path, model):
    result = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, model, str(tmp_path)], capture_output=True,
                            text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    growth = int(result.stdout.split()[-1])
    assert growth < 64 << 20, f"peak RSS grew by {growth >> 20} MiB"
    assert os.listdir(tmp_path) == []


# the state at a step is a function of the step ----------------------------------------------
SCHEDULE_MODELS = [dict(update="sparse", update_chunk_bytes=256, update_fraction=0.05),
                   dict(update="sparse", update_chunk_bytes=512, update_fraction=0.05, update_moves=0.02),
                   dict(update="sgd", update_chunk_bytes=64, update_fraction=0.05),
                   dict(update="trace", update_chunk_bytes=64, update_fraction=0.05)]


@pytest.mark.parametrize("kw", SCHEDULE_MODELS, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_the_state_at_a_step_is_the_same_whatever_the_checkpoint_schedule_or_restarts(base_cfg, kw):
    direct = state(base_cfg, (MIXED,), **kw)
    direct.advance(20)
    stepwise = state(base_cfg, (MIXED,), **kw)
    for step in range(1, 21):
        stepwise.advance(step)
    scheduled = state(base_cfg, (MIXED,), **kw)
    for step in (3, 7, 13, 20):
        scheduled.advance(step)
    assert direct.digest(MIXED) == stepwise.digest(MIXED) == scheduled.digest(MIXED)
    # a restart: the state saved at step 7 loaded into a fresh state, carried on to 20
    seven = state(base_cfg, (MIXED,), **kw)
    seven.advance(7)
    resumed = state(base_cfg, (MIXED,), **kw)
    resumed.load(MIXED, BytesView(bytearray(file_bytes(seven, MIXED))), 7)
    resumed.advance(20)
    assert resumed.digest(MIXED) == direct.digest(MIXED)
    other_seed = state(base_cfg, (MIXED,), seed=8, **kw)
    other_seed.advance(20)
    assert other_seed.digest(MIXED) != direct.digest(MIXED)


@pytest.mark.parametrize("model", ["sgd", "trace"])
def test_a_restored_error_is_carried_on_as_training_would(base_cfg, model):
    """update(a, b) adds T(b) - T(a) to what the state holds: a lossy restore's error stays."""
    at_five = state(base_cfg, (ALIGNED,), update=model)
    at_five.advance(5)
    saved = np.frombuffer(file_bytes(at_five, ALIGNED), np.float32).copy()
    saved[100] += np.float32(0.5)
    resumed = state(base_cfg, (ALIGNED,), update=model)
    resumed.load(ALIGNED, BytesView(bytearray(saved.tobytes())), 5)
    resumed.advance(30)
    direct = state(base_cfg, (ALIGNED,), update=model)
    direct.advance(30)
    got = np.frombuffer(file_bytes(resumed, ALIGNED), np.float32)
    want = np.frombuffer(file_bytes(direct, ALIGNED), np.float32)
    differs = np.flatnonzero(got != want)
    assert differs.tolist() == [100] and abs(float(got[100]) - float(want[100]) - 0.5) < 1e-6


def test_sparse_changes_grow_with_the_interval(base_cfg):
    fraction, unit = 0.01, 256
    for steps in (1, 10, 40):
        st = state(base_cfg, (ALIGNED,), update="sparse", update_chunk_bytes=unit, update_fraction=fraction)
        st.advance(100)
        before = units_of(file_bytes(st, ALIGNED), unit)
        st.advance(100 + steps)
        changed = sum(x != y for x, y in zip(before, units_of(file_bytes(st, ALIGNED), unit)))
        n, p = len(before), 1 - (1 - fraction) ** steps
        assert abs(changed - n * p) < 5 * (n * p * (1 - p)) ** 0.5 + 1, (steps, changed, n * p)
