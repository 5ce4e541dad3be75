"""Names Prometheus keeps for itself, sent to the agent by every way in, with a real Prometheus scraping the agent.

Once a workload's page with `weird{__name__="x"} 1` made Prometheus fail the agent's whole scrape (every series of
the target lost), and one that said `up 0` made it record the healthy agent as down. Now the workload's own
instrumentation (a scraped page, prometheus_client's multiprocess files, OTLP pushed to the receiver, annotated
pods) is renamed `exported_<name>`, what the workload chose through the hook is refused (registration, and the
spool's reader for a shard written otherwise), and a name outside Prometheus's grammar in a file is left out."""

from __future__ import annotations

import json
import os
import struct
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from outrider.shared import spool
from tests import helpers
from tests.fakes.pod_pages import Pages
from tests.helpers import free_port, samples, wait_until
from tests.integration.test_annotated_pods import LOOPBACK_AGENT, NODE, ApiServer, pod
from tests.servers import PrometheusServer

pytestmark = pytest.mark.integration

# Each way in names its own metrics, so that each renaming is seen on its own.
PAGE = b"""# TYPE weird gauge
weird{__name__="x"} 1
up 0
__hidden 1
ok_page{__meta_x="y"} 2
scrape_samples_scraped 5
ALERTS{alertname="Fake",alertstate="firing"} 1
"""
POD_PAGE = b"""pod_weird{__name__="x"} 1
scrape_timeout_seconds 0
ALERTS_FOR_STATE{alertname="Pod"} 1
"""


def _entry(key: bytes, value: float) -> bytes:
    return len(key).to_bytes(4, "little") + key + b"\0" * (8 - (len(key) + 4) % 8) + struct.pack("<dd", value, 0.0)


def multiproc_dir(directory: Path) -> Path:
    """A prometheus_client multiprocess file written by hand: prometheus_client itself refuses `__` labels, a file
    does not."""
    directory.mkdir()
    keys = [b'["scrape_duration_seconds", "scrape_duration_seconds", {}, "h"]',
            b'["mp_weird", "mp_weird", {"__name__": "x"}, "h"]',
            b'["bad name", "bad name", {}, "h"]', b'["mp_twice", "mp_twice", ["a", "a"], ["1", "2"], "h"]',
            b'["mp_ok", "mp_ok", {"a\\"b": "1"}, "h"]', b'["mp_fine", "mp_fine", {}, "h"]']
    entries = b"".join(_entry(k, 4.0) for k in keys)
    (directory / "gauge_all_1.db").write_bytes((8 + len(entries)).to_bytes(4, "little") + b"\0" * 4 + entries)
    return directory


def hostile_shard(directory: Path) -> Path:
    """A shard (this test's pid: a live process the agent trusts) that names Prometheus's own series: a hook that
    refuses nothing, or a file written by hand."""
    directory.mkdir(mode=0o700)
    entries = [["up", "gauge", {}, 0, []], ["ALERTS_FOR_STATE", "gauge", {"alertname": "x"}, 1, []],
               ["scrape_series_added", "gauge", {}, 2, []], ["shard_ok_total", "counter", {}, 3, []]]
    w = spool.ShardWriter(str(directory), os.getpid(), 1)
    w.write(json.dumps({"meta": {"rank": "0"}, "series": entries}).encode(), [0.0, 1.0, 7.0, 5.0], flags=0,
            pid=os.getpid(), stalls=0, start_ns=1, heartbeat_ns=1, last_step_ns=0, steps=0, stalled_since_ns=0)
    w.close()
    return directory


def push_otlp(url: str) -> int:
    """An OTLP request naming Prometheus's own series, and with an attribute `__name__`."""
    request = ExportMetricsServiceRequest()
    metrics = request.resource_metrics.add().scope_metrics.add().metrics
    for name, value, attribute in (("scrape_body_size_bytes", 0.0, "k"), ("otlp_weird", 1.0, "__name__"),
                                   ("otlp_ok", 3.0, "k")):
        m = metrics.add()
        m.name = name
        point = m.gauge.data_points.add()
        point.as_double = value
        kv = point.attributes.add()
        kv.key, kv.value.string_value = attribute, "x"
    req = urllib.request.Request(url, data=request.SerializeToString(), method="POST",
                                 headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return int(r.status)


@pytest.fixture
def pages() -> Iterator[Pages]:
    with Pages() as servers:  # plain HTTP servers, one page each
        yield servers


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApiServer]:
    """The stand-in Kubernetes API server of tests/integration/test_annotated_pods.py, and an agent that may scrape
    loopback pod IPs (the pods' pages are served on 127/8)."""
    monkeypatch.setattr(helpers, "outrider_cmd", lambda *args: [sys.executable, "-c", LOOPBACK_AGENT, *args])
    server = ApiServer(tmp_path / "api")
    try:
        yield server
    finally:
        server.stop()


