"""A workload's own Prometheus endpoint, scraped on loopback every sweep (opt-in).

A service that serves its metrics itself (prometheus_client's start_http_server or make_wsgi_app, a Go or Java
client, an inference server's /metrics) keeps its endpoint and needs no second scrape target: the agent reads it
each sweep and exports what it serves beside its own series, on /metrics and OTLP. The port is the configuration's
`workload_metrics_port`, else the pod's annotation `outrider.dev/metrics-port` (with `outrider.dev/metrics-path`
for another path than /metrics), read every sweep from the Downward API file the chart mounts for the sidecar
(`pod_annotations_file`), so a changed annotation takes effect without a restart. An Outrider annotation rather
than `prometheus.io/scrape`: a cluster's Prometheus that scrapes annotated pods itself would get every series twice.

Bounded like every outbound call (outrider/adapters/outbound.py): the whole scrape (connect, request, every byte of the
answer) within collector_timeout_s, so a workload that answers a byte at a time is cut off; an answer of at most
MAX_BODY_BYTES, read no further; loopback only (127.0.0.1: the pod's own network namespace for a sidecar), plain
HTTP, no redirect followed, no compression asked for. An answer that ends short of its Content-Length (the workload
died mid-answer) or that the deadline cut is no page: http.client hands back what came as if it were all. A scrape
that fails (refused, cut off, too large, not 200)
fails the collector for that sweep: the workload's series are absent and
outrider_collector_success{collector="workload_metrics"} is 0, Prometheus's `up` for it.

The page is read line by line (metrics/text_format.py): a malformed line costs that line, counted in
outrider_collector_errors_total{collector="workload_metrics"}. Counters, gauges, untyped metrics (as gauges) and
histograms are exported; summaries (quantiles no one can merge or send on OTLP as such) and OpenMetrics' other
types are left out, counted. A family's samples that leave a label out have it empty (as Prometheus reads an
absent label). Names the agent owns (`outrider_*`, the catalog's) are refused, and the hook's caps apply
(hook_max_series_per_metric per metric, MAX_SERIES in all: metrics/foreign.py).

The scrape (`scrape`), the page's conversion (`page_metrics`) and the annotations' reading (`annotated_endpoint`)
are also the node agent's, which scrapes the annotated pods of its node at their pod IPs
(collectors/annotated_pods.py): one path for both, the loopback rule the sidecar's alone.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping

from outrider.adapters import outbound
from outrider.collectors.base import Collector, CollectorContext
from outrider.ground.config import CONVERTERS
from outrider.k8s.downward import read_annotations
from outrider.metrics import text_format
from outrider.metrics.family import Family
from outrider.metrics.foreign import Drop, ForeignDefinitions, ForeignMetric
from outrider.shared.version import __version__

MAX_BODY_BYTES = 8 << 20
HOST = "127.0.0.1"
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
PORT_ANNOTATION = "outrider.dev/metrics-port"
PATH_ANNOTATION = "outrider.dev/metrics-path"


class ScrapeError(OSError):
    """The workload's endpoint gave no page: the collector fails for this sweep (its `up` is 0)."""


class BudgetSpent(ScrapeError):
    """Raised by a scrape's `charge`: the caller's budget of bytes is spent; the page is not read further."""


def url(host: str, port: int, path: str) -> str:
    """The endpoint as a URL, for messages (an IPv6 pod IP in brackets)."""
    return f"http://[{host}]:{port}{path}" if ":" in host else f"http://{host}:{port}{path}"


@functools.lru_cache(maxsize=1)
def _connection() -> type:
    return outbound.connection_classes()[0]


def scrape(host: str, port: int, path: str, timeout_s: float, max_bytes: int = MAX_BODY_BYTES,
           charge: Callable[[int], None] | None = None) -> str:
    """The page at http://host:port/path, whole, within timeout_s (connect, request, every byte of the answer) and
    max_bytes (MAX_BODY_BYTES), plain HTTP, no redirect followed; ScrapeError (an OSError) naming the URL otherwise,
    also when the answer ends short of its Content-Length or the deadline cut it (both read as its end otherwise).
    `charge` is told the size of every piece read, and may raise BudgetSpent to stop the reading.
    The host is the caller's to vouch for (loopback for the sidecar, a pod IP the API server gave for a node agent).
    Safe to call from several threads at once: each call has its own connection and its own Deadline."""
    import http.client  # only once a scrape is configured: an agent on its defaults loads no HTTP client

    where = url(host, port, path)
    with outbound.Deadline(timeout_s) as deadline:
        conn = _connection()(host, port, timeout=timeout_s)
        try:
            conn.request("GET", path, headers={"Accept": ACCEPT, "Accept-Encoding": "identity",
                                               "User-Agent": f"outrider/{__version__}"})
            response = conn.getresponse()
            if response.status != 200:
                raise ScrapeError(f"{where} answered HTTP {response.status}")
            read = response.read
            if charge is not None:
                def read(n: int, _read: Callable[[int], bytes] = response.read,
                         _charge: Callable[[int], None] = charge) -> bytes:
                    chunk = _read(n)
                    _charge(len(chunk))
                    return chunk
            body = outbound.read_capped(read, max_bytes)
            if deadline.expired:  # its shutdown of the socket reads as the end of the answer
                raise ScrapeError(f"{where}: no complete answer within collector_timeout_s ({timeout_s:g} s)")
            if response.length:  # read(n) returns what came, without IncompleteRead, when the answer ends early
                raise ScrapeError(f"{where}: the answer ended {response.length} bytes short of its Content-Length")
        except outbound.ResponseTooLarge:
            raise ScrapeError(f"{where}: a page larger than {max_bytes} bytes; not read") from None
        except ScrapeError:
            raise
        except (OSError, ValueError, http.client.HTTPException) as e:
            if deadline.expired:
                raise ScrapeError(f"{where}: no complete answer within collector_timeout_s "
                                  f"({timeout_s:g} s)") from None
            raise ScrapeError(f"{where}: {e or type(e).__name__}") from None
        finally:
            conn.close()
    return body.decode("utf-8", "replace")


