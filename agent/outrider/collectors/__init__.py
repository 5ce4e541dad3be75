"""Collectors, one per file, registered by name in one table.

`--collector.NAME` / `--no-collector.NAME` and the `collectors` config key are derived from REGISTRY.
"""

from __future__ import annotations

from outrider.collectors.agent_self import SelfCollector
from outrider.collectors.alerts import AlertsCollector
from outrider.collectors.base import Collector, CollectorContext
from outrider.collectors.diagnosis import DiagnosisCollector
from outrider.collectors.gpu import GpuCollector
from outrider.collectors.hook import HookCollector
from outrider.collectors.host import HostCollector
from outrider.collectors.process import ProcessCollector

REGISTRY: dict[str, type[Collector]] = {
    cls.name: cls
    for cls in (HostCollector, ProcessCollector, GpuCollector, HookCollector, DiagnosisCollector, AlertsCollector,
                SelfCollector)
}


def default_collectors() -> tuple[str, ...]:
    return tuple(name for name, cls in REGISTRY.items() if cls.default_enabled)


__all__ = ["REGISTRY", "Collector", "CollectorContext", "default_collectors"]