def test_reserved_names_from_every_way_in_never_take_the_agents_target_down(tmp_path: Path, pages: Pages,
                                                                             api: ApiServer) -> None:
    receiver = free_port()
    api.pods = [pod("shop-0", "127.0.0.2", pages.serve("127.0.0.2", POD_PAGE.decode()))]
    env = {"OUTRIDER_SPOOL_DIR": str(hostile_shard(tmp_path / "spool")),
           "OUTRIDER_WORKLOAD_METRICS_PORT": str(pages.serve("127.0.0.1", PAGE.decode())),
           "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir(tmp_path / "multiproc")),
           "OUTRIDER_OTLP_RECEIVER_LISTEN": f"127.0.0.1:{receiver}", "OUTRIDER_RULE_FILES": "",
           "OUTRIDER_SCRAPE_ANNOTATED_PODS": "true", "NODE_NAME": NODE, "OUTRIDER_K8S_API_SERVER": api.url,
           "OUTRIDER_K8S_SERVICE_ACCOUNT_DIR": str(api.account_dir),
           "OUTRIDER_COLLECTORS": "host,hook,workload_metrics,prometheus_multiproc,otlp_receiver,annotated_pods,self"}
    with helpers.AgentProcess(env=env) as agent:
        assert push_otlp(f"http://127.0.0.1:{receiver}/v1/metrics") == 200
        exposed = wait_until(lambda: (lambda t: t if all(n in t for n in ("otlp_ok", "shard_ok_total", "pod_weird"))
                                      else None)(agent.metrics()),
                             timeout_s=30, what="every way in on the agent's /metrics")
        with PrometheusServer(tmp_path / "prom", [f"127.0.0.1:{agent.port}"]) as prom:
            target = f'{{job="outrider", instance="127.0.0.1:{agent.port}"}}'
            assert prom.wait_for(f"up{target} == 1")
            # each way in, renamed: the values are kept under exported_ names
            for query in ('weird{exported___name__="x", job="outrider"} == 1',  # the scraped page
                          "exported_up == 0", 'ok_page{exported___meta_x="y"} == 2', "exported___hidden == 1",
                          'exported_ALERTS{alertname="Fake"} == 1', "exported_scrape_samples_scraped == 5",
                          'pod_weird{exported___name__="x", exported_pod="shop-0"} == 1',  # an annotated pod
                          'exported_scrape_timeout_seconds{exported_pod="shop-0"} == 0',
                          'exported_ALERTS_FOR_STATE{alertname="Pod"} == 1',
                          'mp_weird{exported___name__="x"} == 4',  # the multiprocess file
                          "exported_scrape_duration_seconds == 4", "mp_fine == 4",
                          'otlp_weird{exported___name__="x"} == 1',  # OTLP
                          "exported_scrape_body_size_bytes == 0", 'otlp_ok{k="x"} == 3',
                          'shard_ok_total{rank="0"} == 5',  # the shard: its good series read
                          "outrider_host_memory_limit_bytes"):  # the agent's own series, all scraped
                assert prom.wait_for(query), query
            # Prometheus's own series stay its own, through several scrapes
            assert prom.wait_for(f"count_over_time(up{target}[1m]) >= 5", timeout_s=90)
            assert prom.query(f"min_over_time(up{target}[1m]) < 1") == []
            for own in ("scrape_samples_scraped", "scrape_duration_seconds", "scrape_series_added"):
                assert len(prom.query(f"{own}{target}")) == 1 and prom.query(f"{own}{target} == 5") == [], own
            assert prom.query("ALERTS") == [] and prom.query("ALERTS_FOR_STATE") == []
            assert prom.query('{rank="0", __name__=~"up|ALERTS_FOR_STATE|scrape_series_added"}') == []
            # and every sample the agent exposes was stored
            ingested = 'count({job="outrider", __name__!~"up|scrape_.+"})'
            assert prom.wait_for(f"{ingested} == scalar(scrape_samples_scraped{target})")
    # the names outside Prometheus's grammar in the multiprocess file, left out; the shard's reserved names refused
    parsed = samples(exposed)
    assert not {name for name, _ in parsed} & {"bad name", "mp_twice", "mp_ok", "up", "ALERTS_FOR_STATE",
                                                "scrape_series_added"}
    assert parsed[("outrider_hook_shard_errors_total", (("reason", "invalid_series"),))] >= 3, "each counted"
