"""Outrider -> OpenTelemetry: the hook's series as instruments of the application's own MeterProvider.

`outrider.instrument(meter_provider=provider)` hands the hook's series (steps, step time, data wait, requests,
latency, allocator, custom metrics) to the provider the application already has, so the one OTLP pipeline it runs
carries both. The names, units and attributes are those the agent's OTLP export uses (the catalog's
semantic-convention names: `http.server.request.duration`, `outrider.train.steps`, ...; `outrider.rank` and
`outrider.training_job` where the process has them; custom metrics under their own names), under the scope
"outrider" the agent's export has too.

Observable instruments, read at the provider's collection time from the hook's last flush (Hook.last_layout, at
most one flush interval, 1 s, old): never the live cells, so a collection costs the hot path nothing and never races
the publisher. Counters are observable counters of their running totals, gauges observable gauges (up-down counters
where the catalog says so). A histogram has no observable instrument in OpenTelemetry's API, and the SDK's
explicit-bucket aggregation takes single measurements only, never the hook's pre-aggregated buckets (replaying
every observation would cost the workload per observation, not per series). So each histogram becomes three
observable counters: `<name>.bucket` (the cumulative count at or below the attribute `le`, Prometheus's buckets,
`+Inf` included), `<name>.count` and `<name>.sum`. Nothing is lost (any percentile a Prometheus-style backend
computes from buckets it computes from these), but a backend sees counters, not a histogram: the agent's own OTLP
export sends real histograms, for those who need them.

One path at a time: while an agent serves the spool (a sidecar, `outrider run`, a standalone agent: it holds the
spool's lock, looked at once per flush), it exports these series itself, and the bridge observes nothing, so no
series reaches a pipeline twice. The bridge takes over again when no agent holds the spool.

New names (a custom metric registered later) get their instruments from a short-lived thread started at collection
time: the SDK holds its collection lock while it runs callbacks, and a callback that created an instrument would
wait for itself. Such a series shows from the collection after the one that first sees it.

OpenTelemetry's API is imported here, and only when a meter provider is given: importing outrider never loads it.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from outrider.hook import api
from outrider.hook.election import agent_serving
from outrider.metrics.catalog import CATALOG, CUSTOM_HELP, MetricDef, custom_definition, definitions, otlp_attributes
from outrider.shared import spool
from outrider.shared.version import __version__

LOG = logging.getLogger("outrider.hook")
SCOPE = "outrider"  # the agent's OTLP export's instrumentation scope
COUNT_UNIT = "{observation}"
MAX_DEFINITIONS = 10_000  # custom (name, kind, labels) definitions cached; cleared past this
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./-")
Spec = tuple[str, str, str, str]  # OTel name, instrument (counter, updowncounter, gauge), unit, description


def instrument_specs(defn: MetricDef) -> list[Spec]:
    """The OpenTelemetry instruments one definition is published as: itself, or a histogram's three counters."""
    if defn.instrument == "histogram":
        return [(f"{defn.otel_name}.bucket", "counter", COUNT_UNIT,
                 f"{defn.help} Cumulative count of observations at or below `le`."),
                (f"{defn.otel_name}.count", "counter", COUNT_UNIT, f"{defn.help} Count of observations."),
                (f"{defn.otel_name}.sum", "counter", defn.unit, f"{defn.help} Sum of observations.")]
    return [(defn.otel_name, defn.instrument, defn.unit, defn.help)]


def _valid_name(name: str) -> bool:
    """OpenTelemetry's instrument name syntax (a letter, then letters, digits, `_ . / -`, at most 255)."""
    return 0 < len(name) <= 255 and name[0].isascii() and name[0].isalpha() and set(name) <= _NAME_CHARS


