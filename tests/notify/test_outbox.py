"""The outbox's promises one by one, on a real directory: order, what is on disk and how (0600 files named by
sequence, no .tmp left), what acknowledging removes, what a restart finds, the byte accounting behind the byte bound,
ages, and the memory-only queue of a receiver without a directory."""

from __future__ import annotations

import json
import logging
import os
import stat
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest

from outrider.notify.base import Notification
from outrider.notify.outbox import MAX_BYTES, MAX_ENTRIES, Outbox
from tests.notify.test_delivery import alert


def names(box: Outbox, n: int = 1_000) -> list[str]:
    return [x.alertname for x in box.peek(n)]


def on_disk(d: Path) -> list[str]:
    return sorted(os.listdir(d))


def fixed(i: int) -> Notification:
    """An alert of a known size: its creation time fixed (written with as many digits as it has)."""
    return replace(alert(f"A{i}", "firing", n=i), created=1_700_000_000.25)


def size(i: int) -> int:
    return len(json.dumps(fixed(i).to_json(), separators=(",", ":")).encode())


def disk_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.name.endswith(".json") and f.name[:-5].isdigit())


def filled(d: Path, n: int) -> Outbox:
    box = Outbox(str(d))
    for i in range(n):
        box.put(alert(f"A{i}", "firing", n=i))
    return box


def test_notifications_queue_in_order_as_0600_files_named_by_sequence(tmp_path: Path) -> None:
    d = tmp_path / "box"
    box = filled(d, 3)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert names(box) == ["A0", "A1", "A2"] and len(box) == 3
    assert on_disk(d) == [f"{i:020d}.json" for i in (1, 2, 3)], "no .tmp left behind"
    for f in d.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    first = json.loads((d / f"{1:020d}.json").read_bytes())
    assert first == alert("A0", "firing", n=0).to_json() | {"created": first["created"]}
    assert names(box, 2) == ["A0", "A1"] and names(box, 0) == []
    assert box.write_errors == 0 and box.dropped == {} and box.in_memory_only() == 0


def test_ack_removes_the_oldest_and_their_files_and_no_more(tmp_path: Path) -> None:
    d = tmp_path / "box"
    box = filled(d, 4)
    box.ack(2)
    assert names(box) == ["A2", "A3"] and on_disk(d) == [f"{i:020d}.json" for i in (3, 4)]
    assert box._bytes == disk_bytes(d) > 0, "the byte count follows what is queued"
    box.ack(5)  # more than queued: empties it
    assert len(box) == 0 and on_disk(d) == [] and box._bytes == 0
    box.ack(1)
    assert len(box) == 0


def test_a_restart_finds_the_queue_in_order_and_numbers_on_after_it(tmp_path: Path) -> None:
    d = tmp_path / "box"
    box = filled(d, 3)
    box.ack(1)
    (d / "00000000000000000009.json.tmp").write_text("half a write")  # a crash mid-write
    (d / "notes.txt").write_text("not the outbox's")
    (d / "x1.json").write_text("{}")  # not a sequence number
    again = Outbox(str(d))
    assert names(again) == ["A1", "A2"] and again.dropped == {}
    assert again._bytes == disk_bytes(d)
    assert not (d / "00000000000000000009.json.tmp").exists(), "an unfinished write is removed"
    assert (d / "notes.txt").exists() and (d / "x1.json").exists(), "what is not the outbox's is left alone"
    again.put(alert("A3", "firing", n=3))
    assert f"{4:020d}.json" in on_disk(d), "numbering goes on after the highest found"
    assert names(Outbox(str(d))) == ["A1", "A2", "A3"]


