"""OTLP export of the real agent into receivers built from opentelemetry-proto (HTTP/protobuf and gRPC)."""

from __future__ import annotations

from pathlib import Path

import pytest

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
