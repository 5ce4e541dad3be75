"""Protobuf's wire format, the little of it the exposition needs: varints, zigzag, and a message's fields. The writer
(metrics/protobuf_exposition.py) and the reader (metrics/protobuf_format.py) share it, so each encoding is written
once.

The reader trusts nothing it reads: every length is checked against the end of the message it lies in, a varint
has at most ten bytes, and groups (a deprecated wire type with no length) are refused. What it refuses raises
WireError; it never reads past `end`, and its work is bounded by the bytes it is given.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

VARINT, I64, LEN, I32 = 0, 1, 2, 5  # wire types (3 and 4, groups, are refused)
ONE_BYTE = [bytes((i,)) for i in range(128)]  # the varints of 0 to 127, made once
_MASK64 = (1 << 64) - 1
_DOUBLE = struct.Struct("<d")


class WireError(ValueError):
    """Bytes that are not a protobuf message: truncated, a length past the end, an unknown wire type."""


def varint(n: int) -> bytes:
    """An unsigned integer as protobuf's base-128 varint (a negative one as its 64-bit two's complement)."""
    if n < 128:
        return ONE_BYTE[n] if n >= 0 else varint(n & _MASK64)
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def zigzag(n: int) -> int:
    """A signed integer as sint32/sint64 encode it (0, -1, 1, -2 -> 0, 1, 2, 3)."""
    return n << 1 if n >= 0 else (-n << 1) - 1


def unzigzag(n: int) -> int:
    """The signed integer a zigzagged one stands for (0, 1, 2, 3 -> 0, -1, 1, -2)."""
    return (n >> 1) ^ -(n & 1)


def read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at buf[pos] and the position after it, as protobuf reads it (64 bits kept of ten bytes)."""
    result = shift = 0
    while pos < end:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift >= 70:
            raise WireError("a varint longer than ten bytes")
    raise WireError("a varint cut short")


def read_double(buf: bytes, pos: int) -> float:
    """The little-endian double at buf[pos] (the caller has checked its eight bytes are there)."""
    value: float = _DOUBLE.unpack_from(buf, pos)[0]
    return value


def fields(buf: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Each field of the message in buf[pos:end], in order: (field number, wire type, value, end of the field).
    The value of a varint is the integer; of a fixed-width or length-delimited field, where its bytes start (they run
    to the field's end)."""
    while pos < end:
        key, pos = read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == VARINT:
            value, pos = read_varint(buf, pos, end)
            yield number, wire, value, pos
            continue
        if wire == LEN:
            length, pos = read_varint(buf, pos, end)
            start, stop = pos, pos + length
        elif wire == I64:
            start, stop = pos, pos + 8
        elif wire == I32:
            start, stop = pos, pos + 4
        else:
            raise WireError(f"wire type {wire} (field {number})")
        if stop > end:
            raise WireError(f"field {number} runs past the end of its message ({stop - end} bytes more)")
        yield number, wire, start, stop
        pos = stop


def packed_varints(buf: bytes, pos: int, end: int) -> Iterator[int]:
    """The varints of a packed repeated field's bytes."""
    while pos < end:
        value, pos = read_varint(buf, pos, end)
        yield value
