"""OTLP over gRPC without grpcio: the SDK's protobuf encoding of MetricsData (opentelemetry-exporter-otlp-proto-common,
which the HTTP exporter uses too), sent as one unary MetricsService/Export call by outrider.adapters.grpc_client (h2).

It reads the variables the SDK's gRPC exporter reads, the metrics-specific one first, with its meaning:
OTEL_EXPORTER_OTLP[_METRICS]_ENDPOINT (http://localhost:4317 by default; http:// is plaintext, https:// is TLS, a bare
host:port is TLS unless _INSECURE=true), _INSECURE, _CERTIFICATE (the CA bundle; the system's otherwise),
_CLIENT_KEY and _CLIENT_CERTIFICATE (mutual TLS), _HEADERS (sent as gRPC metadata) and _COMPRESSION (gzip or none).
The timeout is the caller's (otlp_timeout_s), and bounds each export whole. Failures are returned, not raised, as
the SDK's exporters do; the caller counts them and backs off.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData
from opentelemetry.util.re import parse_env_headers

from outrider.adapters import grpc_client
from outrider.ground.config import ConfigError, redact_url_password

LOG = logging.getLogger("outrider.exporters.otlp")
EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
DEFAULT_ENDPOINT = "http://localhost:4317"
MAX_RESPONSE_BYTES = 1 << 20  # an ExportMetricsServiceResponse is a partial-success count and a message


def _env(env: Mapping[str, str], name: str) -> str | None:
    """OTEL_EXPORTER_OTLP_METRICS_<name>, else OTEL_EXPORTER_OTLP_<name>."""
    value = env.get(f"OTEL_EXPORTER_OTLP_METRICS_{name}")
    return value if value is not None else env.get(f"OTEL_EXPORTER_OTLP_{name}")


def target_from(endpoint: str, env: Mapping[str, str]) -> grpc_client.Target:
    """Where the exports go, and whether over TLS, as the SDK's gRPC exporter decides it."""
    if "://" in endpoint:
        url = urllib.parse.urlsplit(endpoint)
        scheme, host, port = url.scheme, url.hostname or "", url.port
    else:  # host:port, as the SDK also takes it
        scheme = ""
        host, _, port_text = endpoint.rpartition(":")
        if not host:
            host, port_text = endpoint, ""
        host = host.strip("[]")
        port = int(port_text) if port_text.isdigit() else None
    if not host:
        raise ConfigError(f"otlp_endpoint {redact_url_password(endpoint)!r}: no host to export to")
    insecure_text = _env(env, "INSECURE")
    if scheme == "https":
        insecure = False
    elif insecure_text is not None:
        insecure = insecure_text.strip().lower() == "true"
    else:
        insecure = scheme == "http"
    port = port or 4317
    if insecure:
        return grpc_client.tcp_target(host, port)
    try:
        tls = grpc_client.tls_context(_env(env, "CERTIFICATE") or None, _env(env, "CLIENT_CERTIFICATE") or None,
                                      _env(env, "CLIENT_KEY") or None)
    except (OSError, ValueError) as e:
        raise ConfigError(f"OTLP over gRPC: the TLS certificates cannot be loaded: {e}") from None
    return grpc_client.tcp_target(host, port, tls)


class GrpcMetricExporter:
    """export(MetricsData) -> MetricExportResult, shutdown(): the part of the SDK's exporter interface the agent
    uses."""

    def __init__(self, endpoint: str, timeout_s: float, env: Mapping[str, str] | None = None,
                 on_failure: Callable[[str], None] = lambda reason: None) -> None:
        """on_failure: told "deadline" or "too_large" when an export was cut short (the HTTP exporter's reasons)."""
        env = os.environ if env is None else env
        self.on_failure = on_failure
        self.endpoint = endpoint or _env(env, "ENDPOINT") or DEFAULT_ENDPOINT
        self.shown_endpoint = redact_url_password(self.endpoint)  # for messages: a password in it stays out of logs
        self.target = target_from(self.endpoint, env)
        self.timeout_s = timeout_s
        self.metadata = tuple(parse_env_headers(_env(env, "HEADERS") or "", liberal=True).items())
        compression = (_env(env, "COMPRESSION") or "none").strip().lower()
        if compression not in ("gzip", "none", ""):
            raise ConfigError(f"OTEL_EXPORTER_OTLP_COMPRESSION {compression!r}: OTLP over gRPC takes gzip or none")
        self.compress = compression == "gzip"
        self.last_error = ""

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **_: Any) -> MetricExportResult:
        request = encode_metrics(metrics_data).SerializeToString()
        try:
            answer = grpc_client.call(self.target, EXPORT, request, min(self.timeout_s, timeout_millis / 1000),
                                      metadata=self.metadata, compress=self.compress,
                                      max_response_bytes=MAX_RESPONSE_BYTES)
        except grpc_client.GrpcError as e:
            self.last_error = f"{e.code}: {e.details}"
            if e.cut:
                self.on_failure(e.cut)
            LOG.debug("OTLP/gRPC export to %s failed: %s", self.shown_endpoint, self.last_error)
            return MetricExportResult.FAILURE
        try:
            partial = ExportMetricsServiceResponse.FromString(answer).partial_success
        except Exception as e:  # the receiver took the data; what it said about it does not decode
            LOG.debug("OTLP/gRPC export: the response does not decode: %r", e)
        else:
            if partial.rejected_data_points:
                LOG.warning("OTLP receiver rejected %d data points: %s", partial.rejected_data_points,
                            partial.error_message)
        return MetricExportResult.SUCCESS

    def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
        """Nothing to close: each export is its own connection."""