def page_metrics(page: str, where: str, drop: Drop) -> dict[str, ForeignMetric]:
    """A scraped page as ForeignMetrics by family name (what ForeignDefinitions.families takes): a malformed line
    costs that line, a summary or another type the agent does not export costs that family, a histogram series
    whose buckets are not cumulative costs that series, each told to `drop` (logged once per key, counted)."""
    parsed = text_format.parse(page)
    if parsed.bad_lines:
        drop("line", f"{where}: {parsed.bad_lines} malformed lines left out ({'; '.join(parsed.errors)})")
    metrics: dict[str, ForeignMetric] = {}
    for fam in text_format.families(parsed):
        _take(metrics, fam, drop)
    return metrics


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

    @property
    def url(self) -> str:
        return url(HOST, self._port, self._path)

    def _target(self) -> tuple[int, str]:
        """The configured endpoint, else the one the pod's annotations name now; port 0: none."""
        if self._configured[0] or not self._annotations_file:
            return self._configured
        try:
            annotations = read_annotations(self._annotations_file)
        except (OSError, ValueError) as e:
            self.drop("annotations", f"{self._annotations_file}: {e}")
            return 0, ""
        target = annotated_endpoint(annotations, self.drop)
        return target if target is not None else (0, "")

    def collect(self) -> list[Family]:
        self._port, self._path = self._target()
        if not self._port:
            return []
        metrics = page_metrics(self.scrape(), self.url, self.drop)
        return self._defs.families(metrics, self._per_metric, self.drop)

    def scrape(self) -> str:
        """The page, whole, within the deadline and the size cap; ScrapeError (an OSError) otherwise."""
        return scrape(HOST, self._port, self._path, self._timeout_s)


def annotated_endpoint(annotations: Mapping[str, str], drop: Drop, whose: str = "") -> tuple[int, str] | None:
    """The (port, path) that `outrider.dev/metrics-port` and `outrider.dev/metrics-path` name, checked as the
    configuration's workload_metrics_port and workload_metrics_path are (port 0: none); None without the port
    annotation, or with a bad one (told to `drop`, never a scrape of something else). `whose` names the pod in that
    message and its key."""
    port = annotations.get(PORT_ANNOTATION, "")
    if not port:
        return None
    try:
        return (CONVERTERS["workload_metrics_port"](port),
                CONVERTERS["workload_metrics_path"](annotations.get(PATH_ANNOTATION, "")))
    except ValueError as e:
        drop(f"annotation{':' if whose else ''}{whose}",
             f"{whose + ': ' if whose else ''}annotations {PORT_ANNOTATION}={port!r} / {PATH_ANNOTATION}: "
             f"expected {e}")
        return None


def _take(metrics: dict[str, ForeignMetric], fam: text_format.ParsedFamily[text_format.Sample], drop: Drop) -> None:
    kind = {"counter": "counter", "gauge": "gauge", "untyped": "gauge", "unknown": "gauge",
            "histogram": "histogram"}.get(fam.type)
    if kind is None:
        drop(f"type:{fam.name}", f"{fam.name}: a {fam.type}, which the agent does not export; left out")
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
                drop(f"bucket:{fam.name}", f"{fam.name}: bucket bound {s.labels.get('le')!r}")
                continue
            cumulative.setdefault(labels, {})[bound] = s.value
        elif s.name == f"{fam.name}_sum":
            m.sums[labels] = s.value
    for labels, buckets in cumulative.items():
        own = _own_counts(buckets)
        if own is None:
            drop(f"bucket:{fam.name}", f"{fam.name}: buckets without +Inf, or not cumulative; that series is left out")
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
