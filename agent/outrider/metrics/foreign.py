"""Definitions of metrics the agent learns at run time from someone else's instrumentation (a service's
prometheus_client files, its OpenTelemetry metrics), for which the catalog has no entry.

One definition per (name, type, label names), cached so each sweep reuses it, and bounded: past MAX_DEFINITIONS
the cache is cleared and rebuilt from what is still sent, so label churn cannot grow it for ever.
"""

from __future__ import annotations

from outrider.metrics.catalog import MetricDef, custom_definition

MAX_DEFINITIONS = 10_000


class ForeignDefinitions:
    def __init__(self, collector: str, default_help: str) -> None:
        self.collector = collector
        self.default_help = default_help
        self._defs: dict[tuple[str, str, tuple[str, ...]], MetricDef] = {}

    def get(self, name: str, kind: str, label_names: tuple[str, ...], help_text: str = "",
            otel_name: str = "") -> MetricDef:
        key = (name, kind, label_names)
        defn = self._defs.get(key)
        if defn is None:
            if len(self._defs) >= MAX_DEFINITIONS:
                self._defs.clear()
            defn = self._defs[key] = custom_definition(name, kind, label_names, self.collector,
                                                       help_text or self.default_help, otel_name)
        return defn
