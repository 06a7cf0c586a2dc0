"""Conformance of every dataset format: bytes on disk checked by the format's own library.

Files are written through the real storage layer (and the traced wrapper) the way the engine
does, then read back twice: independently of our code (numpy, h5py, tf.data) and by the
format's own SampleReader, with and without transfer-size pieces.
"""

from __future__ import annotations

import os
import tracemalloc
import zipfile

import h5py
import numpy as np
import pytest

from dlio_ckpt.content import ByteSource
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.formats import FileSpec, FormatOptions, get_format, names
from dlio_ckpt.storage.events import EventRecorder, JobClock
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.traced import TracedStorage

ALL = ["npz", "npy", "hdf5", "tfrecord", "raw", "indexed_binary"]
# Formats whose whole-file read touches every byte exactly once, and whose writes never go back.
EXACT_IO = ["npy", "tfrecord", "raw", "indexed_binary"]
SMALL = FormatOptions(write_chunk_bytes=1024)  # several chunks per sample


@pytest.fixture(scope="module")
def source() -> ByteSource:
    return ByteSource(seed=7, pool_bytes=1 << 20)


def make_spec(tmp_path, name: str, num_samples: int = 6, sample_bytes: int = 3001, index: int = 2) -> FileSpec:
    fmt = get_format(name)
    return FileSpec(index=index, path=str(tmp_path / f"file_{index}.{fmt.extension}"), num_samples=num_samples, sample_bytes=sample_bytes)


def write(storage, name: str, spec: FileSpec, source: ByteSource, options: FormatOptions = SMALL) -> list[str]:
    """As the engine does: the format gets open_output, the caller closes what it opened."""
    opened = {}

    def open_output(suffix: str):
        opened[suffix] = storage.open_write(spec.path + suffix)
        return opened[suffix]

    get_format(name).write(open_output, spec, source, options)
    for handle in opened.values():
        handle.fsync()
        handle.close()
    return [spec.path + suffix for suffix in opened]


def open_reader(storage, name: str, spec: FileSpec, options: FormatOptions = SMALL):
    return get_format(name).open(lambda suffix: storage.open_read(spec.path + suffix), spec, options)


def expected(source: ByteSource, spec: FileSpec) -> np.ndarray:
    return np.stack([source.array(spec.sample_key(i), spec.sample_bytes) for i in range(spec.num_samples)])


def independent_read(name: str, spec: FileSpec) -> np.ndarray:
    """The samples as the format's own library sees them, without any of our code."""
    if name == "npz":
        with np.load(spec.path) as archive:
            return archive["x"]
    if name == "npy":
        return np.load(spec.path)
    if name == "hdf5":
        with h5py.File(spec.path, "r") as h5:
            return h5["x"][()]
    if name == "raw":
        return np.fromfile(spec.path, dtype=np.uint8).reshape(spec.num_samples, spec.sample_bytes)
    if name == "indexed_binary":
        index = np.fromfile(spec.path + ".idx", dtype="<u8")
        assert index[:1].tobytes() == b"DLIOIDX\0" and index[1] == 1
        count = int(index[2])
        offsets, sizes = index[3 : 3 + count], index[3 + count :]
        data = np.fromfile(spec.path, dtype=np.uint8)
        return np.stack([data[o : o + s] for o, s in zip(offsets, sizes)])
    raise AssertionError(name)


# -- independent libraries read what we wrote -------------------------------------------------


@pytest.mark.parametrize("name", [n for n in ALL if n != "tfrecord"])
def test_own_library_reads_exact_bytes(tmp_path, source, name):
    spec = make_spec(tmp_path, name)
    write(PosixStorage(), name, spec, source)
    np.testing.assert_array_equal(independent_read(name, spec), expected(source, spec))


def test_npz_labels(tmp_path, source):
    spec = make_spec(tmp_path, "npz")
    write(PosixStorage(), "npz", spec, source)
    with np.load(spec.path) as archive:
        assert archive["y"].dtype == np.int64 and archive["y"].shape == (spec.num_samples,)


# -- our readers ------------------------------------------------------------------------------


