"""A workload's own Prometheus endpoint, scraped on loopback every sweep (opt-in).

A service that serves its metrics itself (prometheus_client's start_http_server or make_wsgi_app, a Go or Java
client, an inference server's /metrics) keeps its endpoint and needs no second scrape target: the agent reads it
each sweep and exports what it serves beside its own series, on /metrics and OTLP. The port is the configuration's
`workload_metrics_port`, else the pod's annotation `outrider.dev/metrics-port` (with `outrider.dev/metrics-path`
for another path than /metrics), read every sweep from the Downward API file the chart mounts for the sidecar
(`pod_annotations_file`), so a changed annotation takes effect without a restart. An Outrider annotation rather
than `prometheus.io/scrape`: a cluster's Prometheus that scrapes annotated pods itself would get every series twice.

Bounded like every outbound call (outrider/outbound.py): the whole scrape (connect, request, every byte of the
answer) within collector_timeout_s, so a workload that answers a byte at a time is cut off; an answer of at most
MAX_BODY_BYTES, read no further; loopback only (127.0.0.1: the pod's own network namespace for a sidecar), plain
HTTP, no redirect followed, no compression asked for. A scrape that fails (refused, cut off, too large, not 200)
fails the collector for that sweep: the workload's series are absent and
outrider_collector_success{collector="workload_metrics"} is 0, Prometheus's `up` for it.

The page is read line by line (metrics/text_format.py): a malformed line costs that line, counted in
outrider_collector_errors_total{collector="workload_metrics"}. Counters, gauges, untyped metrics (as gauges) and
histograms are exported; summaries (quantiles no one can merge or send on OTLP as such) and OpenMetrics' other
types are left out, counted. A family's samples that leave a label out have it empty (as Prometheus reads an
absent label). Names the agent owns (`outrider_*`, the catalog's) are refused, and the hook's caps apply
(hook_max_series_per_metric per metric, MAX_SERIES in all: metrics/foreign.py).
"""

from __future__ import annotations

import math

from outrider import outbound
from outrider.collectors.base import Collector, CollectorContext
from outrider.config import CONVERTERS
from outrider.k8s.downward import read_annotations
from outrider.metrics import text_format
from outrider.metrics.family import Family
from outrider.metrics.foreign import ForeignDefinitions, ForeignMetric
from outrider.version import __version__

MAX_BODY_BYTES = 8 << 20
HOST = "127.0.0.1"
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
PORT_ANNOTATION = "outrider.dev/metrics-port"
PATH_ANNOTATION = "outrider.dev/metrics-path"


class ScrapeError(OSError):
    """The workload's endpoint gave no page: the collector fails for this sweep (its `up` is 0)."""


