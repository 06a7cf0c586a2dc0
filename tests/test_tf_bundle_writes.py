"""The write calls TensorFlow makes to a bundle's files (checkpoint/tf_bundle_writes.py).

Without TensorFlow: the data file's buffer flushes and a leveldb table's block writes against
offsets worked out by hand. With TensorFlow: the calls TensorflowFormat works out from the tensors
alone (what the engine records) against the blocks of every index TF wrote, read back here
(two shards, multi-block indexes, every kind of entry). With darshan-runtime too: the format's
SaveV2 and merge (a data file over 8 MiB, indexes of more than one 256 KiB block) run under the
real non-MPI darshan-runtime in a subprocess, and the calls worked out per file against the
fwrite calls and bytes darshan-runtime's STDIO module counted.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from dlio_ckpt.checkpoint.formats import get_format
from dlio_ckpt.checkpoint.tf_bundle_writes import data_file_writes, table_reads, table_writes

MIB = 1 << 20
RUNTIME = Path(__file__).resolve().parents[1].parent / "shared" / "tools" / "darshan-runtime-3.4.7" / "nonmpi" / "libdarshan.so"


@pytest.mark.parametrize("size, expected", [
    (0, []),  # nothing buffered: no call at close
    (1, [(0, 1)]),
    (8 * MIB, [(0, 8 * MIB)]),
    (8 * MIB + 1, [(0, 8 * MIB), (8 * MIB, 1)]),
    # TF 2.21, tensors of 3, 7 and 20 MiB, 1 KiB and a 5,000-byte string (fwrite interposer): 8, 8, 8 MiB, then the rest
    (31_463_310, [(0, 8 * MIB), (8 * MIB, 8 * MIB), (16 * MIB, 8 * MIB), (24 * MIB, 6_297_486)]),
])
def test_a_data_file_is_written_in_full_8_mib_buffers_then_the_rest(size, expected):
    assert data_file_writes(size) == expected


def test_a_one_block_table_is_its_block_then_the_metaindex_index_and_footer():
    """TF 2.21's index of three tensors "a", "b", "c" (values of 18, 17 and 14 bytes) under its
    6-byte header, as an fwrite interposer saw it: the data block holds 3 + 6, 4 + 18, 4 + 17 and
    4 + 14 bytes of entries and 8 of restarts (78); the index block one entry for it, keyed "d" (the
    shortest key after "c"), 4 + 2 bytes, and 8 of restarts (14)."""
    assert table_writes([(b"", 6), (b"a", 18), (b"b", 17), (b"c", 14)]) == \
        [(0, 78), (78, 5), (83, 8), (91, 5), (96, 14), (110, 5), (115, 48)]


def test_the_merge_reads_a_table_footer_first_then_its_index_block_then_each_data_block():
    """TF's table reader (MergeV2Checkpoints reading a staged index): the footer, the index block
    and its trailer, then every data block and its trailer in key order; never the metaindex
    block. The one-block table above: 48 B at 115, 14 + 5 at 96, 78 + 5 at 0 (keras_tfdata.py's
    staged index of 2,131 B, DXT of darshan-runtime: 48 at 2,083, 20 at 2,063, 2,050 at 0)."""
    assert table_reads([(b"", 6), (b"a", 18), (b"b", 17), (b"c", 14)]) == [(115, 48), (96, 19), (0, 83)]
    # two data blocks (44 at 0 and 42 at 49, below): both read, in order, after footer and index
    entries = [(b"apple", 10), (b"apricot", 10), (b"cat", 10), (b"cherry", 10)]
    assert table_reads(entries, block_bytes=40, restart_interval=2) == [(138, 48), (109, 29), (0, 49), (49, 47)]


def test_data_blocks_are_cut_at_the_block_size_and_keyed_by_short_separators():
    """Blocks of 40 bytes, a restart every 2 entries, values of 10 bytes: "apple" (3 + 5 + 10 = 18,
    with 8 of restarts 26) and "apricot" (sharing "ap": 3 + 5 + 10 = 18) make 44 >= 40: a block of
    44. Its index key is "b" (after "apricot", before "cat"). "cat" (3 + 3 + 10) and "cherry"
    (sharing "c": 3 + 5 + 10) make 16 + 18 + 8 = 42: a block of 42 at 49, keyed "d". Index block:
    two entries of 3 + 1 + 2 bytes and 12 of restarts (every index entry restarts): 24."""
    entries = [(b"apple", 10), (b"apricot", 10), (b"cat", 10), (b"cherry", 10)]
    assert table_writes(entries, block_bytes=40, restart_interval=2) == \
        [(0, 44), (44, 5), (49, 42), (91, 5), (96, 8), (104, 5), (109, 24), (133, 5), (138, 48)]


def test_every_restart_interval_entries_a_key_is_written_whole():
    """"k1" (3 + 2 + 1), "k2" (sharing "k": 3 + 1 + 1), then, 2 entries on, "k3" whole (3 + 2 + 1)
    with a second restart: 17 + 12 = 29 bytes."""
    assert table_writes([(b"k1", 1), (b"k2", 1), (b"k3", 1)], restart_interval=2) == \
        [(0, 29), (29, 5), (34, 8), (42, 5), (47, 14), (61, 5), (66, 48)]


def read_table(table: bytes) -> list[tuple[int, int]]:
    """The write calls of a real index file, read from it independently of the prediction: the
    footer's handles (metaindex, index block), the index block's entries (each a data block's
    handle), each block then its 5-byte trailer, then the 48-byte footer; checked to cover the file."""
    def varint(at: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            value |= (table[at] & 0x7F) << shift
            at, shift = at + 1, shift + 7
            if table[at - 1] < 0x80:
                return value, at

    def handle(at: int) -> tuple[tuple[int, int], int]:
        offset, at = varint(at)
        size, at = varint(at)
        return (offset, size), at

    assert struct.unpack("<Q", table[-8:])[0] == 0xDB4775248B80FB57  # the table magic
    metaindex, at = handle(len(table) - 48)
    (index_at, index_size), _ = handle(at)
    restarts = struct.unpack("<I", table[index_at + index_size - 4:index_at + index_size])[0]
    blocks, at, end = [], index_at, index_at + index_size - 4 * (restarts + 1)
    while at < end:
        _, at = varint(at)
        unshared, at = varint(at)
        _, at = varint(at)
        block, at = handle(at + unshared)
        blocks.append(block)
    writes = []
    for offset, size in [*blocks, metaindex, (index_at, index_size)]:
        assert offset == (writes[-1][0] + 5 if writes else 0)
        writes += [(offset, size), (offset + size, 5)]
    assert writes[-1][0] + 5 == len(table) - 48
    return writes + [(len(table) - 48, 48)]


def _chunks(tensor):
    yield memoryview(bytearray(tensor.nbytes))


def test_the_worked_out_calls_are_those_of_tensorflows_own_files(tmp_path):
    """Two ranks' shards through the format (SaveV2 each, then MergeV2Checkpoints): 1,000-character
    names (the second shard's index and the merged one of more than one 256 KiB block), a shaped bfloat16
    tensor, an int64 step, a 5,000-byte object graph blob and a plain value; every index TF wrote,
    read back here, against the calls the format worked out from the tensors alone."""
    pytest.importorskip("tensorflow")
    from dlio_ckpt.plan.model import TensorSpec

    fmt = get_format("tensorflow")
    long = "long_variable_scope_" * 50
    shards = []
    for rank in range(2):
        extra = [[TensorSpec("head", 12, 2, "model", "bfloat16", shape=(3, 4)),
                  TensorSpec("step", 1, 8, "optimizer", "int64"),
                  TensorSpec("_CHECKPOINTABLE_OBJECT_GRAPH", 0, 1, "object", blob=5000)],
                 [TensorSpec("epoch", 0, 1, "object", value="7")]][rank]  # keys unique across the shards
        tensors = tuple([TensorSpec(f"layer_{i:04d}/{long}", 3, 4, "model") for i in range(150 + 130 * rank)] + extra)
        shards.append((str(tmp_path / f"ckpt-1.data-0000{rank}-of-00002"), rank, tensors))
    for data, rank, tensors in shards:
        staged = fmt.write_paths(data, rank, tensors, _chunks)
        calls = dict(staged.writes())
        assert list(calls[staged.data]) == data_file_writes(os.path.getsize(staged.data))
        (index,) = staged.others
        assert list(calls[index]) == read_table(Path(index).read_bytes())
    merged = fmt.merge([data for data, _, _ in shards], {data: (rank, tensors) for data, rank, tensors in shards})
    (index,) = merged.written
    table = Path(index).read_bytes()
    assert list(dict(merged.writes())[index]) == read_table(table)
    assert len(table) > 256 * 1024 and len(read_table(table)) == 2 * 2 + 5  # two data blocks


# -- against TensorFlow under the real darshan-runtime ----------------------------------------------

SAVE = """
import json, sys
from dlio_ckpt.checkpoint.formats import get_format
from dlio_ckpt.plan.model import TensorSpec
folder, out = sys.argv[1], sys.argv[2]
# 300 tiny tensors under 1,000-character names: an index of more than one 256 KiB block; with
# 3 and 6 MiB tensors among them, a data file over 8 MiB whose buffers end inside a tensor
tensors = tuple([TensorSpec(f"layer_{i:04d}/" + "long_variable_scope_" * 50, 3, 4, "model") for i in range(300)]
                + [TensorSpec("big_a", 3 * 2**18, 4, "model"), TensorSpec("big_b", 6 * 2**18, 4, "model"),
                   TensorSpec("_CHECKPOINTABLE_OBJECT_GRAPH", 0, 1, "object", blob=5000)])
def chunks(tensor):
    yield memoryview(bytearray(tensor.nbytes))
fmt = get_format("tensorflow")
data = f"{folder}/ckpt-1.data-00000-of-00001"
staged = fmt.write_paths(data, 0, tensors, chunks)
merged = fmt.merge([data], {data: (0, tensors)})
calls = {**dict(staged.writes()), **dict(merged.writes())}
with open(out, "w") as sink:
    json.dump({"data": calls[staged.data], "staged": calls[staged.others[0]], "merged": calls[merged.written[0]],
               "staged_reads": dict(merged.reads())[staged.others[0]]}, sink)
"""


def _stdio_writes(logs: Path) -> dict[str, tuple[int, int, int]]:
    """Per file darshan-runtime's STDIO module saw: (fwrite calls, bytes, highest byte written).
    Every process writes a log: the program's is named after python (TensorFlow also runs `uname`)."""
    import darshan

    seen = {}
    for log in sorted(logs.glob("*_python*.darshan")):
        report = darshan.DarshanReport(str(log), read_all=True)
        names = dict(report.name_records)
        if "STDIO" not in report.records:
            continue
        for r in report.records["STDIO"].to_df()["counters"].to_dict("records"):
            if int(r["STDIO_WRITES"]) > 0 and not names[r["id"]].startswith("<"):  # not <STDERR>
                seen[names[r["id"]]] = (int(r["STDIO_WRITES"]), int(r["STDIO_BYTES_WRITTEN"]),
                                        int(r["STDIO_MAX_BYTE_WRITTEN"]))
    return seen


def _posix_reads(logs: Path) -> dict[str, tuple[int, int, int]]:
    """Per file darshan-runtime's POSIX module saw read: (read calls, bytes, highest byte read)."""
    import darshan

    seen = {}
    for log in sorted(logs.glob("*_python*.darshan")):
        report = darshan.DarshanReport(str(log), read_all=True)
        names = dict(report.name_records)
        for r in report.records["POSIX"].to_df()["counters"].to_dict("records"):
            if int(r["POSIX_READS"]) > 0:
                seen[names[r["id"]]] = (int(r["POSIX_READS"]), int(r["POSIX_BYTES_READ"]), int(r["POSIX_MAX_BYTE_READ"]))
    return seen


def _counted(calls: list) -> tuple[int, int, int]:
    """Worked-out calls as darshan-runtime's counters see them: calls, bytes, highest byte written."""
    return len(calls), sum(n for _, n in calls), max(o + n for o, n in calls) - 1


def test_the_recorded_calls_are_the_fwrites_darshan_runtime_counts_in_tensorflow(tmp_path, tensorflow_without_keras):
    """The format's SaveV2 and merge, run under darshan-runtime in a subprocess: per file, the calls
    the format worked out (what the engine records) against the fwrites and bytes STDIO counted."""
    if not RUNTIME.is_file():
        pytest.skip(f"darshan-runtime not present at {RUNTIME}")
    pytest.importorskip("darshan")
    pytest.importorskip("tensorflow")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "realapps"))
    from programs import traced_environment

    folder, logs = tmp_path / "ckpt", tmp_path / "logs"
    for path in (folder, logs):
        path.mkdir()
    env = traced_environment(RUNTIME, logs)
    program, out = tmp_path / "save.py", tmp_path / "calls.json"  # a file, not `-c`: the log keeps the
    program.write_text(SAVE)  # command line, whose newlines PyDarshan would read as the mount table's lines
    done = subprocess.run([sys.executable, str(program), str(folder), str(out)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = _stdio_writes(logs)
    # TF writes the staged files under temporary names (`.tempstate<random>`), renamed when closed
    (data,) = [p for p in seen if ".data-00000-of-00001.tempstate" in p]
    (staged,) = [p for p in seen if ".index.tempstate" in p]
    merged = str(folder / "ckpt-1.index")
    assert sorted(seen) == sorted([data, staged, merged])
    calls = json.loads(out.read_text())
    assert seen == {data: _counted(calls["data"]), staged: _counted(calls["staged"]), merged: _counted(calls["merged"])}
    # and in numbers: a data file over 8 MiB in 2 calls; indexes over 256 KiB: 2 blocks, 2 calls each, then 5
    assert seen[data][0] == 2 and seen[data][1] > 8 * MIB and seen[staged][0] == seen[merged][0] == 2 * 2 + 5
    assert seen[merged][1] > 256 * 1024
    # the merge reads the staged index back (its final staged name): footer, index block, 2 data blocks
    read = {path: n for path, n in _posix_reads(logs).items() if path.startswith(str(folder))}
    staged_index = str(folder / "ckpt-1_temp" / "part-00000-of-00001.index")
    assert read == {staged_index: _counted(calls["staged_reads"])}
    assert read[staged_index][0] == 2 + 2 and read[staged_index][1] == seen[staged][1] - 8 - 5  # all but the metaindex
