"""The shard format: round trip through the writer and the reader, and every way a shard can be bad."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from outrider.hook import shard
from outrider.hook.runtime import ShardWriter


def write_one(tmp_path: Path) -> ShardWriter:
    w = ShardWriter(str(tmp_path), 4242, 1_000)
    directory = json.dumps({"meta": {"rank": "3"}, "series": [
        ["outrider_train_steps_total", "counter", {}, 0, []],
        ["h_seconds", "histogram", {"model": "a"}, 1, [0.1, 1.0]],
    ]}).encode()
    w.write(directory, [7.0, 1.0, 2.0, 3.0, 4.5], flags=0, pid=4242, stalls=0, start_ns=1_000,
            heartbeat_ns=2_000, last_step_ns=1_500, steps=7, stalled_since_ns=0)
    return w


def test_round_trip(tmp_path: Path) -> None:
    w = write_one(tmp_path)
    data = Path(w.path).read_bytes()
    assert len(data) == shard.SHARD_BYTES
    snap = shard.decode(data)
    assert snap.header.steps == 7 and snap.header.pid == 4242 and snap.header.seq % 2 == 0
    assert snap.meta == {"rank": "3"}
    name, kind, labels, values, bounds = snap.series[1]
    assert (name, kind, labels, values, bounds) == ("h_seconds", "histogram", {"model": "a"}, [1.0, 2.0, 3.0, 4.5],
                                                    (0.1, 1.0))


def test_shard_is_private_to_the_user(tmp_path: Path) -> None:
    w = write_one(tmp_path)
    assert Path(w.path).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("damage", ["truncated", "magic", "newer", "directory", "offset", "lengths"])
def test_damaged_shards_raise_format_errors(tmp_path: Path, damage: str) -> None:
    data = bytearray(Path(write_one(tmp_path).path).read_bytes())
    if damage == "truncated":
        data = data[:40]
    elif damage == "magic":
        data[0:8] = b"NOTASHRD"
    elif damage == "newer":
        struct.pack_into("<I", data, 8, shard.VERSION + 1)
    elif damage == "directory":
        data[shard.HEADER_BYTES:shard.HEADER_BYTES + 5] = b"\xff{{{["
    elif damage == "offset":
        text = json.dumps({"meta": {}, "series": [["x", "counter", {}, 99999, []]]}).encode()
        data[shard.HEADER_BYTES:shard.HEADER_BYTES + len(text)] = text
        struct.pack_into("<I", data, 64, len(text))
    elif damage == "lengths":
        struct.pack_into("<I", data, 68, shard.MAX_VALUES + 1)
    with pytest.raises(shard.ShardFormatError):
        shard.decode(bytes(data))


def test_writer_refuses_more_than_the_format_holds(tmp_path: Path) -> None:
    w = ShardWriter(str(tmp_path), 1, 1)
    with pytest.raises(ValueError, match="shard full"):
        w.write(b"{}", [0.0] * (shard.MAX_VALUES + 1), flags=0, pid=1, stalls=0, start_ns=1, heartbeat_ns=1,
                last_step_ns=0, steps=0, stalled_since_ns=0)