class OtelBridge:
    """The hook's series on one MeterProvider. Callbacks run on the provider's collecting thread."""

    def __init__(self, meter_provider: Any) -> None:
        self.provider = meter_provider
        self._meter = meter_provider.get_meter(SCOPE, __version__)
        self._lock = threading.Lock()  # the index's rebuild and the instrument table
        self._instruments: dict[str, Any] = {}  # OTel name -> instrument (created, or refused: None)
        self._pending: dict[str, Spec] = {}  # new names, for the creating thread
        self._creating = False
        self._defs: dict[tuple[str, str, tuple[str, ...]], MetricDef] = {}
        self._source: tuple[Any, Any] | None = None  # (hook, layout) the index was built from: held, not an id()
        self._index: dict[str, list[Observation]] = {}
        self._quiet = False  # an agent served the spool at the last rebuild
        for defn in definitions("hook"):  # the built-in series exist from the first collection on
            for spec in instrument_specs(defn):
                self._create(spec)

    # --- instruments -------------------------------------------------------------------------------------------
    def _create(self, spec: Spec) -> None:
        name, kind, unit, description = spec
        if name in self._instruments:
            return
        if not _valid_name(name):
            LOG.warning("outrider: %r is not a valid OpenTelemetry instrument name; not published there", name)
            self._instruments[name] = None
            return
        make = {"counter": self._meter.create_observable_counter, "gauge": self._meter.create_observable_gauge,
                "updowncounter": self._meter.create_observable_up_down_counter}[kind]
        try:
            self._instruments[name] = make(name, callbacks=[functools.partial(self._observe, name)], unit=unit,
                                           description=description)
        except Exception as e:  # the provider refused it: that series only is left out
            LOG.warning("outrider: the meter provider refused instrument %r: %s", name, e)
            self._instruments[name] = None

    def _create_pending(self) -> None:
        """The creating thread: outside the SDK's collection, which holds the lock instrument creation takes."""
        while True:
            with self._lock:
                todo = list(self._pending.values())
                self._pending.clear()
                if not todo:
                    self._creating = False
                    return
            for spec in todo:
                self._create(spec)

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._creating = False  # the creating thread, if one ran, is the parent's

    # --- observations ------------------------------------------------------------------------------------------
    def _observe(self, name: str, options: CallbackOptions) -> Iterable[Observation]:
        try:
            return self._current().get(name, [])
        except Exception:  # a callback never raises into the application's collection
            LOG.debug("outrider: the OpenTelemetry bridge's callback failed", exc_info=True)
            return []

    def _current(self) -> dict[str, list[Observation]]:
        hook = api.S.hook
        if hook is None:
            return {}
        layout = hook.last_layout
        source = self._source
        if source is not None and source[0] is hook and source[1] is layout:
            return self._index
        with self._lock:
            if self._source is None or self._source[0] is not hook or self._source[1] is not layout:
                self._index = self._build(hook, layout)
                self._source = (hook, layout)
            index = self._index
            if self._pending and not self._creating:
                self._creating = True
                try:
                    threading.Thread(target=self._create_pending, name="outrider-otel-bridge", daemon=True).start()
                except RuntimeError:  # no thread to be had now (interpreter exit): tried at the next collection
                    self._creating = False
        return index

    def _agent_serves(self, spool_dir: str) -> bool:
        if not os.path.isdir(spool_dir):
            return False
        try:
            return agent_serving(spool_dir)
        except OSError:
            return False

    def _build(self, hook: Any, layout: tuple[list[list[Any]], list[float]]) -> dict[str, list[Observation]]:
        """The observations of one flush, by instrument name (under the lock)."""
        quiet = self._agent_serves(hook.spool_dir)
        if quiet != self._quiet:
            self._quiet = quiet
            if quiet:
                LOG.info("outrider: an agent serves the spool %s and exports the hook's series: the OpenTelemetry "
                         "bridge observes none of them meanwhile", hook.spool_dir)
            else:
                LOG.info("outrider: no agent serves the spool: the OpenTelemetry bridge publishes the hook's series")
        if quiet:
            return {}
        ident = hook.identity
        identity = {"training_job": str(ident.training_job)[:spool.MAX_LABEL_VALUE],
                    "rank": str(ident.rank)[:spool.MAX_LABEL_VALUE]}
        points: dict[str, dict[frozenset[tuple[str, str | int]], tuple[dict[str, str | int], float]]] = {}

        def add(instrument: str, attributes: dict[str, str | int], value: float) -> None:
            at = points.setdefault(instrument, {})
            key = frozenset(attributes.items())
            have = at.get(key)
            at[key] = (attributes, value + (have[1] if have else 0.0))  # one point per attributes, as the agent's

        entries, values = layout
        for name, kind, labels, offset, bounds in entries:
            label_map = {**labels, **identity}
            defn = self._definition(name, kind, tuple(label_map))
            if defn is None:
                continue  # the agent refuses it too (invalid_series)
            attributes = otlp_attributes(defn, tuple(label_map.get(label.prom, "") for label in defn.labels))
            specs = instrument_specs(defn)
            for spec in specs:
                if spec[0] not in self._instruments and spec[0] not in self._pending:
                    self._pending[spec[0]] = spec
            if kind == "histogram":
                width = len(bounds) + 2
                cells = values[offset:offset + width]
                if len(cells) != width:
                    continue
                running = 0.0
                for bound, count in zip([*bounds, float("inf")], cells[:-1], strict=True):
                    running += count
                    add(specs[0][0], {**attributes, "le": "+Inf" if bound == float("inf") else repr(float(bound))},
                        running)
                add(specs[1][0], attributes, running)
                add(specs[2][0], attributes, cells[-1])
            elif offset < len(values):
                add(specs[0][0], attributes, values[offset])
        return {name: [Observation(value, attributes) for attributes, value in at.values()]
                for name, at in points.items()}

    def _definition(self, name: str, kind: str, label_names: tuple[str, ...]) -> MetricDef | None:
        """The catalog's definition (None where the series' shape is not its), else the custom one the agent makes."""
        defn = CATALOG.get(name)
        if defn is not None:
            return defn if defn.type == kind and set(defn.label_names) == set(label_names) else None
        key = (name, kind, label_names)
        hit = self._defs.get(key)
        if hit is None:
            if len(self._defs) >= MAX_DEFINITIONS:
                self._defs.clear()
            hit = self._defs[key] = custom_definition(name, kind, label_names, "hook", CUSTOM_HELP)
        return hit


_BRIDGES: list[OtelBridge] = []
_ATTACHING = threading.Lock()


def publish(meter_provider: Any) -> OtelBridge | None:
    """Publish the hook's series on `meter_provider` (once per provider); None where the provider refused. Never
    raises: the hook goes on without the bridge."""
    with _ATTACHING:
        for bridge in _BRIDGES:
            if bridge.provider is meter_provider:
                return bridge
        try:
            bridge = OtelBridge(meter_provider)
        except Exception as e:
            LOG.warning("outrider: the hook's series could not be published on the meter provider: %s", e)
            return None
        _BRIDGES.append(bridge)
        return bridge


def _after_fork_in_child() -> None:
    global _ATTACHING
    _ATTACHING = threading.Lock()
    for bridge in _BRIDGES:
        bridge.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
