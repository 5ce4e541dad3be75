"""The OTLP receiver (collectors/otlp_receiver.py) value by value, in process: OTLP requests built from
opentelemetry-proto's own messages, as an SDK's exporter sends them, handed to the receiver's handler; what it keeps
read back from its families. Each kind of point and temporality, every refusal with its reason, the series caps and
staleness at their edges, the exponential buckets' bounds, merges and classic form, the request results.
tests/integration/test_otlp_receiver*.py run the same receiver in a real agent against the real SDK."""

from __future__ import annotations

import gzip
import logging
import math
import time
import tracemalloc
import types
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from outrider.adapters.http_server import Request, Response
from outrider.collectors import otlp_receiver
from outrider.collectors.base import CollectorContext
from outrider.collectors.otlp_receiver import (
    CUMULATIVE,
    DELTA,
    MAX_BODY_BYTES,
    MAX_EXPONENT,
    MAX_EXPONENTIAL_BUCKETS,
    MAX_SCALE,
    MAX_SERIES,
    MIN_SCALE,
    STALE_S,
    OtlpReceiverCollector,
    _bound,
    _exponent_ok,
    _Exponential,
    _value,
    exponential_point,
    label_name,
    prometheus_name,
)
from outrider.ground.config import Config
from outrider.metrics.family import Family, HistogramValue
from outrider.shared.sketch import MIN_VALUE, Sketch, downscale

Labels = tuple[str, ...]


# --- requests as an exporter sends them -------------------------------------------------------------------------------

def attrs(**values: str) -> list[KeyValue]:
    return [KeyValue(key=k.replace("__", "."), value=AnyValue(string_value=v)) for k, v in values.items()]


def number(value: float, **labels: str) -> pb.NumberDataPoint:
    p = pb.NumberDataPoint(attributes=attrs(**labels))
    if isinstance(value, int):
        p.as_int = value
    else:
        p.as_double = value
    return p


def gauge(name: str, *points: pb.NumberDataPoint, unit: str = "", description: str = "") -> pb.Metric:
    return pb.Metric(name=name, unit=unit, description=description, gauge=pb.Gauge(data_points=points))


def summed(name: str, *points: pb.NumberDataPoint, monotonic: bool = True, temporality: Any = CUMULATIVE,
           unit: str = "") -> pb.Metric:
    return pb.Metric(name=name, unit=unit, sum=pb.Sum(data_points=points, is_monotonic=monotonic,
                                                      aggregation_temporality=temporality))


def explicit(bounds: list[float], counts: list[int], total: float, **labels: str) -> pb.HistogramDataPoint:
    return pb.HistogramDataPoint(explicit_bounds=bounds, bucket_counts=counts, count=sum(counts), sum=total,
                                 attributes=attrs(**labels))


def histogram(name: str, *points: pb.HistogramDataPoint, temporality: Any = CUMULATIVE, unit: str = "s") -> pb.Metric:
    return pb.Metric(name=name, unit=unit, histogram=pb.Histogram(data_points=points,
                                                                  aggregation_temporality=temporality))


def point(scale: int, offset: int, counts: list[int], zero: int = 0, threshold: float = 0.0, total: float = 1.0,
          count: int | None = None, **labels: str) -> pb.ExponentialHistogramDataPoint:
    return pb.ExponentialHistogramDataPoint(
        scale=scale, zero_count=zero, zero_threshold=threshold, sum=total,
        count=zero + sum(counts) if count is None else count,
        positive=pb.ExponentialHistogramDataPoint.Buckets(offset=offset, bucket_counts=counts),
        attributes=attrs(**labels))


def exponential(name: str, *points: pb.ExponentialHistogramDataPoint, temporality: Any = CUMULATIVE) -> pb.Metric:
    return pb.Metric(name=name, unit="s", exponential_histogram=pb.ExponentialHistogram(
        data_points=points, aggregation_temporality=temporality))


def request(*metrics: pb.Metric, service: str = "shop") -> bytes:
    resource = Resource(attributes=attrs(service__name=service, host__name="h1") if service else [])
    return bytes(ExportMetricsServiceRequest(resource_metrics=[pb.ResourceMetrics(
        resource=resource, scope_metrics=[pb.ScopeMetrics(metrics=list(metrics))])]).SerializeToString())


