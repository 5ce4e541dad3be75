"""Outrider -> prometheus_client: the hook's series in a prometheus_client registry the service already exposes.

`outrider.prometheus_collector()` registers one collector in the registry (prometheus_client's default one unless
given another) that reports what this process's hook last published: its built-in series (steps, step time,
requests, data wait, ...) and the custom ones, so a service without a sidecar shows them on the /metrics endpoint
it already serves. The values are those of the hook's last flush (at most one flush interval, 1 s, old): the
collector reads the flush's snapshot, never the live cells, so a scrape costs the workload nothing on its hot path
and never races the publisher. Each process reports its own series, as prometheus_client does outside its
multiprocess mode.

prometheus_client is imported here, and only when this is called: importing outrider never loads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from outrider.hook import api

HELP = "Published by the Outrider hook (see Outrider's metrics reference)."


class HookSeriesCollector:
    """A prometheus_client collector (its `collect()` protocol) over the hook's last published layout."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        hook = api.S.hook
        if hook is None:
            return
        entries, values = hook.last_layout
        families: dict[str, Any] = {}  # prometheus_client families of three types, used alike
        label_sets: dict[str, list[str]] = {}  # the label names each family was made with
        for name, kind, labels, offset, bounds in entries:
            names = sorted(labels)
            fam: Any = families.get(name)
            if fam is None:
                if kind == "counter":
                    fam = CounterMetricFamily(name[:-6] if name.endswith("_total") else name, HELP, labels=names)
                elif kind == "gauge":
                    fam = GaugeMetricFamily(name, HELP, labels=names)
                elif kind == "histogram":
                    fam = HistogramMetricFamily(name, HELP, labels=names)
                else:
                    continue
                families[name], label_sets[name] = fam, names
            if label_sets[name] != names:
                continue  # one name, two label sets: the registry refuses this; never a malformed exposition
            label_values = [str(labels[n]) for n in names]
            if kind == "histogram":
                width = len(bounds) + 2
                cells = values[offset:offset + width]
                if len(cells) != width:
                    continue
                buckets, running = [], 0.0
                for bound, count in zip([*bounds, float("inf")], cells[:-1], strict=True):
                    running += count
                    buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
                fam.add_metric(label_values, buckets, cells[-1])
            else:
                fam.add_metric(label_values, values[offset])
        yield from families.values()


def prometheus_collector(registry: Any = None) -> HookSeriesCollector:
    """Register the hook's series in `registry` (prometheus_client's REGISTRY when None); returns the collector, to
    unregister it with registry.unregister(). Call after outrider.instrument()."""
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    collector = HookSeriesCollector()
    registry.register(collector)
    return collector
