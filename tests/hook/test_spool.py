"""The spool contract (outrider/spool.py): the shard format round trip, every way a shard can be bad, and the
safety rules: private directories, no links followed, no file read that an untrusted user owns."""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path

import pytest

from outrider import spool

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="changing a file's owner needs root (CI runs as root)")
STRANGER = 54321  # a uid that is neither this user, root, nor trusted


def write_one(spool_dir: Path, pid: int = 4242, series: list[list[object]] | None = None,
              values: list[float] | None = None) -> spool.ShardWriter:
    w = spool.ShardWriter(str(spool_dir), pid, 1_000)
    directory = json.dumps({"meta": {"rank": "3"}, "series": series if series is not None else [
        ["outrider_train_steps_total", "counter", {}, 0, []],
        ["h_seconds", "histogram", {"model": "a"}, 1, [0.1, 1.0]],
    ]}).encode()
    w.write(directory, values if values is not None else [7.0, 1.0, 2.0, 3.0, 4.5], flags=0, pid=pid, stalls=0,
            start_ns=1_000, heartbeat_ns=2_000, last_step_ns=1_500, steps=7, stalled_since_ns=0)
    return w


def reader(spool_dir: Path, trusted: bool = True) -> spool.ShardReader:
    return spool.ShardReader(str(spool_dir), lambda uid, pid: trusted or uid == os.geteuid())


def test_round_trip_through_the_files(tmp_path: Path) -> None:
    w = write_one(tmp_path)
    assert os.path.getsize(w.path) == spool.SHARD_BYTES, "all blocks reserved up front"
    r = reader(tmp_path)
    assert r.paths() == [w.path]
    snap = r.read(w.path)
    assert snap is not None and snap.header.steps == 7 and snap.header.pid == 4242 and snap.header.seq % 2 == 0
    assert snap.meta == {"rank": "3"} and snap.uid == os.geteuid()
    assert snap.series[1] == ("h_seconds", "histogram", {"model": "a"}, [1.0, 2.0, 3.0, 4.5], (0.1, 1.0))
    assert spool.decode(Path(w.path).read_bytes()).series == snap.series


def test_shard_and_default_spool_are_private(tmp_path: Path) -> None:
    private = tmp_path / "spool"
    spool.prepare_dir(str(private), private=True)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    w = write_one(private)
    assert stat.S_IMODE(Path(w.path).stat().st_mode) == 0o600


@pytest.mark.parametrize("damage", ["truncated", "magic", "newer", "directory", "lengths", "meta_type",
                                    "series_type"])
def test_damaged_shards_raise_format_errors_with_their_reason(tmp_path: Path, damage: str) -> None:
    data = bytearray(Path(write_one(tmp_path).path).read_bytes())
    reason = "corrupt"
    if damage == "truncated":
        data, reason = data[:40], "truncated"
    elif damage == "magic":
        data[0:8] = b"NOTASHRD"
    elif damage == "newer":
        struct.pack_into("<I", data, 8, spool.VERSION + 1)
        reason = "newer_version"
    elif damage == "directory":
        data[spool.HEADER_BYTES:spool.HEADER_BYTES + 5] = b"\xff{{{["
    elif damage == "lengths":
        struct.pack_into("<I", data, 68, spool.MAX_VALUES + 1)
    else:
        doc = {"meta": [1, 2], "series": []} if damage == "meta_type" else {"meta": {}, "series": {"a": 1}}
        text = json.dumps(doc).encode()
        data[spool.HEADER_BYTES:spool.HEADER_BYTES + len(text)] = text
        struct.pack_into("<I", data, 64, len(text))
    with pytest.raises(spool.ShardFormatError) as e:
        spool.decode(bytes(data))
    assert e.value.reason == reason
    path = tmp_path / "outrider-1-1.shard"
    path.write_bytes(bytes(data))
    with pytest.raises(spool.ShardFormatError) as e:
        reader(tmp_path).read(str(path))
    assert e.value.reason == reason


@pytest.mark.parametrize(("entry", "values", "why"), [
    (["a metric", "counter", {}, 0, []], [1.0], "invalid metric name"),
    (["a-b", "counter", {}, 0, []], [1.0], "invalid metric name"),
    (["__name__", "counter", {}, 0, []], [1.0], "invalid metric name"),
    (["x_total", "counter", {"a-b": "v"}, 0, []], [1.0], "invalid or reserved label name"),
    (["x_total", "counter", {"__name__": "v"}, 0, []], [1.0], "invalid or reserved label name"),
    (["h", "histogram", {"le": "1"}, 0, [1.0]], [1.0, 0.0, 1.0], "invalid or reserved label name"),
    (["x_total", "counter", {"rank": "9"}, 0, []], [1.0], "invalid or reserved label name"),
    (["h", "histogram", {}, 0, [1.0]], [float("nan"), 0.0, 1.0], "NaN or infinite"),
    (["h", "histogram", {}, 0, [1.0]], [float("inf"), 0.0, 1.0], "NaN or infinite"),
    (["h", "histogram", {}, 0, [1.0]], [-1.0, 0.0, 1.0], "negative or fractional"),
    (["x_total", "counter", {}, 0, []], [-5.0], "a counter is negative"),
    (["x_total", "counter", {}, 99999, []], [1.0], "offset outside"),
    (["x_total", "counter", "labels", 0, []], [1.0], "labels are not an object"),
    (["x_total", "summary", {}, 0, []], [1.0], "unknown kind"),
    (["h", "histogram", {}, 0, [2.0, 1.0]], [0.0, 0.0, 0.0, 0.0], "not finite and increasing"),
    ("not a list", [1.0], "an entry is not"),
])
def test_a_bad_series_is_dropped_alone_and_the_rest_of_the_shard_is_read(tmp_path: Path, entry: object,
                                                                       values: list[float], why: str) -> None:
    good = ["good_total", "counter", {"k": "v"}, len(values), []]
    w = write_one(tmp_path, series=[entry, good], values=[*values, 3.0])  # type: ignore[list-item]
    snap = reader(tmp_path).read(w.path)
    assert snap is not None
    assert snap.series == [("good_total", "counter", {"k": "v"}, [3.0], ())]
    assert len(snap.rejected) == 1 and why in snap.rejected[0]


