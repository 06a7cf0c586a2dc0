"""MLPerf Storage v3.0: the retinanet (jpeg) and flux (parquet) workloads, their dataset formats,
and the v3.0 divisions in mode=datasize.

Bytes on disk are checked by independent readers (Pillow decodes every JPEG, pyarrow reads every
Parquet file), the workloads' figures against their cited source files, and the reads a sample
costs by counting the read calls on the file.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import run_cli
from dlio_ckpt.config.load import load_config
from dlio_ckpt.config.mlperf_rules import division
from dlio_ckpt.content import ByteSource
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.formats import FileSpec, FormatOptions, get_format
from dlio_ckpt.formats.jpeg import JPEG_MIN_BYTES, SEGMENT_COST, comment_sizes
from dlio_ckpt.formats.parquet import Column, parse_columns, row_layout
from dlio_ckpt.optional import missing
from dlio_ckpt.storage.posix import PosixFile, PosixStorage

FLUX_COLUMNS = ("t5_encodings:float32:524328", "clip_encodings:float32:409", "mean:float32:8232",
                "logvar:float32:8232", "timestamp:float32:7")


@pytest.fixture(scope="module")
def source() -> ByteSource:
    return ByteSource(seed=7, pool_bytes=1 << 20)


def write(name: str, spec: FileSpec, source: ByteSource, options: FormatOptions) -> None:
    handle = PosixStorage().open_write(spec.path)
    get_format(name).write(lambda suffix: handle, spec, source, options)
    handle.fsync()
    handle.close()


class CountingFile(PosixFile):
    """A POSIX read handle that records (offset, size) of every read call (pyarrow reads through
    read/seek, the formats through read_at_into): the I/O a sample costs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def read_at(self, offset, size):
        self.calls.append((offset, size))
        return super().read_at(offset, size)

    def read_at_into(self, buffer, offset):
        self.calls.append((offset, len(buffer)))
        return super().read_at_into(buffer, offset)


def counting(path: str) -> CountingFile:
    return PosixStorage().open_read(path, handle_class=CountingFile)


# -- jpeg ---------------------------------------------------------------------------------------


def _comments(data: bytes) -> bytes:
    """The payload of every COM segment, parsed independently of the format's code."""
    out, at = b"", 2
    while data[at : at + 2] != b"\xff\xda":  # up to the start of scan
        marker, length = data[at : at + 2], int.from_bytes(data[at + 2 : at + 4], "big")
        if marker == b"\xff\xfe":
            out += data[at + 4 : at + 2 + length]
        at += 2 + length
    return out


@pytest.mark.parametrize("size", [JPEG_MIN_BYTES, JPEG_MIN_BYTES + 1, JPEG_MIN_BYTES + 3, JPEG_MIN_BYTES + 4,
                                  JPEG_MIN_BYTES + 65537, JPEG_MIN_BYTES + 65540, 322957])
def test_jpeg_files_are_real_jpegs_of_exactly_the_drawn_size(tmp_path, source, size):
    from PIL import Image

    spec = FileSpec(index=5, path=str(tmp_path / "img.jpeg"), num_samples=1, sample_bytes=size)
    write("jpeg", spec, source, FormatOptions(write_chunk_bytes=4096))
    data = (tmp_path / "img.jpeg").read_bytes()
    assert len(data) == size
    with Image.open(tmp_path / "img.jpeg") as image:
        image.load()  # decodes the image data
        assert image.format == "JPEG" and image.size == (8, 8)
    carried = _comments(data) + data[data.rindex(b"\xff\xd9") + 2 :]
    assert carried == source.array(spec.sample_key(0), len(carried)).tobytes()  # the sample's seeded bytes
    reader = get_format("jpeg").open(lambda suffix: PosixStorage().open_read(spec.path), spec, FormatOptions())
    try:
        assert reader.read(0) == size and bytes(reader.fetch(0)) == data  # the loader reads the whole file
    finally:
        reader.close()


def test_comment_sizes_fill_every_room_exactly():
    for room in list(range(0, 12)) + [65536, 65537, 65538, 65539, 65540, 65541, 3 * 65537 + 2]:
        sizes, trailing = comment_sizes(room)
        assert sum(sizes) + SEGMENT_COST * len(sizes) + trailing == room
        assert 0 <= trailing < SEGMENT_COST and all(0 <= s <= 65533 for s in sizes)


