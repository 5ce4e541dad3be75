"""An application's own OpenTelemetry metrics, pushed by the real OTel SDK (MeterProvider + OTLP/HTTP exporter) to
the agent's local receiver, come out of the agent's /metrics; the SDK's in-memory reader over the same provider is
the oracle of every value. A hostile or malformed request changes nothing."""

from __future__ import annotations

import gzip
import math
import random
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ProtoResource
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from outrider.collectors.otlp_receiver import CUMULATIVE, DELTA, MAX_EXPONENTIAL_BUCKETS, label_name
from outrider.exporters.otlp import OtlpExporter
from outrider.ground.config import Config
from outrider.metrics.exposition import PROTOBUF_CONTENT_TYPE
from outrider.metrics.family import Family, HistogramValue
from outrider.shared.sketch import RELATIVE_ERROR, Sketch, downscale
from tests.helpers import AgentProcess, free_port, http_get, wait_until
from tests.integration.test_prometheus_multiproc import ours as scraped
from tests.metrics.test_protobuf_format import index_at
from tests.prometheus_model import native_buckets, parse_exposition

pytestmark = pytest.mark.integration


@pytest.fixture
def agent() -> Iterator[tuple[AgentProcess, str]]:
    port = free_port()
    with AgentProcess(env={"OUTRIDER_OTLP_RECEIVER_LISTEN": f"127.0.0.1:{port}", "OUTRIDER_RULE_FILES": "",
                           "OUTRIDER_COLLECTORS": "otlp_receiver,self"}) as a:
        yield a, f"http://127.0.0.1:{port}/v1/metrics"


# Each instrument's name on the agent's /metrics: the one the OpenTelemetry Collector's Prometheus exporter gives it
# (tests/collectors/test_otlp_names.py holds the translator's documented examples)
COLLECTOR_NAMES = {
    "shop.orders": "shop_orders_total",  # a counter in {order}: an annotation, no unit word
    "shop.request.duration": "shop_request_duration_seconds",
    "shop.queue.depth": "shop_queue_depth",
    "shop.cache.utilization": "shop_cache_utilization_ratio",  # a gauge in 1
    "shop.pool.usage": "shop_pool_usage",  # an up-down counter in 1: no ratio
    "shop.network.io": "shop_network_io_bytes_per_second",
    "shop.sent.bytes": "shop_sent_bytes_total",  # a counter in By: `bytes` is in the name already
}


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
    cache = meter.create_gauge("shop.cache.utilization", unit="1")
    pool = meter.create_up_down_counter("shop.pool.usage", unit="1")
    network = meter.create_gauge("shop.network.io", unit="By/s")
    sent = meter.create_counter("shop.sent.bytes", unit="By")
    try:
        for round_ in range(2):  # two exports: deltas must add up to what the cumulative oracle says
            for i in range(30):
                orders.add(1, {"payment.method": "card" if i % 3 else "cash"})
                latency.record(0.02 * (i % 5), {"http.route": "/pay"})
            queue.add(5 - round_)
            cache.set(0.25 * (round_ + 1))
            pool.add(2)
            network.set(1e6 + round_)
            sent.add(1500)
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
                name = COLLECTOR_NAMES[m.name]
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
    assert compared == 8, "two counter series, the histogram, the up-down counters, the gauges, the byte counter"
    histogram = COLLECTOR_NAMES["shop.request.duration"]
    assert {n for n, _ in got if n.startswith("shop_")} == {*COLLECTOR_NAMES.values(), *(
        histogram + part for part in ("_bucket", "_count", "_sum"))} - {histogram}, "no series under another name"
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


# --- exponential histograms ---------------------------------------------------------------------------------------

_rng = random.Random(9)
LATENCIES = [_rng.lognormvariate(math.log(0.05), 1.1) for _ in range(3000)]  # nine octaves: 300 buckets at scale 5
STEPS = [_rng.lognormvariate(math.log(0.01), 0.3) for _ in range(3000)]  # three octaves: 800 buckets at scale 8
# 0.01% either side of a boundary of ours (10.12 ms): 150 buckets at scale 20, two at scale 5
NEAR = [2 ** (-212 / 32) * (1 + 1e-4 * (_rng.random() - 0.5)) for _ in range(3000)]


