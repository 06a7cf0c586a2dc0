"""The dataset manifest's bytes, written and read one file entry at a time (pure).

The manifest (`.dlio_ckpt_dataset.json`) is the dataset's commit record: its header (fingerprint,
format, workload, created) and every file's size, written last. It used to be built as one dict
and one `json.dumps(manifest, indent=1)` string, and read back whole with `json.loads`: ~1 KiB of
Python objects a file at both ends (10 million files: GiBs). `encode` yields the same bytes,
piece by piece, from an iterator of (name, size); `decode` reads them back line by line, header
first, then one (name, size) at a time, so neither end holds the file table. The layout is the
one `json.dumps(..., indent=1)` writes (one entry a line; JSON escapes any newline in a name),
so manifests written before this module read back as they were; a manifest in any other layout
is not trusted (ValueError), as a damaged one is not, and the dataset is generated again.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii
from collections.abc import Callable, Iterable, Iterator

SIZES = "sizes"
READ_CHUNK = 1 << 20  # bytes per read of a manifest read back; one read for any manifest below it


def encode(header: dict, sizes: Iterable[tuple[str, int]]) -> Iterator[str]:
    """The text of json.dumps({**header, "sizes": dict(sizes)}, indent=1), in pieces."""
    head = json.dumps({**header, SIZES: {}}, indent=1)
    opening = head[: -len("{}\n}")]  # up to and including '"sizes": '
    yield opening + "{"
    # json.dumps of a str is encode_basestring_ascii's (ensure_ascii), of an int int.__repr__:
    # called directly, the same text at a fifth of the cost a file
    quoted = encode_basestring_ascii
    empty = True
    for name, size in sizes:
        yield ("\n  " if empty else ",\n  ") + quoted(name) + ": " + repr(int(size))
        empty = False
    yield "}\n}" if empty else "\n }\n}"


def _field(line: str) -> tuple[str, object]:
    """One `"key": value` line of the layout (trailing comma allowed) as (key, value)."""
    (key, value), = json.loads("{" + line.strip().rstrip(",") + "}").items()
    return key, value


def decode(lines: Iterable[str]) -> tuple[dict, Iterator[tuple[str, int]]]:
    """(header, iterator of (name, size)) of a manifest's lines (`encode`'s layout); ValueError
    (raised while iterating, too) where the text is not in that layout."""
    source = iter(lines)
    if next(source, None) != "{":
        raise ValueError("not a dataset manifest")
    header: dict = {}
    for line in source:
        if line == f' "{SIZES}": {{}}':  # no files: the last field
            if next(source, None) != "}":
                raise ValueError("not a dataset manifest")
            return header, iter(())
        if line == f' "{SIZES}": {{':
            return header, _entries(source)
        if not line.startswith(' "'):
            raise ValueError("not a dataset manifest")
        key, value = _field(line)
        header[key] = value
    raise ValueError("dataset manifest cut short")


def _entries(source: Iterator[str]) -> Iterator[tuple[str, int]]:
    for line in source:
        if line == " }":
            if next(source, None) != "}" or next(source, None) is not None:
                raise ValueError("not a dataset manifest")
            return
        if not line.startswith('  "'):
            raise ValueError("not a dataset manifest")
        name, size = _field(line)
        if not isinstance(size, int) or isinstance(size, bool):
            raise ValueError("not a dataset manifest")
        yield name, size
    raise ValueError("dataset manifest cut short")


def text_lines(read_at: Callable[[int, int], bytes], size: int) -> Iterator[str]:
    """The lines (without their newline) of a `size`-byte UTF-8 file read READ_CHUNK bytes at a
    time through `read_at(offset, length)` (a storage handle's)."""
    rest = b""
    for offset in range(0, size, READ_CHUNK):
        chunk = read_at(offset, min(READ_CHUNK, size - offset))
        if not chunk:
            break
        *whole, rest = (rest + chunk).split(b"\n")
        for line in whole:
            yield line.decode()
    yield rest.decode()
