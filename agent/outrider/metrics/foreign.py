"""Metrics the agent learns at run time from someone else's instrumentation (a service's prometheus_client files,
its own /metrics endpoint, its OpenTelemetry metrics), for which the catalog has no entry.

ForeignDefinitions: one definition per (name, type, label names), cached so each sweep reuses it, and bounded: past
MAX_DEFINITIONS the cache is cleared and rebuilt from what is still sent, so label churn cannot grow it for ever.
`families()` turns a sweep's ForeignMetrics into families: names the agent owns (`outrider_*`, the catalog's)
refused, and the hook's caps applied (at most `per_metric` series per metric, MAX_SERIES in all). Names and labels
Prometheus keeps for itself (`up`, `scrape_*`, `ALERTS`, `__name__` and every `__*` label:
outrider/shared/prometheus_names.py) are renamed `exported_<name>`, as Prometheus renames a target's colliding labels,
said once and counted: a page that says `up 0` or `weird{__name__="x"} 1` would otherwise mark the agent's whole target
down in Prometheus. With `enrichment` (default owner label name -> configured name), every definition also carries the
Kubernetes owner labels (catalog.K8S_OWNER: namespace, pod, container, on OTLP k8s.*), after its own: a node agent's
series of many pods.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from outrider.metrics.catalog import CATALOG, K8S_OWNER, MetricDef, custom_definition, with_enrichment
from outrider.metrics.family import Family, HistogramValue
from outrider.shared import prometheus_names

MAX_DEFINITIONS = 10_000
MAX_SERIES = 2_000  # all metrics of one source together, as the hook's per-process cap
Drop = Callable[[str, str], None]  # a collector's drop(key, why): logged once per key, counted


@dataclass
class ForeignMetric:
    kind: str  # counter, gauge, histogram
    help: str
    label_names: tuple[str, ...]  # its own; with enrichment, each series' labels are these and then the owner's
    # counter/gauge: labels -> value; histogram: labels -> {upper bound: that bucket's own count} and their sums
    values: dict[tuple[str, ...], float] = field(default_factory=dict)
    stamps: dict[tuple[str, ...], float] = field(default_factory=dict)
    buckets: dict[tuple[str, ...], dict[float, float]] = field(default_factory=dict)
    sums: dict[tuple[str, ...], float] = field(default_factory=dict)


class ForeignDefinitions:
    def __init__(self, collector: str, default_help: str, enrichment: Mapping[str, str] | None = None) -> None:
        self.collector = collector
        self.default_help = default_help
        self.enrichment = enrichment
        # (name, kind, label names) -> its definition, and what was renamed in it ("" when nothing)
        self._defs: dict[tuple[str, str, tuple[str, ...]], tuple[MetricDef, str]] = {}

    def get(self, name: str, kind: str, label_names: tuple[str, ...], help_text: str = "", otel_name: str = "",
            drop: Drop | None = None) -> MetricDef:
        """The definition of a foreign metric, its name and labels renamed away from Prometheus's own (told to
        `drop` each time: logged once, counted)."""
        key = (name, kind, label_names)
        hit = self._defs.get(key)
        if hit is None:
            if len(self._defs) >= MAX_DEFINITIONS:
                self._defs.clear()
            public, labels, renamed = public_names(name, label_names)
            if public != name:  # on OTLP too: a Collector writing to Prometheus would meet the same name
                otel_name = prometheus_names.exported(otel_name) if otel_name else public
            defn = custom_definition(public, kind, labels, self.collector, help_text or self.default_help, otel_name)
            if self.enrichment is not None:
                defn = with_enrichment(replace(defn, enrichment=K8S_OWNER), self.enrichment)
            hit = self._defs[key] = (defn, renamed)
        if hit[1] and drop is not None:
            drop(f"renamed:{name}", f"{name}: {hit[1]}, names Prometheus keeps for its own series and labels")
        return hit[0]

    def families(self, metrics: dict[str, ForeignMetric], per_metric: int, drop: Drop) -> list[Family]:
        """The metrics (by family name, as their source names them) as families, counters under `<family>_total`
        and on OTLP under the family name."""
        out: list[Family] = []
        emitted: set[str] = set()
        total = 0
        for family in sorted(metrics):
            m = metrics[family]
            name = f"{family}_total" if m.kind == "counter" else family
            if name.startswith("outrider_") or name in CATALOG or family in CATALOG:
                drop(f"reserved:{family}", f"{family}: a name the agent owns; left out")
                continue
            fam = Family(self.get(name, m.kind, m.label_names, m.help, otel_name=family, drop=drop))
            invalid = prometheus_names.valid(fam.defn.name, fam.defn.label_names)
            if invalid:  # a file's names are anyone's: one outside the grammar would fail the agent's whole scrape
                drop(f"invalid:{family}", f"{family[:80]!r}: {invalid}; left out")
                continue
            if fam.defn.name in emitted:  # `up` renamed exported_up beside a metric of that name
                drop(f"collision:{family}", f"{family}: exported as {fam.defn.name}, which another of its metrics is "
                                          "called; left out")
                continue
            emitted.add(fam.defn.name)
            series = sorted(m.buckets) if m.kind == "histogram" else sorted(m.values)
            for labels in series:
                if total >= MAX_SERIES:
                    drop("cap", f"past {MAX_SERIES} series in all: from {family} on, the rest are left out")
                    out.append(fam)
                    return out
                if len(fam.samples) >= per_metric:
                    drop(f"cap:{family}", f"{family}: past the cap of {per_metric} series per metric; the rest are "
                                          "left out")
                    break
                if m.kind == "histogram":
                    fam.add(_histogram(m.buckets[labels], m.sums.get(labels, 0.0)), *labels)
                else:
                    fam.add(m.values[labels], *labels)
                total += 1
            out.append(fam)
        return out


def public_names(name: str, label_names: tuple[str, ...]) -> tuple[str, tuple[str, ...], str]:
    """A foreign metric's name and label names renamed away from those Prometheus keeps for itself (`up` ->
    `exported_up`, `__name__` -> `exported___name__`), and what was renamed ("" when nothing)."""
    said = []
    public = name
    if prometheus_names.reserved_metric(name):
        public = prometheus_names.exported(name)
        said.append(f"exported as {public}")
    taken = set(label_names)
    labels = []
    for label in label_names:
        if prometheus_names.reserved_label(label):
            renamed = prometheus_names.exported(label, taken)
            taken.add(renamed)
            said.append(f"label {label} exported as {renamed}")
            label = renamed
        labels.append(label)
    return public, tuple(labels), "; ".join(said)


def _histogram(buckets: dict[float, float], total: float) -> HistogramValue:
    """Each bucket's own count (not cumulative), the last bucket +Inf."""
    bounds = sorted(b for b in buckets if math.isfinite(b))
    counts = [int(buckets[b]) for b in bounds] + [int(buckets.get(math.inf, 0.0))]
    return HistogramValue(tuple(bounds), tuple(counts), total)