def exponential(name: str, values: list[float], scale: int, temporality: int = CUMULATIVE,
                zeros: int = 0) -> ExportMetricsServiceRequest:
    """A request with one exponential histogram point of `values` bucketed at `scale`, as an SDK sends it: the
    positive buckets one array from the lowest occupied one, zeros between."""
    counts: dict[int, int] = {}
    for v in values:
        counts[index_at(v, scale)] = counts.get(index_at(v, scale), 0) + 1
    offset = min(counts) if counts else 0
    array = [counts.get(i, 0) for i in range(offset, max(counts) + 1)] if counts else []
    point = pb.ExponentialHistogramDataPoint(
        count=len(values) + zeros, sum=sum(values), scale=scale, zero_count=zeros,
        positive=pb.ExponentialHistogramDataPoint.Buckets(offset=offset, bucket_counts=array),
        attributes=[KeyValue(key="http.route", value=AnyValue(string_value="/pay"))])
    metric = pb.Metric(name=name, unit="s", exponential_histogram=pb.ExponentialHistogram(
        data_points=[point], aggregation_temporality=temporality))
    return request_of(metric)


def on_boundary(bound: float, scale: int) -> bool:
    """Whether a classic bound is a boundary of exponential buckets at `scale` (2**(i / 2**scale))."""
    i = math.log2(bound) * 2**scale
    return abs(i - round(i)) < 1e-9


def request_of(*metrics: pb.Metric) -> ExportMetricsServiceRequest:
    resource = ProtoResource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value="shop"))])
    return ExportMetricsServiceRequest(resource_metrics=[pb.ResourceMetrics(
        resource=resource, scope_metrics=[pb.ScopeMetrics(metrics=list(metrics))])])


