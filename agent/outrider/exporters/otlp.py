"""OTLP push (http/protobuf; gRPC with the 'grpc' extra), on the OpenTelemetry SDK's HTTP exporter and encoding.

Each sweep's families are converted at export time into the SDK's MetricsData, under the catalog's
OpenTelemetry names, units and attribute names: counters as cumulative monotonic sums, gauges as gauges,
histograms as cumulative explicit-bucket histograms (the SDK's instruments offer no asynchronous histogram, so the
agent builds the data points itself and hands them to the SDK's OTLP/HTTP exporter, or over gRPC to
outrider.exporters.otlp_grpc, which encodes them as the SDK does and sends them without grpcio).

The standard variables are honoured: OTEL_EXPORTER_OTLP_ENDPOINT / _METRICS_ENDPOINT, _HEADERS, _TIMEOUT,
_COMPRESSION, _CERTIFICATE (read by the SDK's HTTP exporter, or as it reads them by the gRPC one),
OTEL_EXPORTER_OTLP_PROTOCOL and
OTEL_METRIC_EXPORT_INTERVAL (read into the config), OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (read by the
SDK's Resource); OTEL_METRICS_EXPORTER=none turns export off (config.otlp_enabled).

An unreachable endpoint is never fatal: a failed export is counted and the next attempts back off exponentially
(with jitter) up to a ceiling. Everything is cumulative, so the first export that gets through carries it all.
This module imports the SDK; the agent imports it only when OTLP export is on, keeping the default agent small.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from outrider.config import Config, ConfigError, k8s_identity
from outrider.metrics.catalog import MetricDef, otlp_attributes
from outrider.metrics.family import Family, HistogramValue
from outrider.version import __version__

LOG = logging.getLogger("outrider.exporters.otlp")
MAX_BACKOFF_S = 300.0
CUMULATIVE = AggregationTemporality.CUMULATIVE


def _http_endpoint(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith("/v1/metrics") else base + "/v1/metrics"


# Only what the chart sets from the Downward API (POD_NAME, POD_NAMESPACE, NODE_NAME): the container's name has no
# Downward API field, and a CONTAINER_NAME variable outside Kubernetes says nothing about a Kubernetes container.
K8S_ATTRIBUTES = {"pod": "k8s.pod.name", "namespace": "k8s.namespace.name", "node": "k8s.node.name"}


def _resource(config: Config) -> Resource:
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win; Outrider fills in only what they leave unset (service,
    host, and the allowed Kubernetes identity from the Downward API variables)."""
    detected = Resource.create()
    attrs = detected.attributes
    defaults: dict[str, str] = {}
    for name, value in k8s_identity(config).items():
        if value and name in K8S_ATTRIBUTES and K8S_ATTRIBUTES[name] not in attrs:
            defaults[K8S_ATTRIBUTES[name]] = value
    if str(attrs.get("service.name", "unknown_service")).startswith("unknown_service"):
        defaults["service.name"] = "outrider"
    if "service.version" not in attrs:
        defaults["service.version"] = __version__
    if "host.name" not in attrs:
        defaults["host.name"] = socket.gethostname()
    return detected.merge(Resource(defaults))


def to_metrics_data(families: list[Family], resource: Resource, start_ns: int, now_ns: int) -> MetricsData:
    """One sweep as OTLP data: one Metric per metric name, its samples as data points. Samples that map to the same
    attributes (the kernel's irq and softirq as cpu.mode "interrupt") are summed into one point."""
    by_name: dict[str, tuple[MetricDef, dict[frozenset[tuple[str, str | int]], Any]]] = {}
    for fam in families:
        if not fam.samples:
            continue
        points = by_name.setdefault(fam.defn.name, (fam.defn, {}))[1]
        for labels, value in fam.samples:
            attrs = otlp_attributes(fam.defn, labels, fam.attributes)
            key = frozenset(attrs.items())
            have = points.get(key)
            if have is None:
                points[key] = value
            elif isinstance(value, HistogramValue) and isinstance(have, HistogramValue):
                points[key] = HistogramValue(value.bounds, tuple(a + b for a, b in zip(have.counts, value.counts)),
                                             have.sum + value.sum)
            elif not isinstance(value, HistogramValue) and not isinstance(have, HistogramValue):
                points[key] = have + value
    metrics = []
    for defn, points in by_name.values():
        data: Any
        if defn.instrument == "histogram":
            data = Histogram(data_points=[HistogramDataPoint(
                attributes=dict(key), start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                count=h.count, sum=h.sum, bucket_counts=list(h.counts), explicit_bounds=list(h.bounds),
                min=None, max=None)  # type: ignore[arg-type]  # unknown: left unset in the protobuf
                for key, h in points.items() if isinstance(h, HistogramValue)], aggregation_temporality=CUMULATIVE)
        else:
            numbers = [NumberDataPoint(attributes=dict(key), start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                                       value=v) for key, v in points.items()]
            if defn.instrument == "gauge":
                data = Gauge(data_points=numbers)
            else:  # counter: monotonic; updowncounter (a usage, a count of things): not
                data = Sum(data_points=numbers, aggregation_temporality=CUMULATIVE,
                           is_monotonic=defn.instrument == "counter")
        metrics.append(Metric(name=defn.otel_name, description=defn.help, unit=defn.unit, data=data))
    scope = InstrumentationScope("outrider", __version__)
    return MetricsData(resource_metrics=[ResourceMetrics(
        resource=resource, scope_metrics=[ScopeMetrics(scope=scope, metrics=metrics, schema_url="")],
        schema_url="")])


