"""OTLP push (http/protobuf; gRPC with the 'grpc' extra), on the OpenTelemetry SDK's HTTP exporter and encoding.

Each sweep's families are converted at export time into the SDK's MetricsData, under the catalog's
OpenTelemetry names, units and attribute names: counters as cumulative monotonic sums, gauges as gauges, the
distributions recorded as sketches (durations: outrider/shared/sketch.py) as cumulative exponential histograms at scale
5, their recorded resolution, and other histograms as cumulative explicit-bucket ones (the SDK's instruments offer no
asynchronous histogram, so the agent builds the data points itself and hands them to the SDK's OTLP/HTTP exporter,
or over gRPC to outrider.exporters.otlp_grpc, which encodes them as the SDK does and sends them without grpcio).
A metric is one or the other, never both (one name, one type: a second stream of the same name would conflict);
otlp_histogram_aggregation (OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION) explicit_bucket_histogram
exports the classic buckets instead, for a pipeline that takes no exponential histograms.

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
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
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

from outrider.ground.config import Config, ConfigError, k8s_identity, redact_url_password
from outrider.metrics.catalog import MetricDef, otlp_attributes
from outrider.metrics.family import Family, HistogramValue
from outrider.shared.sketch import SCALE, Sketch
from outrider.shared.version import __version__

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


def _exponential_point(attributes: dict[str, Any], start_ns: int, now_ns: int, h: HistogramValue,
                       sketch: Sketch) -> ExponentialHistogramDataPoint:
    """A histogram as its sketch: scale 5, the zero bucket's count (values at or below a nanosecond: rounded to
    zero, as the protocol's zero_threshold 0 allows), the positive buckets from the first to the last non-empty one
    (the sketch's bucket index is the protocol's), the exact sum; min and max are not recorded, so left unset."""
    indices = sorted(sketch.buckets)
    offset = indices[0] if indices else 0
    counts = [0] * (indices[-1] - offset + 1) if indices else []
    for i in indices:
        counts[i - offset] = sketch.buckets[i]
    return ExponentialHistogramDataPoint(
        attributes=attributes, start_time_unix_nano=start_ns, time_unix_nano=now_ns, count=sketch.count, sum=h.sum,
        scale=SCALE, zero_count=sketch.zero, positive=Buckets(offset, counts), negative=Buckets(0, []), flags=0,
        min=None, max=None)  # type: ignore[arg-type]  # unknown: left unset in the protobuf


def to_metrics_data(families: list[Family], resource: Resource, start_ns: int, now_ns: int,
                    exponential: bool = True) -> MetricsData:
    """One sweep as OTLP data: one Metric per metric name, its samples as data points. Samples that map to the same
    attributes (the kernel's irq and softirq as cpu.mode "interrupt") are summed into one point. With `exponential`,
    a histogram metric whose every point has its sketch is an exponential histogram, others explicit-bucket."""
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
                points[key] = have + value  # the sketches merged too where both have one
            elif not isinstance(value, HistogramValue) and not isinstance(have, HistogramValue):
                points[key] = have + value
    metrics = []
    for defn, points in by_name.values():
        data: Any
        histograms = [(key, h) for key, h in points.items() if isinstance(h, HistogramValue)]
        if defn.instrument == "histogram" and exponential and histograms and all(h.sketched for _, h in histograms):
            data = ExponentialHistogram(data_points=[
                _exponential_point(dict(key), start_ns, now_ns, h, h.sketch) for key, h in histograms
                if h.sketch is not None], aggregation_temporality=CUMULATIVE)
        elif defn.instrument == "histogram":
            data = Histogram(data_points=[HistogramDataPoint(
                attributes=dict(key), start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                count=h.count, sum=h.sum, bucket_counts=list(h.counts), explicit_bounds=list(h.bounds),
                min=None, max=None)  # type: ignore[arg-type]  # unknown: left unset in the protobuf
                for key, h in histograms], aggregation_temporality=CUMULATIVE)
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


# The final export's bound when the endpoint is failing or was never reached: one attempt, no retries. A run that
# ends must not wait out otlp_timeout_s and the SDK's retries on an endpoint that is not there (5.4 s measured on
# every `outrider run` with an unreachable one, before this bound).
FINAL_EXPORT_BOUND_S = 1.0
FAILED = ("failure", "deadline", "too_large")  # the export results that are failures


def shown_endpoint(config: Config, env: Mapping[str, str] | None = None) -> str:
    """Where the exports go, as the exporter resolves it, for messages (a password in it hidden)."""
    env = os.environ if env is None else env
    if config.otlp_protocol == "grpc":
        url = config.otlp_endpoint or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") \
            or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4317"
    elif config.otlp_endpoint:
        url = _http_endpoint(config.otlp_endpoint)
    elif env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):  # the SDK takes it as it is
        url = env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"]
    else:
        url = _http_endpoint(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318")
    return redact_url_password(url)


class OtlpExporter:
    def __init__(self, config: Config, latest: Callable[[], list[Family]]) -> None:
        """latest: the latest sweep's families (the sampler's, wired by wiring/agent.py)."""
        self.config = config
        self.latest = latest
        self.results: dict[str, int] = {}
        self.endpoint = shown_endpoint(config)
        self._cut_reason = ""  # why the current export's HTTP call was cut short (deadline, too_large), if it was
        self._error = ""  # why the current export's HTTP call failed, if it did
        self.last_error = ""  # why the last failed export failed
        # fails now, not in a background thread, if the protocol is missing
        self._inner = self._make_exporter(config.otlp_timeout_s)
        self._resource = _resource(config)
        self._exponential = config.otlp_histogram_aggregation == "base2_exponential_bucket_histogram"
        self._start_ns = time.time_ns()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._last_ok = False  # the last export got through (False before the first)

    def _make_exporter(self, timeout: float) -> Any:
        """An exporter whose every export is bounded by timeout, its retries (the SDK's) included."""
        if self.config.otlp_protocol == "grpc":
            try:
                from outrider.exporters.otlp_grpc import GrpcMetricExporter
            except ImportError as e:
                raise ConfigError(f"otlp_protocol 'grpc' needs the gRPC exporter: pip install 'outrider[grpc]' "
                                  f"({e})") from None
            return GrpcMetricExporter(self.config.otlp_endpoint, timeout, on_failure=self._cut_short)
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        from outrider.adapters.outbound import bounded_session

        endpoint = _http_endpoint(self.config.otlp_endpoint) if self.config.otlp_endpoint else None
        # timeout bounds the whole export (a peer answering a byte at a time) and the answer's size (a peer
        # answering a gigabyte): requests alone bounds each read and reads any body whole.
        session = bounded_session(timeout, on_failure=self._cut_short, on_error=self._failed_because)
        return OTLPMetricExporter(endpoint=endpoint, timeout=timeout, session=session)

    def _cut_short(self, reason: str) -> None:
        self._cut_reason = reason

    def _failed_because(self, why: str) -> None:
        self._error = why

    def start(self) -> None:
        quiet_sdk_logging(self.config.log_level == "debug")
        self._thread = threading.Thread(target=self._loop, name="outrider-otlp", daemon=True)
        self._thread.start()
        LOG.info("OTLP export to %s every %g s over %s", self.endpoint, self.config.otlp_interval_s,
                 self.config.otlp_protocol)

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

    def export_once(self) -> bool:
        """Export the latest sweep now. Never raises; returns whether the receiver took it. A failure is said at the
        1st, 10th, 100th and every 1000th in a row; the attempts after it back off."""
        ok = self._export(self._inner, self.config.otlp_timeout_s)
        if ok is None:
            return False
        if ok:
            if self._failures:
                LOG.info("OTLP export to %s recovered after %d failed attempts", self.endpoint, self._failures)
            self._failures = 0
            self._retry_at = 0.0
            return True
        self._failures += 1
        pause = min(MAX_BACKOFF_S, 2.0 ** min(self._failures, 16)) * random.uniform(0.5, 1.0)
        self._retry_at = time.monotonic() + pause
        if self._failures in (1, 10, 100) or self._failures % 1000 == 0:
            LOG.warning("OTLP export to %s failed (%d in a row): %s; next attempt in %.0f s", self.endpoint,
                        self._failures, self.last_error, pause)
        return False

    def _export(self, exporter: Any, timeout_s: float) -> bool | None:
        """One export of the latest sweep through `exporter` (made with timeout_s), counted by result; None when
        there is nothing yet."""
        families = self.latest()
        if not families:
            return None
        self._cut_reason = self._error = ""
        err: object = "the endpoint refused it or is unreachable"
        try:
            data = to_metrics_data(families, self._resource, self._start_ns, time.time_ns(), self._exponential)
            ok = exporter.export(data) == MetricExportResult.SUCCESS
        except Exception as e:  # the export thread must never die
            LOG.debug("OTLP export raised", exc_info=True)
            ok, err = False, e
        self._last_ok = ok
        if ok:
            self._count("success")
            return True
        if getattr(exporter, "last_error", ""):  # the gRPC exporter says why
            err = exporter.last_error
        elif self._error:  # the HTTP exporter's session did
            err = self._error
        if self._cut_reason == "deadline":
            err = f"no complete answer within {timeout_s:.2g} s"
        elif self._cut_reason == "too_large":
            err = "the endpoint's answer was larger than 1 MiB: not read"
        self.last_error = str(err)
        self._count(self._cut_reason or "failure")
        return False

    def shutdown(self, timeout_s: float) -> None:
        """A final export of the latest sweep (even while backing off), then stop; bounded by timeout_s, and by
        FINAL_EXPORT_BOUND_S unless the last export got through (the endpoint failing or never reached: one
        attempt). Failures of the agent's life are said here once: where to, why, how many."""
        bound = timeout_s if self._last_ok else min(timeout_s, FINAL_EXPORT_BOUND_S)
        deadline = time.monotonic() + bound
        self._stop.set()
        self._close(self._inner)  # ends the periodic export's retries, if it is in one
        if self._thread is not None:
            self._thread.join(max(0.0, bound / 4))
        final_s = max(0.1, deadline - time.monotonic())
        final = self._make_exporter(final_s)
        ok = self._export(final, final_s)
        self._close(final)
        failed = sum(self.results.get(r, 0) for r in FAILED)
        attempts = failed + self.results.get("success", 0)
        if ok is False:
            LOG.warning("OTLP export to %s failed: %s (%d of %d exports failed, the final one included)",
                        self.endpoint, self.last_error, failed, attempts)
        elif failed:
            LOG.warning("OTLP export to %s: %d of %d exports failed (the last failure: %s); the final one got "
                        "through", self.endpoint, failed, attempts, self.last_error)

    def _close(self, exporter: Any) -> None:
        try:
            exporter.shutdown(timeout_millis=100.0)
        except Exception as e:
            LOG.debug("OTLP exporter shutdown failed: %s", e)

