"""The application's own OpenTelemetry metrics, taken in on a local OTLP/HTTP receiver (opt-in).

A service that already has a MeterProvider points its OTLP exporter at the agent (`otlp_receiver_listen`, loopback
unless set otherwise, `POST /v1/metrics`, http/protobuf) and needs one pipeline, not two: its metrics leave through
the agent's /metrics and OTLP export beside the agent's own. What is taken in is the latest state per series:
cumulative sums and histograms as sent; deltas added up into cumulative ones; gauges and non-monotonic sums as
the last value. Names become the Prometheus names the OpenTelemetry Collector's Prometheus exporters write
(`prometheus_name`: its translator's full normalization, name by name), so a dashboard or rule written against a
Collector works against the agent unchanged; attributes become labels (keys with invalid characters to `_`), and the
resource's `service.name` becomes `service_name`. Summaries are left out, counted.

Exponential histograms keep their resolution where ours can hold it. Scales finer than the sketch's (5) are merged
into it exactly (a bucket at scale s lies inside one at scale 5: downscaling moves whole counts), and the series is
exported as the sketch (a native histogram on /metrics, an exponential histogram on OTLP), its classic side the count
and sum only: so an Outrider forwarding OTLP to another keeps its distributions bucket by bucket. A coarser scale's
buckets straddle ours, and splitting their counts would claim a resolution the sender never measured: such a series
(and one whose zero bucket is wider than ours, MIN_VALUE, or whose buckets lie outside the sketch's range) is kept as
a classic histogram at the sender's own bucket boundaries, its counts exact, its percentiles interpolated inside
buckets as wide as the sender chose; so is every series of a metric where one of them is. Points with negative
values are left out, counted (the sketch holds none, and a classic `le` bucket cannot hold an exponential one's
lower-closed negative range exactly). Delta points merge at the coarser of the two scales; a series past
MAX_EXPONENTIAL_BUCKETS buckets is downscaled until it fits, as OpenTelemetry's SDK does.

The server is the agent's bounded one (outrider/adapters/http_server.py), as for /metrics: a loop thread and
RECEIVER_LIMITS's fixed pool of workers, whatever the number of clients (a thread per connection took the agent from 40
MiB with one upload to 129 MiB with 10 and 296 MiB with 50); at most MAX_CONNECTIONS connections; a request head and
body within REQUEST_TIMEOUT_S of its first byte (enforced on the whole request, not on each read), a body of at most
MAX_BODY_BYTES (413), and the bodies of all connections held at once within MAX_BODIES_BYTES: an upload that finds
no room is answered 503 with Retry-After, which OTLP exporters retry. A client that leaves mid-request is counted
(each one printed a 19-line traceback), as is every other result, in outrider_otlp_receiver_requests_total{result}.

Bounds on what is taken in: the hook's series caps (hook_max_series_per_metric per metric, MAX_SERIES in all),
series not updated for STALE_S forgotten, and an exponential histogram point of at most MAX_EXPONENTIAL_BUCKETS
buckets, at a scale OpenTelemetry allows (-10 to 20), with bounds that are finite doubles (within 2**±MAX_EXPONENT).
Names the agent owns (`outrider_*`, the catalog's) are refused. Every refusal is logged once and counted in
outrider_collector_errors_total{collector="otlp_receiver"}; a malformed request gets 400 and changes nothing.
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from outrider.adapters.http_server import HttpServer, Limits, Request, Response
from outrider.collectors.base import Collector, CollectorContext
from outrider.metrics.catalog import CATALOG
from outrider.metrics.family import Family, HistogramValue
from outrider.metrics.foreign import ForeignDefinitions
from outrider.shared.sketch import MIN_VALUE, SCALE, Sketch, downscale

MAX_BODY_BYTES = 4 << 20
MAX_BODIES_BYTES = 4 * MAX_BODY_BYTES  # request bodies held at once, all clients together
MAX_CONNECTIONS = 64
REQUEST_TIMEOUT_S = 10.0
RECEIVER_LIMITS = Limits(workers=1, max_connections=MAX_CONNECTIONS, backlog=128, header_timeout_s=REQUEST_TIMEOUT_S,
                         idle_timeout_s=60.0, write_timeout_s=REQUEST_TIMEOUT_S, methods=("POST",),
                         max_body_bytes=MAX_BODY_BYTES, max_bodies_bytes=MAX_BODIES_BYTES)
# What the server answered itself, by status, as the receiver's request results
SERVER_RESULTS = {400: "bad_request", 405: "bad_request", 411: "bad_request", 413: "too_large", 431: "bad_request",
                  503: "busy"}
MAX_SERIES = 2_000
STALE_S = 300.0
# The Collector's Prometheus translator (opentelemetry-collector-contrib pkg/translator/prometheus, normalize_name.go
# as of commit 239be622, the `pkg.translator.prometheus.NormalizeName` gate on, its default): UCUM units as the
# Prometheus base-unit words, and the denominators of `per` units (`By/s` -> `bytes_per_second`). A unit not listed
# is its own word; `1` is none (a gauge in `1` is a ratio instead).
UNITS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds", "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes", "TiBy": "tibibytes",
    "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes",
    "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts", "g": "grams",
    "Cel": "celsius", "Hz": "hertz", "1": "", "%": "percent",
}
PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}
# A name's words: runs of ASCII letters and digits. The Collector splits at anything but a Unicode letter or digit,
# so it keeps `é` or `字` in a name; those are outside Prometheus's grammar (a scrape of the page would fail), so
# here they separate words like any other character (the one departure, and only for names the Collector would
# expose invalid).
_WORD = re.compile(r"[A-Za-z0-9]+")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]")
DELTA, CUMULATIVE = 1, 2  # AggregationTemporality
MAX_EXPONENTIAL_BUCKETS = 2_048  # a sketch's whole range is 1,597 buckets at scale 5
MIN_SCALE, MAX_SCALE = -10, 20  # OpenTelemetry's exponential histogram scales
MAX_EXPONENT = 1_000  # a bucket's bounds lie within 2**-MAX_EXPONENT .. 2**MAX_EXPONENT: finite doubles


def _unit_word(unit: str, words: dict[str, str]) -> str:
    """One side of a unit (`By` of `By/s`) as its Prometheus word: "" where blank or an annotation (`{packets}`)."""
    unit = unit.strip()
    if not unit or "{" in unit or "}" in unit:
        return ""
    return "_".join(_WORD.findall(words.get(unit, unit)))


def prometheus_name(name: str, unit: str, data: str, monotonic: bool = False) -> str:
    """An OpenTelemetry metric's Prometheus name as the Collector's translator writes it (UNITS' comment): the name's
    words joined by one `_` (invalid characters, leading, trailing and repeated underscores gone); the unit's word
    unless a word of the name already (`By` -> `bytes`), then `per` and the denominator's unless already one
    (`By/s` -> `bytes_per_second`); `total` last on a monotonic sum, `ratio` last on a gauge in `1` (each moved there
    from inside the name, never doubled); `_` before a leading digit. `data` is the OTLP point kind (`gauge`, `sum`,
    `histogram`, `exponential_histogram`, `summary`). "" where the name has no word at all."""
    words = _WORD.findall(name)
    main, _, per = unit.partition("/")
    main_word = _unit_word(main, UNITS)
    if main_word and main_word not in words:
        words.append(main_word)
    per_word = _unit_word(per, PER_UNITS)
    if per_word and per_word not in words:
        words += ["per", per_word]
    if data == "sum" and monotonic:
        words = [w for w in words if w != "total"] + ["total"]
    if unit == "1" and data == "gauge":  # not an up-down counter in `1`: the Collector's senders misuse `1` for counts
        words = [w for w in words if w != "ratio"] + ["ratio"]
    out = "_".join(words)
    return "_" + out if out[:1].isdigit() else out


def label_name(key: str) -> str:
    out = _INVALID_LABEL.sub("_", key) or "_"
    return "_" + out if out[0].isdigit() else out


@dataclass
class _Exponential:
    """An exponential histogram's buckets as taken in (at its scale, or 5 where it was finer)."""

    scale: int
    zero_threshold: float
    zero: int
    buckets: dict[int, int]  # OpenTelemetry's index at `scale` -> count, (2**(i/2**scale), 2**((i+1)/2**scale)]

    def at(self, scale: int) -> _Exponential:
        """The same counts at a coarser (or equal) scale, exactly."""
        return _Exponential(scale, self.zero_threshold, self.zero, downscale(self.buckets, self.scale - scale))

    def __add__(self, other: _Exponential) -> _Exponential:
        """Two points merged at the coarser scale, downscaled further while past MAX_EXPONENTIAL_BUCKETS."""
        scale = min(self.scale, other.scale)
        a, b = self.at(scale), other.at(scale)
        buckets = dict(a.buckets)
        for i, c in b.buckets.items():
            buckets[i] = buckets.get(i, 0) + c
        merged = _Exponential(scale, max(a.zero_threshold, b.zero_threshold), a.zero + b.zero, buckets)
        while len(merged.buckets) > MAX_EXPONENTIAL_BUCKETS and merged.scale > MIN_SCALE:
            merged = merged.at(merged.scale - 1)
        return merged

    @property
    def count(self) -> int:
        return self.zero + sum(self.buckets.values())

    def sketch(self) -> Sketch | None:
        """The sketch of these buckets, where one exists (the module's docstring)."""
        if not self.zero_threshold <= MIN_VALUE:
            return None
        return Sketch.at_scale(self.scale, self.zero, self.buckets)

    def classic(self) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """Classic bounds and per-bucket counts at the buckets' own boundaries: the zero bucket's threshold, then
        each occupied bucket's lower bound (where it is not the previous one's upper) and upper bound; exact."""
        bounds, counts = [self.zero_threshold], [self.zero]
        for i in sorted(self.buckets):
            lower, upper = _bound(i, self.scale), _bound(i + 1, self.scale)
            if upper <= bounds[-1]:  # inside the zero bucket (a sender's contradiction): its values are in it
                counts[-1] += self.buckets[i]
                continue
            if lower > bounds[-1]:
                bounds.append(lower)
                counts.append(0)
            bounds.append(upper)  # (a bucket straddling the zero threshold counts above it)
            counts.append(self.buckets[i])
        counts.append(0)  # +Inf
        return tuple(bounds), tuple(counts)


def _bound(i: int, scale: int) -> float:
    """The boundary between buckets i - 1 and i at a scale: 2**(i / 2**scale)."""
    return math.pow(2.0, math.ldexp(i, -scale))


def _exponent_ok(i: int, scale: int) -> bool:
    """Whether boundary i at a scale lies within 2**±MAX_EXPONENT (integers only: no overflow to check)."""
    return abs(i) <= (MAX_EXPONENT << scale) if scale >= 0 else (abs(i) << -scale) <= MAX_EXPONENT


def exponential_point(point: Any) -> _Exponential | str:
    """An ExponentialHistogramDataPoint's buckets, finer scales merged into the sketch's; or why it is left out."""
    scale = point.scale
    if not MIN_SCALE <= scale <= MAX_SCALE:
        return f"scale {scale}, outside {MIN_SCALE} to {MAX_SCALE}"
    positive, negative = point.positive.bucket_counts, point.negative.bucket_counts
    if len(positive) + len(negative) > MAX_EXPONENTIAL_BUCKETS:
        return f"{len(positive) + len(negative)} buckets, over {MAX_EXPONENTIAL_BUCKETS}"
    if any(negative):
        return "negative values"
    threshold = point.zero_threshold
    if not 0.0 <= threshold < math.inf:
        return f"zero threshold {threshold}"
    offset = point.positive.offset
    if not (_exponent_ok(offset, scale) and _exponent_ok(offset + len(positive), scale)):
        return f"buckets beyond 2**±{MAX_EXPONENT} (offset {offset} at scale {scale})"
    if point.zero_count + sum(positive) != point.count:
        return f"a count ({point.count}) that is not its buckets' ({point.zero_count + sum(positive)})"
    taken = _Exponential(scale, threshold, point.zero_count, {offset + k: c for k, c in enumerate(positive) if c})
    return taken.at(SCALE) if scale > SCALE else taken


@dataclass
class _Series:
    value: float = 0.0
    bounds: tuple[float, ...] = ()
    counts: list[float] | None = None
    exponential: _Exponential | None = None
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
        self._server: HttpServer | None = None
        self.requests: dict[str, int] = {}  # by result, those the handler answered: accepted, bad_request, too_large
        listen = ctx.config.otlp_receiver_listen
        if listen:
            self._start(listen)

    # --- the transport: the bounded server, and one request at a time ------------------------------------------
    @property
    def address(self) -> tuple[str, int] | None:
        return self._server.address if self._server is not None else None

    def _start(self, listen: str) -> None:
        host, _, port = listen.rpartition(":")
        host = host[1:-1] if host.startswith("[") else host  # an IPv6 address, [::1] (config.parse_listen's forms)
        self._server = HttpServer(host or "127.0.0.1", int(port), self._serve, limits=RECEIVER_LIMITS)
        self._server.start()
        self.log.info("OTLP/HTTP receiver for the application's metrics on http://%s:%d/v1/metrics",
                      *self._server.address)

    def _serve(self, request: Request) -> Response:
        status = self._receive(request)
        if status == 200:  # an empty ExportMetricsServiceResponse
            return Response(200, b"", (("Content-Type", "application/x-protobuf"),))
        return Response(status, b"bad request\n")

    def _count(self, result: str) -> None:
        with self._lock:
            self.requests[result] = self.requests.get(result, 0) + 1

    def _receive(self, request: Request) -> int:
        if request.path != "/v1/metrics":
            self._count("bad_request")
            return 404
        body = request.body  # whole, within MAX_BODY_BYTES and the request's time (the server's)
        if request.headers.get("content-encoding", "") == "gzip":
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
                self.drop("too_large", f"a request inflating to more than {MAX_BODY_BYTES} bytes")
                return 413
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        parsed = ExportMetricsServiceRequest()
        try:
            parsed.ParseFromString(body)
        except Exception as e:  # protobuf's DecodeError, or anything a hostile body provokes
            self._count("bad_request")
            self.drop("decode", f"a request that is not an OTLP ExportMetricsServiceRequest: {e}")
            return 400
        with self._lock:
            self._take(parsed)
        self._count("accepted")
        return 200

    def _requests_family(self, server: HttpServer) -> Family:
        """outrider_otlp_receiver_requests_total: the handler's results and what the server answered or closed
        itself."""
        results = dict(self.requests)
        for status, n in dict(server.refused).items():
            result = SERVER_RESULTS.get(status, "bad_request")
            results[result] = results.get(result, 0) + n
        results["aborted"] = server.aborted
        results["timed_out"] = server.timed_out
        results["evicted"] = server.evicted
        fam = Family("outrider_otlp_receiver_requests_total")
        for result in sorted(results):
            fam.add(results[result], result)
        return fam

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
        elif which in ("histogram", "exponential_histogram"):
            data = getattr(metric, which)
            kind, points, temporality = "histogram", data.data_points, data.aggregation_temporality
        else:
            self.drop(f"unsupported:{metric.name}", f"{metric.name}: {which} is not taken in")
            return
        name = prometheus_name(metric.name, metric.unit, which, which == "sum" and metric.sum.is_monotonic)
        if not name:
            self.drop(f"name:{metric.name}", f"{metric.name!r}: no letter or digit to make a Prometheus name of")
            return
        if name.startswith("outrider_") or name in CATALOG:
            self.drop(f"reserved:{name}", f"{name}: a name the agent owns; left out")
            return
        for point in points:
            v = 0.0
            if kind != "histogram":
                v = point.as_double if point.WhichOneof("value") == "as_double" else float(point.as_int)
                if not math.isfinite(v):  # before its series is made: one first sent as NaN was served as 0
                    continue
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
            if which == "exponential_histogram":
                self._exponential(s, point, temporality, name)
            elif kind == "histogram":
                self._histogram(s, point, temporality, name)
            else:
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
            s.bounds, s.counts, s.total, s.exponential = bounds, counts, point.sum, None

    def _exponential(self, s: _Series, point: Any, temporality: int, name: str) -> None:
        taken = exponential_point(point)
        if isinstance(taken, str):
            self.drop(f"exponential:{name}", f"{name}: an exponential histogram point with {taken}; left out")
            return
        if temporality == DELTA and s.exponential is not None:
            s.exponential, s.total = s.exponential + taken, s.total + point.sum
        else:
            s.exponential, s.total = taken, point.sum
        s.counts = None

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
                series = [(key, s) for key, s in sorted(m.series.items()) if m.kind != "histogram"
                          or s.exponential is not None or s.counts is not None]  # a refused first point: no data
                # the sketch for all of a metric's series or none: one kind of series per metric, as the exporters'
                sketches = [s.exponential.sketch() if s.exponential is not None else None for _, s in series]
                sketched = all(sketch is not None for sketch in sketches)
                for (key, s), sketch in zip(series, sketches):
                    if m.kind != "histogram":
                        fam.add(s.value, *key)
                    elif s.exponential is not None and sketched and sketch is not None:
                        fam.add(HistogramValue((), (sketch.count,), s.total, sketch), *key)
                    elif s.exponential is not None:
                        fam.add(HistogramValue(*s.exponential.classic(), s.total), *key)
                    elif s.counts is not None:
                        fam.add(HistogramValue(s.bounds, tuple(int(c) for c in s.counts), s.total), *key)
                out.append(fam)
            out.append(self._requests_family(self._server))
            return out

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


def _value(any_value: Any) -> str:
    which = any_value.WhichOneof("value")
    v = getattr(any_value, which) if which else ""
    return str(v)[:128] if not isinstance(v, bytes) else v.hex()[:128]
