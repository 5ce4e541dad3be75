"""Every number docs/spool-format.md states for the spool, tested just below, at and just above it, so that a change
of any of them fails a test that names it: the first file's layout, the format's limits on a shard's layout, the
largest file the reader opens, label values, stack dumps, the reader's descriptors, how long a refused file stays
refused, the readers' marks, and the registry's caps of series per metric and per process."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from outrider.hook import settings as hook_settings
from outrider.hook.registry import Registry
from outrider.hook.series import NoopSeries
from outrider.shared import spool

KiB, MiB = 1 << 10, 1 << 20


def header_only(**layout: int) -> bytes:
    """A shard of a header and nothing else (no directory, no values), with the layout given."""
    return spool.pack_header(flags=0, seq=0, pid=1, stalls=0, start_ns=1, heartbeat_ns=1, last_step_ns=0, steps=0,
                             directory_len=layout.pop("directory_len", 0), value_count=layout.pop("value_count", 0),
                             stalled_since_ns=0, **layout)


def fits(**layout: int) -> bool:
    try:
        spool.read_header(header_only(**layout))
    except spool.ShardFormatError as e:
        assert e.reason == "corrupt", e
        return False
    return True


def test_the_first_file_is_a_60_kib_directory_and_24_ki_values_in_256_kib(tmp_path: Path) -> None:
    assert (60 * KiB, 24 * KiB, 256 * KiB) == (spool.DIRECTORY_BYTES, spool.MAX_VALUES, spool.SHARD_BYTES)
    assert spool.DATA_OFFSET == 65536
    w = spool.ShardWriter(str(tmp_path), 1, 1)
    header = dict(flags=0, pid=1, stalls=0, start_ns=1, heartbeat_ns=1, last_step_ns=0, steps=0, stalled_since_ns=0)
    full_directory = b" " * (60 * KiB - 2) + b"{}"
    w.write(full_directory, [1.0] * (24 * KiB), **header)  # both at their limit: written
    assert os.path.getsize(w.path) == 256 * KiB
    snap = spool.decode(Path(w.path).read_bytes())
    assert snap.header.directory_len == 60 * KiB and snap.header.value_count == 24 * KiB
    with pytest.raises(ValueError, match="shard full"):
        w.write(b" " + full_directory, [1.0], **header)
    with pytest.raises(ValueError, match="shard full"):
        w.write(b"{}", [1.0] * (24 * KiB + 1), **header)
    w.close()


def test_a_directory_capacity_of_32_mib_is_the_formats_limit() -> None:
    limit = 32 * MiB
    assert limit == spool.MAX_DIRECTORY_BYTES
    end = 4 * KiB + limit + 16 * MiB
    assert fits(directory_capacity=limit - 8, data_offset=4 * KiB + limit, shard_bytes=end)
    assert fits(directory_capacity=limit, data_offset=4 * KiB + limit, shard_bytes=end)
    assert not fits(directory_capacity=limit + 8, data_offset=4 * KiB + limit + 8, shard_bytes=end)


def test_the_data_starts_after_the_directory_on_a_multiple_of_8() -> None:
    capacity = 128 * KiB
    start = 4 * KiB + capacity
    assert not fits(directory_capacity=capacity, data_offset=start - 8, shard_bytes=1 * MiB)
    assert fits(directory_capacity=capacity, data_offset=start, shard_bytes=1 * MiB)
    assert not fits(directory_capacity=capacity, data_offset=start + 4, shard_bytes=1 * MiB)
    assert fits(directory_capacity=capacity, data_offset=start + 8, shard_bytes=1 * MiB)


def test_a_shard_is_at_most_4_kib_plus_48_mib() -> None:
    limit = 4 * KiB + 48 * MiB
    assert limit == spool.MAX_SHARD_BYTES
    layout = dict(directory_capacity=32 * MiB, data_offset=4 * KiB + 32 * MiB)
    assert fits(shard_bytes=limit - 8, **layout)
    assert fits(shard_bytes=limit, **layout)
    assert not fits(shard_bytes=limit + 8, **layout)
    assert not fits(shard_bytes=4 * KiB + 32 * MiB - 8, **layout), "the data may not start past the file's end"
    assert fits(shard_bytes=4 * KiB + 32 * MiB, **layout), "an empty data area"


def test_the_directory_and_values_must_fit_the_space_the_header_gives_them() -> None:
    layout = dict(directory_capacity=128 * KiB, data_offset=132 * KiB, shard_bytes=132 * KiB + 800)
    assert fits(directory_len=128 * KiB, value_count=100, **layout)
    assert not fits(directory_len=128 * KiB + 1, value_count=100, **layout)
    assert not fits(directory_len=0, value_count=101, **layout)


@pytest.mark.parametrize(("size", "refused"), [(4 * KiB + 48 * MiB, False), (4 * KiB + 48 * MiB + 1, True)])
def test_a_file_larger_than_the_largest_shard_is_never_opened(tmp_path: Path, size: int, refused: bool) -> None:
    w = spool.ShardWriter(str(tmp_path), 4242, 1)
    w.write(b'{"meta":{},"series":[]}', [1.0], flags=0, pid=4242, stalls=0, start_ns=1, heartbeat_ns=1,
            last_step_ns=0, steps=0, stalled_since_ns=0)
    w.close()
    os.truncate(w.path, size)  # sparse: no disk taken
    r = spool.ShardReader(str(tmp_path), lambda uid, pid: True)
    try:
        r.read(w.path)
        reason = ""
    except spool.ShardFormatError as e:
        reason = e.reason
    finally:
        r.close()
    assert (reason == "too_large") == refused, reason


@pytest.mark.parametrize(("value", "kept"), [("v" * 127, True), ("v" * 128, True), ("é" * 128, True),
                                             ("v" * 129, False)])
def test_a_label_value_is_at_most_128_characters(tmp_path: Path, value: str, kept: bool) -> None:
    assert spool.MAX_LABEL_VALUE == 128
    w = spool.ShardWriter(str(tmp_path), 1, 1)
    directory = json.dumps({"meta": {}, "series": [["x_total", "counter", {"path": value}, 0, []]]}).encode()
    w.write(directory, [1.0], flags=0, pid=1, stalls=0, start_ns=1, heartbeat_ns=1, last_step_ns=0, steps=0,
            stalled_since_ns=0)
    snap = spool.decode(Path(w.path).read_bytes())
    assert [s[2]["path"] for s in snap.series] == ([value] if kept else [])
    assert snap.rejected == ([] if kept else ["x_total: label path longer than 128 characters"])
    registry = Registry()
    series = registry.series("counter", "x_total", {"path": value})
    assert isinstance(series, NoopSeries) != kept, "the hook refuses what the reader would"
    assert registry.drop.counts == ({} if kept else {"invalid_label_value": 1})
    w.close()


# Names and labels at each edge of the rule (spool.name_refusal, label_refusal): the grammar's first and later
# characters, the names and labels Prometheus and the agent keep, and the hook's own refusals (colons, outrider_).
@pytest.mark.parametrize(("name", "labels"), [
    ("x", {}), ("_", {}), ("X_9", {}), ("9x", {}), ("x-y", {}), ("", {}), ("é", {}), ("x:y", {}), (":x", {}),
    ("_x", {}), ("__x", {}), ("__name__", {}), ("up", {}), ("up_total", {}), ("ALERTS", {}), ("alerts", {}),
    ("scrape_series_added", {}), ("outrider_x", {}),
    ("x", {"_": "v"}), ("x", {"a9": ""}), ("x", {"9a": "v"}), ("x", {"a:b": "v"}), ("x", {"_a": "v"}),
    ("x", {"__a": "v"}), ("x", {"rank": "0"}), ("x", {"ranks": "0"}), ("x", {"training_job": "j"}),
    ("x", {"le": "1"}), ("x", {"quantile": "0.5"}), ("x", {"Le": "1"}), ("x", {"a": "é" * 128}),
    ("x", {"a": "v" * 129}), ("x", {"a": "caf\udce9"}), ("x", {"a": "v", "b": "w" * 129}),
])
def test_a_series_the_hook_registers_is_one_the_reader_keeps(tmp_path: Path, name: str,
                                                               labels: dict[str, str]) -> None:
    registered = not isinstance(Registry().series("gauge", name, labels), NoopSeries)
    entry = json.dumps({"meta": {}, "series": [[name, "gauge", labels, 0, []]]}).encode()
    w = spool.ShardWriter(str(tmp_path), 1, 1)
    w.write(entry, [1.0], flags=0, pid=1, stalls=0, start_ns=1, heartbeat_ns=1, last_step_ns=0, steps=0,
            stalled_since_ns=0)
    kept = bool(spool.decode(Path(w.path).read_bytes()).series)
    w.close()
    assert kept or not registered, "the hook wrote what the reader drops"
    # the hook refuses more than the reader only by its own rules: colons, and the agent's outrider_ names
    assert registered or not kept or ":" in name or name.startswith("outrider_")


@pytest.mark.parametrize("size", [1 * MiB - 1, 1 * MiB, 1 * MiB + 1])
def test_a_stack_dump_is_read_up_to_1_mib(tmp_path: Path, size: int) -> None:
    assert 1 * MiB == spool.STACKS_MAX_BYTES
    w = spool.ShardWriter(str(tmp_path), 1, 1)
    Path(spool.stacks_path(w.path)).write_bytes(b"s" * size)
    r = spool.ShardReader(str(tmp_path), lambda uid, pid: True)
    text = r.read_stacks(w.path, os.geteuid())
    assert text is not None and len(text) == min(size, 1 * MiB)
    w.close()


@pytest.mark.parametrize(("soft", "budget"), [(4092, 1023), (4096, 1024), (4100, 1024), (8192, 1024),
                                              (36, 9), (32, 8), (28, 8)])
def test_the_reader_keeps_a_quarter_of_the_descriptor_limit_open_at_most_1024_at_least_8(soft: int,
                                                                                           budget: int) -> None:
    assert spool.MAX_OPEN_SHARDS == 1024
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    if before[1] != resource.RLIM_INFINITY and before[1] < soft:
        pytest.skip(f"the hard descriptor limit is {before[1]}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        got = spool.open_budget()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
    assert got == budget


class Clock:
    """spool's view of time: the real module but for a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def module(self) -> SimpleNamespace:
        real = {n: getattr(time, n) for n in dir(time) if not n.startswith("_")}
        return SimpleNamespace(**{**real, "monotonic": lambda: self.now})


