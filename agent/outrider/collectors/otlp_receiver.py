"""The application's own OpenTelemetry metrics, taken in on a local OTLP/HTTP receiver (opt-in).

A service that already has a MeterProvider points its OTLP exporter at the agent (`otlp_receiver_listen`, loopback
unless set otherwise, `POST /v1/metrics`, http/protobuf) and needs one pipeline, not two: its metrics leave through
the agent's /metrics and OTLP export beside the agent's own. What is taken in is the latest state per series:
cumulative sums and histograms as sent; deltas added up into cumulative ones; gauges and non-monotonic sums as
the last value. Names become Prometheus names as the OpenTelemetry specification's compatibility rules say (invalid
characters to `_`, the unit as a suffix: `s` -> `_seconds`, `By` -> `_bytes`, `ms` -> `_milliseconds`, `1` on a
gauge -> `_ratio`; `_total` on monotonic sums); attributes become labels (keys sanitised the same way), and the
resource's `service.name` becomes `service_name`. Exponential histograms and summaries are left out, counted.

Bounds: a request body of at most MAX_BODY_BYTES, a request head and body within REQUEST_TIMEOUT_S, the hook's
series caps (hook_max_series_per_metric per metric, MAX_SERIES in all), and series not updated for STALE_S
forgotten. Names the agent owns (`outrider_*`, the catalog's) are refused. Every refusal is logged once and counted
in outrider_collector_errors_total{collector="otlp_receiver"}; a malformed request gets 400 and changes nothing.
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from outrider.collectors.base import Collector, CollectorContext
from outrider.metrics.catalog import CATALOG
from outrider.metrics.family import Family, HistogramValue
from outrider.metrics.foreign import ForeignDefinitions

if TYPE_CHECKING:  # http.server loads http.client, email and ssl: only when the receiver is turned on
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY_BYTES = 4 << 20
REQUEST_TIMEOUT_S = 10.0
MAX_SERIES = 2_000
STALE_S = 300.0
UNIT_SUFFIXES = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes"}
_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]")
DELTA, CUMULATIVE = 1, 2  # AggregationTemporality


def prometheus_name(name: str, unit: str, kind: str) -> str:
    """An OpenTelemetry instrument name and unit as a Prometheus metric name."""
    out = _INVALID.sub("_", name).strip("_") or "_"
    if out[0].isdigit():
        out = "_" + out
    suffix = UNIT_SUFFIXES.get(unit) or ("ratio" if unit == "1" and kind == "gauge" else "")
    if suffix and not out.endswith("_" + suffix):
        out += "_" + suffix
    if kind == "counter" and not out.endswith("_total"):
        out += "_total"
    return out


def label_name(key: str) -> str:
    out = _INVALID_LABEL.sub("_", key) or "_"
    return "_" + out if out[0].isdigit() else out


@dataclass
class _Series:
    value: float = 0.0
    bounds: tuple[float, ...] = ()
    counts: list[float] | None = None
    total: float = 0.0
    seen: float = 0.0  # monotonic time of the last update


class _Metric:
    def __init__(self, kind: str, help_text: str, labels: tuple[str, ...]) -> None:
        self.kind = kind
        self.help = help_text
        self.labels = labels
        self.series: dict[tuple[str, ...], _Series] = {}


class OtlpReceiverCollector(Collector):
    name = "otlp_receiver"
    description = "the application's own OpenTelemetry metrics, pushed to a local OTLP/HTTP receiver (opt-in)"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self._per_metric = ctx.config.hook_max_series_per_metric
        self._lock = threading.Lock()
        self._metrics: dict[str, _Metric] = {}
        self._defs = ForeignDefinitions(self.name, "A metric of the application's own OpenTelemetry instrumentation.")
        self._server: ThreadingHTTPServer | None = None
        self.requests: dict[str, int] = {}  # by result: accepted, bad_request, too_large
        listen = ctx.config.otlp_receiver_listen
        if listen:
            self._start(listen)

    @property
    def address(self) -> tuple[str, int] | None:
        return self._server.server_address[:2] if self._server is not None else None  # type: ignore[return-value]

    def _start(self, listen: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        host, _, port = listen.rpartition(":")
        collector = self

        class Handler(BaseHTTPRequestHandler):
            timeout = REQUEST_TIMEOUT_S  # each read of the head and the body
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                status = collector._receive(self)
                self.send_response(status)
                body = b"" if status == 200 else b"bad request"
                self.send_header("Content-Type", "application/x-protobuf" if status == 200 else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer((host.strip("[]") or "127.0.0.1", int(port)), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="outrider-otlp-receiver", daemon=True).start()
        self.log.info("OTLP/HTTP receiver for the application's metrics on http://%s:%d/v1/metrics",
                      *self._server.server_address[:2])

    def _count(self, result: str) -> None:
        self.requests[result] = self.requests.get(result, 0) + 1

    def _receive(self, handler: BaseHTTPRequestHandler) -> int:
        if handler.path.split("?", 1)[0] != "/v1/metrics":
            return 404
        try:
            length = int(handler.headers.get("Content-Length", ""))
        except ValueError:
            self._count("bad_request")
            return 411
        if not 0 <= length <= MAX_BODY_BYTES:
            self._count("too_large")
            self.drop("too_large", f"a request of {length} bytes, over {MAX_BODY_BYTES}")
            return 413
        body = handler.rfile.read(length)
        if handler.headers.get("Content-Encoding", "") == "gzip":
            import gzip
            import io
            import zlib

            try:  # read to the cap only: a small body may inflate to gigabytes
                body = gzip.GzipFile(fileobj=io.BytesIO(body)).read(MAX_BODY_BYTES + 1)
            except (OSError, EOFError, zlib.error):
                self._count("bad_request")
                return 400
            if len(body) > MAX_BODY_BYTES:
                self._count("too_large")
                return 413
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        request = ExportMetricsServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception as e:  # protobuf's DecodeError, or anything a hostile body provokes
            self._count("bad_request")
            self.drop("decode", f"a request that is not an OTLP ExportMetricsServiceRequest: {e}")
            return 400
        with self._lock:
            self._take(request)
        self._count("accepted")
        return 200

    # --- taking in -----------------------------------------------------------------------------------------------
    def _take(self, request: Any) -> None:
        now = time.monotonic()
        for rm in request.resource_metrics:
            resource = {kv.key: _value(kv.value) for kv in rm.resource.attributes}
            service = resource.get("service.name", "")
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    self._metric(metric, service, now)

    def _metric(self, metric: Any, service: str, now: float) -> None:
        which = metric.WhichOneof("data")
        if which == "sum":
            kind = "counter" if metric.sum.is_monotonic else "gauge"
            points, temporality = metric.sum.data_points, metric.sum.aggregation_temporality
        elif which == "gauge":
            kind, points, temporality = "gauge", metric.gauge.data_points, CUMULATIVE
        elif which == "histogram":
            kind, points, temporality = "histogram", metric.histogram.data_points, \
                metric.histogram.aggregation_temporality
        else:
            self.drop(f"unsupported:{metric.name}", f"{metric.name}: {which} is not taken in")
            return
        name = prometheus_name(metric.name, metric.unit, kind)
        if name.startswith("outrider_") or name in CATALOG:
            self.drop(f"reserved:{name}", f"{name}: a name the agent owns; left out")
            return
        for point in points:
            attrs = {label_name(kv.key): _value(kv.value) for kv in point.attributes}
            if service:
                attrs.setdefault("service_name", service)
            names = tuple(sorted(attrs))
            m = self._metrics.get(name)
            if m is None:
                m = self._metrics[name] = _Metric(kind, metric.description, names)
            if m.kind != kind or m.labels != names:
                self.drop(f"shape:{name}", f"{name}: sent with two kinds or label sets; the first is kept")
                continue
            key = tuple(attrs[n] for n in names)
            s = m.series.get(key)
            if s is None:
                if len(m.series) >= self._per_metric or self._series_count() >= MAX_SERIES:
                    self.drop(f"cap:{name}", f"{name}: past the series cap ({self._per_metric} per metric, "
                                             f"{MAX_SERIES} in all)")
                    continue
                s = m.series[key] = _Series()
            s.seen = now
            if kind == "histogram":
                self._histogram(s, point, temporality, name)
            else:
                v = point.as_double if point.WhichOneof("value") == "as_double" else float(point.as_int)
                if not math.isfinite(v):
                    continue
                s.value = s.value + v if (kind == "counter" and temporality == DELTA) else v

    def _histogram(self, s: _Series, point: Any, temporality: int, name: str) -> None:
        bounds = tuple(point.explicit_bounds)
        counts = [float(c) for c in point.bucket_counts]
        if len(counts) != len(bounds) + 1 or list(bounds) != sorted(bounds):
            self.drop(f"histogram:{name}", f"{name}: bucket counts do not match the bounds")
            return
        if temporality == DELTA and s.counts is not None and s.bounds == bounds:
            s.counts = [a + b for a, b in zip(s.counts, counts, strict=True)]
            s.total += point.sum
        else:
            s.bounds, s.counts, s.total = bounds, counts, point.sum

    def _series_count(self) -> int:
        return sum(len(m.series) for m in self._metrics.values())

    # --- exporting -------------------------------------------------------------------------------------------------
    def collect(self) -> list[Family]:
        if self._server is None:
            return []
        cutoff = time.monotonic() - STALE_S
        with self._lock:
            out = []
            emitted: set[str] = set()
            for name in sorted(self._metrics):
                m = self._metrics[name]
                for key in [k for k, s in m.series.items() if s.seen < cutoff]:
                    del m.series[key]
                if not m.series:
                    continue
                fam = Family(self._defs.get(name, m.kind, m.labels, m.help, drop=self.drop))
                if fam.defn.name in emitted:  # `up` renamed exported_up beside a metric of that name
                    continue
                emitted.add(fam.defn.name)
                for key, s in sorted(m.series.items()):
                    if m.kind == "histogram":
                        if s.counts is not None:
                            fam.add(HistogramValue(s.bounds, tuple(int(c) for c in s.counts), s.total), *key)
                    else:
                        fam.add(s.value, *key)
                out.append(fam)
            return out

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _value(any_value: Any) -> str:
    which = any_value.WhichOneof("value")
    v = getattr(any_value, which) if which else ""
    return str(v)[:128] if not isinstance(v, bytes) else v.hex()[:128]
