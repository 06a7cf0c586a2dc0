"""The C TorchStream (dlio_ckpt/checkpoint/_torch_stream_c.c) against the Python classes it stands
for (filebuf.FilebufStream under torch_archive.ArchiveNamed): the same system calls with the same
bytes, piece for piece, on torch.save's own output and on records torch writes only past 4 GiB
(zip64 offsets), and the `torch` format's file byte for byte torch.save(state, path)'s with either."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from dlio_ckpt.checkpoint import torch_stream as torch_stream_module
from dlio_ckpt.checkpoint.filebuf import FilebufStream
from dlio_ckpt.checkpoint.torch_archive import ArchiveNamed

stream_c = pytest.importorskip("dlio_ckpt.checkpoint._torch_stream_c", reason="the C extension is not built")


class Recording:
    """A handle that keeps each call: ("writev", [bytes, ...]) or ("write", bytes)."""

    def __init__(self, with_writev: bool = True) -> None:
        self.calls: list = []
        self.offset = 0
        if with_writev:
            self.writev = self._writev

    def _writev(self, buffers) -> int:
        pieces = [bytes(memoryview(b).cast("B")) for b in buffers]
        self.calls.append(("writev", pieces))
        self.offset += sum(map(len, pieces))
        return sum(map(len, pieces))

    def write(self, data) -> int:
        piece = bytes(memoryview(data).cast("B"))
        self.calls.append(("write", piece))
        self.offset += len(piece)
        return len(piece)

    def tell(self) -> int:
        return self.offset

    def content(self) -> bytes:
        return b"".join(b"".join(c[1]) if c[0] == "writev" else c[1] for c in self.calls)


def python_pair(handle, stem: str, alignment: int = 64):
    stream = FilebufStream(handle)
    return ArchiveNamed(stream, stem, alignment) if stem else stream


def state(torch) -> dict:
    rng = np.random.default_rng(3)
    values = {f"layer{i}.weight": torch.from_numpy(rng.standard_normal(n).astype(np.float32))
              for i, n in enumerate((864, 32, 9216, 3, 70000, 1))}
    values["step"] = torch.tensor(7, dtype=torch.int64)
    values["nested"] = {"momentum": torch.from_numpy(rng.standard_normal(300).astype(np.float32)), "lr": 0.1}
    return values


@pytest.mark.parametrize("stem", ["checkpoint_1", "a_much_longer_name_than_archive", "c", ""])
@pytest.mark.parametrize("with_writev", [True, False])
def test_torch_save_through_c_issues_the_python_streams_calls(tmp_path, stem, with_writev):
    torch = pytest.importorskip("torch")
    values = state(torch)
    handles = {}
    for side, make in (("c", stream_c.TorchStream), ("python", python_pair)):
        handles[side] = Recording(with_writev)
        torch.save(values, make(handles[side], stem, 64))
    assert handles["c"].calls == handles["python"].calls
    assert [op for op, _ in handles["c"].calls].count("write") == (1 if with_writev else len(handles["c"].calls))
    content = handles["c"].content()
    if stem:  # what torch.save(values, "<stem>.pt") writes, byte for byte
        torch.save(values, tmp_path / f"{stem}.pt")
        assert content == (tmp_path / f"{stem}.pt").read_bytes()
    loaded = torch.load(__import__("io").BytesIO(content), weights_only=True)
    assert torch.equal(loaded["layer4.weight"], values["layer4.weight"]) and loaded["nested"]["lr"] == 0.1


def _record(name: bytes, data: bytes) -> list[bytes]:
    """One zip record as torch hands it over: header, name, padded extra, data, zip64 descriptor."""
    extra = b"FB" + struct.pack("<H", 20) + b"Z" * 20
    header = b"PK\x03\x04" + bytes(22) + struct.pack("<HH", len(name), len(extra))
    return [header, name, extra, data, b"PK\x07\x08" + struct.pack("<IQQ", 0, len(data), len(data))]


def _zip64_pieces(first: bytes, second: bytes) -> tuple[list[bytes], bytes]:
    """Two records, then a central directory whose first entry keeps the second record's local
    header offset in a zip64 extra block (as torch does past 4 GiB) and whose second entry has a
    32-bit offset (the first record's), then the zip64 end, its locator and the end record."""
    data = bytes(range(256)) * 8
    records = _record(first, data) + _record(second, data[::-1])
    at_second = sum(map(len, records[:5]))  # the second header's offset in torch's bytes
    zip64 = struct.pack("<HH", 1, 24) + struct.pack("<QQQ", len(data), len(data), at_second)
    entry = (b"PK\x01\x02" + bytes(16) + struct.pack("<II", 0xFFFFFFFF, 0xFFFFFFFF)
             + struct.pack("<HHHHHII", len(second), len(zip64), 0, 0, 0, 0, 0xFFFFFFFF) + second + zip64)
    plain = (b"PK\x01\x02" + bytes(16) + struct.pack("<II", len(data), len(data))
             + struct.pack("<HHHHHII", len(first), 0, 0, 0, 0, 0, 0) + first)
    ends = [b"PK\x06\x06" + bytes(52), b"PK\x06\x07" + bytes(16), b"PK\x05\x06" + bytes(18)]
    return records + [entry + plain] + ends, zip64


@pytest.mark.parametrize("stem", ["checkpoint_12", "x"])
def test_zip64_offsets_are_moved_as_the_python_stream_moves_them(stem):
    pieces, zip64 = _zip64_pieces(b"archive/data/0", b"archive/data/1")
    handles = {}
    for side, make in (("c", stream_c.TorchStream), ("python", python_pair)):
        handles[side] = Recording()
        stream = make(handles[side], stem, 64)
        for piece in pieces:
            assert stream.write(memoryview(piece)) == len(piece)
        stream.flush()
    assert handles["c"].calls == handles["python"].calls
    content = handles["c"].content()
    assert content.count(f"{stem}/data/".encode()) == 4 and b"archive/" not in content
    second = content.index(b"PK\x03\x04", 1)  # where the second record's header landed
    assert second != struct.unpack_from("<Q", zip64, 20)[0]  # the renaming moved it
    moved = content.index(b"\x01\x00\x18\x00", content.index(b"PK\x01\x02"))  # the entry's zip64 block
    assert struct.unpack_from("<Q", content, moved + 20)[0] == second
    # each record's data starts on a 64-byte boundary in the file, as torch aligns it
    assert content.index(bytes(range(256))) % 64 == 0 and content.index(bytes(range(256))[::-1]) % 64 == 0


def test_a_closed_stream_writes_nothing_more():
    handle = Recording()
    stream = stream_c.TorchStream(handle, "checkpoint_1", 64)
    stream.write(b"x" * 10)  # buffered
    stream.close()
    assert stream.closed and handle.calls == []
    with pytest.raises(ValueError):
        stream.write(b"y")


def test_without_the_extension_the_python_pair_writes_the_same_file(monkeypatch):
    torch = pytest.importorskip("torch")
    values = state(torch)
    handles = {"c": Recording(), "python": Recording()}
    built = torch_stream_module.torch_stream(handles["c"], "checkpoint_1", 64)
    assert type(built) is stream_c.TorchStream
    torch.save(values, built)
    monkeypatch.setattr(torch_stream_module, "_torch_stream_c", None)
    fallback = torch_stream_module.torch_stream(handles["python"], "checkpoint_1", 64)
    assert isinstance(fallback, ArchiveNamed)
    torch.save(values, fallback)
    assert handles["c"].calls == handles["python"].calls
    assert isinstance(torch_stream_module.torch_stream(Recording(), "", 64), FilebufStream)
