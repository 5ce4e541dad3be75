"""outrider.adapters.grpc_client (unary gRPC on h2) against real grpcio servers on 127.0.0.1 and against hostile raw
sockets: requests larger than HTTP/2's initial flow-control window arrive whole, gzip both ways, metadata, TLS with
ALPN, the server's status and message; a peer that answers a byte at a time ends by the deadline, an answer above the
cap is not read. And the OTLP/gRPC exporter's reading of the SDK's variables (endpoint, TLS, headers, compression)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

from outrider.adapters import grpc_client
from outrider.exporters.otlp_grpc import EXPORT, GrpcMetricExporter, target_from
from outrider.ground.config import ConfigError
from tests.helpers import free_port, self_signed

pytestmark = pytest.mark.integration
METHOD = "/test.Echo/Call"


class Echo:
    """A grpcio server with one raw-bytes method: `handler(request, context) -> bytes` (an echo by default)."""

    def __init__(self, handler: Callable[[bytes, Any], bytes] | None = None, tls: tuple[Path, Path] | None = None,
                 compression: grpc.Compression | None = None, method: str = METHOD) -> None:
        self.calls: list[tuple[bytes, dict[str, str]]] = []
        self.handler = handler or (lambda request, context: request)
        self.port = free_port()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), compression=compression,
                                  options=[("grpc.max_receive_message_length", 64 << 20)])
        service, name = method.strip("/").split("/")
        rpc = grpc.unary_unary_rpc_method_handler(self._call)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {name: rpc}),))
        if tls is None:
            self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        else:
            cert, key = tls
            creds = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
            self.server.add_secure_port(f"127.0.0.1:{self.port}", creds)
        self.server.start()

    def _call(self, request: bytes, context: Any) -> bytes:
        self.calls.append((request, dict(context.invocation_metadata())))
        return self.handler(request, context)

    def __enter__(self) -> Echo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=0).wait(5)


def test_a_request_far_larger_than_the_initial_window_arrives_whole() -> None:
    request = bytes(range(256)) * 4096  # 1 MiB: sixteen times HTTP/2's initial 64 KiB window
    with Echo() as server:
        answer = grpc_client.call(grpc_client.tcp_target("127.0.0.1", server.port), METHOD, request, 10)
    assert answer == request and server.calls[0][0] == request


def test_gzip_both_ways_and_metadata() -> None:
    request = b"outrider " * 10_000
    with Echo(compression=grpc.Compression.Gzip) as server:
        answer = grpc_client.call(grpc_client.tcp_target("127.0.0.1", server.port), METHOD, request, 10,
                                  metadata=[("Authorization", "Bearer t0ken"), ("x-team", "ml")], compress=True)
    assert answer == request
    _, metadata = server.calls[0]
    assert metadata["authorization"] == "Bearer t0ken" and metadata["x-team"] == "ml"
    assert metadata["user-agent"].startswith("outrider/")


def test_the_servers_status_and_message_come_back() -> None:
    def refuse(request: bytes, context: Any) -> bytes:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "no exports for you: 100% sure")

    with Echo(refuse) as server, pytest.raises(grpc_client.GrpcError) as e:
        grpc_client.call(grpc_client.tcp_target("127.0.0.1", server.port), METHOD, b"x", 10)
    assert e.value.code == "PERMISSION_DENIED" and e.value.details == "no exports for you: 100% sure"


def test_an_unknown_method_is_unimplemented_and_nothing_listening_is_unavailable() -> None:
    with Echo() as server, pytest.raises(grpc_client.GrpcError) as e:
        grpc_client.call(grpc_client.tcp_target("127.0.0.1", server.port), "/test.Echo/Nope", b"x", 10)
    assert e.value.code == "UNIMPLEMENTED"
    with pytest.raises(grpc_client.GrpcError) as e:
        grpc_client.call(grpc_client.tcp_target("127.0.0.1", free_port()), METHOD, b"x", 10)
    assert e.value.code == "UNAVAILABLE"


def test_tls_with_alpn_verifies_the_server(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    with Echo(tls=(cert, key)) as server:
        trusted = grpc_client.tls_context(str(cert))
        assert grpc_client.call(grpc_client.tcp_target("127.0.0.1", server.port, trusted), METHOD, b"tls", 10) == \
            b"tls"
        with pytest.raises(grpc_client.GrpcError) as e:  # the system's CAs do not know this certificate
            grpc_client.call(grpc_client.tcp_target("127.0.0.1", server.port, grpc_client.tls_context()), METHOD,
                             b"tls", 10)
    assert e.value.code == "UNAVAILABLE" and "certificate" in e.value.details
    assert len(server.calls) == 1


def test_an_answer_above_the_cap_is_not_read() -> None:
    with Echo(lambda request, context: b"\0" * (8 << 20)) as server, pytest.raises(grpc_client.GrpcError) as e:
        grpc_client.call(grpc_client.tcp_target("127.0.0.1", server.port), METHOD, b"x", 10,
                         max_response_bytes=1 << 20)
    assert e.value.code == "RESOURCE_EXHAUSTED"


@contextlib.contextmanager
def trickling_peer() -> Iterator[int]:
    """Accepts and sends a valid HTTP/2 SETTINGS frame one byte every 0.25 s, forever: only a total deadline ends
    a call to it (each read gets a byte well within any per-read timeout)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    stop = threading.Event()
    frame = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn, contextlib.suppress(OSError):
                i = 0
                while not stop.wait(0.25):
                    conn.sendall(frame[i % len(frame):i % len(frame) + 1])
                    i += 1

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        t.join(5)
        listener.close()