@pytest.fixture
def receiver() -> Iterator[OtlpReceiverCollector]:
    r = OtlpReceiverCollector(CollectorContext(Config(otlp_receiver_listen="127.0.0.1:0")))
    try:
        yield r
    finally:
        r.close()


def capped(per_metric: int) -> OtlpReceiverCollector:
    return OtlpReceiverCollector(CollectorContext(Config(otlp_receiver_listen="127.0.0.1:0",
                                                         hook_max_series_per_metric=per_metric)))


def post(r: OtlpReceiverCollector, body: bytes, path: str = "/v1/metrics", **headers: str) -> Response:
    return r._serve(Request("POST", path, headers, "127.0.0.1", body=body))


def push(r: OtlpReceiverCollector, *metrics: pb.Metric, service: str = "shop") -> None:
    assert post(r, request(*metrics, service=service)).status == 200


def address_of(r: OtlpReceiverCollector) -> tuple[str, int] | None:
    return r.address


def families(r: OtlpReceiverCollector) -> dict[str, Family]:
    return {f.defn.name: f for f in r.collect()}


def values(r: OtlpReceiverCollector, name: str) -> dict[Labels, Any]:
    return dict(families(r)[name].samples)


def requests(r: OtlpReceiverCollector) -> dict[str, float]:
    return {labels[0]: v for labels, v in values(r, "outrider_otlp_receiver_requests_total").items()}


def logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


# --- names, labels, attribute values ------------------------------------------------------------------------------

def test_a_unit_with_a_brace_on_either_side_is_an_annotation() -> None:
    assert prometheus_name("x", "{req", "gauge") == "x" and prometheus_name("x", "req}", "gauge") == "x"
    assert prometheus_name("x", " ms ", "gauge") == "x_milliseconds"
    assert prometheus_name("x", "req/{s", "gauge") == "x_req"


def test_a_unit_of_several_words_is_joined_as_the_name_is() -> None:
    assert prometheus_name("x", "foo bar", "gauge") == "x_foo_bar"
    assert prometheus_name("x", "By/foo bar", "gauge") == "x_bytes_per_foo_bar"


def test_a_sum_is_a_counter_only_when_said_monotonic() -> None:
    assert prometheus_name("queue.depth", "", "sum") == "queue_depth"


def test_label_names() -> None:
    assert label_name("http.route") == "http_route" and label_name("a-b c") == "a_b_c"
    assert label_name("") == "_" and label_name("1") == "_1" and label_name("9lives") == "_9lives"
    assert label_name("_x") == "_x" and label_name("Zz_9") == "Zz_9"


def test_attribute_values_as_label_values() -> None:
    assert _value(AnyValue(string_value="card")) == "card"
    assert _value(AnyValue(int_value=-5)) == "-5" and _value(AnyValue(double_value=1.5)) == "1.5"
    assert _value(AnyValue(bool_value=True)) == "True"
    assert _value(AnyValue(bytes_value=b"\x01\xff")) == "01ff"
    assert _value(AnyValue()) == "", "no value set"
    assert _value(AnyValue(string_value="é" * 200)) == "é" * 128
    assert _value(AnyValue(bytes_value=bytes(range(100)))) == bytes(range(64)).hex()


# --- exponential buckets ------------------------------------------------------------------------------------------

def test_bucket_bounds_and_the_exponents_a_double_holds() -> None:
    assert _bound(3, 1) == 2**1.5 and _bound(-2, 0) == 0.25 and _bound(5, -1) == 1024.0 and _bound(0, 7) == 1.0
    for scale in (0, 1, 3, MAX_SCALE):
        top = MAX_EXPONENT << scale
        assert _exponent_ok(top, scale) and _exponent_ok(-top, scale)
        assert not _exponent_ok(top + 1, scale) and not _exponent_ok(-top - 1, scale)
    for scale in (-1, -3, MIN_SCALE):
        top = MAX_EXPONENT >> -scale
        assert _exponent_ok(top, scale) and _exponent_ok(-top, scale)
        assert not _exponent_ok(top + 1, scale) and not _exponent_ok(-top - 1, scale)


