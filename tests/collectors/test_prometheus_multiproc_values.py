"""collectors/prometheus_multiproc in process, value by value: multiprocess directories written by prometheus_client
itself (its metrics, each "worker" a process identifier of its own, and its MmapedDict for what a test must place
exactly: a timestamp, an older client's key), merged by the collector and compared with prometheus_client's own
MultiProcessCollector; then each file and entry that is refused, by its reason and text, the gauge modes one by one,
the caps as the files are read, and the reader's bounds at their edges."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, values
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from outrider.collectors import prometheus_multiproc
from outrider.collectors.base import CollectorContext
from outrider.collectors.prometheus_multiproc import (
    GAUGE_MODES,
    MAX_FILES,
    MAX_KEY_BYTES,
    READ_CHUNK,
    PrometheusMultiprocCollector,
    _kind_of,
    _Merged,
    read_entries,
    read_file,
)
from outrider.ground.config import Config
from outrider.metrics.exposition import render
from outrider.metrics.foreign import MAX_SERIES
from outrider.wiring.sampler import SweepStats
from tests.helpers import record_drops

Key = tuple[str, tuple[tuple[str, str], ...]]


class Workers:
    """prometheus_client in multiprocess mode over `directory`, a worker at a time: each `worker(pid)` is a
    registry whose metrics write `<type>_<pid>.db` files as that process's would."""

    def __init__(self, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.directory = directory
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
        self._monkeypatch = monkeypatch

    def worker(self, pid: int) -> CollectorRegistry:
        values.close_all_multiprocess_files()
        self._monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda: pid))
        return CollectorRegistry()

    def done(self) -> None:
        values.close_all_multiprocess_files()


@pytest.fixture
def workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workers]:
    directory = tmp_path / "multiproc"
    directory.mkdir()
    w = Workers(directory, monkeypatch)
    try:
        yield w
    finally:
        w.done()


class Collector:
    """The collector over a directory, each drop it makes kept (key, text) as well as counted."""

    def __init__(self, directory: Path | str, per_metric: int = 100, proc_root: str = "/proc") -> None:
        self.c = PrometheusMultiprocCollector(CollectorContext(
            Config(prometheus_multiproc_dir=str(directory), hook_max_series_per_metric=per_metric,
                   proc_root=proc_root), SweepStats()))
        self.drops = record_drops(self.c)

    def samples(self) -> dict[Key, float]:
        return parsed(render(self.c.collect()).decode())

    def families(self) -> dict[str, list[tuple[tuple[str, ...], Any]]]:
        return {f.defn.name: f.samples for f in self.c.collect()}


