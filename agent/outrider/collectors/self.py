"""Self collector ("self"): the agent's own CPU and RSS, its sweeps, scrapes and exports, and each collector's
success, duration and dropped readings."""

from __future__ import annotations

import os
import time

from outrider.collectors.base import Collector, CollectorContext
from outrider.ground.config import k8s_identity
from outrider.kernel import procfs
from outrider.metrics.family import Family
from outrider.shared.version import __version__


class SelfCollector(Collector):
    name = "self"
    description = "the agent's own CPU, RSS, sweep duration, and per-collector success and duration"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        # The agent's own /proc, whatever proc_root says (that may be the host's, for the node agent). One read of
        # /proc/PID/stat gives CPU and RSS, through a descriptor kept open (psutil read two files, opened each
        # time, and cost 1.8 MiB of RSS to import).
        self._reader = procfs.KeptOpenReader("/proc")
        # Facts that never change while the agent runs: built once, shared by every sweep.
        self._static = [Family("outrider_agent_info").add(1, __version__),
                        Family("outrider_agent_start_time_seconds").add(time.time())]
        k8s = k8s_identity(self.ctx.config)
        self._k8s = [Family("outrider_k8s_info").add(1, *(k8s.get(n, "") for n in ("pod", "namespace", "node",
                                                                                    "container")))
                     ] if any(k8s.values()) else []

    def close(self) -> None:
        self._reader.close()

    def collect(self) -> list[Family]:
        stats = self.ctx.stats
        pid = os.getpid()  # in the path, so a forked child never reads its parent's descriptor
        me = procfs.parse_proc_stat(self._reader.read_bytes(f"{pid}/stat"), pid)
        fams = [
            *self._static,
            Family("outrider_agent_cpu_seconds_total").add(me.user_s, "user").add(me.system_s, "system"),
            Family("outrider_agent_memory_rss_bytes").add(me.rss_bytes),
            Family("outrider_agent_sweeps_total").add(stats.sweeps),
            *self.ctx.reports(self.name),  # wired by wiring/agent.py: the exporters' scrapes and OTLP export results
            *self._k8s,
        ]
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