def test_a_point_taken_finer_scales_merged_into_ours() -> None:
    taken = exponential_point(point(5, -3, [1, 0, 2], zero=4, threshold=1e-12))
    assert taken == _Exponential(5, 1e-12, 4, {-3: 1, -1: 2}) and isinstance(taken, _Exponential)
    assert taken.count == 7
    assert exponential_point(point(7, 8, [1, 2, 3, 4, 5])) == _Exponential(5, 0.0, 0, {2: 10, 3: 5})
    assert exponential_point(point(6, 0, [1, 1])) == _Exponential(5, 0.0, 0, {0: 2})
    assert exponential_point(point(4, 0, [1, 1])) == _Exponential(4, 0.0, 0, {0: 1, 1: 1}), "coarser: as sent"
    assert exponential_point(point(MIN_SCALE, 0, [], zero=2)) == _Exponential(MIN_SCALE, 0.0, 2, {})
    assert exponential_point(point(MIN_SCALE, 0, [1])) == "buckets beyond 2**±1000 (offset 0 at scale -10)", \
        "bucket 0 at scale -10 ends at 2**1024"
    assert exponential_point(point(MAX_SCALE, 0, [1])) == _Exponential(5, 0.0, 0, {0: 1})
    negative_zeros = point(5, 0, [1])
    negative_zeros.negative.bucket_counts.extend([0, 0])
    assert isinstance(exponential_point(negative_zeros), _Exponential), "empty negative buckets hold no value"


def test_each_point_refused_says_why() -> None:
    assert exponential_point(point(MIN_SCALE - 1, 0, [1])) == "scale -11, outside -10 to 20"
    assert exponential_point(point(MAX_SCALE + 1, 0, [1])) == "scale 21, outside -10 to 20"
    full = point(5, 0, [1] * MAX_EXPONENTIAL_BUCKETS)
    assert isinstance(exponential_point(full), _Exponential), "exactly MAX_EXPONENTIAL_BUCKETS"
    full.negative.bucket_counts.append(0)
    assert exponential_point(full) == "2049 buckets, over 2048", "negative buckets count too"
    negative = point(5, 0, [1], count=2)
    negative.negative.bucket_counts.extend([0, 1])
    assert exponential_point(negative) == "negative values"
    assert exponential_point(point(5, 0, [1], threshold=-0.5)) == "zero threshold -0.5"
    assert exponential_point(point(5, 0, [1], threshold=math.inf)) == "zero threshold inf"
    assert exponential_point(point(5, 0, [1], threshold=math.nan)) == "zero threshold nan"
    top = MAX_EXPONENT << 5
    assert isinstance(exponential_point(point(5, top - 1, [1])), _Exponential), "its upper bound at 2**1000"
    assert exponential_point(point(5, top, [1])) == "buckets beyond 2**±1000 (offset 32000 at scale 5)"
    assert isinstance(exponential_point(point(5, -top, [1])), _Exponential)
    assert exponential_point(point(5, -top - 1, [1])) == "buckets beyond 2**±1000 (offset -32001 at scale 5)"
    assert exponential_point(point(5, 0, [1, 2], zero=1, count=5)) == "a count (5) that is not its buckets' (4)"
    assert exponential_point(point(5, 0, [1, 2], zero=1, count=3)) == "a count (3) that is not its buckets' (4)"


def test_points_merge_at_the_coarser_scale() -> None:
    a = _Exponential(5, 1e-9, 2, {0: 1, 1: 1, 7: 3})
    b = _Exponential(3, 1e-6, 1, {0: 5, 4: 1})
    merged = a + b
    assert merged == _Exponential(3, 1e-6, 3, {0: 7, 1: 3, 4: 1})
    assert b + a == merged
    assert a.at(5) == a and a.at(4) == _Exponential(4, 1e-9, 2, {0: 2, 3: 3})


