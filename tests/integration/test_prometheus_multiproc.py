"""A real gunicorn service with 3 workers instrumented with prometheus_client in multiprocess mode: the agent
merges its PROMETHEUS_MULTIPROC_DIR into its own /metrics, with no change to the service. prometheus_client's own
MultiProcessCollector over the same directory is the oracle of every merged value."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from outrider.collectors import prometheus_multiproc
from outrider.collectors.base import CollectorContext
from outrider.collectors.prometheus_multiproc import PrometheusMultiprocCollector, read_entries, read_file
from outrider.ground.config import Config
from outrider.metrics.exposition import render
from outrider.wiring.sampler import SweepStats
from tests.helpers import AgentProcess, free_port, http_get, reap, wait_until

pytestmark = pytest.mark.integration

APP = '''
from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter("shop_requests", "Requests served.", ["route"])
LATENCY = Histogram("shop_latency_seconds", "Request latency.", ["route"], buckets=(0.01, 0.1, 1.0))
IN_FLIGHT = Gauge("shop_in_flight", "Requests in flight.", multiprocess_mode="livesum")
WORKER = Gauge("shop_worker_started", "Start of each worker.", multiprocess_mode="all")
WORKER.set(1.0)
OWNED = Counter("outrider_train_steps", "A name the agent owns.")


def app(environ, start_response):
    route = environ["PATH_INFO"]
    with IN_FLIGHT.track_inprogress():
        REQUESTS.labels(route).inc()
        LATENCY.labels(route).observe(0.05 if route == "/fast" else 0.5)
        OWNED.inc()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]
'''


def oracle(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    out = {}
    for fam in registry.collect():
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def ours(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def shop(tmp_path: Path) -> tuple[Path, str]:
    directory = tmp_path / "multiproc"
    directory.mkdir()
    (tmp_path / "shop.py").write_text(APP)
    port = free_port()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--workers", "3", "--bind", f"127.0.0.1:{port}",
                             "--chdir", str(tmp_path), "shop:app"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_get(url + "/fast")[0] == 200, timeout_s=60, what="gunicorn to serve")
        # each worker writes its files when it imports the app: all three booted, not only the one that answered
        wait_until(lambda: len(list(directory.glob("gauge_all_*.db"))) == 3, timeout_s=120, what="3 booted workers")
        yield directory, url
    finally:
        proc.send_signal(signal.SIGTERM)
        reap([proc])


def test_the_merged_values_equal_prometheus_clients_own_merge(shop: tuple[Path, str]) -> None:
    directory, url = shop
    for i in range(60):
        assert http_get(url + ("/fast" if i % 3 else "/slow"))[0] == 200
    collector = PrometheusMultiprocCollector(CollectorContext(Config(prometheus_multiproc_dir=str(directory)),
                                                              SweepStats()))
    got = ours(render(collector.collect()).decode())
    want = oracle(directory)
    compared = 0
    for key, value in want.items():
        name = key[0]
        if name.startswith("outrider_") or name.endswith("_created"):
            continue
        assert got.get(key) == pytest.approx(value), key
        compared += 1
    assert compared >= 12, "counters, every bucket of the histogram, its sum and count, gauges of each mode"
    assert got[("shop_requests_total", (("route", "/fast"),))] == 41  # 1 for readiness + 40
    assert got[("shop_requests_total", (("route", "/slow"),))] == 20
    assert got[("shop_latency_seconds_bucket", (("le", "1.0"), ("route", "/slow")))] == 20
    pids = {dict(k[1])["pid"] for k in got if k[0] == "shop_worker_started"}
    assert len(pids) == 3, "mode all: one series per worker, labelled by pid"
    assert not [k for k in got if k[0].startswith("outrider_")], "an agent-owned name is refused"
    assert collector.errors >= 1, "and counted"


def test_the_agent_serves_them_on_its_own_endpoint(shop: tuple[Path, str]) -> None:
    directory, url = shop
    for _ in range(5):
        http_get(url + "/fast")
    with AgentProcess(env={"PROMETHEUS_MULTIPROC_DIR": str(directory), "OUTRIDER_RULE_FILES": "",
                           "OUTRIDER_COLLECTORS": "prometheus_multiproc,self"}) as agent:
        got = ours(agent.metrics())
    assert got[("shop_requests_total", (("route", "/fast"),))] == 6
    assert got[("outrider_collector_success", (("collector", "prometheus_multiproc"),))] == 1


def _entry(key: bytes, value: float) -> bytes:
    return len(key).to_bytes(4, "little") + key + b"\0" * (8 - (len(key) + 4) % 8) + struct.pack("<dd", value, 0.0)


def test_a_truncated_or_hostile_file_costs_that_file_only(tmp_path: Path) -> None:
    old_key = b'["a", "a_total", [], [], "h"]'  # the older key layout, label names and values apart
    new_key = b'["b", "b_total", {"k": "v"}, "h"]'
    entries = _entry(old_key, 3.0) + _entry(new_key, 4.0)
    good = tmp_path / "counter_1.db"
    good.write_bytes((8 + len(entries)).to_bytes(4, "little") + b"\0" * 4 + entries)
    (tmp_path / "counter_2.db").write_bytes((10_000).to_bytes(4, "little") + b"\0" * 12)  # used past its size
    (tmp_path / "counter_3.db").symlink_to("/etc/passwd")  # never followed
    (tmp_path / "notes.txt").write_text("not a prometheus_client file")
    collector = PrometheusMultiprocCollector(CollectorContext(Config(prometheus_multiproc_dir=str(tmp_path)),
                                                              SweepStats()))
    fams = {f.defn.name: f.samples for f in collector.collect()}
    assert fams == {"a_total": [((), 3.0)], "b_total": [(("v",), 4.0)]}
    assert collector.errors == 2, "the truncated file and the link, each counted"
    assert [k for k, _, _ in read_entries(good.read_bytes())] == [old_key.decode(), new_key.decode()]


def test_the_series_cap_holds(tmp_path: Path) -> None:
    entries = b"".join(_entry(b'["c", "c_total", {"id": "%d"}, "h"]' % i, 1.0) for i in range(150))
    (tmp_path / "counter_1.db").write_bytes((8 + len(entries)).to_bytes(4, "little") + b"\0" * 4 + entries)
    collector = PrometheusMultiprocCollector(CollectorContext(
        Config(prometheus_multiproc_dir=str(tmp_path), hook_max_series_per_metric=100), SweepStats()))
    (fam,) = collector.collect()
    assert len(fam.samples) == 100 and collector.errors == 1


def test_a_file_is_read_a_window_at_a_time_entries_across_windows_included(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    entries = b"".join(_entry(b'["c", "c_total", {"id": "%d"}, "h"]' % i, float(i)) for i in range(50))
    path = tmp_path / "counter_1.db"
    path.write_bytes((8 + len(entries)).to_bytes(4, "little") + b"\0" * 4 + entries + b"\0" * 100)
    monkeypatch.setattr(prometheus_multiproc, "READ_CHUNK", 64)  # an entry is 56 bytes: most cross a window
    assert list(read_file(str(path))) == list(read_entries(path.read_bytes()))
    assert len(list(read_file(str(path)))) == 50
    path.write_bytes(path.read_bytes()[:300])  # cut short under the reader: the used size promises more
    with pytest.raises(ValueError, match="used size"):
        list(read_file(str(path)))


def test_past_the_caps_series_are_dropped_as_they_are_read_and_each_cut_counted_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus_multiproc, "MAX_SERIES", 150)
    # two workers' files: the first 100 ids of `c` are kept, and summed over both files; `d` gets what is left of
    # the 150 in all
    for pid in (1, 2):
        entries = b"".join(_entry(b'["c", "c_total", {"id": "%d"}, "h"]' % i, 1.0) for i in range(300))
        entries += b"".join(_entry(b'["d", "d_total", {"id": "%d"}, "h"]' % i, 1.0) for i in range(80))
        (tmp_path / f"counter_{pid}.db").write_bytes((8 + len(entries)).to_bytes(4, "little") + b"\0" * 4 + entries)
    collector = PrometheusMultiprocCollector(CollectorContext(
        Config(prometheus_multiproc_dir=str(tmp_path), hook_max_series_per_metric=100), SweepStats()))
    merged = prometheus_multiproc._Merged(100)
    for pid in (1, 2):
        for key, v, stamp in read_file(str(tmp_path / f"counter_{pid}.db")):
            collector._take(merged, "counter", "", pid, key, v, stamp)
    assert merged.series == 150 and {f: len(m.values) for f, m in merged.metrics.items()} == {"c": 100, "d": 50}, \
        "no more is ever held than the caps allow"
    assert set(merged.metrics["c"].values.values()) == {2.0}, "a kept series is summed over both files"
    errors = collector.errors
    fams = {f.defn.name: f.samples for f in collector.collect()}
    assert len(fams["c_total"]) == 100 and len(fams["d_total"]) == 50
    assert collector.errors - errors == 2, "each cut once a sweep: c's cap, then the cap in all"
