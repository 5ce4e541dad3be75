"""The outbox's one bound holds in memory and on disk alike: past it the oldest notification goes, its file with it,
counted; a restart re-sends nothing that was reported dropped; a corrupt file is dropped and counted, once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from outrider.metrics.exposition import render
from outrider.notify.outbox import MAX_BYTES, MAX_ENTRIES, Outbox
from tests.helpers import free_port
from tests.notify.test_delivery import alert, dispatcher


def names(box: Outbox) -> list[str]:
    return [n.alertname for n in box.peek(1_000_000)]


def files(directory: Path) -> list[str]:
    return sorted(f for f in os.listdir(directory) if f.endswith(".json"))


@pytest.mark.parametrize("extra", [0, 1, 3])
def test_the_count_bound_drops_the_oldest_and_its_file(tmp_path: Path, extra: int) -> None:
    box = Outbox(str(tmp_path / "box"), max_entries=5)
    for i in range(5 + extra):
        box.put(alert(f"A{i}", "firing", n=i))
    assert names(box) == [f"A{i}" for i in range(extra, 5 + extra)], "the newest five are kept, in order"
    assert len(files(tmp_path / "box")) == 5, "the disk holds what memory holds, no more"
    assert box.dropped.get("full", 0) == extra


def test_a_restart_re_sends_nothing_that_was_dropped(tmp_path: Path) -> None:
    box = Outbox(str(tmp_path / "box"), max_entries=3)
    for i in range(10):
        box.put(alert(f"A{i}", "firing", n=i))
    assert box.dropped == {"full": 7}
    restored = Outbox(str(tmp_path / "box"), max_entries=3)
    assert names(restored) == ["A7", "A8", "A9"] and restored.dropped == {}


def test_the_byte_bound_holds_too(tmp_path: Path) -> None:
    one = len(json.dumps(alert("A0", "firing").to_json(), separators=(",", ":")).encode())
    box = Outbox(str(tmp_path / "box"), max_bytes=3 * one + one // 2)  # room for three, not four
    for i in range(6):
        box.put(alert(f"A{i}", "firing", n=i))
    assert names(box) == ["A3", "A4", "A5"] and box.dropped == {"full": 3}
    assert sum(os.path.getsize(tmp_path / "box" / f) for f in files(tmp_path / "box")) <= 3 * one + one // 2


def test_a_smaller_bound_at_start_drops_the_oldest_files(tmp_path: Path) -> None:
    box = Outbox(str(tmp_path / "box"), max_entries=10)
    for i in range(10):
        box.put(alert(f"A{i}", "firing", n=i))
    smaller = Outbox(str(tmp_path / "box"), max_entries=4)
    assert names(smaller) == ["A6", "A7", "A8", "A9"] and smaller.dropped == {"full": 6}
    assert len(files(tmp_path / "box")) == 4


def test_a_corrupt_file_is_dropped_and_counted_once(tmp_path: Path) -> None:
    box = Outbox(str(tmp_path / "box"))
    box.put(alert("A0", "firing"))
    (tmp_path / "box" / f"{99:020d}.json").write_text("{not json")
    first = Outbox(str(tmp_path / "box"))
    assert names(first) == ["A0"] and first.dropped == {"unreadable": 1}
    second = Outbox(str(tmp_path / "box"))
    assert second.dropped == {}, "not found again at the next start"


def test_the_defaults_are_the_documented_bounds() -> None:
    assert (MAX_ENTRIES, MAX_BYTES) == (10_000, 16 << 20)


def test_drops_reach_the_agents_metrics(tmp_path: Path) -> None:
    d = dispatcher(tmp_path, [{"name": "hook", "type": "webhook", "url": f"http://127.0.0.1:{free_port()}/"}])
    try:
        d.deliveries[0].outbox.max_entries = 2
        for i in range(5):
            d.notify(alert(f"A{i}", "firing", n=i))
    finally:
        d.stop()
    text = render(d.families()).decode()
    assert 'outrider_notify_dropped_total{receiver="hook",type="webhook",reason="full"} 3' in text