def test_jpeg_reads_are_whole_files_in_transfer_pieces(tmp_path, source):
    spec = FileSpec(index=1, path=str(tmp_path / "a.jpeg"), num_samples=1, sample_bytes=10_000)
    write("jpeg", spec, source, FormatOptions())
    handle = counting(spec.path)
    reader = get_format("jpeg").open(lambda suffix: handle, spec, FormatOptions(transfer_size=4096))
    assert reader.read(0) == 10_000
    reader.close()
    assert [offset for offset, _ in handle.calls] == [0, 4096, 8192]


# -- parquet ------------------------------------------------------------------------------------


def test_parquet_rows_hold_the_sample_bytes_in_the_listed_columns(tmp_path, source):
    pq = pytest.importorskip("pyarrow.parquet")
    columns = ("a:float32:100", "b:uint8:3", "c:float64:2")
    options = FormatOptions(parquet_columns=columns, row_group_size=3)
    spec = FileSpec(index=2, path=str(tmp_path / "f.parquet"), num_samples=7, sample_bytes=419)
    write("parquet", spec, source, options)
    parquet = pq.ParquetFile(spec.path)  # pyarrow's reading, not ours
    assert parquet.metadata.num_rows == 7 and parquet.metadata.num_row_groups == 3  # 3 + 3 + 1
    assert [parquet.metadata.row_group(i).num_rows for i in range(3)] == [3, 3, 1]
    table = parquet.read()
    assert table.column_names == ["a", "b", "c"]
    assert [table.schema.field(n).type.list_size for n in "abc"] == [100, 3, 2]
    assert str(table.schema.field("c").type.value_type) == "double"
    for row in range(7):
        got = b"".join(np.asarray(table.column(n).combine_chunks().values).reshape(7, -1)[row].tobytes() for n in "abc")
        assert got == source.array(spec.sample_key(row), 419).tobytes()


def test_flux_columns_are_the_record_length_and_scale_with_the_sample():
    flux = parse_columns(FLUX_COLUMNS)
    assert sum(c.count * c.itemsize for c in flux) == 2_164_832  # flux_b200.yaml record_length
    assert row_layout(flux, 2_164_832) == flux
    small = row_layout(flux, 64 * 1024)
    assert [c.name for c in small] == [c.name for c in flux] and all(c.count >= 1 for c in small)
    assert 64 * 1024 - 4 < sum(c.count * c.itemsize for c in small) <= 64 * 1024  # whole float32 values
    assert row_layout((), 10) == (Column("data", "uint8", 10),)


def test_parquet_reads_the_footer_then_a_row_group_per_sample_keeping_four(tmp_path, source):
    pytest.importorskip("pyarrow")
    options = FormatOptions(parquet_columns=("x:float32:64", "y:float32:16"), row_group_size=2)
    spec = FileSpec(index=3, path=str(tmp_path / "g.parquet"), num_samples=12, sample_bytes=320)
    write("parquet", spec, source, options)
    handle = counting(spec.path)
    reader = get_format("parquet").open(lambda suffix: handle, spec, options)
    try:
        # pyarrow's footer read at open: the file's last 64 KiB (here the whole, small file), once
        size = os.path.getsize(spec.path)
        assert handle.calls == [(max(0, size - 65536), min(size, 65536))]
        chunks = [(reader._chunks[g]) for g in range(6)]
        reads = []
        for sample in (0, 1, 2, 3, 4, 6, 0, 8, 10, 0, 2):
            del handle.calls[:]
            assert reader.read(sample) == 320
            reads.append(list(handle.calls))
        # groups 0..3 read once each (a sample's neighbour in its group costs nothing); 0 again is
        # cached; group 4 evicts the least recently used (1), group 5 the next (2); 0 is still
        # cached, 1 is read again
        assert reads == [chunks[0], [], chunks[1], [], chunks[2], chunks[3], [], chunks[4], chunks[5], [], chunks[1]]
        assert all(len(c) == 2 for c in chunks)  # one read per column chunk
        assert bytes(reader.fetch(7)) == source.array(spec.sample_key(7), 320).tobytes()
    finally:
        reader.close()


def test_parquet_without_pyarrow_names_the_extra_to_install():
    message = str(missing("pyarrow", "no module named 'pyarrow'"))
    assert "dataset.format=parquet" in message and "pip install 'dlio_ckpt[parquet]'" in message