@pytest.mark.parametrize("transfer_size", [0, 1000, 4096])
@pytest.mark.parametrize("name", ALL)
def test_sample_reader_sizes_and_bytes(tmp_path, source, name, transfer_size):
    spec = make_spec(tmp_path, name)
    storage = PosixStorage()
    write(storage, name, spec, source)
    reader = open_reader(storage, name, spec, FormatOptions(transfer_size=transfer_size))
    try:
        for sample in reversed(range(spec.num_samples)):  # any order, not just file order
            assert reader.read(sample) == spec.sample_bytes
            assert bytes(reader.fetch(sample)) == source.array(spec.sample_key(sample), spec.sample_bytes).tobytes()
    finally:
        reader.close()


@pytest.mark.parametrize("name", ALL)
def test_direct_io_round_trip(tmp_path, source, name):
    spec = make_spec(tmp_path, name, num_samples=3, sample_bytes=5000)
    storage = PosixStorage(direct_io=True)
    try:
        write(storage, name, spec, source)
    except OSError as exc:  # tmpfs and some overlay file systems refuse O_DIRECT
        pytest.skip(f"O_DIRECT not supported here: {exc}")
    reader = open_reader(storage, name, spec, FormatOptions(transfer_size=4096))
    try:
        assert bytes(reader.fetch(1)) == source.array(spec.sample_key(1), spec.sample_bytes).tobytes()
    finally:
        reader.close()


@pytest.mark.parametrize("name", EXACT_IO)
def test_traced_bytes_match_disk(tmp_path, source, name):
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    traced = TracedStorage(PosixStorage(), recorder)
    spec = make_spec(tmp_path, name)
    paths = write(traced.with_phase("generate"), name, spec, source)
    on_disk = sum(os.path.getsize(p) for p in paths)
    assert recorder.bytes_written["generate"] == on_disk
    reader = open_reader(traced.with_phase("train"), name, spec, FormatOptions(transfer_size=1000))
    for sample in range(spec.num_samples):
        reader.read(sample)
    reader.close()
    assert recorder.bytes_read["train"] == on_disk
    assert recorder.op_counts[("train", "open")] == recorder.op_counts[("train", "close")] == len(paths)


@pytest.mark.parametrize("name", ["npz", "hdf5"])
def test_traced_library_formats_read_at_least_payload(tmp_path, source, name):
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    traced = TracedStorage(PosixStorage(), recorder)
    spec = make_spec(tmp_path, name)
    write(traced.with_phase("generate"), name, spec, source)
    assert recorder.bytes_written["generate"] >= os.path.getsize(spec.path)  # they may rewrite headers
    reader = open_reader(traced.with_phase("train"), name, spec)
    for sample in range(spec.num_samples):
        reader.read(sample)
    reader.close()
    # The libraries read their metadata more than once (np.load sniffs the magic, zipfile and
    # HDF5 re-read directory records; np.load(path) does it in 4 KiB buffered reads: the first
    # 4 KiB twice, the end records in reads of up to 4 KiB), but never the payload twice.
    assert spec.payload_bytes <= recorder.bytes_read["train"] <= os.path.getsize(spec.path) + 2 * 4096
    assert recorder.op_counts[("train", "close")] == 1


# -- compression and chunking -----------------------------------------------------------------


@pytest.mark.parametrize(
    "options, chunks",
    [
        (FormatOptions(chunking=True, chunk_size_bytes=1024), (1, 1024)),  # a row split in pieces
        (FormatOptions(chunking=True, chunk_size_bytes=9000), (2, 3001)),  # whole rows per chunk
        (FormatOptions(compression="gzip", compression_level=6, chunk_size_bytes=4096), (1, 3001)),
        (FormatOptions(compression="lzf", chunk_size_bytes=1000), (1, 1000)),
        (FormatOptions(compression="gzip", chunking=True, chunk_size_bytes=7000, write_chunk_bytes=4096), (2, 3001)),
    ],
)
def test_hdf5_chunking_and_compression(tmp_path, source, options, chunks):
    spec = make_spec(tmp_path, "hdf5", num_samples=5)
    write(PosixStorage(), "hdf5", spec, source, options)
    with h5py.File(spec.path, "r") as h5:
        assert h5["x"].chunks == chunks
        assert h5["x"].compression == (None if options.compression == "none" else options.compression)
        np.testing.assert_array_equal(h5["x"][()], expected(source, spec))
    reader = open_reader(PosixStorage(), "hdf5", spec, options)
    assert bytes(reader.fetch(4)) == source.array(spec.sample_key(4), spec.sample_bytes).tobytes()
    reader.close()


