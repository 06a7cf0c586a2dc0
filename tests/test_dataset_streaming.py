"""Constant memory in the file count (issue 26, item 3): the dataset plan is a lazy FileList whose
size does not grow with the files, and the dataset manifest is written and read one entry at a time,
byte for byte what one json.dumps(..., indent=1) of the whole table wrote."""

from __future__ import annotations

import json
import os
import pickle
import sys

import numpy as np
import pytest

from dlio_ckpt.config.load import load_config
from dlio_ckpt.formats.base import FileSpec
from dlio_ckpt.plan import dataset_manifest
from dlio_ckpt.plan.dataset import generation_share, plan_dataset
from dlio_ckpt.plan.file_list import FileList
from dlio_ckpt.plan.read import plan_epoch


def _old_paths(folder: str, split: str, count: int, subfolders: int, prefix: str, extension: str) -> list[str]:
    """The naming rule as plan/dataset.py spelled it out per file before FileList (an independent copy)."""
    width = max(len(str(count)), 1)
    paths = []
    for i in range(count):
        parts = [folder, split]
        if subfolders:
            parts.append(f"{i % subfolders:0{len(str(subfolders))}d}")
        parts.append(f"{prefix}_{i:0{width}d}_of_{count}.{extension}")
        paths.append(os.path.join(*parts))
    return paths


def _config(*overrides: str):
    return load_config(["scale=tiny", "dataset.format=npz", "storage.root=/nonexistent", *overrides])


def test_the_lazy_plan_lists_the_files_the_per_file_rule_names():
    config = _config("dataset.num_files_train=23", "dataset.num_subfolders_train=4", "dataset.num_files_eval=5",
                     "dataset.num_subfolders_eval=0", "dataset.record_length_bytes_stdev=1000")
    plan = plan_dataset(config, "npz")
    ds = config.dataset
    paths = _old_paths(plan.folder, "train", 23, 4, ds.file_prefix, "npz") + \
        _old_paths(plan.folder, "eval", 5, 0, ds.file_prefix, "npz")
    draw = np.random.default_rng([ds.seed, 0, 0]).normal(ds.record_length_bytes, 1000, 1024)[:23]  # the first block's
    sizes = np.maximum(draw, ds.record_length_bytes_min).astype(np.int64)
    files = list(plan.files)
    assert [f.path for f in files] == paths and [f.index for f in files] == list(range(28))
    assert [f.sample_bytes for f in files[:23]] == sizes.tolist()
    assert len(set(f.sample_bytes for f in files[:23])) > 1
    assert plan.files[-1] == files[-1] and plan.files[7] == files[7] and list(plan.files[3:20:4]) == files[3:20:4]
    assert list(generation_share(plan, 1, 3)) == files[1::3]
    assert plan.train_samples == 23 * ds.num_samples_per_file
    assert plan.payload_bytes == sum(f.payload_bytes for f in files)
    assert plan.files.folders() == sorted({os.path.dirname(p) for p in paths})
    assert pickle.loads(pickle.dumps(plan.train)) == plan.train  # as worker processes get it
    with pytest.raises(IndexError):
        plan.files[28]


def _plan_bytes(plan) -> int:
    """Bytes the plan's file lists hold (their objects and what they refer to), without pickling
    a file table: the lists, their naming rules and any size array."""
    seen = 0
    for files in (plan.train, plan.eval):
        seen += sys.getsizeof(files)
        for rule in files._splits:
            seen += sys.getsizeof(rule) + sum(sys.getsizeof(getattr(rule, name)) for name in rule.__dataclass_fields__)
    return seen


def test_the_plan_holds_no_per_file_objects_when_every_file_has_one_size():
    small = plan_dataset(_config("dataset.num_files_train=10", "dataset.record_length_bytes_stdev=0"), "npz")
    huge = plan_dataset(_config("dataset.num_files_train=10000000", "dataset.record_length_bytes_stdev=0"), "npz")
    assert len(huge.train) == 10_000_000 and huge.train[9_999_999].path.endswith("/train/img_09999999_of_10000000.npz")
    assert _plan_bytes(huge) == _plan_bytes(small)


def test_varying_sizes_hold_nothing_per_file():
    small = plan_dataset(_config("dataset.num_files_train=1000", "dataset.record_length_bytes_stdev=100"), "npz")
    large = plan_dataset(_config("dataset.num_files_train=101000", "dataset.record_length_bytes_stdev=100"), "npz")
    assert _plan_bytes(large) == _plan_bytes(small)  # plan/file_sizes.py: a block of sizes drawn when asked


