"""The spool shard format: one file per instrumented process, written by the hook, merged by the agent.

Stdlib only (the hook imports it). Little-endian, fixed size (SHARD_BYTES), created 0600 in the spool directory
as ``outrider-<pid>-<start_ns>.shard``. docs/spool-format.md describes it for other readers.

    offset  size  field
    0       8     magic b"OUTRSHD1"
    8       4     format version (u32) = 1; a reader skips (and counts) shards of a newer version
    12      4     flags (u32): 1 = closed (the process finished and flushed), 2 = stalled
    16      8     seq (u64): even when the shard is consistent; odd while the writer updates it (a seqlock)
    24      4     pid (u32)
    28      4     stall count (u32)
    32      8     start time, unix ns
    40      8     heartbeat, unix ns (written every flush, about once a second)
    48      8     last completed step, unix ns (0: none yet)
    56      8     steps completed (u64)
    64      4     directory length in bytes (u32)
    68      4     values in the data area (u32)
    72      8     stalled since, unix ns (0: not stalled)
    80..4095      reserved (zero)
    4096          directory: UTF-8 JSON {"meta": {...}, "series": [[name, kind, labels, offset, bounds], ...]}
    DATA_OFFSET   data: float64 values; a counter or gauge takes one, a histogram len(bounds) + 2
                  (bucket counts, the last for +Inf, then the sum)

All values are cumulative since the process started, so a reader that restarts, or reads twice, never counts
twice. The writer bumps seq to odd, writes, and bumps it to even; a reader retries until it sees the same even
seq before and after copying.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"OUTRSHD1"
VERSION = 1
HEADER_BYTES = 4096
DIRECTORY_BYTES = 60 * 1024
DATA_OFFSET = HEADER_BYTES + DIRECTORY_BYTES
MAX_VALUES = 24 * 1024
SHARD_BYTES = DATA_OFFSET + 8 * MAX_VALUES  # 256 KiB

FLAG_CLOSED = 1
FLAG_STALLED = 2

_HEAD = struct.Struct("<8sIIQIIQQQQIIQ")  # through offset 80
_SEQ = struct.Struct("<Q")
SEQ_OFFSET = 16


class ShardFormatError(ValueError):
    """A shard that cannot be read: truncated, corrupt, or of a newer format version."""


@dataclass
class ShardHeader:
    version: int
    flags: int
    seq: int
    pid: int
    stalls: int
    start_ns: int
    heartbeat_ns: int
    last_step_ns: int
    steps: int
    directory_len: int
    value_count: int
    stalled_since_ns: int


@dataclass
class ShardSnapshot:
    header: ShardHeader
    meta: dict[str, Any]
    series: list[tuple[str, str, dict[str, str], list[float], tuple[float, ...]]] = field(default_factory=list)
    # (name, kind, labels, values, bounds)


def pack_header(buf: Any, *, flags: int, seq: int, pid: int, stalls: int, start_ns: int, heartbeat_ns: int,
                last_step_ns: int, steps: int, directory_len: int, value_count: int, stalled_since_ns: int) -> None:
    _HEAD.pack_into(buf, 0, MAGIC, VERSION, flags, seq, pid, stalls, start_ns, heartbeat_ns, last_step_ns, steps,
                    directory_len, value_count, stalled_since_ns)


def read_header(buf: bytes) -> ShardHeader:
    if len(buf) < _HEAD.size:
        raise ShardFormatError(f"truncated: {len(buf)} bytes, header needs {_HEAD.size}")
    fields = _HEAD.unpack_from(buf, 0)
    if fields[0] != MAGIC:
        raise ShardFormatError("not an Outrider shard (bad magic)")
    header = ShardHeader(*fields[1:])
    if header.version > VERSION:
        raise ShardFormatError(f"format version {header.version} is newer than this agent's {VERSION}")
    if header.directory_len > DIRECTORY_BYTES or header.value_count > MAX_VALUES:
        raise ShardFormatError("corrupt: directory or data larger than the format allows")
    return header


def read_seq(buf: Any) -> int:
    return int(_SEQ.unpack_from(buf, SEQ_OFFSET)[0])


def decode(buf: bytes) -> ShardSnapshot:
    """Decode a consistent copy of a shard (the caller copied it under the seqlock)."""
    header = read_header(buf)
    if len(buf) < DATA_OFFSET + 8 * header.value_count:
        raise ShardFormatError(f"truncated: {len(buf)} bytes")
    try:
        directory = json.loads(bytes(buf[HEADER_BYTES:HEADER_BYTES + header.directory_len]) or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ShardFormatError(f"corrupt directory: {e}") from None
    if not isinstance(directory, dict):
        raise ShardFormatError("corrupt directory: not an object")
    values = struct.unpack_from(f"<{header.value_count}d", buf, DATA_OFFSET)
    snap = ShardSnapshot(header, dict(directory.get("meta") or {}))
    for entry in directory.get("series") or ():
        try:
            name, kind, labels, offset, bounds = entry
            width = len(bounds) + 2 if kind == "histogram" else 1
            if not (offset >= 0 and offset + width <= header.value_count):
                raise ValueError("offset outside the data area")
            snap.series.append((str(name), str(kind), {str(k): str(v) for k, v in labels.items()},
                                list(values[offset:offset + width]), tuple(float(b) for b in bounds)))
        except (TypeError, ValueError, AttributeError) as e:
            raise ShardFormatError(f"corrupt directory entry {entry!r}: {e}") from None
    return snap