def quiet_sdk_logging(debug: bool) -> None:
    """The SDK logs every transient retry; Outrider counts failures and logs them itself, with backoff."""
    logging.getLogger("opentelemetry").setLevel(logging.DEBUG if debug else logging.CRITICAL)


class OtlpExporter:
    def __init__(self, config: Config, latest: Callable[[], list[Family]]) -> None:
        """latest: the latest sweep's families (the sampler's, wired by agent.py)."""
        self.config = config
        self.latest = latest
        self.results: dict[str, int] = {}
        self._cut_reason = ""  # why the current export's HTTP call was cut short (deadline, too_large), if it was
        self._inner = self._make_exporter()  # fails now, not in a background thread, if the protocol is missing
        self._resource = _resource(config)
        self._start_ns = time.time_ns()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0
        self._retry_at = 0.0

    def _make_exporter(self) -> Any:
        timeout = self.config.otlp_timeout_s
        if self.config.otlp_protocol == "grpc":
            try:
                from outrider.exporters.otlp_grpc import GrpcMetricExporter
            except ImportError as e:
                raise ConfigError(f"otlp_protocol 'grpc' needs the gRPC exporter: pip install 'outrider[grpc]' "
                                  f"({e})") from None
            return GrpcMetricExporter(self.config.otlp_endpoint, timeout, on_failure=self._cut_short)
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        from outrider.outbound import bounded_session

        endpoint = _http_endpoint(self.config.otlp_endpoint) if self.config.otlp_endpoint else None
        # otlp_timeout_s bounds the whole export (a peer answering a byte at a time) and the answer's size (a peer
        # answering a gigabyte): requests alone bounds each read and reads any body whole.
        session = bounded_session(timeout, on_failure=self._cut_short)
        return OTLPMetricExporter(endpoint=endpoint, timeout=timeout, session=session)

    def _cut_short(self, reason: str) -> None:
        self._cut_reason = reason

    def start(self) -> None:
        quiet_sdk_logging(self.config.log_level == "debug")
        self._thread = threading.Thread(target=self._loop, name="outrider-otlp", daemon=True)
        self._thread.start()
        LOG.info("OTLP export every %g s over %s", self.config.otlp_interval_s, self.config.otlp_protocol)

    def _loop(self) -> None:
        while not self._stop.wait(self.config.otlp_interval_s):
            if time.monotonic() < self._retry_at:
                self._count("skipped")
                continue
            self.export_once()

    def _count(self, result: str) -> None:
        self.results[result] = self.results.get(result, 0) + 1

    def families(self) -> list[Family]:
        """Export results so far, for the self collector."""
        fam = Family("outrider_agent_otlp_exports_total")
        for result, count in sorted(self.results.items()):
            fam.add(count, result)
        return [fam]

    def export_once(self, timeout_s: float | None = None) -> bool:
        """Export the latest sweep now. Never raises; returns whether the receiver took it."""
        families = self.latest()
        if not families:
            return False
        err: object = "endpoint refused or unreachable"
        self._cut_reason = ""
        try:
            data = to_metrics_data(families, self._resource, self._start_ns, time.time_ns())
            timeout_ms = 1000 * (timeout_s if timeout_s is not None else self.config.otlp_timeout_s)
            ok = self._inner.export(data, timeout_millis=timeout_ms) == MetricExportResult.SUCCESS
        except Exception as e:  # the export thread must never die
            LOG.debug("OTLP export raised", exc_info=True)
            ok, err = False, e
        if ok:
            if self._failures:
                LOG.info("OTLP export recovered after %d failed attempts", self._failures)
            self._failures = 0
            self._retry_at = 0.0
            self._count("success")
            return True
        self._failures += 1
        pause = min(MAX_BACKOFF_S, 2.0 ** min(self._failures, 16)) * random.uniform(0.5, 1.0)
        self._retry_at = time.monotonic() + pause
        if getattr(self._inner, "last_error", ""):  # the gRPC exporter says why
            err = self._inner.last_error
        if self._cut_reason == "deadline":
            err = f"no complete answer within otlp_timeout_s ({self.config.otlp_timeout_s:g} s)"
        elif self._cut_reason == "too_large":
            err = "the endpoint's answer was larger than 1 MiB: not read"
        self._count(self._cut_reason or "failure")
        if self._failures in (1, 10, 100) or self._failures % 1000 == 0:
            LOG.warning("OTLP export failed (%d in a row): %s; next attempt in %.0f s", self._failures, err, pause)
        return False

    def shutdown(self, timeout_s: float) -> None:
        """A final export of the latest sweep (even while backing off), then stop; bounded by timeout_s."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(0.0, min(1.0, deadline - time.monotonic())))
        self.export_once(timeout_s=max(0.1, deadline - time.monotonic()))
        try:
            self._inner.shutdown(timeout_millis=max(100.0, 1000 * (deadline - time.monotonic())))
        except Exception as e:
            LOG.warning("OTLP shutdown failed: %s", e)