def test_the_read_plan_of_a_lazy_list_matches_that_of_the_same_files_as_a_tuple():
    config = _config("dataset.num_files_train=40", "dataset.num_files_eval=3")
    plan = plan_dataset(config, "npz")
    as_tuple = tuple(plan.train)
    for rank in range(3):
        lazy = plan_epoch(plan.train, config.reader, rank, 3, 2, False)
        eager = plan_epoch(as_tuple, config.reader, rank, 3, 2, False)
        assert np.array_equal(lazy.samples, eager.samples) and len(lazy.samples) > 0


HEADER = {"fingerprint": "0123456789abcdef", "format": "npz", "workload": "unet3d", "created": "2026-12-01T18:00:00Z"}


@pytest.mark.parametrize("sizes", [
    {},
    {"train/img_0_of_1.npz": 7},
    {"train/0/a.npz": 1, "train/1/b \"q\".npz": 2**40, "eval/é\nname.npz": 0, "train/x.h5.idx": 12},
])
def test_the_manifest_in_pieces_is_byte_identical_to_one_json_dumps_and_reads_back(sizes):
    whole = json.dumps({**HEADER, "sizes": sizes}, indent=1)
    assert "".join(dataset_manifest.encode(HEADER, iter(sizes.items()))) == whole
    header, entries = dataset_manifest.decode(whole.split("\n"))
    assert header == HEADER and dict(entries) == sizes


def test_the_manifest_is_read_in_chunks_and_only_as_far_as_asked(monkeypatch):
    monkeypatch.setattr(dataset_manifest, "READ_CHUNK", 64)
    sizes = {f"train/{i:03d}.npz": i for i in range(50)}
    data = json.dumps({**HEADER, "sizes": sizes}, indent=1).encode()
    reads = []

    def read_at(offset: int, length: int) -> bytes:
        reads.append((offset, length))
        return data[offset:offset + length]

    header, entries = dataset_manifest.decode(dataset_manifest.text_lines(read_at, len(data)))
    assert header == HEADER and len(reads) < 4  # the header needed its first chunks only
    assert dict(entries) == sizes
    assert reads == [(offset, min(64, len(data) - offset)) for offset in range(0, len(data), 64)]


@pytest.mark.parametrize("text", [
    "", "{}", json.dumps({**HEADER, "sizes": {"a": 1}}),  # valid JSON, another layout
    json.dumps({**HEADER, "sizes": {"a": 1, "b": 2}}, indent=1)[:-8],  # cut short
    json.dumps({**HEADER, "sizes": {"a": "1"}}, indent=1),
    json.dumps({**HEADER, "sizes": {"a": 1}}, indent=1) + "\n",
])
def test_a_manifest_in_another_layout_or_cut_short_is_refused(text):
    with pytest.raises(ValueError):
        header, entries = dataset_manifest.decode(text.split("\n"))
        list(entries)


@pytest.mark.parametrize("size_block", [None, 2, 11])
def test_generation_writes_the_manifest_a_whole_table_dump_would_and_reuses_the_dataset(tmp_path, monkeypatch, size_block):
    """A real generation (two subfolders, eval files, varying sizes) commits the manifest that
    json.dumps of every file's size (stat by an independent reader) gives, and a second run
    reuses the dataset from it; also with the sizes spilled and read back 2 at a time, or in one
    full block (11 files: a block that fills, then an empty one)."""
    from ckpt_util import make_ctx
    from dlio_ckpt.engine import generate
    from dlio_ckpt.engine.generate import ensure_dataset
    from dlio_ckpt.formats import get_format

    if size_block:
        monkeypatch.setattr(generate, "SIZE_BLOCK", size_block)

    overrides = ["workload=unet3d", "scale=tiny", "dataset.num_files_train=9", "dataset.num_subfolders_train=2",
                 "dataset.num_files_eval=2", "dataset.record_length_bytes_stdev=500", "dataset.format=npz"]
    ctx = make_ctx(tmp_path, overrides)
    fmt = get_format("npz")
    plan = plan_dataset(ctx.config, fmt.extension)
    assert not ensure_dataset(ctx, plan, fmt).reused
    written = open(plan.manifest_path, "rb").read()
    header = json.loads(written)
    expected = {os.path.relpath(spec.path, plan.folder): os.stat(spec.path).st_size for spec in plan.files}
    assert header["sizes"] == expected and len(expected) == 11
    assert written == json.dumps({**{k: header[k] for k in ("fingerprint", "format", "workload", "created")},
                                  "sizes": expected}, indent=1).encode()
    assert ensure_dataset(make_ctx(tmp_path, overrides), plan, fmt).reused
    with open(plan.files[4].path, "ab") as grown:  # a file whose size the manifest does not record
        grown.write(b"x")
    assert not ensure_dataset(make_ctx(tmp_path, overrides), plan, fmt).reused


