"""`dataset.format=toyset`: raw samples after an 8-byte magic, `TOYSET01`."""

from __future__ import annotations

from dlio_ckpt.formats.streams import OffsetReader, buffered, write_samples

MAGIC = b"TOYSET01"


class ToyDatasetFormat:
    name = "toyset"
    extension = "toy"
    companion_suffixes: tuple[str, ...] = ()
    sequential = False
    write_needs: frozenset[str] = frozenset()
    compressions: tuple[str, ...] = ("none",)

    def write(self, open_output, spec, source, options) -> None:
        with buffered(open_output(""), options) as out:
            out.write(MAGIC)
            write_samples(out, spec, source, options)

    def open(self, open_input, spec, options, scratch=None) -> OffsetReader:
        return OffsetReader(open_input(""), spec.sample_bytes, len(MAGIC), spec.sample_bytes, options, scratch)