@pytest.mark.parametrize("overrides,message", [
    (["workload=retinanet", "dataset.num_samples_per_file=2"], "dataset.num_samples_per_file: a jpeg file holds one image"),
    (["workload=retinanet", "dataset.record_length_bytes=100"], f"set dataset.record_length_bytes={JPEG_MIN_BYTES}"),
    (["workload=flux", "dataset.parquet_columns=[a:float32]"], "dataset.parquet_columns: 'a:float32' is not name:dtype:count"),
    (["workload=flux", "dataset.parquet_columns=[a:text:3]"], "'text' is not a numpy dtype"),
    (["workload=unet3d", "dataset.parquet_row_group_size=4"], "applies to dataset.format=parquet"),
])
def test_bad_jpeg_and_parquet_settings_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as refused:
        load_config(overrides)
    assert message in str(refused.value)


# -- the workloads --------------------------------------------------------------------------------


def test_retinanet_figures_are_the_v3_files():
    b200 = load_config(["workload=retinanet"])
    ds = b200.dataset
    assert (ds.format, ds.num_files_train, ds.num_samples_per_file, ds.record_length_bytes, ds.record_length_bytes_stdev) == \
        ("jpeg", 1_170_301, 1, 322_957, 0)
    assert (b200.reader.batch_size, b200.reader.read_threads, b200.reader.file_shuffle, b200.reader.sample_shuffle) == \
        (24, 8, True, True)
    assert (b200.train.epochs, b200.train.computation_time, b200.metric.au, b200.checkpoint.enabled) == (8, 0.04755, 0.85, False)
    mi355 = load_config(["workload=retinanet", "accelerator=mi355"])
    assert (mi355.reader.batch_size, mi355.train.computation_time) == (36, 0.071325)


def test_flux_figures_are_the_v3_files():
    b200 = load_config(["workload=flux"])
    ds = b200.dataset
    assert (ds.format, ds.num_files_train, ds.num_samples_per_file, ds.record_length_bytes) == ("parquet", 4296, 288, 2_164_832)
    assert tuple(ds.parquet_columns) == FLUX_COLUMNS and ds.parquet_row_group_size == 48
    assert (b200.reader.batch_size, b200.reader.read_threads, b200.reader.sample_shuffle) == (48, 8, False)
    assert (b200.train.epochs, b200.train.computation_time, b200.metric.au) == (1, 1.35, 0.90)
    mi355 = load_config(["workload=flux", "accelerator=mi355"])
    assert (mi355.reader.batch_size, mi355.train.computation_time) == (72, 2.025)
    with pytest.raises(ConfigError, match="no figures for 'h100'; choose one of: b200, mi355"):
        load_config(["workload=flux", "accelerator=h100"])