def test_an_unreadable_file_is_dropped_counted_logged_and_removed(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "box"
    box = Outbox(str(d))
    box.put(alert("A0", "firing"))
    (d / f"{2:020d}.json").write_text("{not json")
    (d / f"{3:020d}.json").write_text('{"id": "x"}')  # JSON, but no notification
    with caplog.at_level(logging.WARNING, logger="outrider.notify"):
        again = Outbox(str(d))
    assert names(again) == ["A0"] and again.dropped == {"unreadable": 2}
    assert on_disk(d) == [f"{1:020d}.json"]
    assert sum("skipping unreadable" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_a_file_larger_than_the_byte_bound_is_unreadable(tmp_path: Path, extra: int) -> None:
    d = tmp_path / "box"
    box = Outbox(str(d))
    box.put(fixed(0))
    bound = size(0) + extra
    again = Outbox(str(d), max_bytes=bound)
    if extra >= 0:
        assert names(again) == ["A0"] and again.dropped == {}, "a file of exactly the bound is read"
    else:
        assert names(again) == [] and again.dropped == {"unreadable": 1}


def test_a_file_past_the_byte_bound_is_named_so_in_the_warning(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "box"
    Outbox(str(d)).put(fixed(0))
    with caplog.at_level(logging.WARNING, logger="outrider.notify"):
        Outbox(str(d), max_bytes=size(0) - 1)
    assert [r.getMessage() for r in caplog.records] == [
        f"outbox {d}: skipping unreadable {1:020d}.json: larger than the outbox's bound"]


def test_the_byte_bound_counts_bytes_not_characters(tmp_path: Path) -> None:
    """A queued file is bounded by its bytes on disk: one with non-ASCII text (the outbox writes ASCII escapes, a
    hand-edited or foreign file may not) is larger than its count of characters."""
    d = tmp_path / "box"
    d.mkdir()
    n = replace(fixed(0), annotations={"summary": "Überlast auf Knoten 1 — prüfen"})
    body = json.dumps(n.to_json(), ensure_ascii=False).encode()
    (d / f"{1:020d}.json").write_bytes(body)
    characters = len(body.decode())
    assert characters < len(body)
    again = Outbox(str(d), max_bytes=len(body))
    assert names(again) == ["A0"] and again._bytes == len(body), "at the bound in bytes: read, its bytes counted"
    refused = Outbox(str(d), max_bytes=characters)
    assert names(refused) == [] and refused.dropped == {"unreadable": 1}, "within it in characters, not in bytes"


def test_a_huge_file_in_the_queue_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    """Memory stays bounded by max_bytes whatever lies in the directory: a 256 MiB file is refused after reading
    one byte past the bound."""
    d = tmp_path / "box"
    d.mkdir()
    with open(d / f"{1:020d}.json", "wb") as fh:
        fh.truncate(256 << 20)  # sparse: no disk taken
    tracemalloc.start()
    try:
        box = Outbox(str(d), max_bytes=64 << 10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert box.dropped == {"unreadable": 1} and on_disk(d) == []
    assert peak < 16 << 20, f"loading took {peak} bytes"


def test_a_directory_where_a_queued_file_would_be_is_skipped_and_the_rest_loads(tmp_path: Path) -> None:
    d = tmp_path / "box"
    filled(d, 2)
    (d / f"{0:020d}.json").mkdir()  # cannot be read, cannot be unlinked
    box = Outbox(str(d))
    assert names(box) == ["A0", "A1"] and box.dropped == {"unreadable": 1}
    assert (d / f"{0:020d}.json").is_dir(), "left where it is: the outbox removes files only"


def test_the_byte_bound_keeps_the_newest_within_it_and_warns_once(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    one = size(0)
    with caplog.at_level(logging.WARNING, logger="outrider.notify"):
        assert size(1) == one
        box = Outbox(str(tmp_path / "box"), max_bytes=2 * one)
        for i in range(2):
            box.put(fixed(i))
        assert names(box) == ["A0", "A1"] and box.dropped == {}, "at the bound: nothing dropped"
        for i in range(2, 5):
            box.put(fixed(i))
    assert names(box) == ["A3", "A4"] and box.dropped == {"full": 3}
    assert box._bytes == disk_bytes(tmp_path / "box")
    assert sum("is full" in r.getMessage() for r in caplog.records) == 1


def test_one_notification_larger_than_the_byte_bound_is_still_kept(tmp_path: Path) -> None:
    box = Outbox(str(tmp_path / "box"), max_bytes=10)
    box.put(alert("A0", "firing"))
    assert names(box) == ["A0"], "the newest is always kept, whatever its size"
    box.put(alert("A1", "firing"))
    assert names(box) == ["A1"] and box.dropped == {"full": 1}


def test_bounds_below_one_mean_one(tmp_path: Path) -> None:
    box = Outbox(None, max_entries=0, max_bytes=0)
    assert (box.max_entries, box.max_bytes) == (1, 1)
    box.put(alert("A0", "firing"))
    box.put(alert("A1", "firing"))
    assert names(box) == ["A1"]
    assert (Outbox(None, max_entries=1, max_bytes=1).max_entries, Outbox(None, max_entries=2).max_entries) == (1, 2)
    assert Outbox(None, max_bytes=2).max_bytes == 2
    assert (Outbox(None).max_entries, Outbox(None).max_bytes) == (MAX_ENTRIES, MAX_BYTES)


def test_a_memory_only_outbox_queues_and_bounds_without_a_disk(tmp_path: Path) -> None:
    box = Outbox(None, max_entries=2)
    for i in range(3):
        box.put(alert(f"A{i}", "firing", n=i))
    assert names(box) == ["A1", "A2"] and box.dropped == {"full": 1}
    assert box.in_memory_only() == 0, "nothing is waiting for a disk it does not have"
    box.persist_pending()
    assert box.write_errors == 0
    box.ack(1)
    assert names(box) == ["A2"]


def test_the_oldest_age_is_that_of_the_first_queued() -> None:
    box = Outbox(None)
    assert box.oldest_age_s() == 0.0
    old = replace(alert("A0", "firing"), created=time.time() - 100.0)
    box.put(old)
    box.put(alert("A1", "firing"))
    assert 99.0 <= box.oldest_age_s() <= 200.0
    future = replace(alert("A2", "firing"), created=time.time() + 1000.0)
    ahead = Outbox(None)
    ahead.put(future)
    assert ahead.oldest_age_s() == 0.0, "a clock step back reads as no age, not a negative one"


def test_a_full_disk_holds_the_rest_in_memory_in_order_and_writes_them_out_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "box"
    box = Outbox(str(d))
    box.put(alert("A0", "firing"))
    real_write = os.write
    refusals = []

    def full(fd: int, data: bytes) -> int:
        refusals.append(fd)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    box.put(alert("A1", "firing"))
    monkeypatch.setattr(os, "write", real_write)
    # A1 is still in memory: A2 must not be written before it (the disk would hold a gap in the order)
    box.put(alert("A2", "firing"))
    assert box.write_errors == 2 and box.in_memory_only() == 2 and len(refusals) == 1
    assert on_disk(d) == [f"{1:020d}.json"], "no .tmp of the refused write is left"
    box.persist_pending()
    assert box.in_memory_only() == 0
    assert on_disk(d) == [f"{i:020d}.json" for i in (1, 2, 3)]
    assert names(Outbox(str(d))) == ["A0", "A1", "A2"]
    # a write refused while persisting stops there: what follows waits its turn
    box.ack(3)
    monkeypatch.setattr(os, "write", full)
    box.put(alert("B0", "firing"))
    box.put(alert("B1", "firing"))
    box.persist_pending()
    assert box.in_memory_only() == 2 and on_disk(d) == []


def test_each_warning_says_what_happened_and_where_it_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "box"
    filled(d, 1)
    (d / "2.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="outrider.notify"):
        box = Outbox(str(d), max_entries=1)
        box.put(alert("A1", "firing"))
        Outbox(None, max_entries=1, max_bytes=7).put(alert("A2", "firing"))
        Outbox(None, max_entries=1, max_bytes=7).put(alert("A3", "firing"))

        def full(fd: int, data: bytes) -> int:
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(os, "write", full)
        box.put(alert("A4", "firing"))
    messages = [r.getMessage() for r in caplog.records]
    try:
        json.loads("{not json")
    except ValueError as e:
        why = str(e)
    assert messages[0] == f"outbox {d}: skipping unreadable 2.json: {why}", "it says why"
    assert messages[1] == (f"outbox {d} is full (1 notifications, {MAX_BYTES} bytes at most): dropping the oldest "
                           "(counted in outrider_notify_dropped_total)")
    assert len(messages) == 3, "a memory-only outbox's single entry is never dropped, so it never warns"
    assert messages[2] == (f"outbox {d}: cannot write a notification (No space left on device): holding it in memory "
                           "until the disk takes it (counted in outrider_notify_outbox_write_errors_total)")
    memory = Outbox(None, max_entries=1)
    with caplog.at_level(logging.WARNING, logger="outrider.notify"):
        memory.put(alert("B0", "firing"))
        memory.put(alert("B1", "firing"))
    assert caplog.records[-1].getMessage().startswith("outbox (memory) is full (1 notifications")


def test_only_sequence_numbered_json_files_are_read_whatever_sorts_first(tmp_path: Path) -> None:
    d = tmp_path / "box"
    filled(d, 1)
    body = (d / f"{1:020d}.json").read_bytes()
    (d / f"{0:020d}.json.tmp").write_text("half a write")  # sorts before every queued file
    (d / "000.txt").write_text("not the outbox's")  # so does this
    (d / "12345x.json").write_bytes(body)  # digits, then not
    (d / "7.json").write_bytes(body)  # a short sequence number is one all the same
    box = Outbox(str(d))
    assert [e.seq for e in box._entries] == [1, 7]
    assert not (d / f"{0:020d}.json.tmp").exists() and (d / "000.txt").exists() and (d / "12345x.json").exists()


def test_a_file_removed_behind_the_outbox_is_no_error(tmp_path: Path) -> None:
    d = tmp_path / "box"
    box = Outbox(str(d), max_entries=2)
    box.put(alert("A0", "firing"))
    box.put(alert("A1", "firing"))
    for f in d.iterdir():
        f.unlink()
    box.put(alert("A2", "firing"))  # drops A0, whose file is gone
    box.ack(1)  # acknowledges A1, whose file is gone
    assert names(box) == ["A2"]


def test_every_refused_write_is_counted_and_what_is_written_later_is_what_was_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "box"
    box = Outbox(str(d))
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    for i in range(2):  # refused, written out, refused again: two refusals of a write actually tried
        monkeypatch.setattr(os, "write", full)
        box.put(alert(f"A{i}", "firing", n=i))
        monkeypatch.setattr(os, "write", real_write)
        box.persist_pending()
    assert box.write_errors == 2 and box.in_memory_only() == 0
    assert box._bytes == disk_bytes(d), "written out in the same compact form as counted"


def test_a_refused_write_whose_temporary_file_is_already_gone_is_held_in_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cleaning up after a refused write finds nothing to remove (another process's sweep of the directory took the
    temporary file): the notification is held in memory all the same, nothing raised into the caller."""
    d = tmp_path / "box"
    box = Outbox(str(d))

    def full_and_swept(fd: int, data: bytes) -> int:
        for f in d.iterdir():
            f.unlink()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full_and_swept)
    box.put(alert("A0", "firing"))
    assert names(box) == ["A0"] and box.write_errors == 1 and box.in_memory_only() == 1
