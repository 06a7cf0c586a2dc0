"""Codec pipelines (checkpoint.codecs, codec/pipeline.py) through the engine: bytes on disk read
back by zstandard itself, and restores compared with an independently regenerated state.

A bytes stage must leave the state codec's container exactly as that codec alone writes it: the
file a pipeline writes, decompressed by the zstandard library, is compared with the file the same
run writes without the stage.
"""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest
import xxhash
import zstandard

from ckpt_util import data_files, make_ctx
from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.codec.base import ChainLink
from dlio_ckpt.codec.pipeline import make_decoder
from dlio_ckpt.config.load import load_config
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.state.base import BytesView
from test_encoded_checkpoints import INCREMENTAL, LOSSY, SPARSE, expected_digests, manifest, save_all

STEPS = (1, 2, 3)


def run_engine(tmp_path: Path, overrides: list[str], steps=STEPS):
    engine = make_checkpoint_engine(make_ctx(tmp_path, overrides))
    save_all(engine, steps)
    return engine


def files_of(engine, step) -> dict[str, bytes]:
    folder = Path(engine.root) / engine.layout.folder(step)
    return {path.name: path.read_bytes() for path in data_files(folder)}


@pytest.mark.parametrize("alone, pipeline", [
    (INCREMENTAL, [o for o in INCREMENTAL if "encoding" not in o] + ["checkpoint.codecs=[incremental,zstd]"]),
    (LOSSY, [o for o in LOSSY if "encoding" not in o] + ["checkpoint.codecs=[lossy,zstd]"]),
], ids=["incremental+zstd", "lossy+zstd"])
def test_a_bytes_stage_compresses_the_state_codecs_container_and_restores(tmp_path, alone, pipeline):
    plain = run_engine(tmp_path / "alone", alone)
    piped = run_engine(tmp_path / "pipeline", pipeline)
    label = pipeline[-1].split("[")[1].rstrip("]").replace(",", "+")
    for step in STEPS:
        expected, written = files_of(plain, step), files_of(piped, step)
        assert sorted(expected) == sorted(written) and expected
        for name, data in written.items():
            assert zstandard.ZstdDecompressor().decompressobj().decompress(data) == expected[name]
        assert manifest(Path(piped.root) / piped.layout.folder(step))["encoding"] == label
    assert sum(map(len, files_of(piped, 1).values())) < sum(map(len, files_of(plain, 1).values()))
    restored, reference = piped.restore(), plain.restore()
    assert restored.verified and restored.chain_length == len(STEPS)
    assert restored.state_digests == reference.state_digests
    if alone is INCREMENTAL:
        assert restored.state_digests == expected_digests(piped, STEPS)


def test_a_bytes_codec_alone_compresses_the_plain_state(tmp_path):
    engine = run_engine(tmp_path, ["checkpoint.codecs=[zstd]", *SPARSE])
    for step_count, step in enumerate(STEPS, 1):
        written = files_of(engine, step)
        plain = {name: zstandard.ZstdDecompressor().decompressobj().decompress(data) for name, data in written.items()}
        assert {name: xxhash.xxh3_128(data).hexdigest() for name, data in plain.items()} == \
            {Path(key).name: digest for key, digest in expected_digests(engine, STEPS[:step_count]).items()}
        entries = manifest(Path(engine.root) / engine.layout.folder(step))["files"]
        assert {e["encoding"]["codec"] for e in entries} == {"zstd"} and all(len(e["encoding"]["chain"]) == 1 for e in entries)
    restored = engine.restore()
    assert restored.verified and restored.chain_length == 1
    assert restored.state_digests == expected_digests(engine, STEPS)


def test_zstd_shrinks_a_compressible_state(tmp_path):
    engine = run_engine(tmp_path, ["checkpoint.codecs=[zstd]", "checkpoint.content=zeros"], steps=(1,))
    assert 0 < sum(map(len, files_of(engine, 1).values())) < engine.plan.total_bytes / 100


def test_one_codec_in_the_list_writes_what_the_encoding_key_writes(tmp_path):
    by_key = run_engine(tmp_path / "key", INCREMENTAL)
    by_list = run_engine(tmp_path / "list", [o for o in INCREMENTAL if "encoding" not in o] + ["checkpoint.codecs=[incremental]"])
    for step in STEPS:
        assert files_of(by_key, step) == files_of(by_list, step)
        assert manifest(Path(by_list.root) / by_list.layout.folder(step))["encoding"] == "incremental"


def test_a_damaged_compressed_link_is_a_rebuild_problem_not_a_crash():
    link = ChainLink(index=4, size=9, read_at=lambda offset, n: memoryview(b"not zstd!"[offset:offset + n]))
    with pytest.raises(ValueError, match=r"^checkpoint 4: zstd cannot decode its container"):
        make_decoder("incremental+zstd", ()).rebuild([link], BytesView(bytearray(8)))
    with pytest.raises(ValueError, match=r"^unknown encoding 'incremental\+snappy' in the manifest$"):
        make_decoder("incremental+snappy", ())


@pytest.mark.parametrize("overrides, message", [
    (["checkpoint.codecs=[zstd,incremental]"],
     "checkpoint.codecs: incremental keeps the state across checkpoints and must come first (got [zstd,incremental])"),
    (["checkpoint.codecs=[incremental,zsdt]"], "checkpoint.codecs: unknown codec 'zsdt' (did you mean 'zstd'?); choose one of: "),
    (["checkpoint.codecs=[zstd]", "checkpoint.encoding=incremental"],
     "checkpoint.codecs=[zstd] and checkpoint.encoding=incremental both choose the codecs; set one"),
    (["checkpoint.codecs=[zstd]", "checkpoint.format=npz"], "checkpoint.codecs=[zstd] stores a container of its own; use checkpoint.format=raw or npy"),
    (["checkpoint.codecs=[lossy,zstd]"], "checkpoint.codecs=[lossy,zstd] quantises how values change, and checkpoint.update=random"),
])
def test_pipelines_are_checked_with_the_config(overrides, message):
    with pytest.raises(ConfigError) as caught:
        load_config(["checkpoint.enabled=true", *overrides])
    assert str(caught.value).startswith(message)


def test_an_npy_file_holds_the_compressed_container_as_its_array(tmp_path):
    """The container's offset comes from the format's spec (one_stream, its header's size): numpy
    reads the file as one uint8 array, which zstandard decompresses into the state."""
    engine = run_engine(tmp_path, ["checkpoint.codecs=[zstd]", "checkpoint.format=npy", *SPARSE], steps=(1,))
    folder = Path(engine.root) / engine.layout.folder(1)
    expected = {Path(key).name: digest for key, digest in expected_digests(engine, (1,)).items()}
    for path in data_files(folder):
        array = numpy.load(path)
        assert array.dtype == numpy.uint8 and array.ndim == 1
        plain = zstandard.ZstdDecompressor().decompressobj().decompress(array.tobytes())
        assert xxhash.xxh3_128(plain).hexdigest() == expected[path.name]
    assert engine.restore().verified
