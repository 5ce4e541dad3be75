"""OTLP export of the real agent into receivers built from opentelemetry-proto (HTTP/protobuf and gRPC)."""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from pathlib import Path
from typing import Any

import pytest

from outrider.exporters.otlp import OtlpExporter
from outrider.ground.config import Config
from outrider.metrics.family import Family, HistogramValue
from outrider.shared.sketch import Sketch
from tests.helpers import AgentProcess, free_port, samples, sleeper, value, wait_until
from tests.servers import OtlpGrpcReceiver, OtlpHttpReceiver, attributes, otlp_points

pytestmark = pytest.mark.integration


def mem_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def otel_env(endpoint: str, **extra: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_METRIC_EXPORT_INTERVAL": "500",
            "OTEL_SERVICE_NAME": "trainer-7", "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=train-0,team=ml",
            "POD_NAME": "ignored-the-standard-variable-wins", "POD_NAMESPACE": "research", **extra}


def check_export(requests: list, watched_pid: int) -> None:  # type: ignore[type-arg]
    points = otlp_points(requests)
    # names are semantic-convention names, with UCUM units
    metric, point = points["system.memory.limit"][-1]
    assert metric.unit == "By"
    assert point.WhichOneof("value") == "as_double" and point.as_double == mem_total_bytes(), point  # exact below 2**53
    metric, _ = points["system.cpu.time"][-1]
    assert metric.unit == "s"
    assert metric.sum.is_monotonic and metric.sum.aggregation_temporality == 2  # cumulative
    modes = {attributes(p.attributes)["cpu.mode"] for _, p in points["system.cpu.time"]}
    assert {"user", "system", "idle"} <= modes
    pids = {attributes(p.attributes).get("process.pid") for _, p in points["process.memory.usage"]}
    assert watched_pid in pids, "process.pid is an int attribute, as the convention says"
    # resource attributes from the standard variables
    res = attributes(requests[-1].resource_metrics[0].resource.attributes)
    assert res["service.name"] == "trainer-7"
    assert res["k8s.pod.name"] == "train-0" and res["team"] == "ml"
    assert res["k8s.namespace.name"] == "research", "filled in from the Downward API variable"
    assert res["telemetry.sdk.name"] == "opentelemetry"


def test_http_protobuf_export_names_units_values_and_resource() -> None:
    work = sleeper(60)
    try:
        with OtlpHttpReceiver() as receiver, \
                AgentProcess("--pid", str(work.pid), env=otel_env(receiver.endpoint)):
            wait_until(lambda: len(otlp_points(receiver.requests).get("process.memory.usage", [])) > 0,
                       timeout_s=30, what="an OTLP export with process metrics")
            check_export(receiver.requests, work.pid)
    finally:
        work.kill()
        work.wait()


def test_grpc_export() -> None:
    work = sleeper(60)
    receiver = OtlpGrpcReceiver()
    try:
        with AgentProcess("--pid", str(work.pid), env=otel_env(receiver.endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                                                              OTEL_EXPORTER_OTLP_INSECURE="true")):
            wait_until(lambda: len(otlp_points(receiver.requests).get("process.memory.usage", [])) > 0,
                       timeout_s=30, what="an OTLP/gRPC export")
            check_export(receiver.requests, work.pid)
    finally:
        receiver.stop()
        work.kill()
        work.wait()


def test_unreachable_endpoint_is_counted_backed_off_and_recovers() -> None:
    port = free_port()  # nothing listens here yet
    env = otel_env(f"http://127.0.0.1:{port}")
    with AgentProcess(env=env, interval_s=0.25) as agent:
        def failures() -> float | None:
            return value(samples(agent.metrics()), "outrider_agent_otlp_exports_total", result="failure")

        wait_until(lambda: (failures() or 0) >= 2, timeout_s=30, what="two counted OTLP failures")
        parsed = samples(agent.metrics())
        assert value(parsed, "outrider_agent_otlp_exports_total", result="skipped"), "backs off between attempts"
        assert agent.proc.poll() is None, "an unreachable endpoint is never fatal"
        with OtlpHttpReceiver(port=port) as receiver:
            wait_until(lambda: receiver.requests, timeout_s=60, what="export to resume once the endpoint is up")
            wait_until(lambda: value(samples(agent.metrics()), "outrider_agent_otlp_exports_total",
                                     result="success"), timeout_s=10, what="a counted success")
            assert "system.cpu.time" in otlp_points(receiver.requests)


def test_sigterm_flushes_a_final_export() -> None:
    with OtlpHttpReceiver() as receiver:
        env = otel_env(receiver.endpoint, OTEL_METRIC_EXPORT_INTERVAL="600000")  # only the final flush exports
        agent = AgentProcess(env=env)
        assert receiver.requests == []
        code = agent.stop()
        assert code == 0
        assert receiver.requests, "the final flush on SIGTERM reached the receiver"
        assert "system.memory.limit" in otlp_points(receiver.requests)


def received_quantile(point: Any, q: float) -> float:
    """The q-quantile of an exponential histogram data point as a receiver computes it from the buckets alone:
    the value of rank ceil(q * count) is in one bucket, (base**i, base**(i+1)]; reported as the point whose
    relative distance to both ends is equal (the zero bucket's as 0)."""
    base = 2.0 ** (2.0 ** -point.scale)
    rank = max(1, math.ceil(q * point.count))
    seen = point.zero_count
    if seen >= rank:
        return 0.0
    for k, count in enumerate(point.positive.bucket_counts):
        seen += count
        if seen >= rank:
            lo, hi = base ** (point.positive.offset + k), base ** (point.positive.offset + k + 1)
            return 2 * lo * hi / (lo + hi)
    raise AssertionError("the buckets hold fewer values than the count")


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_recorded_distribution_arrives_as_an_exponential_histogram_bucket_by_bucket(protocol: str) -> None:
    """Request latencies spread over four decades, recorded as a sketch: the receiver gets the sketch itself,
    bucket by bucket, and every percentile it computes from those buckets is within 1.1% of the values'."""
    rng = random.Random(23)
    values = [rng.lognormvariate(math.log(0.05), 1.3) for _ in range(20_000)]
    bounds = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect_left(bounds, v)] += 1
    sketch = Sketch.of_values(values)
    fam = Family("outrider_request_duration_seconds").add(
        HistogramValue(bounds, tuple(counts), sum(values), sketch), "/generate", "POST", "http", "200", "2xx", "0",
        "serve")
    receiver: OtlpHttpReceiver | OtlpGrpcReceiver = OtlpHttpReceiver() if protocol == "http/protobuf" \
        else OtlpGrpcReceiver()
    try:
        exporter = OtlpExporter(Config(otlp_endpoint=receiver.endpoint, otlp_protocol=protocol), lambda: [fam])
        assert exporter.export_once(), exporter.last_error
        ((metric, point),) = otlp_points(receiver.requests)["http.server.request.duration"]
    finally:
        receiver.stop()
    assert metric.WhichOneof("data") == "exponential_histogram" and metric.unit == "s"
    assert (point.scale, point.count, point.zero_count) == (5, len(values), 0)
    assert point.sum == pytest.approx(sum(values), rel=1e-12)
    received = {point.positive.offset + k: c for k, c in enumerate(point.positive.bucket_counts) if c}
    assert received == dict(sketch.buckets)
    assert sum(point.positive.bucket_counts) == len(values)
    ordered = sorted(values)
    for q in (0.5, 0.9, 0.99, 0.999):
        true = ordered[math.ceil(q * len(values)) - 1]
        assert abs(received_quantile(point, q) / true - 1) <= 0.011, q
