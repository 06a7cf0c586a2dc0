"""Darshan record ids: Bob Jenkins' 64-bit lookup8 hash of a record's name.

PyDarshan joins records to names through these ids, and analysis tools compare ids across logs,
so a log written here must give every path the id darshan-runtime would give it. The hash is the
public-domain lookup8 `hash()` with level 0 (the spec's section 9, checked against test vectors
taken from real logs).
"""

from __future__ import annotations

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C13
# (shift, direction) of the 12 mix steps; +n is a left shift, -n a logical right shift.
_MIX_SHIFTS = (-43, 9, -8, -38, 23, -5, -35, 49, -11, -12, 18, -22)


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    regs = [a, b, c]
    for step, shift in enumerate(_MIX_SHIFTS):
        x, y, z = step % 3, (step + 1) % 3, (step + 2) % 3
        value = (regs[x] - regs[y] - regs[z]) & _MASK
        shifted = (regs[z] << shift) & _MASK if shift > 0 else regs[z] >> -shift
        regs[x] = value ^ shifted
    return regs[0], regs[1], regs[2]


def _word(data: bytes, start: int) -> int:
    return int.from_bytes(data[start : start + 8], "little")


def darshan_hash(name: str | bytes, level: int = 0) -> int:
    """The 64-bit record id darshan-runtime gives `name` (the exact string stored in the log)."""
    data = name.encode("utf-8") if isinstance(name, str) else bytes(name)
    a = b = level & _MASK
    c = _GOLDEN
    position = 0
    remaining = len(data)
    while remaining >= 24:
        a = (a + _word(data, position)) & _MASK
        b = (b + _word(data, position + 8)) & _MASK
        c = (c + _word(data, position + 16)) & _MASK
        a, b, c = _mix(a, b, c)
        position += 24
        remaining -= 24
    tail = data[position:]
    c = (c + len(data)) & _MASK
    a = (a + int.from_bytes(tail[0:8], "little")) & _MASK
    b = (b + int.from_bytes(tail[8:16], "little")) & _MASK
    # The lowest byte of c holds the length, so the last 7 tail bytes go in one byte higher.
    c = (c + (int.from_bytes(tail[16:23], "little") << 8)) & _MASK
    _, _, c = _mix(a, b, c)
    return c