def test_a_peer_that_answers_a_byte_at_a_time_ends_by_the_deadline() -> None:
    with trickling_peer() as port:
        started = time.monotonic()
        with pytest.raises(grpc_client.GrpcError) as e:
            grpc_client.call(grpc_client.tcp_target("127.0.0.1", port), METHOD, b"x", 1.5)
        took = time.monotonic() - started
    assert e.value.code == "DEADLINE_EXCEEDED"
    assert took < 1.5 + 1.0, f"{took:.1f} s: each read is bounded by what is left of the deadline, not by itself"


def test_the_grpc_timeout_header_fits_in_eight_digits() -> None:
    assert grpc_client.grpc_timeout(10) == "10000000u"
    assert grpc_client.grpc_timeout(600) == "600000m"
    assert grpc_client.grpc_timeout(0.0001) == "100u"


@pytest.mark.parametrize(("endpoint", "env", "where", "tls"), [
    ("http://collector:4317", {}, ("collector", 4317), False),
    ("https://collector", {}, ("collector", 4317), True),
    ("https://collector:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, ("collector", 4317), True),
    ("collector:4317", {}, ("collector", 4317), True),  # no scheme: TLS unless told otherwise, as the SDK
    ("collector:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, ("collector", 4317), False),
    ("collector:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_METRICS_INSECURE": "false"},
     ("collector", 4317), True),
    ("http://[::1]:4317", {}, ("::1", 4317), False),
])
def test_the_exporter_reads_endpoint_and_tls_as_the_sdk(endpoint: str, env: dict[str, str],
                                                        where: tuple[str, int], tls: bool) -> None:
    target = target_from(endpoint, env)
    assert (target.host, target.port) == where and (target.tls is not None) == tls


def test_the_exporter_takes_headers_and_compression_from_the_environment() -> None:
    exporter = GrpcMetricExporter("http://127.0.0.1:4317", 5, env={
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=secret,x-tenant=a%20b", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"})
    assert dict(exporter.metadata) == {"api-key": "secret", "x-tenant": "a b"} and exporter.compress
    with pytest.raises(ConfigError, match="gzip or none"):
        GrpcMetricExporter("http://127.0.0.1:4317", 5, env={"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"})
    with pytest.raises(ConfigError, match="certificates"):
        GrpcMetricExporter("https://127.0.0.1:4317", 5, env={"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent"})


PASSWORD = "otlpPASSWORDplanted"


def test_a_password_in_the_endpoint_stays_out_of_its_log_line_and_config_error(
        caplog: pytest.LogCaptureFixture) -> None:
    exporter = GrpcMetricExporter(f"http://outrider:{PASSWORD}@127.0.0.1:{free_port()}", 2.0, env={})
    with caplog.at_level(logging.DEBUG, logger="outrider.exporters.otlp"):
        assert exporter.export(MetricsData(resource_metrics=[])) == MetricExportResult.FAILURE
    (line,) = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert line.startswith("OTLP/gRPC export to http://outrider:<secret>@127.0.0.1:") and PASSWORD not in line
    assert PASSWORD not in exporter.last_error
    with pytest.raises(ConfigError, match="no host") as refused:
        GrpcMetricExporter(f"http://outrider:{PASSWORD}@:4317", 2.0, env={})
    assert PASSWORD not in str(refused.value) and "outrider:<secret>@" in str(refused.value)


def test_an_export_cut_short_is_told_by_reason_as_over_http() -> None:
    reasons: list[str] = []
    with trickling_peer() as port:
        exporter = GrpcMetricExporter(f"http://127.0.0.1:{port}", 1.0, env={}, on_failure=reasons.append)
        assert exporter.export(MetricsData(resource_metrics=[])) == MetricExportResult.FAILURE
    with Echo(lambda request, context: b"\0" * (2 << 20), method=EXPORT) as server:
        exporter = GrpcMetricExporter(f"http://127.0.0.1:{server.port}", 5.0, env={}, on_failure=reasons.append)
        assert exporter.export(MetricsData(resource_metrics=[])) == MetricExportResult.FAILURE
    assert reasons == ["deadline", "too_large"]
    assert exporter.last_error.startswith("RESOURCE_EXHAUSTED")
