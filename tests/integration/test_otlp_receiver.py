"""An application's own OpenTelemetry metrics, pushed by the real OTel SDK (MeterProvider + OTLP/HTTP exporter) to
the agent's local receiver, come out of the agent's /metrics; the SDK's in-memory reader over the same provider is
the oracle of every value. A hostile or malformed request changes nothing."""

from __future__ import annotations

import gzip
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from outrider.collectors.otlp_receiver import label_name, prometheus_name
from tests.helpers import AgentProcess, free_port, wait_until
from tests.integration.test_prometheus_multiproc import ours as scraped

pytestmark = pytest.mark.integration


@pytest.fixture
def agent() -> Iterator[tuple[AgentProcess, str]]:
    port = free_port()
    with AgentProcess(env={"OUTRIDER_OTLP_RECEIVER_LISTEN": f"127.0.0.1:{port}", "OUTRIDER_RULE_FILES": "",
                           "OUTRIDER_COLLECTORS": "otlp_receiver,self"}) as a:
        yield a, f"http://127.0.0.1:{port}/v1/metrics"


@pytest.mark.parametrize("temporality", ["cumulative", "delta"])
def test_the_sdks_metrics_come_out_of_the_agent(agent: tuple[AgentProcess, str], temporality: str) -> None:
    proc, endpoint = agent
    kinds = {}
    if temporality == "delta":
        from opentelemetry.sdk.metrics import Counter, Histogram

        kinds = {Counter: AggregationTemporality.DELTA, Histogram: AggregationTemporality.DELTA}
    exporter = OTLPMetricExporter(endpoint=endpoint, preferred_temporality=kinds)
    pushing = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    oracle = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[pushing, oracle],
                             resource=Resource.create({"service.name": "checkout"}))
    meter = provider.get_meter("shop")
    orders = meter.create_counter("shop.orders", unit="{order}", description="Orders placed.")
    latency = meter.create_histogram("shop.request.duration", unit="s", description="Request latency.")
    queue = meter.create_up_down_counter("shop.queue.depth")
    try:
        for round_ in range(2):  # two exports: deltas must add up to what the cumulative oracle says
            for i in range(30):
                orders.add(1, {"payment.method": "card" if i % 3 else "cash"})
                latency.record(0.02 * (i % 5), {"http.route": "/pay"})
            queue.add(5 - round_)
            assert pushing.force_flush(10_000)
        truth = oracle.get_metrics_data()
    finally:
        provider.shutdown()
    got = wait_until(lambda: (lambda s: s if ("shop_orders_total", (("payment_method", "card"),
                                                                    ("service_name", "checkout"))) in s else None)(
        scraped(proc.metrics())), timeout_s=30, what="the application's metrics on the agent's /metrics")
    compared = 0
    for rm in truth.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = "histogram" if type(m.data).__name__ == "Histogram" else (
                    "counter" if getattr(m.data, "is_monotonic", False) else "gauge")
                name = prometheus_name(m.name, m.unit, kind)
                for p in m.data.data_points:
                    labels = tuple(sorted([*((label_name(k), str(v)) for k, v in p.attributes.items()),
                                           ("service_name", "checkout")]))
                    if kind == "histogram":
                        assert got[(name + "_count", labels)] == p.count
                        assert got[(name + "_sum", labels)] == pytest.approx(p.sum)
                        cumulative = 0
                        for bound, c in zip(p.explicit_bounds, p.bucket_counts, strict=False):
                            cumulative += c
                            le = tuple(sorted((*labels, ("le", str(float(bound))))))
                            assert got[(name + "_bucket", le)] == cumulative, (name, bound)
                    else:
                        assert got[(name, labels)] == p.value, (name, labels)
                    compared += 1
    assert compared == 4, "two counter series, the histogram, the up-down counter"
    assert got[("shop_orders_total", (("payment_method", "card"), ("service_name", "checkout")))] == 40


def test_malformed_oversized_and_misrouted_requests_change_nothing(agent: tuple[AgentProcess, str]) -> None:
    proc, endpoint = agent

    def post(url: str, body: bytes, **headers: str) -> int:
        req = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/x-protobuf", **headers})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    assert post(endpoint, b"\xff\xff\xff not protobuf") == 400
    assert post(endpoint.replace("/v1/metrics", "/v1/traces"), b"") == 404
    assert post(endpoint, gzip.compress(b"\0" * (8 << 20)), **{"Content-Encoding": "gzip"}) == 413
    before = proc.metrics()
    assert "shop_" not in before
    assert proc.proc.poll() is None
