"""The workload's own /metrics endpoint, scraped by the agent (workload_metrics_port, or the pod annotation
outrider.dev/metrics-port): a real prometheus_client service, its page read by prometheus_client's own parser as
the oracle of every value the agent exports; the port named by a Downward API annotations file, changed while the
agent runs; and the bounds of the scrape (a deadline, a size cap, the series caps) against hostile endpoints."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from prometheus_client.parser import text_string_to_metric_families

from outrider.collectors.base import CollectorContext
from outrider.collectors.workload_metrics import ScrapeError, WorkloadMetricsCollector
from outrider.exporters.otlp import to_metrics_data
from outrider.ground.config import Config, ConfigError, load
from outrider.metrics.exposition import render
from tests.helpers import free_port, http_get, reap, served_by_agent, wait_until
from tests.servers import TRICKLE_BYTES, HostilePeer

pytestmark = pytest.mark.integration

SERVICE = r'''
import sys, time
from prometheus_client import Counter, Gauge, Histogram, Info, Summary, start_http_server

REQUESTS = Counter("shop_requests", "Requests served.", ["route", "note"])
LATENCY = Histogram("shop_latency_seconds", "Request latency.", ["route"], buckets=(0.01, 0.1, 1.0))
QUEUE = Gauge("shop_queue_depth", "Requests queued.")
SIZES = Summary("shop_body_bytes", "Request body sizes.")
Info("shop_build", "Build facts.").info({"version": "1.2"})
OWNED = Counter("outrider_train_steps", "A name the agent owns.")
for i in range(12):
    route = "/pay" if i % 3 else "/cart"
    REQUESTS.labels(route, 'say "hi"\\ \n twice').inc()
    LATENCY.labels(route).observe(0.05 * i)
    SIZES.observe(100 * i)
    OWNED.inc()
QUEUE.set(7)
start_http_server(int(sys.argv[1]), addr="127.0.0.1")
open(sys.argv[2], "w").close()
time.sleep(300)
'''


def oracle(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The service's own metrics as prometheus_client's parser reads its page, less what the agent leaves out
    (summaries, info; the names it owns are not the service's). Its process_* and python_* metrics are exported
    too, but change from one scrape to the next."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.type in ("summary", "info") or not fam.name.startswith("shop_"):
            continue
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def exported(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) if fam.name.startswith("shop_") for s in fam.samples}


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[int]:
    script, ready, port = tmp_path / "shop.py", tmp_path / "ready", free_port()
    script.write_text(SERVICE)
    proc = subprocess.Popen([sys.executable, str(script), str(port), str(ready)])
    try:
        wait_until(ready.exists, timeout_s=60, what="the service to serve its /metrics")
        yield port
    finally:
        proc.kill()
        reap([proc])


def collector(**settings: object) -> WorkloadMetricsCollector:
    return WorkloadMetricsCollector(CollectorContext(Config(**settings)))  # type: ignore[arg-type]


def test_the_agent_exports_what_the_workloads_endpoint_serves(shop: int) -> None:
    status, _, page = http_get(f"http://127.0.0.1:{shop}/metrics")
    assert status == 200
    want = oracle(page.decode())
    assert ("shop_requests_total", (("note", 'say "hi"\\ \n twice'), ("route", "/pay"))) in want
    text, left_out = served_by_agent({"OUTRIDER_WORKLOAD_METRICS_PORT": str(shop)}, "shop_requests_total",
                                     "the service's series on the agent's /metrics", "workload_metrics")
    assert exported(text) == want, "every counter, gauge and histogram sample, as prometheus_client reads it"
    assert left_out >= 3, "the summary, the info and the owned name, counted"


def test_on_otlp_they_keep_the_services_own_names(shop: int) -> None:
    c = collector(workload_metrics_port=shop)
    data = to_metrics_data(c.collect(), Resource({}), 0, 1)
    metrics = {m.name: m for m in data.resource_metrics[0].scope_metrics[0].metrics}
    assert metrics["shop_requests"].data.is_monotonic  # type: ignore[union-attr]
    assert sum(p.value for p in metrics["shop_requests"].data.data_points) == 12  # type: ignore[union-attr]
    latency = metrics["shop_latency_seconds"]
    assert latency.unit == "s" and sum(p.count for p in latency.data.data_points) == 12  # type: ignore[union-attr]
    assert "shop_body_bytes" not in metrics and not any(n.startswith("outrider") for n in metrics)


def test_a_workload_gone_fails_the_scrape() -> None:
    c = collector(workload_metrics_port=free_port())  # nothing listens there
    with pytest.raises(ScrapeError, match="refused"):
        c.collect()


class _Page(http.server.BaseHTTPRequestHandler):
    """Serves the class's `page` with `status`."""

    page = b""
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[list[http.server.ThreadingHTTPServer]]:
    servers: list[http.server.ThreadingHTTPServer] = []
    try:
        yield servers
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def _server(servers: list[http.server.ThreadingHTTPServer], page: bytes, status: int = 200) -> int:
    handler = type("Handler", (_Page,), {"page": page, "status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    servers.append(server)
    return server.server_address[1]


def _names(c: WorkloadMetricsCollector) -> dict[str, float]:
    return {fam.defn.name: sum(float(v) for _, v in fam.samples) for fam in c.collect()}


def test_the_pod_annotation_names_the_endpoint_and_a_change_takes_effect(
        tmp_path: Path, serve: list[http.server.ThreadingHTTPServer]) -> None:
    first = _server(serve, b"# TYPE first_up gauge\nfirst_up 1\n")
    second = _server(serve, b"# TYPE second_up gauge\nsecond_up 2\n")
    annotations = tmp_path / "annotations"  # as the kubelet writes a Downward API volume: key="Go-quoted value"
    annotations.write_text(f'kubernetes.io/config.seen="2024-05-01T10:00:00Z"\noutrider.dev/metrics-port="{first}"\n')
    c = collector(pod_annotations_file=str(annotations))
    assert _names(c) == {"first_up": 1}
    annotations.write_text(f'outrider.dev/metrics-port="{second}"\noutrider.dev/metrics-path="/metrics"\n')
    assert _names(c) == {"second_up": 2}, "read every sweep: a changed annotation, another endpoint"
    annotations.write_text('team="shop"\n')
    assert _names(c) == {}, "no annotation, no scrape"
    annotations.write_text('outrider.dev/metrics-port="eighty"\n')
    assert _names(c) == {} and c.errors == 1, "a bad annotation is counted, never a scrape of something else"
    configured = collector(pod_annotations_file=str(annotations), workload_metrics_port=first)
    assert _names(configured) == {"first_up": 1}, "the configuration wins over the annotation"


def test_the_setting_from_the_environment() -> None:
    config = load(env={"OUTRIDER_WORKLOAD_METRICS_PORT": "8000", "OUTRIDER_WORKLOAD_METRICS_PATH": "/m"}).config
    assert (config.workload_metrics_port, config.workload_metrics_path) == (8000, "/m")
    for bad in ({"OUTRIDER_WORKLOAD_METRICS_PORT": "70000"}, {"OUTRIDER_WORKLOAD_METRICS_PATH": "/a b"},
                {"OUTRIDER_WORKLOAD_METRICS_PATH": "metrics"}):
        with pytest.raises(ConfigError, match="WORKLOAD_METRICS"):
            load(env=bad)


@pytest.mark.parametrize("peer", ["trickle"], indirect=True)
def test_an_endpoint_answering_a_byte_at_a_time_is_cut_at_the_deadline(peer: HostilePeer) -> None:
    port = int(peer.start().rsplit(":", 1)[1])
    c = collector(workload_metrics_port=port, collector_timeout_s=1.0)
    outcome: list[BaseException] = []

    def scrape() -> None:
        try:
            c.collect()
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=scrape, daemon=True)
    t.start()
    t.join(60)  # a bound on the test, not the assertion: without a deadline the scrape would last 11.5 s
    assert not t.is_alive() and outcome and isinstance(outcome[0], ScrapeError)
    assert "within collector_timeout_s" in str(outcome[0])
    assert peer.sent_bytes < TRICKLE_BYTES, "cut off before the peer had sent its answer"


@pytest.mark.parametrize("peer", ["flood"], indirect=True)
def test_an_endless_page_is_not_read_past_the_cap(peer: HostilePeer) -> None:
    c = collector(workload_metrics_port=int(peer.start().rsplit(":", 1)[1]), collector_timeout_s=30.0)
    with pytest.raises(ScrapeError, match="larger than"):
        c.collect()
    assert peer.sent_bytes < 1 << 30


def test_a_page_not_200_fails_the_scrape(serve: list[http.server.ThreadingHTTPServer]) -> None:
    c = collector(workload_metrics_port=_server(serve, b"up 1\n", status=503))
    with pytest.raises(ScrapeError, match="HTTP 503"):
        c.collect()


def test_the_series_caps_and_a_bad_line_cost_only_what_they_must(serve: list[http.server.ThreadingHTTPServer]) -> None:
    lines = ["# TYPE a_wide counter"] + [f'a_wide_total{{n="{i}"}} 1' for i in range(150)]
    lines += ["this is { not a sample", '# TYPE kept gauge', 'kept{a="1"} 5', 'kept{a="2",b="x"} 6',
              "# TYPE outrider_mine gauge", "outrider_mine 1"]
    lines += [f"many_{i} {i}" for i in range(3000)]
    c = collector(workload_metrics_port=_server(serve, ("\n".join(lines) + "\n").encode()))
    fams = {fam.defn.name: fam for fam in c.collect()}
    assert len(fams["a_wide_total"].samples) == 100, "hook_max_series_per_metric"
    kept = fams["kept"]
    assert sorted(kept.samples) == [(("1", ""), 5.0), (("2", "x"), 6.0)], "a label left out is empty"
    assert "outrider_mine" not in fams, "a name the agent owns"
    assert sum(len(f.samples) for f in fams.values()) == 2000, "MAX_SERIES in all"
    assert c.errors >= 3  # the bad line, the caps, the owned name
    text = render(list(fams.values())).decode()
    assert 'kept{a="2",b="x"} 6' in text