def test_hdf5_compression_shrinks_compressible_data(tmp_path):
    zeros = ByteSource(seed=0, zeros=True)
    spec = make_spec(tmp_path, "hdf5", num_samples=8, sample_bytes=64 << 10)
    write(PosixStorage(), "hdf5", spec, zeros, FormatOptions(compression="gzip"))
    assert os.path.getsize(spec.path) < spec.payload_bytes // 10


def test_hdf5_rejects_zstd(tmp_path, source):
    spec = make_spec(tmp_path, "hdf5")
    with pytest.raises(ConfigError, match="gzip or lzf"):
        write(PosixStorage(), "hdf5", spec, source, FormatOptions(compression="zstd"))


def test_npz_deflate_round_trip(tmp_path):
    zeros = ByteSource(seed=0, zeros=True)
    spec = make_spec(tmp_path, "npz", num_samples=8, sample_bytes=64 << 10)
    write(PosixStorage(), "npz", spec, zeros, FormatOptions(compression="gzip", compression_level=1))
    with zipfile.ZipFile(spec.path) as archive:
        assert {i.filename: i.compress_type for i in archive.infolist()} == {"x.npy": zipfile.ZIP_DEFLATED, "y.npy": zipfile.ZIP_DEFLATED}
    assert os.path.getsize(spec.path) < spec.payload_bytes // 10
    np.testing.assert_array_equal(independent_read("npz", spec), expected(zeros, spec))


def test_npz_deflate_random_bytes(tmp_path, source):
    spec = make_spec(tmp_path, "npz")
    write(PosixStorage(), "npz", spec, source, FormatOptions(compression="gzip", write_chunk_bytes=1000))
    np.testing.assert_array_equal(independent_read("npz", spec), expected(source, spec))
    reader = open_reader(PosixStorage(), "npz", spec)
    assert bytes(reader.fetch(3)) == source.array(spec.sample_key(3), spec.sample_bytes).tobytes()
    reader.close()


# -- streaming: generation memory does not grow with the file ----------------------------------


@pytest.mark.parametrize(
    "name, num_samples, sample_bytes",
    [(name, 8, 4 << 20) for name in ("npz", "npy", "raw", "tfrecord", "indexed_binary", "hdf5")]
    + [("hdf5", 512, 64 << 10)],  # small samples: hdf5 writes slabs of rows
)
def test_generation_memory_is_bounded(tmp_path, source, name, num_samples, sample_bytes):
    spec = make_spec(tmp_path, name, num_samples=num_samples, sample_bytes=sample_bytes)  # 32 MiB files
    options = FormatOptions(write_chunk_bytes=256 << 10)
    storage = PosixStorage()
    tracemalloc.start()
    try:
        paths = write(storage, name, spec, source, options)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert os.path.getsize(paths[0]) >= spec.payload_bytes
    assert peak < 2 << 20, f"peak {peak} bytes while writing a {spec.payload_bytes}-byte file"


# -- corruption is detected, not returned -----------------------------------------------------