def push(endpoint: str, request: ExportMetricsServiceRequest) -> None:
    req = urllib.request.Request(endpoint, data=request.SerializeToString(), method="POST",
                                 headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def served(proc: AgentProcess, name: str, after: int = 0) -> Any:
    """The metric's first series as the agent's protobuf exposition gives it (read by protobuf's own parser), once
    it holds more than `after` values."""
    def find() -> Any:
        status, _, body = http_get(proc.url + "/metrics", headers={"Accept": PROTOBUF_CONTENT_TYPE})
        assert status == 200
        for fam in parse_exposition(body):
            if fam.name == name and fam.metric and fam.metric[0].histogram.sample_count > after:
                return fam.metric[0].histogram
        return None
    return wait_until(find, timeout_s=30, what=f"{name} on the agent's /metrics")


@pytest.mark.parametrize(("scale", "values"), [(5, LATENCIES), (8, STEPS), (20, NEAR)], ids=["5", "8", "20"])
def test_an_exponential_histogram_at_our_scale_or_finer_is_served_as_the_sketch_bucket_by_bucket(
        agent: tuple[AgentProcess, str], scale: int, values: list[float]) -> None:
    """Each scale with values spanning what its buckets can (an OTLP point's buckets are one dense array; 2,048 at
    most are taken)."""
    proc, endpoint = agent
    push(endpoint, exponential("shop.latency", values, scale, zeros=4))
    h = served(proc, "shop_latency_seconds")
    sketch = Sketch.of_values([*values, 0.0, 0.0, 0.0, 0.0])
    assert (h.schema, h.zero_count, h.sample_count) == (5, 4, len(values) + 4)
    assert native_buckets(h) == {i + 1: c for i, c in sketch.buckets.items()}, "merged into scale 5 exactly"
    assert len(sketch.buckets) >= (2 if scale == 20 else 50)
    assert h.sample_sum == pytest.approx(sum(values), rel=1e-12)
    assert not h.bucket, "no classic buckets: the count and the sum"
    text = scraped(proc.metrics())
    labels = (("http_route", "/pay"), ("service_name", "shop"))
    assert text[("shop_latency_seconds_count", labels)] == len(values) + 4
    assert text[("shop_latency_seconds_bucket", (*labels[:1], ("le", "+Inf"), *labels[1:]))] == len(values) + 4


def test_a_coarser_scale_is_kept_as_classic_buckets_at_the_senders_own_boundaries(
        agent: tuple[AgentProcess, str]) -> None:
    """Scale 2: buckets a factor 2**(1/4) wide, each straddling eight of ours; their counts are exact at the
    sender's boundaries, and no resolution finer than them is claimed."""
    proc, endpoint = agent
    push(endpoint, exponential("shop.latency", LATENCIES, 2, zeros=2))
    h = served(proc, "shop_latency_seconds")
    assert not h.HasField("schema") and not h.positive_span, "not a native histogram"
    occupied = {index_at(v, 2) for v in LATENCIES}
    bounds = [b.upper_bound for b in h.bucket]
    assert bounds[0] == 0.0, "the zero bucket's threshold first"
    assert set(bounds[1:]) == {2 ** (i / 4) for i in occupied} | {2 ** ((i + 1) / 4) for i in occupied}
    for b in h.bucket:
        assert b.cumulative_count == 2 + sum(1 for v in LATENCIES if v <= b.upper_bound), b.upper_bound
    assert h.sample_count == len(LATENCIES) + 2


def test_delta_points_add_up_at_the_coarser_scale(agent: tuple[AgentProcess, str]) -> None:
    proc, endpoint = agent
    first, second = STEPS[:1000], STEPS[1000:]
    push(endpoint, exponential("shop.latency", first, 8, temporality=DELTA))
    served(proc, "shop_latency_seconds")
    push(endpoint, exponential("shop.latency", second, 6, temporality=DELTA))
    h = served(proc, "shop_latency_seconds", after=len(first))
    assert h.sample_count == len(STEPS)
    assert native_buckets(h) == {i + 1: c for i, c in Sketch.of_values(STEPS).buckets.items()}


def test_the_sdks_exponential_histograms_arrive_with_their_buckets(agent: tuple[AgentProcess, str]) -> None:
    """The real OpenTelemetry SDK with its base-2 exponential aggregation (160 buckets at most: for these values
    a scale above 5) pushes to the agent; the SDK's in-memory reader is the oracle of every bucket."""
    proc, endpoint = agent
    exporter = OTLPMetricExporter(endpoint=endpoint)
    pushing = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    oracle = InMemoryMetricReader()
    view = View(instrument_name="shop.step", aggregation=ExponentialBucketHistogramAggregation())
    provider = MeterProvider(metric_readers=[pushing, oracle], views=[view],
                             resource=Resource.create({"service.name": "shop"}))
    steps = provider.get_meter("shop").create_histogram("shop.step", unit="s")
    values = [0.010 + 0.010 * (i % 4 == 3) + 0.0001 * (i % 13) for i in range(2000)]  # 10 ms and 20 ms steps
    try:
        for v in values:
            steps.record(v)
        assert pushing.force_flush(10_000)
        (point,) = [p for rm in oracle.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                    for m in sm.metrics for p in m.data.data_points]
    finally:
        provider.shutdown()
    assert point.scale >= 5, "the SDK kept a scale at least ours for one octave of values"
    theirs = {point.positive.offset + k: c for k, c in enumerate(point.positive.bucket_counts) if c}
    h = served(proc, "shop_step_seconds")
    assert native_buckets(h) == {i + 1: c for i, c in downscale(theirs, point.scale - 5).items()}
    assert native_buckets(h) == {i + 1: c for i, c in Sketch.of_values(values).buckets.items()}
    for q in (0.5, 0.99):
        true = sorted(values)[math.ceil(q * len(values)) - 1]
        assert abs(Sketch.of(h.zero_count, {i - 1: c for i, c in native_buckets(h).items()}).quantile(q)
                   / true - 1) <= RELATIVE_ERROR


def test_an_outrider_forwarding_otlp_to_another_keeps_its_distributions(agent: tuple[AgentProcess, str]) -> None:
    """The agent's own OTLP exporter (an Outrider upstream) sends a recorded distribution as an exponential
    histogram; this agent serves the same sketch, bucket by bucket (under the semantic-convention name's
    Prometheus form: outrider_* names are the agent's own)."""
    proc, endpoint = agent
    sketch = Sketch.of_values(LATENCIES)
    counts = [sum(1 for v in LATENCIES if lo < v <= hi) for lo, hi in zip((-math.inf, 0.1, 1.0), (0.1, 1.0, math.inf))]
    fam = Family("outrider_request_duration_seconds").add(
        HistogramValue((0.1, 1.0), tuple(counts), sum(LATENCIES), sketch), "/generate", "POST", "http", "200", "2xx",
        "0", "serve")
    exporter = OtlpExporter(Config(otlp_endpoint=endpoint), lambda: [fam])
    assert exporter.export_once(), exporter.last_error
    h = served(proc, "http_server_request_duration_seconds")
    assert native_buckets(h) == {i + 1: c for i, c in sketch.buckets.items()}
    assert (h.zero_count, h.sample_count) == (sketch.zero, len(LATENCIES))


def test_exponential_points_it_cannot_take_are_left_out_and_counted(agent: tuple[AgentProcess, str]) -> None:
    proc, endpoint = agent

    def refused(name: str, change: Callable[[Any], None]) -> pb.Metric:
        metric = exponential(name, LATENCIES[:50], 5).resource_metrics[0].scope_metrics[0].metrics[0]
        change(metric.exponential_histogram.data_points[0])
        return metric

    def too_many(p: Any) -> None:
        p.positive.bucket_counts.extend([0] * MAX_EXPONENTIAL_BUCKETS)

    def negative(p: Any) -> None:
        p.negative.offset, p.count = 3, p.count + 1
        p.negative.bucket_counts.append(1)

    bad = [refused("bad.negative", negative), refused("bad.count", lambda p: setattr(p, "count", p.count + 1)),
           refused("bad.scale", lambda p: setattr(p, "scale", 21)), refused("bad.buckets", too_many),
           refused("bad.offset", lambda p: setattr(p.positive, "offset", 2**31 - 1))]
    good = exponential("good.latency", LATENCIES[:50], 5).resource_metrics[0].scope_metrics[0].metrics[0]
    push(endpoint, request_of(*bad, good))
    served(proc, "good_latency_seconds")
    text = proc.metrics()
    assert not [name for name, _ in scraped(text) if name.startswith("bad_")]  # (a HELP text names bad_request)
    errors = scraped(text)[("outrider_collector_errors_total", (("collector", "otlp_receiver"),))]
    assert errors >= len(bad)
    log = proc.output
    for why in ("negative values", "a count (51) that is not its buckets' (50)", "scale 21", "buckets, over",
                "beyond 2**"):
        assert why in log, why


def test_a_distribution_beyond_the_sketchs_range_is_kept_classic_at_our_scale(
        agent: tuple[AgentProcess, str]) -> None:
    """Payload sizes of 2 to 8 MB, sent at scale 8: past the sketch's top (MAX_VALUE, a duration of 11 days), so no
    sketch is claimed; the buckets are kept as classic ones, merged to scale 5 first (a bounded number of them), at
    whose boundaries the counts are exact."""
    proc, endpoint = agent
    rng = random.Random(2)
    sizes = [rng.uniform(2e6, 8e6) for _ in range(500)]
    request = exponential("shop.payload", sizes, 8)
    request.resource_metrics[0].scope_metrics[0].metrics[0].unit = "By"
    push(endpoint, request)
    h = served(proc, "shop_payload_bytes")
    assert not h.HasField("schema"), "not the sketch: its buckets end at MAX_VALUE"
    bounds = [b.upper_bound for b in h.bucket][1:]
    assert all(on_boundary(b, 5) for b in bounds), "scale 5's boundaries"
    assert len(bounds) <= 2 * 32 + 2, "two octaves at 32 buckets an octave"
    for b in h.bucket:
        assert b.cumulative_count == sum(1 for v in sizes if v <= b.upper_bound)


def test_a_metric_is_the_sketch_for_all_its_series_or_for_none(agent: tuple[AgentProcess, str]) -> None:
    """One metric, one kind of series: a series sent at scale 2 makes its sibling at scale 5 classic too (at scale
    5's boundaries); a sibling whose point was refused has no data, and leaves the others their sketch."""
    proc, endpoint = agent

    def on_route(name: str, values: list[float], scale: int, route: str) -> pb.Metric:
        metric = exponential(name, values, scale).resource_metrics[0].scope_metrics[0].metrics[0]
        metric.exponential_histogram.data_points[0].attributes[0].value.string_value = route
        return metric

    mixed_fine, mixed_coarse = on_route("mixed", LATENCIES[:100], 5, "/a"), on_route("mixed", LATENCIES[:100], 2, "/b")
    mixed_fine.exponential_histogram.data_points.append(mixed_coarse.exponential_histogram.data_points[0])
    kept, refused = on_route("kept", LATENCIES, 5, "/a"), on_route("kept", LATENCIES[:10], 5, "/b")
    refused.exponential_histogram.data_points[0].count += 1
    kept.exponential_histogram.data_points.append(refused.exponential_histogram.data_points[0])
    push(endpoint, request_of(mixed_fine, kept))
    h = served(proc, "kept_seconds")
    assert native_buckets(h) == {i + 1: c for i, c in Sketch.of_values(LATENCIES).buckets.items()}
    body = http_get(proc.url + "/metrics", headers={"Accept": PROTOBUF_CONTENT_TYPE})[2]
    (mixed,) = [f for f in parse_exposition(body) if f.name == "mixed_seconds"]
    assert len(mixed.metric) == 2 and not any(m.histogram.HasField("schema") for m in mixed.metric)
    by_route = {m.label[0].value: [b.upper_bound for b in m.histogram.bucket][1:] for m in mixed.metric}
    assert all(on_boundary(b, 5) for b in by_route["/a"]), "scale 5's own boundaries"
    assert all(on_boundary(b, 2) for b in by_route["/b"]), "scale 2's"
    assert len(by_route["/a"]) > len(by_route["/b"])