def test_a_refused_file_is_looked_at_again_after_a_minute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert spool.RECHECK_S == 60.0
    clock = Clock()
    monkeypatch.setattr(spool, "time", clock.module())
    junk = tmp_path / "outrider-1-1.shard"
    junk.write_bytes(b"garbage" * 1000)
    r = spool.ShardReader(str(tmp_path), lambda uid, pid: True)
    opened: list[str] = []
    real_open = os.open

    def watching(p: str, *a: object, **kw: object) -> int:
        opened.append(p)
        return real_open(p, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", watching)
    with pytest.raises(spool.ShardFormatError):
        r.read(str(junk))
    assert opened == [str(junk)]
    clock.now += 59.9
    with pytest.raises(spool.ShardRejected):
        r.read(str(junk))
    assert opened == [str(junk)], "59.9 s later: refused without being opened"
    clock.now += 0.1
    with pytest.raises(spool.ShardRejected, match="still refused"):
        r.read(str(junk))
    assert opened == [str(junk)] * 2, "60 s later: opened again (and, refused alike, still counted once)"
    assert r.rejected() == {"corrupt": 1}
    r.close()


@pytest.mark.parametrize(("held", "counted"), [(63, 63), (64, 64), (65, 64)])
def test_at_most_64_reader_marks_count(tmp_path: Path, held: int, counted: int) -> None:
    assert spool.MAX_READERS == 64
    marks = [spool.ReaderMark(str(tmp_path)) for _ in range(held)]
    try:
        assert len(spool.live_readers(str(tmp_path))) == counted
    finally:
        for m in marks:
            m.close()


def test_a_metric_has_at_most_100_label_sets_and_a_process_2000_series() -> None:
    """The registry's caps with the hook's defaults (hook_max_series_per_metric 100; 2,000 series a process)."""
    assert hook_settings.HookSettings().hook_max_series_per_metric == 100
    r = Registry(hook_settings.HookSettings().hook_max_series_per_metric)
    first = [r.series("counter", "m0_total", {"k": str(i)}) for i in range(100)]
    assert not any(isinstance(s, NoopSeries) for s in first) and r.drop.counts == {}, "100 label sets: all kept"
    assert isinstance(r.series("counter", "m0_total", {"k": "100"}), NoopSeries)
    assert r.drop.counts == {"series_limit_per_metric": 1}, "the 101st refused, counted"
    for m in range(1, 19):
        for i in range(100):
            assert not isinstance(r.series("counter", f"m{m}_total", {"k": str(i)}), NoopSeries)
    rest = [r.series("counter", "m19_total", {"k": str(i)}) for i in range(99)]
    assert not any(isinstance(s, NoopSeries) for s in rest), "1,999 series"
    assert not isinstance(r.series("counter", "m19_total", {"k": "99"}), NoopSeries), "the 2,000th kept"
    assert isinstance(r.series("counter", "m20_total", {"k": "0"}), NoopSeries), "the 2,001st refused"
    assert r.drop.counts == {"series_limit_per_metric": 1, "series_limit": 1}
    assert not isinstance(r.builtin_counter("outrider_hook_dropped_total", {"reason": "x"}), NoopSeries), \
        "the hook's own counters are outside the caps"