def _generated(tmp_path, overrides):
    from ckpt_util import make_ctx
    from dlio_ckpt.engine.generate import ensure_dataset
    from dlio_ckpt.formats import get_format

    ctx = make_ctx(tmp_path, ["workload=unet3d", "scale=tiny", "dataset.format=npz", *overrides])
    fmt = get_format("npz")
    plan = plan_dataset(ctx.config, fmt.extension)
    ensure_dataset(ctx, plan, fmt)
    return ctx, plan, fmt


def test_a_manifest_larger_than_one_write_goes_out_in_several_and_reads_back_the_same(tmp_path, monkeypatch):
    from dlio_ckpt.engine import generate
    from dlio_ckpt.storage.events import OPS

    ctx, plan, fmt = _generated(tmp_path, ["dataset.num_files_train=12", "dataset.num_subfolders_train=3"])
    one_write = open(plan.manifest_path, "rb").read()
    monkeypatch.setattr(generate, "MANIFEST_WRITE_BYTES", 100)
    before = len(ctx.recorder.array())
    generate._write_manifest(ctx.storage.with_phase("generate"), plan, fmt, ctx.config.workload)
    pieces = open(plan.manifest_path, "rb").read()
    events = ctx.recorder.array()[before:]
    manifest = [i for i, p in enumerate(ctx.recorder.paths) if ".dlio_ckpt_dataset.json" in p]
    writes = [e for e in events if OPS[e["op"]] == "write" and e["file"] in manifest]
    created = lambda text: [line for line in text.split(b"\n") if b'"created"' not in line]  # noqa: E731
    assert created(pieces) == created(one_write) and len(one_write) > 5 * 100
    lengths = [int(e["length"]) for e in writes]
    assert len(lengths) >= 5 and sum(lengths) == len(pieces)
    assert all(100 <= n < 100 + 80 for n in lengths[:-1])  # a write once 100 bytes are held: one entry over at most


def test_a_manifest_that_fails_half_way_leaves_no_manifest_and_no_temporary_file(tmp_path, monkeypatch):
    """A file gone before the manifest lists it: its stat fails, and the dataset stays untrusted
    (no manifest, nothing half-written beside it)."""
    from dlio_ckpt.engine import generate

    ctx, plan, fmt = _generated(tmp_path, ["dataset.num_files_train=12", "dataset.num_subfolders_train=3"])
    monkeypatch.setattr(generate, "MANIFEST_WRITE_BYTES", 100)
    os.remove(plan.manifest_path)
    os.remove(plan.files[9].path)
    before = set(os.listdir(plan.folder))
    with pytest.raises(FileNotFoundError):
        generate._write_manifest(ctx.storage.with_phase("generate"), plan, fmt, ctx.config.workload)
    assert set(os.listdir(plan.folder)) == before and not os.path.exists(plan.manifest_path)


def test_the_manifest_stats_every_file_before_it_opens_as_the_whole_table_dump_did(tmp_path):
    """The same calls in the same order as before streaming: every file's stat, then the
    manifest's open, one write, fsync, close."""
    from dlio_ckpt.storage.events import OPS

    ctx, plan, fmt = _generated(tmp_path, ["dataset.num_files_train=6", "dataset.num_subfolders_train=2"])
    events = ctx.recorder.array()
    calls = [(OPS[e["op"]], ctx.recorder.paths[e["file"]]) for e in events]
    opened = calls.index(("open", plan.manifest_path)) if ("open", plan.manifest_path) in calls else \
        next(i for i, (op, path) in enumerate(calls) if op == "open" and path.startswith(plan.manifest_path))
    before = [path for op, path in calls[opened - len(plan.files):opened]]
    assert before == [spec.path for spec in plan.files] and all(op == "stat" for op, _ in calls[opened - 6:opened])
    assert [op for op, _ in calls[opened:opened + 4]] == ["open", "write", "fsync", "close"]