def test_tfrecord_detects_corrupt_data(tmp_path, source):
    spec = make_spec(tmp_path, "tfrecord")
    write(PosixStorage(), "tfrecord", spec, source)
    with open(spec.path, "r+b") as raw:
        raw.seek(os.path.getsize(spec.path) // 2)
        byte = raw.read(1)
        raw.seek(-1, os.SEEK_CUR)
        raw.write(bytes([byte[0] ^ 0xFF]))
    reader = open_reader(PosixStorage(), "tfrecord", spec)
    with pytest.raises(ValueError, match="CRC"):
        for sample in range(spec.num_samples):
            reader.read(sample)
    reader.close()


def test_truncated_raw_file_raises(tmp_path, source):
    spec = make_spec(tmp_path, "raw")
    write(PosixStorage(), "raw", spec, source)
    os.truncate(spec.path, spec.payload_bytes - 10)
    reader = open_reader(PosixStorage(), "raw", spec, FormatOptions(transfer_size=1000))
    reader.read(0)
    with pytest.raises(EOFError):
        reader.read(spec.num_samples - 1)
    reader.close()


def test_indexed_rejects_foreign_index(tmp_path, source):
    spec = make_spec(tmp_path, "indexed_binary")
    write(PosixStorage(), "indexed_binary", spec, source)
    with open(spec.path + ".idx", "r+b") as index:
        index.write(b"NOTANIDX")
    with pytest.raises(ValueError, match="index"):
        open_reader(PosixStorage(), "indexed_binary", spec)


def test_npy_rejects_wrong_shape(tmp_path, source):
    spec = make_spec(tmp_path, "npy")
    write(PosixStorage(), "npy", spec, source)
    other = FileSpec(spec.index, spec.path, spec.num_samples + 1, spec.sample_bytes)
    with pytest.raises(ValueError, match="plan says"):
        open_reader(PosixStorage(), "npy", other)


# -- registry ---------------------------------------------------------------------------------


def test_registry_names_and_attributes():
    assert names() == sorted(ALL + ["jpeg", "parquet"])  # those two: tests/test_mlperf_v3.py
    expected_attributes = {
        "jpeg": ("jpeg", (), False),
        "parquet": ("parquet", (), False),
        "npz": ("npz", (), False),
        "npy": ("npy", (), False),
        "hdf5": ("h5", (), False),
        "tfrecord": ("tfrecord", (), True),
        "raw": ("bin", (), False),
        "indexed_binary": ("bin", (".idx",), False),
    }
    for name, (extension, companions, sequential) in expected_attributes.items():
        fmt = get_format(name)
        assert fmt.name == name
        assert (fmt.extension, tuple(fmt.companion_suffixes), fmt.sequential) == (extension, companions, sequential)


@pytest.mark.parametrize("typo, suggestion", [("hfd5", "hdf5"), ("tfrecords", "tfrecord"), ("npzz", "npz")])
def test_registry_typo_suggests_close_match(typo, suggestion):
    with pytest.raises(ConfigError, match=f"did you mean '{suggestion}'"):
        get_format(typo)


# -- TensorFlow: tf.data reads our TFRecords; the tensorflow reader path -----------------------


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def test_tensorflow_parses_every_record(tmp_path, source, tf):
    spec = make_spec(tmp_path, "tfrecord", num_samples=5, sample_bytes=300)  # short varints too
    write(PosixStorage(), "tfrecord", spec, source)
    features = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    records = list(tf.data.TFRecordDataset(spec.path))
    assert len(records) == spec.num_samples
    for sample, record in enumerate(records):
        example = tf.io.parse_single_example(record, features)
        assert example["image"].numpy() == source.array(spec.sample_key(sample), spec.sample_bytes).tobytes()
        assert int(example["label"]) == spec.sample_key(sample) % 128


def test_tensorflow_parses_large_records(tmp_path, source, tf):
    spec = make_spec(tmp_path, "tfrecord", num_samples=2, sample_bytes=(1 << 20) + 17)
    write(PosixStorage(), "tfrecord", spec, source, FormatOptions(write_chunk_bytes=100_000))
    features = {"image": tf.io.FixedLenFeature([], tf.string)}
    for sample, record in enumerate(tf.data.TFRecordDataset(spec.path)):
        image = tf.io.parse_single_example(record, features)["image"].numpy()
        assert image == source.array(spec.sample_key(sample), spec.sample_bytes).tobytes()


@pytest.mark.parametrize("drop_last, read_threads", [(False, 2), (True, 0)])
def test_tfdata_batches_count_samples_and_bytes(tmp_path, source, tf, drop_last, read_threads):
    from dlio_ckpt.engine.tf_reader import tfdata_batches, tfrecord_reads

    storage = PosixStorage()
    specs = [make_spec(tmp_path, "tfrecord", num_samples=5, sample_bytes=1000 + 10 * i, index=i) for i in range(3)]
    for spec in specs:
        write(storage, "tfrecord", spec, source)
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    traced = TracedStorage(storage, recorder, phase="train")
    batches = list(tfdata_batches([s.path for s in specs], [s.num_samples for s in specs], batch_size=4, read_threads=read_threads, prefetch_size=2,
                                  shuffle_buffer_size=8, seed=3, drop_last=drop_last, storage=traced))
    total = sum(s.num_samples for s in specs)
    if drop_last:
        assert [b.samples for b in batches] == [4] * (total // 4)
    else:
        assert sum(b.samples for b in batches) == total
        assert sum(b.payload_bytes for b in batches) == sum(s.payload_bytes for s in specs)
    assert recorder.bytes_read["train"] == sum(os.path.getsize(s.path) for s in specs)
    # every pread TFRecordDataset makes (tf_reader.tfrecord_reads), not one per file: the summary said 16 where the program made 48
    assert recorder.op_counts[("train", "read")] == sum(len(tfrecord_reads(os.path.getsize(s.path))) for s in specs) == 2 * len(specs)


@pytest.mark.parametrize("counts, parallel", [([5, 2, 7, 1, 4], 2), ([3, 3, 3], 4), ([2, 6, 1], 0), ([4, 1, 3, 2], 3)])
def test_interleave_files_is_the_order_tensorflow_interleaves_records_in(tmp_path, source, tf, counts, parallel):
    from dlio_ckpt.engine.tf_reader import interleave_files

    paths, file_of = [], {}
    for index, count in enumerate(counts):
        # each file's records told apart by their size
        spec = make_spec(tmp_path, "tfrecord", num_samples=count, sample_bytes=50 + index, index=index)
        write(PosixStorage(), "tfrecord", spec, source)
        paths.append(spec.path)
        file_of[spec.sample_bytes] = index
    features = {"image": tf.io.FixedLenFeature([], tf.string)}
    dataset = tf.data.TFRecordDataset(paths, num_parallel_reads=parallel or None)
    real = [file_of[len(tf.io.parse_single_example(record, features)["image"].numpy())] for record in dataset]
    assert len(real) == sum(counts)
    assert interleave_files(counts, parallel).tolist() == real


def test_tfrecord_reads_are_the_preads_tensorflow_makes():
    from dlio_ckpt.engine.tf_reader import READ_BUFFER, tfrecord_reads

    # strace of TFRecordDataset (TensorFlow 2.21) over files of these sizes: pread64(fd, buf, 262144, offset) until a
    # short one, then one asking for the rest of that buffer, which returns 0
    assert READ_BUFFER == 262144
    assert tfrecord_reads(4216) == [(0, 4216), (4216, 0)]
    assert tfrecord_reads(400236) == [(0, 262144), (262144, 138092), (400236, 0)]
    assert tfrecord_reads(1200236) == [(0, 262144), (262144, 262144), (524288, 262144), (786432, 262144),
                                       (1048576, 151660), (1200236, 0)]
    assert tfrecord_reads(2 * 262144) == [(0, 262144), (262144, 262144), (524288, 0)]


def test_the_tensorflow_reader_loads_tensorflow_when_made_not_at_the_first_batch(monkeypatch):
    # training's clock starts after the reader is made: TensorFlow's import (~4.6 s here) inside
    # the first batch was counted as waiting for data (a tiny run: 5.40 s of training, 0.38 s without it)
    from dlio_ckpt.engine import tf_reader
    from dlio_ckpt.engine.readers import TensorFlowReader

    loads = []
    monkeypatch.setattr(tf_reader, "load_tensorflow", lambda: loads.append("tensorflow"))
    TensorFlowReader(PosixStorage(), files=(), reader_config=None, seed=0)
    assert loads == ["tensorflow"]