class WorkloadMetricsCollector(Collector):
    name = "workload_metrics"
    description = "a workload's own Prometheus /metrics endpoint, scraped on loopback (workload_metrics_port)"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        config = ctx.config
        self._configured = (config.workload_metrics_port, config.workload_metrics_path)
        self._annotations_file = config.pod_annotations_file
        self._port, self._path = self._configured
        self._timeout_s = config.collector_timeout_s
        self._per_metric = config.hook_max_series_per_metric
        self._defs = ForeignDefinitions(self.name, "A metric of the workload's own /metrics endpoint.")
        self._connection: type | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self._port}{self._path}"

    def _target(self) -> tuple[int, str]:
        """The configured endpoint, else the one the pod's annotations name now; port 0: none."""
        if self._configured[0] or not self._annotations_file:
            return self._configured
        try:
            annotations = read_annotations(self._annotations_file)
        except (OSError, ValueError) as e:
            self.drop("annotations", f"{self._annotations_file}: {e}")
            return 0, ""
        port = annotations.get(PORT_ANNOTATION, "")
        if not port:
            return 0, ""
        try:
            # checked as the configuration's keys are
            return (CONVERTERS["workload_metrics_port"](port),
                    CONVERTERS["workload_metrics_path"](annotations.get(PATH_ANNOTATION, "")))
        except ValueError as e:
            self.drop("annotation", f"annotations {PORT_ANNOTATION}={port!r} / {PATH_ANNOTATION}: expected {e}")
            return 0, ""

    def collect(self) -> list[Family]:
        self._port, self._path = self._target()
        if not self._port:
            return []
        page = text_format.parse(self.scrape())
        if page.bad_lines:
            self.drop("line", f"{self.url}: {page.bad_lines} malformed lines left out ({'; '.join(page.errors)})")
        metrics: dict[str, ForeignMetric] = {}
        for fam in text_format.families(page):
            self._take(metrics, fam)
        return self._defs.families(metrics, self._per_metric, self.drop)

    def scrape(self) -> str:
        """The page, whole, within the deadline and the size cap; ScrapeError (an OSError) otherwise."""
        import http.client  # only once a scrape is configured: an agent on its defaults loads no HTTP client

        if self._connection is None:
            self._connection = outbound.connection_classes()[0]
        with outbound.Deadline(self._timeout_s) as deadline:
            conn = self._connection(HOST, self._port, timeout=self._timeout_s)
            try:
                conn.request("GET", self._path, headers={"Accept": ACCEPT, "Accept-Encoding": "identity",
                                                         "User-Agent": f"outrider/{__version__}"})
                response = conn.getresponse()
                if response.status != 200:
                    raise ScrapeError(f"{self.url} answered HTTP {response.status}")
                body = outbound.read_capped(response.read, MAX_BODY_BYTES)
            except outbound.ResponseTooLarge:
                raise ScrapeError(f"{self.url}: a page larger than {MAX_BODY_BYTES} bytes; not read") from None
            except ScrapeError:
                raise
            except (OSError, ValueError, http.client.HTTPException) as e:
                if deadline.expired:
                    raise ScrapeError(f"{self.url}: no complete answer within collector_timeout_s "
                                      f"({self._timeout_s:g} s)") from None
                raise ScrapeError(f"{self.url}: {e or type(e).__name__}") from None
            finally:
                conn.close()
        return body.decode("utf-8", "replace")

    def _take(self, metrics: dict[str, ForeignMetric], fam: text_format.ParsedFamily) -> None:
        kind = {"counter": "counter", "gauge": "gauge", "untyped": "gauge", "unknown": "gauge",
                "histogram": "histogram"}.get(fam.type)
        if kind is None:
            self.drop(f"type:{fam.name}", f"{fam.name}: a {fam.type}, which the agent does not export; left out")
            return
        family = fam.name[:-len("_total")] if kind == "counter" and fam.name.endswith("_total") else fam.name
        # A family's OpenMetrics creation time is not a value of it (a 0.0.4 page's `x_created` gauges are theirs)
        samples = [s for s in fam.samples if s.name != f"{family}_created"]
        names = tuple(sorted({n for s in samples for n in s.labels} - ({"le"} if kind == "histogram" else set())))
        m = metrics[family] = ForeignMetric(kind, fam.help, names)
        if kind != "histogram":
            for s in samples:
                m.values[tuple(s.labels.get(n, "") for n in names)] = s.value
            return
        cumulative: dict[tuple[str, ...], dict[float, float]] = {}
        for s in samples:
            labels = tuple(s.labels.get(n, "") for n in names)
            if s.name == f"{fam.name}_bucket":
                try:
                    bound = float(s.labels.get("le", ""))
                except ValueError:
                    self.drop(f"bucket:{fam.name}", f"{fam.name}: bucket bound {s.labels.get('le')!r}")
                    continue
                cumulative.setdefault(labels, {})[bound] = s.value
            elif s.name == f"{fam.name}_sum":
                m.sums[labels] = s.value
        for labels, buckets in cumulative.items():
            own = _own_counts(buckets)
            if own is None:
                self.drop(f"bucket:{fam.name}", f"{fam.name}: buckets without +Inf, or not cumulative; that series "
                                                "is left out")
                continue
            m.buckets[labels] = own


def _own_counts(cumulative: dict[float, float]) -> dict[float, float] | None:
    """Cumulative bucket counts (the exposition's) as each bucket's own; None when they cannot be."""
    if math.inf not in cumulative or any(math.isnan(b) or not math.isfinite(v) for b, v in cumulative.items()):
        return None
    own, previous = {}, 0.0
    for bound in sorted(cumulative):
        count = cumulative[bound] - previous
        if count < 0:
            return None
        own[bound], previous = count, cumulative[bound]
    return own