def test_a_merge_past_the_bucket_bound_is_downscaled_until_it_fits() -> None:
    half = MAX_EXPONENTIAL_BUCKETS // 2
    low = _Exponential(5, 0.0, 0, {i: 1 for i in range(half)})
    assert (low + _Exponential(5, 0.0, 0, {half + i: 1 for i in range(half)})).scale == 5, "exactly the bound: kept"
    high = _Exponential(5, 0.0, 0, {half + i: 1 for i in range(half + 1)})
    merged = low + high
    assert merged.scale == 4 and merged.buckets == downscale({**low.buckets, **high.buckets}, 1)
    wide = _Exponential(5, 0.0, 0, {i * 1024: 1 for i in range(MAX_EXPONENTIAL_BUCKETS + 1)})  # 2**1024 apart
    assert (wide + _Exponential(5, 0.0, 0, {})).scale == 5 - 11, "down to where pairs of them merge"
    coarsest = _Exponential(MIN_SCALE, 0.0, 0, {i: 1 for i in range(MAX_EXPONENTIAL_BUCKETS + 1)})
    assert (coarsest + _Exponential(MIN_SCALE, 0.0, 0, {})).scale == MIN_SCALE, "never coarser than OpenTelemetry's"


def test_the_sketch_where_the_zero_bucket_fits_ours() -> None:
    e = _Exponential(5, MIN_VALUE, 3, {0: 2, 40: 1})
    assert e.sketch() == Sketch.of(3, {0: 2, 40: 1})
    assert _Exponential(5, MIN_VALUE * 1.01, 3, {0: 2}).sketch() is None, "a zero bucket wider than ours"
    assert _Exponential(4, 0.0, 0, {0: 2}).sketch() is None, "coarser than ours"


def test_classic_buckets_at_the_senders_boundaries() -> None:
    # scale 0: bucket i is (2**i, 2**(i+1)]
    e = _Exponential(0, 0.0, 2, {0: 3, 1: 4, 3: 5})
    assert e.classic() == ((0.0, 1.0, 2.0, 4.0, 8.0, 16.0), (2, 0, 3, 4, 0, 5, 0))
    # a zero threshold at 4: buckets wholly inside it (upper at 2 and at 4) are counted in it; the next starts there
    assert _Exponential(0, 4.0, 1, {0: 3, 1: 4, 2: 5}).classic() == ((4.0, 8.0), (8, 5, 0))
    # a bucket straddling the threshold counts above it
    assert _Exponential(0, 3.0, 1, {1: 4}).classic() == ((3.0, 4.0), (1, 4, 0))
    assert _Exponential(0, 0.0, 0, {}).classic() == ((0.0,), (0, 0))


# --- the receiver: transport and results ----------------------------------------------------------------------------

def test_without_an_address_no_receiver_and_nothing_collected() -> None:
    r = OtlpReceiverCollector(CollectorContext(Config()))
    assert address_of(r) is None and r.collect() == []
    r.close()


