"""Collectors, one per file, registered by name in one table.

`--collector.NAME` / `--no-collector.NAME` and the `collectors` config key are derived from REGISTRY; `resolve`
checks the names a configuration gives and applies the toggles (the configuration itself never imports a
collector).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from outrider.collectors.alerts import AlertsCollector
from outrider.collectors.annotated_pods import AnnotatedPodsCollector
from outrider.collectors.base import Collector, CollectorContext, SweepStats
from outrider.collectors.diagnosis import DiagnosisCollector
from outrider.collectors.efficiency import EfficiencyCollector
from outrider.collectors.gpu import GpuCollector
from outrider.collectors.hook import HookCollector
from outrider.collectors.host import HostCollector
from outrider.collectors.oom import OomCollector
from outrider.collectors.otlp_receiver import OtlpReceiverCollector
from outrider.collectors.process import ProcessCollector
from outrider.collectors.prometheus_multiproc import PrometheusMultiprocCollector
from outrider.collectors.self import SelfCollector
from outrider.collectors.workload_metrics import WorkloadMetricsCollector
from outrider.ground.config import ConfigError, LoadedConfig

REGISTRY: dict[str, type[Collector]] = {
    cls.name: cls
    for cls in (HostCollector, OomCollector, ProcessCollector, GpuCollector, HookCollector,
                PrometheusMultiprocCollector, WorkloadMetricsCollector, AnnotatedPodsCollector, OtlpReceiverCollector,
                DiagnosisCollector, EfficiencyCollector, AlertsCollector, SelfCollector)
}


def default_collectors() -> tuple[str, ...]:
    return tuple(name for name, cls in REGISTRY.items() if cls.default_enabled)


def resolve(loaded: LoadedConfig, toggles: Sequence[tuple[str, bool]] = ()) -> LoadedConfig:
    """The configuration with its collector list checked against the registry and the --collector.NAME /
    --no-collector.NAME toggles applied; an unknown name is a ConfigError naming where it came from."""
    names = loaded.config.collectors
    for name in names:
        if name not in REGISTRY:
            raise ConfigError(f"{loaded.sources['collectors']}: key 'collectors': unknown collector {name!r}; "
                              f"known: {', '.join(sorted(REGISTRY))}")
    enabled = list(names or default_collectors())
    sources = dict(loaded.sources)
    for name, on in toggles:
        if name not in REGISTRY:
            raise ConfigError(f"flag --{'' if on else 'no-'}collector.{name}: unknown collector; "
                              f"known: {', '.join(sorted(REGISTRY))}")
        if on and name not in enabled:
            enabled.append(name)
        if not on and name in enabled:
            enabled.remove(name)
        sources["collectors"] = "flags --collector.* / --no-collector.*"
    return LoadedConfig(dataclasses.replace(loaded.config, collectors=tuple(enabled)), sources)


def build(ctx: CollectorContext, names: Sequence[str] = ()) -> list[Collector]:
    """The collectors a configuration enables (all default ones when it names none), built in registry order
    of the names given."""
    return [REGISTRY[name](ctx) for name in (names or default_collectors())]


__all__ = ["REGISTRY", "Collector", "CollectorContext", "SweepStats", "build", "default_collectors", "resolve"]