def parsed(text: str) -> dict[Key, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def oracle(directory: Path) -> dict[Key, float]:
    """prometheus_client's own merge, less what the agent does not export (created stamps, summaries)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in registry.collect() if fam.type != "summary"
            for s in fam.samples if not s.name.endswith("_created")}


def entry(key: str | bytes, value: float, stamp: float = 0.0) -> bytes:
    raw = key.encode() if isinstance(key, str) else key
    return len(raw).to_bytes(4, "little") + raw + b" " * (8 - (len(raw) + 4) % 8) + struct.pack("<dd", value, stamp)


def file_of(*entries: bytes, used: int | None = None, tail: bytes = b"") -> bytes:
    body = b"".join(entries)
    return (8 + len(body) if used is None else used).to_bytes(4, "little") + b"\0" * 4 + body + tail


def place(path: Path, entries: list[tuple[str, float, float]]) -> None:
    """Entries written by prometheus_client's MmapedDict, timestamps and keys as the test gives them."""
    d = MmapedDict(str(path))
    try:
        for key, value, stamp in entries:
            d.write_value(key, value, stamp)
    finally:
        d.close()


def key(family: str, sample: str, labels: dict[str, str] | None = None, help_text: str = "h") -> str:
    labels = labels or {}
    return mmap_key(family, sample, tuple(labels), tuple(labels.values()), help_text)


# --- merged as prometheus_client merges ---------------------------------------------------------------------------

def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Each os.pread from now on, as (offset, length), in order; each still reads."""
    reads: list[tuple[int, int]] = []
    pread = os.pread

    def counted(fd: int, n: int, at: int) -> bytes:
        reads.append((at, n))
        return pread(fd, n, at)

    monkeypatch.setattr(os, "pread", counted)
    return reads


def test_three_workers_merged_as_prometheus_client_merges_them(workers: Workers) -> None:
    for pid, n in ((101, 3), (102, 5), (103, 0)):
        r = workers.worker(pid)
        requests = Counter("shop_requests", "Requests served.", ["route"], registry=r)
        latency = Histogram("shop_latency_seconds", "Request latency.", ["route"], buckets=(0.01, 0.1, 1.0),
                            registry=r)
        started = Gauge("shop_worker_started", "Start of each worker.", multiprocess_mode="all", registry=r)
        in_flight = Gauge("shop_in_flight", "In flight.", multiprocess_mode="sum", registry=r)
        lowest = Gauge("shop_free_bytes", "Free bytes.", ["pool"], multiprocess_mode="min", registry=r)
        highest = Gauge("shop_queue_depth", "Queue depth.", multiprocess_mode="max", registry=r)
        Summary("shop_body_bytes", "Request bodies.", registry=r).observe(100)
        started.set(pid * 10)
        in_flight.set(n)
        lowest.labels("a").set(1000 - n)
        highest.set(n * 2)
        for i in range(n):
            route = "/pay" if i % 2 else "/cart"
            requests.labels(route).inc()
            latency.labels(route).observe(0.05 * i)
    workers.done()
    c = Collector(workers.directory)
    got = c.samples()
    want = oracle(workers.directory)
    assert got == want
    assert got[("shop_requests_total", (("route", "/cart"),))] == 5
    assert got[("shop_latency_seconds_bucket", (("le", "0.1"), ("route", "/cart")))] == 4
    assert got[("shop_latency_seconds_sum", (("route", "/pay"),))] == pytest.approx(0.05 * (1 + 1 + 3))
    assert {v for (name, _), v in got.items() if name == "shop_worker_started"} == {1010, 1020, 1030}
    assert got[("shop_worker_started", (("pid", "102"),))] == 1020
    assert got[("shop_in_flight", ())] == 8
    assert got[("shop_free_bytes", (("pool", "a"),))] == 995
    assert got[("shop_queue_depth", ())] == 10
    assert c.drops == [("summary", "summary_101.db: summaries carry no quantiles in multiprocess mode; left out"),
                       ("summary", "summary_102.db: summaries carry no quantiles in multiprocess mode; left out"),
                       ("summary", "summary_103.db: summaries carry no quantiles in multiprocess mode; left out")]


def test_live_gauges_count_live_workers_only(workers: Workers, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "201").mkdir(parents=True)  # alive; 202 is not
    for pid in (201, 202):
        r = workers.worker(pid)
        Gauge("shop_live_all", "h", multiprocess_mode="liveall", registry=r).set(pid)
        Gauge("shop_live_sum", "h", multiprocess_mode="livesum", registry=r).set(3)
        Gauge("shop_live_recent", "h", multiprocess_mode="livemostrecent", registry=r).set(pid)
        Gauge("shop_all", "h", multiprocess_mode="all", registry=r).set(pid)
        Counter("shop_done", "h", registry=r).inc(2)
    workers.done()
    got = Collector(workers.directory, proc_root=str(proc)).samples()
    assert got == {("shop_live_all", (("pid", "201"),)): 201, ("shop_live_sum", ()): 3, ("shop_live_recent", ()): 201,
                   ("shop_all", (("pid", "201"),)): 201, ("shop_all", (("pid", "202"),)): 202,
                   ("shop_done_total", ()): 4}, "a dead worker's counts and its `all` gauge still count"


def test_liveness_is_asked_once_per_pid_a_sweep(workers: Workers, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "301").mkdir(parents=True)
    r = workers.worker(301)
    Gauge("a", "h", multiprocess_mode="liveall", registry=r).set(1)
    Gauge("b", "h", multiprocess_mode="livesum", registry=r).set(2)
    workers.done()
    c = Collector(workers.directory, proc_root=str(proc))
    asked: list[int] = []
    alive = c.c._alive

    def counted(pid: int) -> bool:
        asked.append(pid)
        return alive(pid)

    c.c._alive = counted  # type: ignore[method-assign]
    assert c.samples() == {("a", (("pid", "301"),)): 1, ("b", ()): 2}
    assert asked == [301]
    (proc / "301").rmdir()
    assert c.samples() == {}, "asked again the next sweep: gone"


def test_most_recent_takes_the_latest_stamp_and_a_tie_the_later_file(tmp_path: Path) -> None:
    g = key("temp", "temp")
    place(tmp_path / "gauge_mostrecent_1.db", [(g, 10.0, 500.0), (key("tie", "tie"), 1.0, 7.0)])
    place(tmp_path / "gauge_mostrecent_2.db", [(g, 20.0, 400.0), (key("tie", "tie"), 2.0, 7.0)])
    place(tmp_path / "gauge_mostrecent_3.db", [(g, 30.0, 450.0)])
    c = Collector(tmp_path)
    assert c.samples() == {("temp", ()): 10.0, ("tie", ()): 2.0}
    assert c.samples() == oracle(tmp_path)


def test_most_recent_before_the_epoch_still_counts(tmp_path: Path) -> None:
    place(tmp_path / "gauge_mostrecent_1.db", [(key("t", "t"), 5.0, -1e300)])
    assert Collector(tmp_path).samples() == {("t", ()): 5.0}


@pytest.mark.parametrize(("mode", "want"), [("min", -4.0), ("max", 9.0), ("sum", 5.0), ("livesum", 5.0),
                                            ("all", None), ("liveall", None), ("mostrecent", 9.0),
                                            ("livemostrecent", 9.0)])
def test_each_gauge_mode_over_three_files(tmp_path: Path, mode: str, want: float | None) -> None:
    proc = tmp_path / "proc"
    for pid, v in ((1, 0.0), (2, -4.0), (3, 9.0)):
        (proc / str(pid)).mkdir(parents=True)
        place(tmp_path / f"gauge_{mode}_{pid}.db", [(key("g", "g"), v, float(pid))])
    got = Collector(tmp_path, proc_root=str(proc)).samples()
    if want is None:
        assert got == {("g", (("pid", "1"),)): 0.0, ("g", (("pid", "2"),)): -4.0, ("g", (("pid", "3"),)): 9.0}
    else:
        assert got == {("g", ()): want}
    assert got == oracle(tmp_path) or mode.startswith("live")  # the oracle asks the machine's own /proc for live


def test_min_and_max_of_values_on_one_side_of_zero(tmp_path: Path) -> None:
    for pid, v in ((1, 7.0), (2, 3.0), (3, 5.0)):
        place(tmp_path / f"gauge_min_{pid}.db", [(key("lo", "lo"), v, 0.0)])
        place(tmp_path / f"gauge_max_{pid}.db", [(key("hi", "hi"), -v, 0.0)])
    assert Collector(tmp_path).samples() == {("lo", ()): 3.0, ("hi", ()): -3.0}


def test_counters_with_and_without_total_and_histograms_without_created_or_count(tmp_path: Path) -> None:
    place(tmp_path / "counter_1.db", [
        (key("a", "a_total"), 2.0, 0.0), (key("a", "a_created"), 1.7e9, 0.0), (key("b", "b"), 3.0, 0.0),
        (key("c", "c_count"), 9.0, 0.0), (key("d", "x_total"), 4.0, 0.0)])
    place(tmp_path / "histogram_1.db", [
        (key("h", "h_bucket", {"le": "0.5", "r": "x"}), 1.0, 0.0), (key("h", "h_bucket", {"le": "+Inf", "r": "x"}),
                                                                    2.0, 0.0),
        (key("h", "h_sum", {"r": "x"}), 0.75, 0.0), (key("h", "h_count", {"r": "x"}), 99.0, 0.0),
        (key("h", "h_created", {"r": "x"}), 1.7e9, 0.0), (key("h", "h_bucket", {"le": "0.5", "r": "y"}), 1.0, 0.0)])
    c = Collector(tmp_path)
    assert c.samples() == {
        ("a_total", ()): 2.0, ("b_total", ()): 3.0,
        ("h_bucket", (("le", "0.5"), ("r", "x"))): 1.0, ("h_bucket", (("le", "+Inf"), ("r", "x"))): 3.0,
        ("h_count", (("r", "x"),)): 3.0, ("h_sum", (("r", "x"),)): 0.75,
        ("h_bucket", (("le", "0.5"), ("r", "y"))): 1.0, ("h_bucket", (("le", "+Inf"), ("r", "y"))): 1.0,
        ("h_count", (("r", "y"),)): 1.0, ("h_sum", (("r", "y"),)): 0.0,
    }, "a counter's _created and _count, another family's sample, a histogram's _count and _created: not merged"
    assert c.drops == []


def test_a_histogram_bucket_whose_bound_is_no_number_is_dropped(tmp_path: Path) -> None:
    place(tmp_path / "histogram_1.db", [(key("h", "h_bucket", {"le": "half"}), 1.0, 0.0),
                                        (key("h", "h_bucket", {"le": "1.0"}), 2.0, 0.0),
                                        (key("h", "h_sum"), 0.5, 0.0)])
    c = Collector(tmp_path)
    assert c.samples() == {("h_bucket", (("le", "1.0"),)): 2.0, ("h_bucket", (("le", "+Inf"),)): 2.0,
                           ("h_count", ()): 2.0, ("h_sum", ()): 0.5}
    assert c.drops == [("entry", "h: bucket bound 'half'")]


def test_a_histogram_bucket_without_a_bound(tmp_path: Path) -> None:
    place(tmp_path / "histogram_1.db", [(key("h", "h_bucket", {"r": "x"}), 1.0, 0.0)])
    c = Collector(tmp_path)
    c.samples()
    assert c.drops == [("entry", "h: bucket bound ''")]


def test_the_older_key_layout_and_the_newer_one_are_both_read(tmp_path: Path) -> None:
    place(tmp_path / "counter_1.db", [
        (json.dumps(["old", "old_total", ["route", "code"], ["/pay", 200], "Old help."]), 2.0, 0.0),
        (json.dumps(["new", "new_total", {"route": "/pay", "code": 200}, "New help."]), 3.0, 0.0)])
    fams = {f.defn.name: f for f in Collector(tmp_path).c.collect()}
    assert fams["old_total"].samples == [(("/pay", "200"), 2.0)]
    assert fams["old_total"].defn.label_names == ("route", "code")
    assert fams["old_total"].defn.help == "Old help."
    assert fams["new_total"].samples == [(("/pay", "200"), 3.0)]
    assert fams["new_total"].defn.label_names == ("route", "code")
    assert fams["new_total"].defn.help == "New help."


def test_a_family_and_sample_that_are_no_strings_are_read_as_text(tmp_path: Path) -> None:
    place(tmp_path / "gauge_sum_1.db", [(json.dumps([7, 7, {}, 5]), 1.0, 0.0)])
    c = Collector(tmp_path)
    fams = {f.defn.name: f for f in c.c.collect()}
    assert fams == {} or set(fams) == {"7"}
    assert [k for k, _ in c.drops] == ["invalid:7"], "then refused by its name, not dropped as a key"


@pytest.mark.parametrize("bad", [
    "not json", "[1, 2, 3]", "[]", '"a string"', '["a", "a", {"k": "v"}]', '["a", "a_total", 7, "h"]',
    '["a", "a_total", ["k"], "v", "h", "x"]', '["a", "a_total", ["k"], 7, "h"]', '{"a": 1, "b": 2, "c": 3, "d": 4}',
    '["a", "a_total", [1, 2], "h"]',
])
def test_a_key_that_is_not_prometheus_clients_is_dropped_and_the_rest_read(tmp_path: Path, bad: str) -> None:
    (tmp_path / "counter_1.db").write_bytes(file_of(entry(key("a", "a_total"), 1.0), entry(bad, 5.0),
                                                    entry(key("b", "b_total"), 2.0)))
    c = Collector(tmp_path)
    assert c.samples() == {("a_total", ()): 1.0, ("b_total", ()): 2.0}
    assert c.drops == [("key", f"an entry whose key is not prometheus_client's: {bad[:80]!r}")]


def test_a_long_bad_key_is_said_in_80_characters(tmp_path: Path) -> None:
    bad = "x" * 200
    (tmp_path / "counter_1.db").write_bytes(file_of(entry(bad, 5.0)))
    c = Collector(tmp_path)
    c.samples()
    assert c.drops == [("key", f"an entry whose key is not prometheus_client's: {'x' * 80!r}")]


@pytest.mark.parametrize(("raw", "value"), [
    ('["a", "a_total", ["k", "j"], ["v"], "h"]', 1.0), ('["a", "a_total", ["k"], ["v", "w"], "h"]', 1.0),
    ('["a", "a_total", {}, "h"]', math.nan), ('["a", "a_total", {}, "h"]', math.inf),
    ('["a", "a_total", {}, "h"]', -math.inf)])
def test_an_entry_whose_labels_and_values_differ_or_whose_value_is_not_finite(tmp_path: Path, raw: str,
                                                                               value: float) -> None:
    (tmp_path / "counter_1.db").write_bytes(file_of(entry(raw, value), entry(key("b", "b_total"), 2.0)))
    c = Collector(tmp_path)
    assert c.samples() == {("b_total", ()): 2.0}
    assert c.drops == [("entry", "a: labels and values differ, or the value is not finite")]


def test_a_metric_published_with_two_types_or_label_sets_keeps_the_first(tmp_path: Path) -> None:
    place(tmp_path / "counter_1.db", [(key("x", "x_total", {"a": "1"}), 1.0, 0.0),
                                      (key("x", "x_total", {"b": "1"}), 5.0, 0.0)])
    place(tmp_path / "gauge_sum_1.db", [(key("x", "x"), 7.0, 0.0)])
    c = Collector(tmp_path)
    assert c.samples() == {("x_total", (("a", "1"),)): 1.0}
    assert c.drops == [("shape:x", "x: published with two types or label sets; the first is kept")] * 2


def test_a_name_the_agent_owns_is_refused(tmp_path: Path) -> None:
    place(tmp_path / "counter_1.db", [(key("outrider_train_steps", "outrider_train_steps_total"), 1.0, 0.0),
                                      (key("shop", "shop_total"), 2.0, 0.0)])
    c = Collector(tmp_path)
    assert c.samples() == {("shop_total", ()): 2.0}
    assert [k for k, _ in c.drops] == ["reserved:outrider_train_steps"]


# --- the directory and its files ----------------------------------------------------------------------------------

def test_no_directory_set_collects_nothing(tmp_path: Path) -> None:
    c = PrometheusMultiprocCollector(CollectorContext(Config(), SweepStats()))
    assert c.collect() == [] and c.errors == 0


def test_a_directory_that_cannot_be_listed_is_said(tmp_path: Path) -> None:
    c = Collector(tmp_path / "missing")
    assert c.c.collect() == []
    assert c.drops == [("directory", f"{tmp_path / 'missing'}: No such file or directory")]
    (tmp_path / "a-file").write_text("")
    c = Collector(tmp_path / "a-file")
    assert c.c.collect() == []
    assert c.drops == [("directory", f"{tmp_path / 'a-file'}: Not a directory")]


@pytest.mark.parametrize(("name", "kind"), [
    ("counter_123.db", ("counter", "", 123)), ("histogram_7.db", ("histogram", "", 7)),
    ("summary_1.db", ("summary", "", 1)), ("gauge_all_9.db", ("gauge", "all", 9)),
    ("gauge_livemostrecent_42.db", ("gauge", "livemostrecent", 42)), ("gauge_0.db", None),
    ("gauge_median_1.db", None), ("gauge_live_sum_1.db", None), ("counter_x_1.db", None), ("counter_1.txt", None),
    ("counter_.db", None), ("counter_1a.db", None), ("counter.db", None), ("info_1.db", None), ("counter_1.db~", None),
    (".db", None), ("histogram_all_1.db", None), ("counter_-1.db", None),
] + [(f"gauge_{mode}_5.db", ("gauge", mode, 5)) for mode in GAUGE_MODES])
def test_the_file_names_read(name: str, kind: tuple[str, str, int] | None) -> None:
    assert _kind_of(name) == kind


def test_other_files_are_passed_over_and_bad_ones_cost_themselves(tmp_path: Path) -> None:
    place(tmp_path / "counter_1.db", [(key("a", "a_total"), 1.0, 0.0)])
    (tmp_path / "notes.txt").write_text("not a prometheus_client file")
    (tmp_path / "counter_2.db").write_bytes((10_000).to_bytes(4, "little") + b"\0" * 12)
    (tmp_path / "counter_3.db").symlink_to(tmp_path / "counter_1.db")
    (tmp_path / "counter_4.db").mkdir()
    (tmp_path / "counter_5.db").write_bytes(file_of(entry(b"\xff\xfe", 1.0)))
    (tmp_path / "counter_6.db").write_bytes(file_of(entry(key("b", "b_total"), 2.0), entry(key("c", "c_total"),
                                                                                          3.0))[:-4])
    c = Collector(tmp_path)
    assert c.samples() == {("a_total", ()): 1.0}
    assert [k for k, _ in c.drops] == ["file:counter_2.db", "file:counter_3.db", "file:counter_4.db",
                                       "file:counter_5.db", "file:counter_6.db"]
    texts = dict(c.drops)
    assert texts["file:counter_2.db"] == "counter_2.db: used size 10000 outside the file's 16 bytes"
    assert texts["file:counter_3.db"] == "counter_3.db: [Errno 40] Too many levels of symbolic links: " \
        f"'{tmp_path / 'counter_3.db'}'"
    assert texts["file:counter_4.db"] == "counter_4.db: not a regular file"
    assert texts["file:counter_5.db"].startswith("counter_5.db: 'utf-8' codec can't decode byte 0xff")
    assert texts["file:counter_6.db"] == "counter_6.db: used size 104 outside the file's 100 bytes"


def test_a_file_cut_short_keeps_the_entries_before_the_cut(tmp_path: Path) -> None:
    data = file_of(entry(key("b", "b_total"), 2.0), entry(key("c", "c_total"), 3.0))
    (tmp_path / "counter_1.db").write_bytes(data[:8] + data[8:-4] + b"\0" * 4)
    (tmp_path / "counter_1.db").write_bytes(
        (len(data) - 8).to_bytes(4, "little") + data[4:-8])  # the second entry's value runs past the used size
    c = Collector(tmp_path)
    assert c.samples() == {("b_total", ()): 2.0}
    assert c.drops == [("file:counter_1.db", "counter_1.db: an entry runs past the used size")]


def test_more_files_than_the_bound_are_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert MAX_FILES == 10_000
    monkeypatch.setattr(prometheus_multiproc, "MAX_FILES", 3)
    for pid in range(1, 6):
        place(tmp_path / f"counter_{pid}.db", [(key("a", "a_total"), 1.0, 0.0)])
    (tmp_path / "counter_1.dbx").write_text("")  # not a file of prometheus_client's: not counted
    (tmp_path / "aaa.txt").write_text("")
    c = Collector(tmp_path)
    assert c.samples() == {("a_total", ()): 3.0}, "counter_1.db to counter_3.db"
    assert c.drops == [("too_many_files", f"{tmp_path} holds more than 3 files; the rest are left out")]


def test_a_summarys_file_counts_among_the_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus_multiproc, "MAX_FILES", 1)
    (tmp_path / "summary_1.db").write_bytes(b"")
    (tmp_path / "summary_2.db").write_bytes(b"")
    c = Collector(tmp_path)
    assert c.samples() == {}
    assert [k for k, _ in c.drops] == ["summary", "too_many_files"]


def test_exactly_the_bound_of_files_are_all_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus_multiproc, "MAX_FILES", 3)
    for pid in range(1, 4):
        place(tmp_path / f"counter_{pid}.db", [(key("a", "a_total"), 1.0, 0.0)])
    c = Collector(tmp_path)
    assert c.samples() == {("a_total", ()): 3.0} and c.drops == []


# --- the reader ---------------------------------------------------------------------------------------------------

def test_prometheus_clients_own_file_read_entry_by_entry(tmp_path: Path) -> None:
    entries = [(key("a", "a_total"), 1.5, 0.0)] + [(key("b", "b_total", {"k": "v" * n}), float(n), n * 1.5)
                                                   for n in range(12)]
    place(tmp_path / "counter_1.db", entries)
    data = (tmp_path / "counter_1.db").read_bytes()
    assert list(read_entries(data)) == entries, "every key length, so every padding from 1 to 8 bytes"
    assert list(read_file(str(tmp_path / "counter_1.db"))) == entries


def test_an_empty_file_of_prometheus_clients_has_no_entries(tmp_path: Path) -> None:
    MmapedDict(str(tmp_path / "counter_1.db")).close()
    data = (tmp_path / "counter_1.db").read_bytes()
    assert len(data) == 64 << 10 and list(read_entries(data)) == []


@pytest.mark.parametrize(("data", "why"), [
    (b"", "shorter than its header"), (b"\x08\0\0\0\0\0\0", "shorter than its header"),
    ((7).to_bytes(4, "little") + b"\0" * 12, "used size 7 outside the file's 16 bytes"),
    ((17).to_bytes(4, "little") + b"\0" * 12, "used size 17 outside the file's 16 bytes"),
    ((-1).to_bytes(4, "little", signed=True) + b"\0" * 12, "used size -1 outside the file's 16 bytes"),
    ((11).to_bytes(4, "little") + b"\0" * 12, "an entry's length runs past the used size"),
    (file_of(b"\0\0\0\0" + b"\0" * 20), "an entry runs past the used size"),  # a key of 0 bytes
    (file_of(b"\0\0\0\0" + b"\0" * 28), "an entry runs past the used size"),
    (file_of((-8).to_bytes(4, "little", signed=True) + b"\0" * 20), "an entry runs past the used size"),
    (file_of(entry("k", 1.0), used=31, tail=b"\0"), "an entry runs past the used size"),  # one byte short of its end
])
def test_a_malformed_file_is_refused_at_its_first_bad_entry(data: bytes, why: str) -> None:
    with pytest.raises(ValueError) as e:
        list(read_entries(data))
    assert str(e.value) == why


def test_the_used_size_bounds_the_entries_whatever_follows() -> None:
    data = file_of(entry("k", 1.0), tail=entry("tail", 2.0))
    assert list(read_entries(data)) == [("k", 1.0, 0.0)]
    assert list(read_entries(file_of(used=8, tail=entry("k", 1.0)))) == [], "a used size of 8: none"
    exact = file_of(entry("k", 1.0))
    assert list(read_entries(exact)) == [("k", 1.0, 0.0)], "the last entry ending at the used size and the file's"
    with pytest.raises(ValueError, match="an entry's length runs past the used size"):
        list(read_entries(file_of(entry("k", 1.0), b"\x05\0\0", tail=b"\0" * 40)))
    for tail in (b"", b"\0" * 40):  # the used size ends with a whole length: the entry it starts runs past it
        with pytest.raises(ValueError) as e:
            list(read_entries(file_of(entry("k", 1.0), b"\x05\0\0\0", tail=tail)))
        assert str(e.value) == "an entry runs past the used size"


def test_a_key_of_0_bytes_is_refused_even_where_its_value_fits() -> None:
    data = file_of(b"\0\0\0\0" + b"\0" * 4 + struct.pack("<dd", 1.0, 0.0))  # its length, padding, its value
    with pytest.raises(ValueError) as e:
        list(read_entries(data))
    assert str(e.value) == "an entry runs past the used size"


def test_a_window_is_read_again_only_when_an_entry_runs_past_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus_multiproc, "READ_CHUNK", 64)
    first, second = "a" * 40, "b" * 40  # 4 + 40 + 4 bytes of padding + 16: the first entry's value ends at 72
    path = tmp_path / "counter_1.db"
    path.write_bytes(file_of(entry(first, 1.0), entry(second, 2.0)))
    reads = counted_reads(monkeypatch)
    assert list(read_file(str(path))) == [(first, 1.0, 0.0), (second, 2.0, 0.0)]
    assert reads == [(0, 8), (8, 64), (72, 64)], "the window [8, 72) holds the first entry to its last byte"


def test_a_key_at_its_bound_is_read_and_one_past_it_refused() -> None:
    assert MAX_KEY_BYTES == 64 << 10
    at = "k" * MAX_KEY_BYTES
    assert list(read_entries(file_of(entry(at, 1.0)))) == [(at, 1.0, 0.0)]
    with pytest.raises(ValueError) as e:
        list(read_entries(file_of(entry(at + "k", 1.0))))
    assert str(e.value) == f"an entry's key of {MAX_KEY_BYTES + 1} bytes, more than {MAX_KEY_BYTES}"


def test_a_file_is_read_a_window_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert READ_CHUNK == 1 << 20
    entries = [(f'["c", "c_total", {{"id": "{i}"}}, "h"]', float(i), 0.0) for i in range(40)]
    path = tmp_path / "counter_1.db"
    path.write_bytes(file_of(*(entry(k, v) for k, v, _ in entries), tail=b"\0" * 100))
    reads = counted_reads(monkeypatch)
    assert list(read_file(str(path))) == entries
    assert reads == [(0, 8), (8, READ_CHUNK)], "the header, then one window for the whole file"
    reads.clear()
    monkeypatch.setattr(prometheus_multiproc, "READ_CHUNK", 64)  # an entry is 56 bytes: most cross a window
    assert list(read_file(str(path))) == entries
    assert all(n == 64 for _, n in reads[1:]) and len(reads) > 40
    assert reads[1] == (8, 64), "the first window from the first entry"
    big = "k" * 100
    path.write_bytes(file_of(entry(big, 1.0)))
    reads.clear()
    assert list(read_file(str(path))) == [(big, 1.0, 0.0)], "a key longer than a window is read whole"
    assert (12, 100) in reads


def test_a_file_cut_short_under_the_reader_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = b"".join(entry(f'["c", "c_total", {{"id": "{i}"}}, "h"]', 1.0) for i in range(20))
    path = tmp_path / "counter_1.db"
    path.write_bytes(file_of(entries))
    monkeypatch.setattr(prometheus_multiproc, "READ_CHUNK", 64)
    it = read_file(str(path))
    next(it)
    path.write_bytes(path.read_bytes()[:300])  # the same file, shorter: its used size promises more
    with pytest.raises(ValueError) as e:
        list(it)
    assert str(e.value) == "the file ends before its used size (cut short while read)"


def test_a_file_larger_than_its_bound_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert prometheus_multiproc.MAX_FILE_BYTES == 64 << 20
    path = tmp_path / "counter_1.db"
    path.write_bytes(file_of(entry("k", 1.0)))
    size = path.stat().st_size
    monkeypatch.setattr(prometheus_multiproc, "MAX_FILE_BYTES", size)
    assert list(read_file(str(path))) == [("k", 1.0, 0.0)], "at the bound: read"
    monkeypatch.setattr(prometheus_multiproc, "MAX_FILE_BYTES", size - 1)
    with pytest.raises(ValueError) as e:
        list(read_file(str(path)))
    assert str(e.value) == f"{size} bytes, more than {size - 1}"


def test_a_fifo_is_neither_waited_on_nor_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "counter_1.db")
    with pytest.raises(ValueError, match=r"^not a regular file$"):
        list(read_file(str(tmp_path / "counter_1.db")))


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_file_is_closed_whether_read_through_refused_or_left_part_read(tmp_path: Path) -> None:
    path = tmp_path / "counter_1.db"
    path.write_bytes(file_of(entry("a", 1.0), entry("b", 2.0)))
    before = _open_descriptors()
    list(read_file(str(path)))
    assert _open_descriptors() == before
    it = read_file(str(path))
    next(it)
    assert _open_descriptors() == before + 1
    it.close()
    assert _open_descriptors() == before
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ValueError):
        list(read_file(str(tmp_path / "fifo")))
    assert _open_descriptors() == before


# --- the caps as the files are read -------------------------------------------------------------------------------

def _counters(path: Path, family: str, ids: range, value: float = 1.0) -> None:
    (path).write_bytes(file_of(*(entry(json.dumps([family, f"{family}_total", {"id": str(i)}, "h"]), value)
                                 for i in ids)))


def test_the_per_metric_cap_keeps_the_first_series_met_and_says_it_once(tmp_path: Path) -> None:
    _counters(tmp_path / "counter_1.db", "c", range(5))
    _counters(tmp_path / "counter_2.db", "c", range(3, 8))
    c = Collector(tmp_path, per_metric=4)
    got = c.samples()
    assert got == {("c_total", (("id", str(i)),)): (2.0 if i == 3 else 1.0) for i in range(4)}, \
        "the first 4 met, summed over both files"
    assert c.drops == [("cap:c", "c: past the cap of 4 series per metric; the rest are left out")]
    c.samples()
    assert c.drops[1:] == [("cap:c", "c: past the cap of 4 series per metric; the rest are left out")], \
        "said once each sweep"


def test_the_cap_in_all_and_which_cut_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert MAX_SERIES == 2000
    monkeypatch.setattr(prometheus_multiproc, "MAX_SERIES", 6)
    _counters(tmp_path / "counter_1.db", "a", range(4))
    _counters(tmp_path / "counter_2.db", "b", range(4))
    (tmp_path / "counter_3.db").write_bytes(file_of(entry(key("c", "c_total"), 1.0)))
    c = Collector(tmp_path, per_metric=100)
    got = c.samples()
    assert sorted(got) == sorted([("a_total", (("id", str(i)),)) for i in range(4)]
                                 + [("b_total", (("id", str(i)),)) for i in range(2)])
    assert c.drops == [("cap", "past 6 series in all: series of b and others are left out"),
                       ("cap", "past 6 series in all: series of c and others are left out")]


def test_merged_holds_no_more_than_the_caps_and_finds_kept_series_again(tmp_path: Path) -> None:
    drops: list[tuple[str, str]] = []

    def drop(k: str, why: str) -> None:
        drops.append((k, why))

    m = _Merged(2)
    assert (m.per_metric, m.metrics, m.per_family, m.series, m.accepted) == (2, {}, {}, 0, set())
    first = m.room("c", "counter", ("id",), ("1",), "h", drop)
    assert first is not None and (first.kind, first.help, first.label_names) == ("counter", "h", ("id",))
    first.values[("1",)] = 1.0
    assert m.room("c", "counter", ("id",), ("1",), "other help", drop) is first, "a series held: no new room taken"
    assert (m.per_family, m.series) == ({"c": 1}, 1)
    second = m.room("c", "counter", ("id",), ("2",), "h", drop)
    assert second is first
    second.values[("2",)] = 1.0
    assert m.room("c", "counter", ("id",), ("3",), "h", drop) is None and m.series == 2
    assert drops == [("cap:c", "c: past the cap of 2 series per metric; the rest are left out")]
    h = m.room("h", "histogram", (), (), "h", drop)
    assert h is not None and m.per_family == {"c": 2, "h": 1}
    h.buckets[()] = {1.0: 1.0}
    assert m.room("h", "histogram", (), (), "h", drop) is h, "a histogram's series held by its buckets"
    s = m.room("s", "histogram", (), (), "h", drop)
    assert s is not None
    s.sums[()] = 1.0
    assert m.room("s", "histogram", (), (), "h", drop) is s, "or by its sum alone"
    assert m.room("c", "gauge", ("id",), ("1",), "h", drop) is None
    assert m.room("c", "counter", ("other",), ("1",), "h", drop) is None
    assert drops[1:] == [("shape:c", "c: published with two types or label sets; the first is kept")] * 2


def test_past_caps_tells_a_key_without_parsing_it() -> None:
    drops: list[tuple[str, str]] = []

    def drop(k: str, why: str) -> None:
        drops.append((k, why))

    m = _Merged(1)
    kept = '["c", "c_total", {"id": "1"}, "h"]'
    assert m.past_caps(kept, drop) is False, "nothing held yet"
    assert m.room("c", "counter", ("id",), ("1",), "h", drop) is not None
    m.accepted.add(hash(kept))
    assert m.past_caps(kept, drop) is False, "a series taken already: its entry is read"
    assert m.past_caps('["c", "c_total", {"id": "2"}, "h"]', drop) is True
    assert m.past_caps('["c", "c_total", {"id": "3"}, "h"]', drop) is True
    assert drops == [("cap:c", "c: past the cap of 1 series per metric; the rest are left out")], "said once"
    assert m.past_caps('["d", "d_total", {"id": "2"}, "h"]', drop) is False, "another metric"
    assert m.past_caps('["c\\u0063", "c_total", {}, "h"]', drop) is False, "an escaped name: parsed, not told"
    assert m.past_caps('["c', drop) is False, "no end to the name"
    assert m.past_caps(' ["c", "c_total", {"id": "2"}, "h"]', drop) is False, "not the client's key text"
    assert m.past_caps('[ "c", "c_total", {"id": "2"}, "h"]', drop) is False
    assert m.past_caps('["c"', drop) is True, "the name is the first string, whatever follows"


def test_past_caps_in_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus_multiproc, "MAX_SERIES", 1)
    drops: list[tuple[str, str]] = []
    m = _Merged(100)
    m.room("a", "counter", (), (), "h", lambda k, why: drops.append((k, why)))
    assert m.past_caps('["b", "b_total", {}, "h"]', lambda k, why: drops.append((k, why))) is True
    assert drops == [("cap", "past 1 series in all: series of b and others are left out")]


def test_a_series_past_the_cap_found_again_by_its_key_is_still_summed(tmp_path: Path) -> None:
    for pid in (1, 2, 3):
        _counters(tmp_path / f"counter_{pid}.db", "c", range(6))
    got = Collector(tmp_path, per_metric=2).samples()
    assert got == {("c_total", (("id", "0"),)): 3.0, ("c_total", (("id", "1"),)): 3.0}


def test_gauges_all_per_pid_count_against_the_cap(tmp_path: Path) -> None:
    for pid in (1, 2, 3):
        place(tmp_path / f"gauge_all_{pid}.db", [(key("g", "g"), float(pid), 0.0)])
    c = Collector(tmp_path, per_metric=2)
    assert c.samples() == {("g", (("pid", "1"),)): 1.0, ("g", (("pid", "2"),)): 2.0}
    assert [k for k, _ in c.drops] == ["cap:g"]


def test_a_nan_entry_past_the_cap_does_not_take_room(tmp_path: Path) -> None:
    (tmp_path / "counter_1.db").write_bytes(file_of(
        entry(key("c", "c_total", {"id": "0"}), math.nan), entry(key("c", "c_total", {"id": "1"}), 1.0)))
    c = Collector(tmp_path, per_metric=1)
    assert c.samples() == {("c_total", (("id", "1"),)): 1.0}


def test_a_histogram_at_a_cap_of_one_series_keeps_its_sum_and_every_bucket(workers: Workers) -> None:
    r = workers.worker(1)
    h = Histogram("lat", "Latency.", buckets=(0.5, 1.0), registry=r)
    h.observe(0.25)
    h.observe(0.75)
    workers.done()
    got = Collector(workers.directory, per_metric=1).samples()
    assert got == {("lat_bucket", (("le", "0.5"),)): 1.0, ("lat_bucket", (("le", "1.0"),)): 2.0,
                   ("lat_bucket", (("le", "+Inf"),)): 2.0, ("lat_count", ()): 2.0, ("lat_sum", ()): 1.0}
    assert got == oracle(workers.directory)


def test_a_name_written_with_an_escape_is_parsed_not_told_by_its_text(tmp_path: Path) -> None:
    """`x\\u0063` in a key's JSON is the name xc; a metric literally named x\\u0063 (a backslash in it) at its cap
    must not take xc's entries with it."""
    literal = "x\\u0063"
    (tmp_path / "counter_1.db").write_bytes(file_of(
        entry(json.dumps([literal, literal + "_total", {"id": "1"}, "h"]), 1.0),
        entry(json.dumps([literal, literal + "_total", {"id": "2"}, "h"]), 1.0),
        entry('["x\\u0063", "x\\u0063_total", {"id": "3"}, "h"]', 5.0)))
    c = Collector(tmp_path, per_metric=1)
    assert c.samples() == {("xc_total", (("id", "3"),)): 5.0}
    assert [k for k, _ in c.drops] == [f"cap:{literal}", f"invalid:{literal}"]


def test_a_metric_without_help_gets_the_collectors_and_every_definition_names_the_collector(tmp_path: Path) -> None:
    place(tmp_path / "counter_1.db", [(key("quiet", "quiet_total", help_text=""), 1.0, 0.0),
                                      (key("said", "said_total", help_text="Said."), 1.0, 0.0)])
    ctx = CollectorContext(Config(prometheus_multiproc_dir=str(tmp_path)), SweepStats())
    c = PrometheusMultiprocCollector(ctx)
    assert c.ctx is ctx
    fams = {f.defn.name: f.defn for f in c.collect()}
    assert fams["quiet_total"].help == "A metric of the service's own prometheus_client instrumentation."
    assert fams["said_total"].help == "Said."
    assert {d.collector for d in fams.values()} == {"prometheus_multiproc"}


def test_a_metric_named_nothing_is_told_by_its_own_name(tmp_path: Path) -> None:
    """The key of a metric named "" starts `[""`: its name is the empty text between those quotes, never the text
    up to the next quote (a metric `", ` at its cap must not take its entries)."""
    odd = '", '
    (tmp_path / "counter_1.db").write_bytes(file_of(
        entry(json.dumps([odd, odd + "_total", {"id": "1"}, "h"]), 1.0),
        entry(json.dumps([odd, odd + "_total", {"id": "2"}, "h"]), 1.0),
        entry(json.dumps(["", "_total", {}, "h"]), 3.0)))
    c = Collector(tmp_path, per_metric=1)
    assert {name: samples for name, samples in c.families().items() if samples} == {"_total": [((), 3.0)]}
    assert [k for k, _ in c.drops] == [f"cap:{odd}", f"invalid:{odd}"]
