"""The collector interface: a name and `collect() -> list[Family]`, plus the context collectors are built with."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from outrider.ground.clock import SYSTEM, Clock
from outrider.ground.config import Config, ConfigError
from outrider.ground.logs import LogOnce
from outrider.metrics.catalog import CATALOG, K8S_OWNER, MetricDef, with_enrichment
from outrider.metrics.family import Family

Reporter = Callable[[], list[Family]]
StackDump = tuple[int, str, str, str]  # (pid, rank, path, the Python stacks) of a stalled process


@dataclass
class CollectorStatus:
    success: bool = True
    duration_s: float = 0.0
    errors: int = 0
    hung: bool = False


@dataclass
class SweepStats:
    """The sweep loop's own numbers (written by the sampler, reported by the self collector)."""

    sweeps: int = 0
    last_sweep_s: float = 0.0
    last_sweep_monotonic: float = 0.0
    collectors: dict[str, CollectorStatus] = field(default_factory=dict)


@dataclass
class CollectorContext:
    """What a collector is built with. Everything from above the collectors' layer (the rule engine, the
    notifiers, the exporters) arrives here as plain callables wired by wiring/agent.py, never as objects."""

    config: Config
    stats: SweepStats = field(default_factory=SweepStats)
    # Roots of the watched process trees; empty watches every process visible to the agent.
    roots: tuple[int, ...] = ()
    # Processes never reported as watched (the agent itself, when it wraps a command).
    exclude_pids: frozenset[int] = field(default_factory=frozenset)
    # The hook collector takes the spool's agent lock, telling instrumented processes an agent is present.
    # False for the agent a hooked process runs itself (the hook already holds the lock).
    hold_spool_lock: bool = True
    # Called with every finished sweep (the sampler's listeners): collectors that reason over sweeps join here.
    listeners: list[Callable[[list[Family]], None]] = field(default_factory=list)
    # Families other parts of the agent report through a collector, by collector name: "alerts" gets the rule
    # engine's and the notifiers', "self" the exporters' counters.
    reporters: dict[str, list[Reporter]] = field(default_factory=dict)
    # The stack dumps of processes the hook collector saw stalled in its last sweep (for stall pages).
    stalled_stacks: list[StackDump] = field(default_factory=list)
    # The clocks collectors read (deadlines, ages, timestamps): the system's, or a test's own.
    clock: Clock = SYSTEM

    def reports(self, collector: str) -> list[Family]:
        out: list[Family] = []
        for reporter in self.reporters.get(collector, ()):
            out.extend(reporter())
        return out


class Collector:
    """One source of metrics. Subclasses set `name` and implement `collect`.

    A reading that fails is dropped with `drop()`: logged once per key, counted in
    `outrider_collector_errors_total`, and the sweep goes on. An exception escaping `collect` marks the whole
    collector failed for that sweep (`outrider_collector_success` 0); the sampler catches it.
    """

    name: ClassVar[str] = ""
    default_enabled: ClassVar[bool] = True
    description: ClassVar[str] = ""
    # A collector calling into something that can hang (a driver) runs on its own thread, and a sweep waits for it
    # at most collector_timeout_s: the sweep goes on without it and reports it hung.
    may_block: ClassVar[bool] = False
    # Runs after the sweep's listeners (the rule engine), to report what they did in the same sweep.
    after_listeners: ClassVar[bool] = False

    def __init__(self, ctx: CollectorContext) -> None:
        self.ctx = ctx
        self.errors = 0
        self.log = logging.getLogger(f"outrider.collectors.{self.name}")
        self._once = LogOnce(self.log)

    def collect(self) -> list[Family]:
        raise NotImplementedError

    def drop(self, key: str, error: BaseException | str) -> None:
        self.errors += 1
        self._once.warning(key, "%s: dropped reading %s: %s (logged once; counted in "
                           "outrider_collector_errors_total)", self.name, key, error)

    def close(self) -> None:
        """Release resources (threads, handles). Idempotent."""


OWNER_LABEL_KEYS = ("k8s_owner_namespace_label", "k8s_owner_pod_label", "k8s_owner_container_label")


def owner_label_names(config: Config) -> dict[str, str]:
    """The owner labels' configured names by their default ones (exported_pod -> k8s_owner_pod_label's value); two
    keys giving one name is a configuration error naming both."""
    names = {default.prom: getattr(config, key) for default, key in zip(K8S_OWNER, OWNER_LABEL_KEYS)}
    chosen = list(names.values())
    for name in chosen:
        keys = [key for key, other in zip(OWNER_LABEL_KEYS, chosen) if other == name]
        if len(keys) > 1:
            raise ConfigError(f"{' and '.join(keys)} are both '{name}': give each owner label its own name")
    return names


def owner_definitions(config: Config, collector: str) -> dict[str, MetricDef]:
    """The collector's metrics that name a Kubernetes owner (GPU series, OOM victims), with the owner labels under
    their configured names; a name that is not distinct or that such a metric already uses is a configuration error
    naming its key."""
    names = owner_label_names(config)
    chosen = list(names.values())
    defs: dict[str, MetricDef] = {}
    for defn in CATALOG.values():
        if defn.collector != collector or not defn.enrichment:
            continue
        for key, name in zip(OWNER_LABEL_KEYS, chosen):
            if name in defn.label_names:
                raise ConfigError(f"{key}: '{name}' is already a label of {defn.name}; choose another name")
        defs[defn.name] = with_enrichment(defn, names)
    return defs