def test_the_receiver_listens_where_told_loopback_by_default(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    r = OtlpReceiverCollector(CollectorContext(Config(otlp_receiver_listen=":0")))
    try:
        assert r.address is not None and r.address[0] == "127.0.0.1" and r.address[1] > 0
        assert [m.getMessage() for m in caplog.records] == [
            f"OTLP/HTTP receiver for the application's metrics on http://127.0.0.1:{r.address[1]}/v1/metrics"]
    finally:
        r.close()
    assert address_of(r) is None and r.collect() == []
    r.close()


def test_an_ipv6_address_in_brackets() -> None:
    r = OtlpReceiverCollector(CollectorContext(Config(otlp_receiver_listen="[::1]:0")))
    try:
        assert r.address is not None and r.address[0] == "::1"
        push(r, gauge("g", number(1.0)))
        assert values(r, "g") == {("shop",): 1.0}
    finally:
        r.close()


def test_answers_and_results(receiver: OtlpReceiverCollector, caplog: pytest.LogCaptureFixture) -> None:
    ok = post(receiver, request(gauge("q", number(1.0))))
    assert ok == Response(200, b"", (("Content-Type", "application/x-protobuf"),))
    assert post(receiver, request(), path="/v1/traces") == Response(404, b"bad request\n")
    assert post(receiver, request(), path="/v1/metrics?x=1").status == 200
    assert post(receiver, b"\xff\xff\xff not protobuf") == Response(400, b"bad request\n")
    assert "otlp_receiver: dropped reading decode: a request that is not an OTLP ExportMetricsServiceRequest: " \
        in logged(caplog)
    assert post(receiver, b"not gzip", **{"content-encoding": "gzip"}).status == 400
    assert post(receiver, gzip.compress(request(gauge("q", number(2.0)))), **{"content-encoding": "gzip"}).status == 200
    assert values(receiver, "q") == {("shop",): 2.0}
    assert requests(receiver) == {"accepted": 3, "bad_request": 3, "aborted": 0, "timed_out": 0, "evicted": 0}
    assert receiver.errors == 1


def body_of(size: int) -> bytes:
    """A valid request of exactly `size` bytes: one resource attribute padded to it."""
    pad = size
    while True:
        body = bytes(ExportMetricsServiceRequest(resource_metrics=[pb.ResourceMetrics(
            resource=Resource(attributes=attrs(pad="x" * pad)))]).SerializeToString())
        if len(body) == size:
            return body
        pad -= len(body) - size


def test_a_gzip_body_inflating_past_the_cap_is_refused(receiver: OtlpReceiverCollector,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    assert post(receiver, gzip.compress(body_of(MAX_BODY_BYTES)), **{"content-encoding": "gzip"}).status == 200
    refused = post(receiver, gzip.compress(body_of(MAX_BODY_BYTES + 1)), **{"content-encoding": "gzip"})
    assert refused == Response(413, b"bad request\n")
    assert requests(receiver)["too_large"] == 1 and requests(receiver)["accepted"] == 1
    assert f"otlp_receiver: dropped reading too_large: a request inflating to more than {MAX_BODY_BYTES} bytes" \
        in logged(caplog)
    assert post(receiver, body_of(100), **{"content-encoding": "identity"}).status == 200


def test_what_the_server_answers_itself_is_counted_by_result(receiver: OtlpReceiverCollector) -> None:
    assert receiver._server is not None
    receiver._server.refused.update({400: 1, 405: 2, 411: 3, 413: 4, 431: 5, 503: 6})
    receiver._server.aborted, receiver._server.timed_out, receiver._server.evicted = 7, 8, 9
    receiver._count("bad_request")
    assert requests(receiver) == {"bad_request": 12, "too_large": 4, "busy": 6, "aborted": 7, "timed_out": 8,
                                  "evicted": 9}
    assert list(requests(receiver)) == sorted(requests(receiver))


# --- taking in ------------------------------------------------------------------------------------------------------

def test_each_kind_and_temporality(receiver: OtlpReceiverCollector) -> None:
    push(receiver, gauge("queue.depth", number(3, route="/a"), number(4.5, route="/b"), description="the queue"),
         summed("orders", number(2, pay="card")), summed("pool.usage", number(5), monotonic=False),
         summed("sent", number(10), temporality=DELTA), summed("level", number(7), monotonic=False,
                                                               temporality=DELTA))
    push(receiver, summed("orders", number(3, pay="card")), summed("sent", number(5), temporality=DELTA),
         summed("level", number(2), monotonic=False, temporality=DELTA), summed("pool.usage", number(1.5),
                                                                                monotonic=False))
    got = families(receiver)
    assert dict(got["queue_depth"].samples) == {("/a", "shop"): 3.0, ("/b", "shop"): 4.5}
    assert got["queue_depth"].defn.type == "gauge" and got["queue_depth"].defn.label_names == ("route", "service_name")
    assert got["queue_depth"].defn.help == "the queue" and got["queue_depth"].defn.collector == "otlp_receiver"
    assert got["orders_total"].defn.help == "A metric of the application's own OpenTelemetry instrumentation."
    assert dict(got["orders_total"].samples) == {("card", "shop"): 3.0}, "cumulative: the last total"
    assert got["orders_total"].defn.type == "counter"
    assert dict(got["pool_usage"].samples) == {("shop",): 1.5} and got["pool_usage"].defn.type == "gauge"
    assert dict(got["sent_total"].samples) == {("shop",): 15.0}, "deltas added up"
    assert dict(got["level"].samples) == {("shop",): 2.0}, "a non-monotonic delta is its last value"


def test_labels_from_attributes_and_the_service(receiver: OtlpReceiverCollector) -> None:
    push(receiver, gauge("g", number(1.0, http__route="/pay", service_name="own")))
    push(receiver, gauge("h", number(1.0)), service="")
    assert values(receiver, "g") == {("/pay", "own"): 1.0}, "the point's own service_name wins"
    assert families(receiver)["h"].defn.label_names == () and values(receiver, "h") == {(): 1.0}


def test_a_non_finite_value_leaves_the_last_one(receiver: OtlpReceiverCollector) -> None:
    push(receiver, gauge("nan", number(math.nan)), gauge("inf", number(-math.inf, i="b"), number(2.0, i="a")))
    assert "nan" not in families(receiver), "no value was sent: none is served (it was served as 0)"
    assert values(receiver, "inf") == {("a", "shop"): 2.0}
    push(receiver, gauge("g", number(2.0)))
    push(receiver, gauge("g", number(math.nan)), summed("c", number(math.inf), temporality=DELTA))
    push(receiver, summed("c", number(4), temporality=DELTA))
    assert values(receiver, "g") == {("shop",): 2.0} and values(receiver, "c_total") == {("shop",): 4.0}


def test_what_is_not_taken_is_dropped_and_said(receiver: OtlpReceiverCollector,
                                              caplog: pytest.LogCaptureFixture) -> None:
    summary = pb.Metric(name="rpc.latency", summary=pb.Summary(data_points=[pb.SummaryDataPoint(count=1)]))
    push(receiver, summary, pb.Metric(name="empty"), gauge("+++", number(1.0)), gauge("outrider.mine", number(1.0)),
         gauge("outrider_gpu_utilization_ratio", number(1.0)), gauge("fine", number(1.0)))
    text = logged(caplog)
    for said in ("dropped reading unsupported:rpc.latency: rpc.latency: summary is not taken in",
                 "dropped reading unsupported:empty: empty: None is not taken in",
                 "dropped reading name:+++: '+++': no letter or digit to make a Prometheus name of",
                 "dropped reading reserved:outrider_mine: outrider_mine: a name the agent owns; left out",
                 "reserved:outrider_gpu_utilization_ratio: outrider_gpu_utilization_ratio: a name the agent owns"):
        assert said in text, said
    assert receiver.errors == 5
    assert {n for n in families(receiver)} == {"fine", "outrider_otlp_receiver_requests_total"}


def test_a_metric_keeps_its_first_kind_and_label_set(receiver: OtlpReceiverCollector,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    push(receiver, gauge("m", number(1.0, a="1"), number(2.0, b="2"), number(3.0, a="3")))
    push(receiver, summed("m", number(4.0, a="1"), monotonic=False), summed("m", number(5.0, a="1")))
    assert values(receiver, "m") == {("1", "shop"): 4.0, ("3", "shop"): 3.0}
    assert "dropped reading shape:m: m: sent with two kinds or label sets; the first is kept" in logged(caplog)
    assert receiver.errors == 1, "logged once, counted once: the counter is m_total, another metric"
    assert values(receiver, "m_total") == {("1", "shop"): 5.0}
    push(receiver, histogram("m", explicit([1.0], [1, 0], 0.5, a="1"), unit=""))
    assert receiver.errors == 2 and values(receiver, "m") == {("1", "shop"): 4.0, ("3", "shop"): 3.0}


def test_the_series_caps_at_their_edges(caplog: pytest.LogCaptureFixture) -> None:
    r = capped(3)
    try:
        push(r, gauge("g", *(number(float(i), i=str(i)) for i in range(4))))
        assert values(r, "g") == {(str(i), "shop"): float(i) for i in range(3)}
        assert r.errors == 1 and "dropped reading cap:g: g: past the series cap (3 per metric, 2000 in all)" \
            in logged(caplog)
        push(r, gauge("g", number(8.0, i="5"), number(9.0, i="0")))
        assert values(r, "g")[("0", "shop")] == 9.0 and r.errors == 2, "a series kept is updated after one refused"
    finally:
        r.close()
    r = capped(MAX_SERIES + 10)
    try:
        push(r, gauge("a", *(number(1.0, i=str(i)) for i in range(MAX_SERIES - 1))))
        push(r, gauge("b", number(1.0, i="0")))
        assert r._series_count() == MAX_SERIES and r.errors == 0
        push(r, gauge("b", number(1.0, i="1")), gauge("a", number(1.0, i="x")))
        assert r._series_count() == MAX_SERIES and r.errors == 2
    finally:
        r.close()


def test_explicit_histograms(receiver: OtlpReceiverCollector, caplog: pytest.LogCaptureFixture) -> None:
    push(receiver, histogram("cum", explicit([0.1, 1.0], [1, 2, 3], 5.5)),
         histogram("d", explicit([0.1, 1.0], [1, 2, 3], 5.5), temporality=DELTA),
         histogram("twin", explicit([1.0, 1.0], [1, 2, 0], 2.0)))
    push(receiver, histogram("cum", explicit([0.1, 1.0], [2, 2, 3], 6.0)),
         histogram("d", explicit([0.1, 1.0], [1, 0, 1], 2.5), temporality=DELTA))
    assert values(receiver, "cum_seconds") == {("shop",): HistogramValue((0.1, 1.0), (2, 2, 3), 6.0)}
    assert values(receiver, "d_seconds") == {("shop",): HistogramValue((0.1, 1.0), (2, 2, 4), 8.0)}, "added up"
    assert values(receiver, "twin_seconds") == {("shop",): HistogramValue((1.0, 1.0), (1, 2, 0), 2.0)}
    push(receiver, histogram("d", explicit([0.5], [4, 1], 3.0), temporality=DELTA))
    assert values(receiver, "d_seconds") == {("shop",): HistogramValue((0.5,), (4, 1), 3.0)}, "new bounds: afresh"
    push(receiver, histogram("bad", explicit([1.0, 0.5], [1, 1, 1], 1.0)),
         histogram("short", explicit([1.0], [1], 1.0)), histogram("long", explicit([1.0], [1, 1, 1], 1.0)))
    assert "dropped reading histogram:bad_seconds: bad_seconds: bucket counts do not match the bounds" \
        in logged(caplog)
    assert receiver.errors == 3
    got = families(receiver)
    assert not any(got[n].samples for n in ("bad_seconds", "short_seconds", "long_seconds")), "a refused first point"


def test_exponential_histograms_as_the_sketch_or_classic(receiver: OtlpReceiverCollector,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    push(receiver, exponential("fine", point(6, 0, [1, 1, 2], zero=1, total=3.5, route="/a")),
         exponential("coarse", point(0, 0, [3, 4], zero=2, total=9.0)))
    assert values(receiver, "fine_seconds") == {("/a", "shop"): HistogramValue((), (5,), 3.5,
                                                                                Sketch.of(1, {0: 2, 1: 2}))}
    assert values(receiver, "coarse_seconds") == {("shop",): HistogramValue((0.0, 1.0, 2.0, 4.0), (2, 0, 3, 4, 0),
                                                                            9.0)}
    push(receiver, exponential("fine", point(5, 0, [1], total=1.0, route="/b"), point(2, 0, [1], route="/c")))
    got = values(receiver, "fine_seconds")
    assert all(v.sketch is None and v.bounds for v in got.values()), "one series classic: all of them classic"
    assert got[("/a", "shop")] == HistogramValue(*_Exponential(5, 0.0, 1, {0: 2, 1: 2}).classic(), 3.5)
    push(receiver, exponential("bad", point(30, 0, [1])))
    assert "dropped reading exponential:bad_seconds: bad_seconds: an exponential histogram point with scale 30, " \
        "outside -10 to 20; left out" in logged(caplog)
    assert not families(receiver)["bad_seconds"].samples


def test_a_series_whose_point_was_refused_leaves_its_siblings_the_sketch(receiver: OtlpReceiverCollector) -> None:
    push(receiver, exponential("kept", point(5, 0, [1, 2], total=2.0, route="/a"),
                               point(5, 0, [1], count=5, route="/b")))
    assert values(receiver, "kept_seconds") == {("/a", "shop"): HistogramValue((), (3,), 2.0,
                                                                               Sketch.of(0, {0: 1, 1: 2}))}


def test_a_gzip_bomb_is_inflated_only_to_the_cap(receiver: OtlpReceiverCollector) -> None:
    """64 MiB of zeros in 64 KiB: read to MAX_BODY_BYTES + 1 and refused, never inflated whole."""
    bomb = gzip.compress(bytes(64 << 20), compresslevel=1)
    tracemalloc.start()
    try:
        assert post(receiver, bomb, **{"content-encoding": "gzip"}).status == 413
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_BODY_BYTES, f"{peak} bytes held at once"


def test_exponential_deltas_merge_and_cumulatives_replace(receiver: OtlpReceiverCollector) -> None:
    push(receiver, exponential("d", point(5, 0, [1, 1], total=2.0), temporality=DELTA),
         exponential("c", point(5, 0, [1, 1], total=2.0)))
    push(receiver, exponential("d", point(5, 1, [3], zero=1, total=4.0), temporality=DELTA),
         exponential("c", point(5, 1, [3], zero=1, total=4.0)))
    assert values(receiver, "d_seconds") == {("shop",): HistogramValue((), (6,), 6.0, Sketch.of(1, {0: 1, 1: 4}))}
    assert values(receiver, "c_seconds") == {("shop",): HistogramValue((), (4,), 4.0, Sketch.of(1, {1: 3}))}


def test_a_series_switching_between_explicit_and_exponential_keeps_the_latest(receiver: OtlpReceiverCollector) -> None:
    push(receiver, histogram("h", explicit([1.0], [1, 1], 2.0)))
    push(receiver, exponential("h", point(5, 0, [2], total=3.0)))
    assert values(receiver, "h_seconds") == {("shop",): HistogramValue((), (2,), 3.0, Sketch.of(0, {0: 2}))}
    push(receiver, histogram("h", explicit([1.0], [3, 0], 1.0), temporality=DELTA))
    assert values(receiver, "h_seconds") == {("shop",): HistogramValue((1.0,), (3, 0), 1.0)}
    push(receiver, exponential("h", point(5, 0, [1], total=1.0), temporality=DELTA))
    assert values(receiver, "h_seconds") == {("shop",): HistogramValue((), (1,), 1.0, Sketch.of(0, {0: 1}))}


# --- exporting ------------------------------------------------------------------------------------------------------

def test_series_not_updated_for_stale_s_are_forgotten(receiver: OtlpReceiverCollector,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    now = [10_000.0]
    clock = types.SimpleNamespace(monotonic=lambda: now[0])
    monkeypatch.setattr(otlp_receiver, "time", clock)
    push(receiver, gauge("old", number(1.0, i="a")), gauge("kept", number(1.0)))
    now[0] += 1.0
    push(receiver, gauge("old", number(2.0, i="b")), gauge("kept", number(2.0)))
    now[0] += STALE_S - 1.0
    assert values(receiver, "old") == {("a", "shop"): 1.0, ("b", "shop"): 2.0}, "exactly STALE_S: kept"
    now[0] += 0.5
    assert values(receiver, "old") == {("b", "shop"): 2.0}
    now[0] += 1.0
    assert "old" not in families(receiver) and "kept" not in families(receiver)
    assert receiver._metrics["old"].series == {}


def test_a_name_renamed_onto_another_is_served_once(receiver: OtlpReceiverCollector,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    push(receiver, gauge("up", number(1.0)), gauge("exported.up", number(2.0)), gauge("z", number(3.0)))
    got = families(receiver)
    assert dict(got["exported_up"].samples) == {("shop",): 2.0} and dict(got["z"].samples) == {("shop",): 3.0}
    assert "dropped reading renamed:up: up: exported as exported_up" in logged(caplog)
    assert [f.defn.name for f in receiver.collect()] == ["exported_up", "z", "outrider_otlp_receiver_requests_total"]


def test_a_request_through_the_server(receiver: OtlpReceiverCollector) -> None:
    """The handler is the server's: a real POST, as an exporter makes it."""
    import http.client

    assert receiver.address is not None
    c = http.client.HTTPConnection(*receiver.address, timeout=30)
    c.request("POST", "/v1/metrics", body=request(gauge("g", number(1.0))),
              headers={"Content-Type": "application/x-protobuf"})
    response = c.getresponse()
    assert (response.status, response.getheader("Content-Type"), response.read()) == (
        200, "application/x-protobuf", b"")
    c.close()
    assert values(receiver, "g") == {("shop",): 1.0}
    assert time.monotonic() - receiver._metrics["g"].series[("shop",)].seen < STALE_S
