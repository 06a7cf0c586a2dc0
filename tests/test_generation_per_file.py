"""Generation's per-file cost (issue 26, item 3): what was cut is emulator work, not the emulated
program's I/O. A raw file that fits the write buffer is written without the BufferedWriter but
with the same write calls; the manifest's names are taken without os.path.relpath but are the
same names; each file is stat'ed once (for the manifest), not twice, and the dataset's bytes on
disk still match an independent reader's."""

from __future__ import annotations

import io
import os

import pytest

from dlio_ckpt.content import ByteSource
from dlio_ckpt.formats.base import FileSpec, FormatOptions
from dlio_ckpt.formats.streams import buffered, write_in_one, write_samples, write_straight


class CallLog(io.RawIOBase):
    """A raw handle that keeps every write call's bytes, in order (what the storage would see)."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return sum(map(len, self.calls))

    def write(self, data) -> int:
        self.calls.append(bytes(data))
        return len(self.calls[-1])


def _through_the_writer(num_samples: int, sample_bytes: int, chunk: int, pool: int, zeros: bool):
    """(spec, options, source, the calls `buffered` and `write_samples` issue for the file)."""
    spec = FileSpec(index=7, path="x", num_samples=num_samples, sample_bytes=sample_bytes)
    options = FormatOptions(write_chunk_bytes=chunk)
    source = ByteSource(seed=3, pool_bytes=pool, zeros=zeros)
    calls = CallLog()
    with buffered(calls, options) as out:
        write_samples(out, spec, source, options)
    return spec, options, source, calls


@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("nbytes", [1, 4096, 4097, 1 << 16])
def test_a_piece_is_the_one_chunk_the_source_yields_for_an_item_within_its_window(zeros, nbytes):
    source = ByteSource(seed=5, pool_bytes=1 << 16, zeros=zeros)
    for key in (0, 1, 7 << 24, (123 << 24) + 5):
        chunks = list(source.chunks(key, nbytes, nbytes))
        assert len(chunks) == 1 and bytes(source.piece(key, nbytes)) == bytes(chunks[0])
    with pytest.raises(ValueError):
        source.piece(3, source.window + 1)


@pytest.mark.parametrize("num_samples,sample_bytes,chunk,pool", [
    (1, 4096, 4 << 20, 1 << 16),     # the 4 KiB file of the benchmark: one write
    (1, 0, 4 << 20, 1 << 16),        # an empty file: no write at all
    (3, 1000, 4 << 20, 1 << 16),     # several samples coalesced into one write
    (1, 8192, 100, 1 << 16),         # chunk below io.DEFAULT_BUFFER_SIZE: the buffer is 8 KiB, exactly full
    (2, 4096, 8192, 1 << 16),        # exactly the buffer
    (1, 3000, 4 << 20, 1024),        # a sample longer than the pool window: laps, several chunks
    (3, 5000, 8192, 1 << 16),        # larger than the buffer: not written here, buffered as before
    (1, 70000, 65536, 1 << 20),      # one sample over the buffer: passes through
])
@pytest.mark.parametrize("zeros", [False, True])
def test_a_file_written_in_one_gets_the_write_calls_the_buffered_writer_issues(num_samples, sample_bytes, chunk, pool,
                                                                                zeros):
    spec, options, source, before = _through_the_writer(num_samples, sample_bytes, chunk, pool, zeros)
    after = CallLog()
    fits = write_in_one(after, spec, source, options)
    assert fits == (spec.payload_bytes <= max(chunk, io.DEFAULT_BUFFER_SIZE))
    if fits:
        assert after.calls == before.calls and len(after.calls) == (1 if spec.payload_bytes else 0)
    else:
        assert after.calls == [] and len(before.calls) >= 1


@pytest.mark.parametrize("sample_bytes,chunk,pool", [
    (32 << 20, 4 << 20, 64 << 20),   # generate_vs_fio's file: 8 chunks of exactly the buffer
    (10 << 20, 4 << 20, 64 << 20),   # 2 chunks and a rest of 2 MiB
    (70000, 65536, 1 << 20),         # one chunk and a rest
    (100000, 8192, 1 << 20),         # the buffer's default size as the chunk
])
@pytest.mark.parametrize("zeros", [False, True])
def test_one_large_sample_written_straight_gets_the_buffered_writers_calls(sample_bytes, chunk, pool, zeros):
    """Each call's bytes and their order, the BufferedWriter's against the pool's own chunks; files it
    does not take (several samples, a chunk below the buffer's default, a sample over the pool) are
    left to the writer, with nothing written."""
    spec, options, source, before = _through_the_writer(1, sample_bytes, chunk, pool, zeros)
    after = CallLog()
    if sample_bytes > source.window:  # zeros: a 4 MiB pool, so a longer sample is left to the writer
        assert not write_straight(after, spec, source, options) and after.calls == []
        return
    assert write_straight(after, spec, source, options)
    assert [len(c) for c in after.calls] == [len(c) for c in before.calls] and after.calls == before.calls
    assert len(after.calls) == -(-sample_bytes // chunk)
    pool_1m = ByteSource(seed=4, pool_bytes=1 << 20)
    for other, other_options in [(FileSpec(index=3, path="x", num_samples=2, sample_bytes=70000), FormatOptions(write_chunk_bytes=65536)),
                                 (spec, FormatOptions(write_chunk_bytes=4096)),
                                 (FileSpec(index=3, path="x", num_samples=1, sample_bytes=3 << 20), FormatOptions(write_chunk_bytes=65536))]:
        untouched = CallLog()
        assert not write_straight(untouched, other, pool_1m, other_options) and untouched.calls == []


def _generate(tmp_path, fmt_name: str, *overrides: str):
    from ckpt_util import make_ctx
    from dlio_ckpt.engine.generate import ensure_dataset
    from dlio_ckpt.formats import get_format
    from dlio_ckpt.plan.dataset import plan_dataset

    ctx = make_ctx(tmp_path, ["workload=unet3d", "scale=tiny", f"dataset.format={fmt_name}", *overrides])
    fmt = get_format(fmt_name)
    plan = plan_dataset(ctx.config, fmt.extension)
    return ctx, plan, ensure_dataset(ctx, plan, fmt)


@pytest.mark.parametrize("fmt_name", ["raw", "indexed_binary"])
def test_generation_stats_each_file_once_and_reports_the_bytes_an_independent_reader_sums(tmp_path, fmt_name):
    """The manifest's stat of every file (and companion) is the only one; bytes_on_disk is the
    sum of the sizes os.stat gives; a reuse stats each file once too and reports the same."""
    from dlio_ckpt.storage.events import OPS

    overrides = ("dataset.num_files_train=7", "dataset.num_subfolders_train=3", "dataset.num_files_eval=2")
    ctx, plan, result = _generate(tmp_path, fmt_name, *overrides)
    names = [os.path.join(folder, name) for folder, _, files in os.walk(plan.folder) for name in files
             if not name.startswith(".dlio_ckpt")]
    assert len(names) == 9 * (2 if fmt_name == "indexed_binary" else 1)
    assert not result.reused and result.bytes_on_disk == sum(os.stat(n).st_size for n in names) > 0
    stats = [ctx.recorder.paths[e["file"]] for e in ctx.recorder.array() if OPS[e["op"]] == "stat"]
    assert sorted(stats) == sorted(names)
    again, _, reused = _generate(tmp_path, fmt_name, *overrides)
    stats = [again.recorder.paths[e["file"]] for e in again.recorder.array() if OPS[e["op"]] == "stat"]
    assert reused.reused and reused.bytes_on_disk == result.bytes_on_disk and sorted(stats) == sorted(names)


def test_the_manifest_names_are_relpath_of_every_path_and_the_paths_are_the_specs():
    from dlio_ckpt.config.load import load_config
    from dlio_ckpt.engine.generate import all_paths, relative_paths
    from dlio_ckpt.formats import get_format
    from dlio_ckpt.plan.dataset import plan_dataset

    config = load_config(["scale=tiny", "storage.root=rel/./root", "dataset.num_files_train=11",
                          "dataset.num_subfolders_train=4", "dataset.num_files_eval=3"])
    for name in ("raw", "indexed_binary"):
        fmt = get_format(name)
        plan = plan_dataset(config, fmt.extension)
        suffixes = ("",) + tuple(fmt.companion_suffixes)
        paths = [spec.path + suffix for spec in plan.files for suffix in suffixes]
        assert list(all_paths(plan, fmt)) == paths and len(paths) == 14 * len(suffixes)
        assert list(relative_paths(plan, fmt)) == [os.path.relpath(p, plan.folder) for p in paths]
    assert list(plan.files[2:9:3].paths()) == [spec.path for spec in list(plan.files)[2:9:3]]
