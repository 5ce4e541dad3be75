"""OTLP push through the OpenTelemetry SDK (http/protobuf; gRPC with the 'grpc' extra).

Each catalog metric becomes an observable instrument whose callback reads the sampler's latest sweep, under its
OpenTelemetry name, unit and attribute names. The standard variables are honoured: OTEL_EXPORTER_OTLP_ENDPOINT /
_METRICS_ENDPOINT, _HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE (read by the SDK's exporter),
OTEL_EXPORTER_OTLP_PROTOCOL and OTEL_METRIC_EXPORT_INTERVAL (read into the config), OTEL_SERVICE_NAME and
OTEL_RESOURCE_ATTRIBUTES (read by the SDK's Resource), and OTEL_METRICS_EXPORTER=none turns export off.

An unreachable endpoint is never fatal: a failed export is counted and the next attempts back off exponentially
(with jitter) up to a ceiling. Counters are cumulative, so the first export that gets through carries everything.
This module imports the SDK; the agent imports this module only when OTLP export is on (config.otlp_enabled),
keeping the default agent small.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from outrider import __version__
from outrider.config import Config, ConfigError
from outrider.metrics.catalog import MetricDef, definitions
from outrider.metrics.family import Family
from outrider.sampler import Sampler

LOG = logging.getLogger("outrider.exporters.otlp")
MAX_BACKOFF_S = 300.0


def _http_endpoint(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith("/v1/metrics") else base + "/v1/metrics"


def _attributes(defn: MetricDef, values: tuple[str, ...]) -> dict[str, str | int]:
    out: dict[str, str | int] = {}
    for label, value in zip(defn.labels, values):
        out[label.otel] = int(value) if label.otel == "process.pid" and value.isdigit() else value
    return out


def _resource() -> Resource:
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win; Outrider fills in only what they leave unset."""
    detected = Resource.create()
    attrs = detected.attributes
    defaults: dict[str, str] = {}
    if str(attrs.get("service.name", "unknown_service")).startswith("unknown_service"):
        defaults["service.name"] = "outrider"
    if "service.version" not in attrs:
        defaults["service.version"] = __version__
    if "host.name" not in attrs:
        defaults["host.name"] = socket.gethostname()
    return detected.merge(Resource(defaults))


def quiet_sdk_logging(debug: bool) -> None:
    """The SDK logs every transient retry; Outrider counts failures and logs them itself, with backoff."""
    logging.getLogger("opentelemetry").setLevel(logging.DEBUG if debug else logging.CRITICAL)


class OtlpExporter:
    def __init__(self, config: Config, sampler: Sampler) -> None:
        self.config = config
        self.sampler = sampler
        self._latest: dict[str, list[Family]] = {}
        self._lock = threading.Lock()
        self._provider: Any = None
        self._exporter: _BackoffExporter | None = None
        self._inner = self._make_exporter()  # fails now, not in a background thread, if the protocol is missing
        sampler.listeners.append(self._on_sweep)

    def _on_sweep(self, families: list[Family]) -> None:
        latest: dict[str, list[Family]] = {}
        for fam in families:
            latest.setdefault(fam.defn.name, []).append(fam)
        with self._lock:
            self._latest = latest

    def _observe(self, defn: MetricDef) -> Iterable[Any]:
        with self._lock:
            fams = self._latest.get(defn.name, [])
        for fam in fams:
            for values, value in fam.samples:
                yield Observation(value, _attributes(defn, values))

    def _make_exporter(self) -> Any:
        timeout = self.config.otlp_timeout_s
        if self.config.otlp_protocol == "grpc":
            try:
                from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                    OTLPMetricExporter as GrpcExporter,
                )
            except ImportError as e:
                raise ConfigError(f"otlp_protocol 'grpc' needs the gRPC exporter: pip install 'outrider[grpc]' "
                                  f"({e})") from None
            return GrpcExporter(endpoint=self.config.otlp_endpoint or None, timeout=timeout)
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        endpoint = _http_endpoint(self.config.otlp_endpoint) if self.config.otlp_endpoint else None
        return OTLPMetricExporter(endpoint=endpoint, timeout=timeout)

    def start(self) -> None:
        quiet_sdk_logging(self.config.log_level == "debug")
        self._exporter = exporter = _BackoffExporter(self._inner, self.sampler)
        reader = PeriodicExportingMetricReader(
            exporter, export_interval_millis=self.config.otlp_interval_s * 1000,
            export_timeout_millis=self.config.otlp_timeout_s * 1000)
        self._provider = MeterProvider(metric_readers=[reader], resource=_resource(), shutdown_on_exit=False)
        meter = self._provider.get_meter("outrider", __version__)
        enabled = {type(c).name for c in self.sampler.collectors}
        for defn in definitions():
            if defn.collector not in enabled:
                continue

            def callback(options: CallbackOptions, defn: MetricDef = defn) -> Iterable[Any]:
                return list(self._observe(defn))

            make = meter.create_observable_counter if defn.type == "counter" else meter.create_observable_gauge
            make(defn.otel_name, callbacks=[callback], unit=defn.unit, description=defn.help)
        LOG.info("OTLP export every %.0f s over %s", self.config.otlp_interval_s, self.config.otlp_protocol)

    def shutdown(self, timeout_s: float) -> None:
        """Final export of the latest sweep, then stop; bounded by timeout_s."""
        if self._provider is None:
            return
        provider, self._provider = self._provider, None
        if self._exporter is not None:
            self._exporter.final = True  # the last flush is attempted even while backing off
        try:
            provider.force_flush(timeout_millis=timeout_s * 1000)
        except Exception as e:  # never let a flush failure block shutdown
            LOG.warning("final OTLP flush failed: %s", e)
        try:
            provider.shutdown(timeout_millis=max(100.0, timeout_s * 1000))
        except Exception as e:
            LOG.warning("OTLP shutdown failed: %s", e)


class _BackoffExporter(MetricExporter):
    """Counts every attempt by result and, after a failure, skips exports for an exponentially growing,
    jittered pause (the SDK's reader would otherwise retry a dead endpoint every interval)."""

    def __init__(self, inner: Any, sampler: Sampler) -> None:
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self._inner = inner
        self._stats = sampler.stats
        self._failures = 0
        self._retry_at = 0.0
        self.final = False

    def _count(self, result: str) -> None:
        self._stats.otlp_results[result] = self._stats.otlp_results.get(result, 0) + 1

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        if time.monotonic() < self._retry_at and not self.final:
            self._count("skipped")
            return MetricExportResult.FAILURE
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis)
        except Exception as e:  # the exporter must never take the reader thread down
            LOG.debug("OTLP export raised", exc_info=True)
            result = MetricExportResult.FAILURE
            err: object = e
        else:
            err = "endpoint refused or unreachable"
        if result == MetricExportResult.SUCCESS:
            if self._failures:
                LOG.info("OTLP export recovered after %d failed attempts", self._failures)
            self._failures = 0
            self._retry_at = 0.0
            self._count("success")
            return result
        self._failures += 1
        pause = min(MAX_BACKOFF_S, 2.0 ** min(self._failures, 16)) * random.uniform(0.5, 1.0)
        self._retry_at = time.monotonic() + pause
        self._count("failure")
        if self._failures in (1, 10, 100) or self._failures % 1000 == 0:
            LOG.warning("OTLP export failed (%d in a row): %s; next attempt in %.0f s", self._failures, err, pause)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return bool(self._inner.force_flush(timeout_millis=timeout_millis))

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)