@pytest.mark.mpi
@pytest.mark.parametrize("workload,extra,files,file_bytes", [
    ("retinanet", [], 16, 322_957),
    ("flux", ["dataset.record_length_bytes=64KiB"], 8, None),
])
def test_v3_workloads_run_at_tiny_scale_on_two_ranks(workdir, workload, extra, files, file_bytes):
    store = workdir / "store"
    done = run_cli([f"workload={workload}", "scale=tiny", "progress=false", f"storage.root={store}",
                    f"hydra.run.dir={workdir / 'run'}", *extra], workdir / "cwd", mpi_ranks=2, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((workdir / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["dataset"]["format"] == ("jpeg" if workload == "retinanet" else "parquet")
    data = sorted(p for p in store.rglob(f"*.{summary['dataset']['format']}"))
    assert len(data) == files == summary["dataset"]["files_train"]
    if file_bytes:
        assert {p.stat().st_size for p in data} == {file_bytes}
        from PIL import Image

        with Image.open(data[0]) as image:
            image.load()
    else:
        pq = pytest.importorskip("pyarrow.parquet")
        table = pq.read_table(data[0])
        assert table.num_rows == 8 and table.column_names == [c.split(":")[0] for c in FLUX_COLUMNS]


@pytest.mark.parametrize("workload,per_file", [("retinanet", 322_957), ("flux", 288 * 2_164_832)])
def test_v3_workloads_plan_for_1024_ranks(workdir, workload, per_file):
    done = run_cli([f"workload={workload}", "mode=plan", "world.size=1024", "progress=false",
                    f"storage.root={workdir / 'store'}", f"hydra.run.dir={workdir / 'run'}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    plan = json.loads((workdir / "run" / "plan.json").read_text())
    assert plan["world_size"] == 1024
    text = json.dumps(plan)
    assert str(1_170_301 if workload == "retinanet" else 4296) in text
    assert not (workdir / "store").exists()  # a plan does no I/O


# -- the v3.0 divisions in mode=datasize ------------------------------------------------------------


def test_divisions_follow_the_v3_rules():
    assert division("retinanet", "b200", ["dataset.num_files_train", "reader.read_threads", "storage.root"])[0] == "closed"
    assert division("unet3d", "mi355", ["storage.direct_io"])[0] == "closed"
    assert division("retinanet", "mi355", ["dataset.num_samples_per_file"]) == \
        ("open", "dataset.num_samples_per_file changed (allowed in OPEN only)")
    assert division("retinanet", "b200", ["storage.direct_io"])[0] == "none"  # odirect: unet3d only
    assert division("retinanet", "b200", ["train.computation_time"])[0] == "none"
    assert division("retinanet", "h100", [])[0] == "none"
    assert division("flux", "b200", [])[0] == "none"  # runs, but in neither division's model list


def test_datasize_line_says_the_division(workdir):
    done = run_cli(["workload=retinanet", "accelerator=mi355", "mode=datasize", "datasize.clients=2",
                    "datasize.client_memory_bytes=128GiB", "datasize.ranks=16"], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.strip().splitlines()
    # ceil(5 x 2 x 128 GiB / 322,957 B) = 4,255,643 files; 500 steps x 16 ranks x batch 36 = 288,000
    assert line.startswith("datasize: retinanet needs dataset.num_files_train=4255643 ")
    assert "(288000 files)" in line and line.endswith("MLPerf Storage v3.0: CLOSED (retinanet on mi355)")
    flux = run_cli(["workload=flux", "mode=datasize", "datasize.json=true", "datasize.client_memory_bytes=64GiB"],
                   workdir / "cwd")
    answer = json.loads(flux.stdout)
    assert answer["file_bytes"] == 288 * 2_164_832 and answer["num_files_train"] == -(-5 * 64 * (1 << 30) // (288 * 2_164_832))
    assert answer["mlperf_v3_division"] == "none"
    assert list((workdir / "cwd").iterdir()) == []


def test_list_workloads_shows_the_v3_workloads_with_their_sources(workdir):
    done = run_cli(["--list-workloads"], workdir / "cwd")
    assert done.returncode == 0
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert "mlcommons/storage 3f8f689" in lines["retinanet"] and "retinanet_b200.yaml" in lines["retinanet"]
    assert "mlcommons/storage 3f8f689" in lines["flux"] and "flux_datagen.yaml" in lines["flux"]


def test_the_mlperf_v3_dlio_files_run_as_they_are(tmp_path):
    """dlio_config= with MLPerf Storage's own retinanet_b200.yaml and flux_b200.yaml (3f8f689,
    trimmed to the keys that shape I/O): the same figures as the shipped workloads."""
    retinanet = tmp_path / "retinanet_b200.yaml"
    retinanet.write_text("model: {name: retinanet, type: cnn}\nframework: pytorch\n"
                         "workflow: {generate_data: False, train: True, checkpoint: False}\n"
                         "dataset: {data_folder: data/retinanet/, format: jpeg, num_files_train: 1170301, "
                         "num_samples_per_file: 1, record_length_bytes: 322957}\n"
                         "reader: {data_loader: pytorch, batch_size: 24, read_threads: 8, file_shuffle: seed, sample_shuffle: seed}\n"
                         "train: {epochs: 8, computation_time: 0.04755}\nmetric: {au: 0.85}\n")
    flux = tmp_path / "flux_b200.yaml"
    flux.write_text("model: {name: flux}\nframework: pytorch\n"
                    "workflow: {generate_data: False, train: True, checkpoint: False}\n"
                    "dataset:\n  data_folder: data/flux/\n  format: parquet\n  compression: none\n"
                    "  num_files_train: 4296\n  num_samples_per_file: 288\n  record_length: 2164832\n"
                    "  parquet:\n    row_group_size: 48\n    columns:\n"
                    + "".join(f"      - {{name: {c.split(':')[0]}, dtype: float32, size: {c.split(':')[2]}}}\n" for c in FLUX_COLUMNS)
                    + "reader: {data_loader: pytorch, batch_size: 48, read_threads: 8, file_shuffle: seed}\n"
                      "train: {epochs: 1, computation_time: 1.35}\nmetric: {au: 0.90}\n")
    imported = load_config([f"dlio_config={retinanet}"])
    shipped = load_config(["workload=retinanet"])
    assert imported.dataset.format == "jpeg" and imported.dataset.num_files_train == shipped.dataset.num_files_train
    assert (imported.reader.batch_size, imported.train.computation_time) == (24, 0.04755)
    imported = load_config([f"dlio_config={flux}"])
    assert imported.dataset.format == "parquet" and tuple(imported.dataset.parquet_columns) == FLUX_COLUMNS
    assert (imported.dataset.parquet_row_group_size, imported.dataset.record_length_bytes) == (48, 2_164_832)
