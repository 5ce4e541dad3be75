"""Self collector ("self"): the agent's own CPU and RSS, its sweeps, scrapes and exports, and each collector's
success, duration and dropped readings."""

from __future__ import annotations

import time

import psutil

from outrider.collectors.base import Collector, CollectorContext
from outrider.config import k8s_identity
from outrider.metrics.family import Family
from outrider.version import __version__


class SelfCollector(Collector):
    name = "self"
    description = "the agent's own CPU, RSS, sweep duration, and per-collector success and duration"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self._proc = psutil.Process()
        self._start = time.time()

    def collect(self) -> list[Family]:
        stats = self.ctx.stats
        cpu = self._proc.cpu_times()
        fams = [
            Family("outrider_agent_info").add(1, __version__),
            Family("outrider_agent_start_time_seconds").add(self._start),
            Family("outrider_agent_cpu_seconds_total").add(cpu.user, "user").add(cpu.system, "system"),
            Family("outrider_agent_memory_rss_bytes").add(self._proc.memory_info().rss),
            Family("outrider_agent_sweeps_total").add(stats.sweeps),
            *self.ctx.reports(self.name),  # wired by agent.py: the exporters' scrapes and OTLP export results
        ]
        k8s = k8s_identity(self.ctx.config)
        if any(k8s.values()):
            fams.append(Family("outrider_k8s_info").add(1, *(k8s.get(n, "") for n in ("pod", "namespace", "node",
                                                                                   "container"))))
        if stats.sweeps:
            fams.append(Family("outrider_agent_sweep_duration_seconds").add(stats.last_sweep_s))
        success = Family("outrider_collector_success")
        duration = Family("outrider_collector_duration_seconds")
        errors = Family("outrider_collector_errors_total")
        hung = Family("outrider_collector_hung")
        for name, c in stats.collectors.items():
            success.add(1 if c.success else 0, name)
            duration.add(c.duration_s, name)
            errors.add(c.errors, name)
            hung.add(1 if c.hung else 0, name)
        return [*fams, success, duration, errors, hung]