def test_a_label_value_that_is_not_utf8_drops_the_series(tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 1, 1)
    directory = b'{"meta":{},"series":[["x_total","counter",{"path":"caf\\udce9"},0,[]]]}'  # a lone surrogate
    w.write(directory, [1.0], flags=0, pid=1, stalls=0, start_ns=1, heartbeat_ns=1, last_step_ns=0, steps=0,
            stalled_since_ns=0)
    snap = reader(tmp_path).read(w.path)
    assert snap is not None and snap.series == [] and "not valid UTF-8" in snap.rejected[0]


def test_writer_refuses_more_than_the_format_holds(tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 1, 1)
    with pytest.raises(ValueError, match="shard full"):
        w.write(b"{}", [0.0] * (spool.MAX_VALUES + 1), flags=0, pid=1, stalls=0, start_ns=1, heartbeat_ns=1,
                last_step_ns=0, steps=0, stalled_since_ns=0)


def test_a_shard_truncated_under_the_reader_is_an_error_for_that_shard_only(tmp_path: Path) -> None:
    w = write_one(tmp_path)
    r = reader(tmp_path)
    assert r.read(w.path) is not None  # the reader now holds the file open
    os.truncate(w.path, 100)  # what once killed a mapping reader with SIGBUS
    with pytest.raises(spool.ShardTruncated):
        r.read(w.path)
    os.truncate(w.path, 0)
    with pytest.raises(spool.ShardTruncated):
        r.read(w.path)


def test_links_fifos_and_foreign_files_in_the_spool_are_never_followed_or_read(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    secret = Path(write_one(other).path)  # a valid shard, outside the spool
    sp = tmp_path / "spool"
    sp.mkdir()
    (sp / "outrider-1-1.shard").symlink_to(secret)
    os.mkfifo(sp / "outrider-2-2.shard")
    r = reader(sp)
    for path in r.paths():
        with pytest.raises(spool.ShardFormatError):
            r.read(path)  # returns at once: a FIFO is never opened for reading


@needs_root
def test_shards_and_stack_dumps_of_untrusted_owners_are_not_read(tmp_path: Path) -> None:
    w = write_one(tmp_path)
    os.chown(w.path, STRANGER, STRANGER)
    with pytest.raises(spool.ShardUntrusted):
        reader(tmp_path, trusted=False).read(w.path)
    w2 = write_one(tmp_path, pid=77)
    stacks = Path(spool.stacks_path(w2.path))
    stacks.write_text("planted")
    os.chown(stacks, STRANGER, STRANGER)
    assert reader(tmp_path).read_stacks(w2.path, os.geteuid()) is None, "a dump not of the shard's owner"


def test_a_stack_dump_planted_as_a_link_is_neither_followed_nor_overwritten(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("root-only contents")
    sp = tmp_path / "spool"
    sp.mkdir()
    w = write_one(sp)
    link = Path(spool.stacks_path(w.path))
    link.symlink_to(target)
    assert reader(sp).read_stacks(w.path, os.geteuid()) is None, "the agent does not follow it"
    w.write_stacks("# header\n", lambda fh: fh.write("stacks\n"))
    assert target.read_text() == "root-only contents", "the writer replaced the link, never wrote through it"
    assert not link.is_symlink() and "stacks" in link.read_text()


def test_a_planted_lock_link_is_not_followed(tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    sp.mkdir(mode=0o700)
    (sp / spool.LOCK_NAME).symlink_to(tmp_path / "created-by-the-agent")
    assert spool.try_lock(str(sp)) is None
    assert not (tmp_path / "created-by-the-agent").exists()


def test_the_private_spool_refuses_a_directory_someone_else_prepared(tmp_path: Path) -> None:
    open_dir = tmp_path / "world"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(spool.SpoolError, match="open to other users"):
        spool.prepare_dir(str(open_dir), private=True)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "private-target")
    (tmp_path / "private-target").mkdir(mode=0o700)
    with pytest.raises(spool.SpoolError, match="symbolic link"):
        spool.prepare_dir(str(link), private=True)
    with pytest.raises(spool.SpoolError, match="symbolic link"):
        spool.prepare_dir(str(link), private=False)


@needs_root
def test_a_configured_spool_may_be_a_shared_volume_but_not_a_strangers_directory(tmp_path: Path) -> None:
    empty_dir = tmp_path / "emptydir"  # what Kubernetes mounts: root's, mode 0777
    empty_dir.mkdir()
    empty_dir.chmod(0o777)
    assert spool.prepare_dir(str(empty_dir), private=False) == str(empty_dir)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, STRANGER, STRANGER)
    with pytest.raises(spool.SpoolError, match="not trusted"):
        spool.prepare_dir(str(theirs), private=False)
    assert spool.prepare_dir(str(theirs), private=False, trusted_uids=frozenset({STRANGER})) == str(theirs)
    with pytest.raises(spool.SpoolError, match="belongs to uid"):
        spool.prepare_dir(str(theirs), private=True)
