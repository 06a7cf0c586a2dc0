"""The write calls TensorFlow makes to a bundle's files (checkpoint/tf_bundle_writes.py).

Without TensorFlow: the data file's buffer flushes and a hand-built leveldb table's block writes,
against offsets worked out by hand. With TensorFlow and darshan-runtime: a real SaveV2 +
MergeV2Checkpoints (a data file over 8 MiB, indexes of more than one 256 KiB block) run under the
real non-MPI darshan-runtime in a subprocess, and the calls the emulation records for each of its
files (TensorflowFormat.write_calls, what the engine records) against the fwrite calls and bytes
darshan-runtime's STDIO module counted for that file.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from dlio_ckpt.checkpoint.formats import get_format
from dlio_ckpt.checkpoint.tf_bundle_writes import data_file_writes, table_writes

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


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _hand_built_table(metaindex_at: int = 317) -> bytes:
    """Two data blocks (300 and 7 bytes), the empty metaindex block, an index block of two
    entries (keys "a" and "b", values their blocks' handles), each block with a 5-byte trailer
    (type 0: uncompressed), then the footer, whose metaindex handle points at `metaindex_at`."""
    trailer = b"\0" * 5
    first, second = b"\x01" * 300, b"\x02" * 7
    metaindex = struct.pack("<II", 0, 1)  # one restart at 0
    entries = b"".join(b"\0" + _varint(1) + _varint(len(value)) + key + value
                       for key, value in ((b"a", _varint(0) + _varint(300)), (b"b", _varint(305) + _varint(7))))
    index = entries + struct.pack("<III", 0, 7, 2)  # restarts at each entry (index blocks restart at every key)
    body = first + trailer + second + trailer + metaindex + trailer + index + trailer
    handles = _varint(metaindex_at) + _varint(8) + _varint(330) + _varint(len(index))
    return body + handles.ljust(40, b"\0") + struct.pack("<Q", 0xDB4775248B80FB57)


def test_a_table_is_written_block_by_block_then_its_footer():
    table = _hand_built_table()
    assert len(table) == 409  # 300 + 5 + 7 + 5 + 8 + 5 + 26 + 5 + 48
    assert table_writes(table) == [(0, 300), (300, 5), (305, 7), (312, 5),  # the data blocks, each then its trailer
                                   (317, 8), (325, 5),  # the metaindex block
                                   (330, 26), (356, 5),  # the index block: 2 entries of 7 bytes, 3 restarts words
                                   (361, 48)]  # the footer


@pytest.mark.parametrize("table, message", [
    (_hand_built_table()[:40], "40 bytes, shorter than its 48-byte footer"),
    (_hand_built_table()[:-1] + b"\0", "its last 8 bytes are not the table magic number"),
    (_hand_built_table()[:100] + _hand_built_table()[-48:], "its index block (330, 26) lies outside the file"),
    (_hand_built_table(metaindex_at=318), "a block at byte 318, expected at 317"),
])
def test_a_file_that_is_not_a_whole_table_is_refused(table, message):
    with pytest.raises(ValueError) as caught:
        table_writes(table)
    assert str(caught.value) == f"not a TensorFlow table: {message}"


# -- against TensorFlow under the real darshan-runtime ----------------------------------------------

SAVE = """
import shutil, sys
import numpy as np
import tensorflow as tf
folder, kept = sys.argv[1], sys.argv[2]
# 300 tiny tensors under 1,000-character names: an index of more than one 256 KiB block; with
# 3 and 6 MiB tensors among them, a data file over 8 MiB whose buffers end inside a tensor
names = [f"layer_{i:05d}/" + "long_variable_scope_" * 50 + "kernel" for i in range(300)] + ["big_a", "big_b", "graph"]
values = [np.full(3, i, np.float32) for i in range(300)] + [np.ones(3 * 2**18, np.float32), np.ones(6 * 2**18, np.float32),
                                                            b"object graph"]
prefix = f"{folder}/ckpt-1_temp/part-00000-of-00001"
tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                  tensors=[tf.constant(v) for v in values])
shutil.copyfile(f"{prefix}.index", f"{kept}/staged.index")  # MergeV2Checkpoints deletes it
tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=[prefix], destination_prefix=f"{folder}/ckpt-1", delete_old_dirs=True)
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


def _predicted(calls: list[tuple[int, int]]) -> tuple[int, int, int]:
    return len(calls), sum(n for _, n in calls), max(o + n for o, n in calls) - 1


def test_the_recorded_calls_are_the_fwrites_darshan_runtime_counts_in_tensorflow(tmp_path, tensorflow_without_keras):
    if not RUNTIME.is_file():
        pytest.skip(f"darshan-runtime not present at {RUNTIME}")
    pytest.importorskip("darshan")
    pytest.importorskip("tensorflow")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_profile import exclude_environment

    folder, kept, logs = tmp_path / "ckpt", tmp_path / "kept", tmp_path / "logs"
    for path in (folder, kept, logs):
        path.mkdir()
    env = dict(os.environ, DARSHAN_ENABLE_NONMPI="1", DARSHAN_LOG_DIR_PATH=str(logs), LD_PRELOAD=str(RUNTIME),
               TF_CPP_MIN_LOG_LEVEL="3", DARSHAN_EXCLUDE_DIRS=exclude_environment())
    program = tmp_path / "save.py"  # a file, not `-c`: the log keeps the command line, whose newlines
    program.write_text(SAVE)  # PyDarshan would read as the mount table's lines
    done = subprocess.run([sys.executable, str(program), str(folder), str(kept)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = _stdio_writes(logs)
    # TF writes the staged files under temporary names (`.tempstate<random>`), renamed when closed
    (data,) = [p for p in seen if ".data-00000-of-00001.tempstate" in p]
    (staged,) = [p for p in seen if ".index.tempstate" in p]
    merged = str(folder / "ckpt-1.index")
    assert sorted(seen) == sorted([data, staged, merged])
    fmt = get_format("tensorflow")
    data_size = (folder / "ckpt-1.data-00000-of-00001").stat().st_size
    assert data_size > 8 * MIB and (kept / "staged.index").stat().st_size > 256 * 1024
    read = lambda path: Path(path).read_bytes()  # noqa: E731
    expected = {data: _predicted(fmt.write_calls("x.data-00000-of-00001", data_size, read)),
                staged: _predicted(fmt.write_calls(str(kept / "staged.index"), 0, read)),
                merged: _predicted(fmt.write_calls(merged, 0, read))}
    assert seen == expected
    # and in numbers: 2 buffers of 8 MiB then the rest; 2 data blocks of an index, each 2 calls, then 5
    assert seen[data][0] == 2 and seen[staged][0] == seen[merged][0] == 2 * 2 + 5
