"""Raw binary: the samples of a file back to back, no header, sample i at i * sample_bytes."""

from __future__ import annotations

from dlio_ckpt.content import ByteSource
from dlio_ckpt.formats.base import FileSpec, FormatOptions, Opener, Scratch
from dlio_ckpt.formats.streams import OffsetReader, buffered, write_in_one, write_samples, write_straight


class RawFormat:
    name = "raw"
    extension = "bin"
    companion_suffixes: tuple[str, ...] = ()
    sequential = False
    write_needs: frozenset[str] = frozenset()
    compressions: tuple[str, ...] = ("none",)  # dataset.compression values it offers

    def write(self, open_output: Opener, spec: FileSpec, source: ByteSource, options: FormatOptions) -> None:
        handle = open_output("")
        # a small file: its one write; one large sample: its chunks; each as `buffered` issues them
        if not write_in_one(handle, spec, source, options) and not write_straight(handle, spec, source, options):
            with buffered(handle, options) as out:
                write_samples(out, spec, source, options)

    def open(self, open_input: Opener, spec: FileSpec, options: FormatOptions,
             scratch: Scratch | None = None) -> OffsetReader:
        return OffsetReader(open_input(""), spec.sample_bytes, 0, spec.sample_bytes, options, scratch)
