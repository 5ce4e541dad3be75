"""The node agent's scrape of its node's annotated pods: each Running pod with `outrider.dev/metrics-port`, at its
pod IP, every sweep (opt-in: scrape_annotated_pods).

What the sidecar does for its own pod on loopback (collectors/workload_metrics.py), a node agent does for every pod
of its node: the pods come from the API server (k8s/node_pods.py: `pods: list` for spec.nodeName=k8s_node_name,
asked every pod_discovery_interval_s, never on every sweep), the port and path from each pod's annotations
(`outrider.dev/metrics-port`, `outrider.dev/metrics-path`, checked as the sidecar checks them), and the scrape, the
page's reading and its conversion are the sidecar's own code. Only the IPs the API server gave as podIPs are
scraped: the address is never the workload's to choose.

Bounded in total, not per pod. The scrapes run at once on at most MAX_PARALLEL threads, each within
collector_timeout_s and at most MAX_PAGE_BYTES (1 MiB), and all of them together read at most MAX_SWEEP_BYTES
(8 MiB) a sweep: once that is spent, the pages still being read are cut off and those not begun are refused, each
named in the log and counted (its pod has no series this sweep). Each page is parsed on the sweep thread as soon as
it has come (not once all have), its text dropped at once, and its series cut to the pod's share right away, so the
agent holds at most MAX_SWEEP_BYTES (plus one 64 KiB read per thread) of pages, one page's parse, and MAX_SERIES
series at a time: some 8 MiB of text and the parse of 1 MiB (measured: 16 pods of 1 MiB pages, a peak RSS of
77 MiB from 29 MiB at the start; the chart's limit is 128 MiB). The sweep waits for the pages at most
collector_timeout_s, parsing included (plus one ask of the API server, itself within collector_timeout_s, when one
is due). Not a `may_block` collector: the sampler would drop
all of a sweep's pods' series the moment the wait for one hung pod reached collector_timeout_s; this collector's
own wait is that bound already, and the pods that answered in time keep their series.

A pod that has not answered by then (it hangs or trickles) has no series this sweep; its scrape ends at its own
deadline. A pod whose scrape fails is logged once by name and counted in
outrider_collector_errors_total{collector="annotated_pods"}; the other pods' series are exported all the same, and
outrider_collector_success stays 1. Pods that failed or did not answer go to the end of the next sweep's queue, and
one that keeps failing is skipped for 1, 3, then 7 sweeps between tries (BACKOFF_SWEEPS), so that pods that hang
cannot take every thread sweep after sweep; a pod that never got a thread (more than MAX_PARALLEL slow pods ahead of
it) is logged as such, not blamed, and keeps its place. outrider_collector_success is 0 when the agent has no list
of its node's pods younger than 2 discovery intervals (a failed ask keeps the last list that long: logged once,
counted).

Every series gets its pod's identity as the agent's other series do: the owner labels (k8s_owner_namespace_label,
k8s_owner_pod_label, k8s_owner_container_label; exported_namespace, exported_pod, exported_container by default,
on OTLP k8s.namespace.name, k8s.pod.name, k8s.container.name), the container where exactly one of the pod's
containers declares the annotated port, else none. A workload label with one of those names is renamed as
Prometheus renames it when honor_labels is false: `exported_<name>` (and again while that is taken too). The caps
are each pod's own: hook_max_series_per_metric per metric of a pod, and an even share of MAX_SERIES
(metrics/foreign.py) for each pod, MAX_SERIES // the number of targets (at least 1), so that a noisy pod cannot
crowd out the others' series; each cut names its pod. A metric that one pod calls a counter and another a gauge is
taken from the first pod (by namespace and name) and left out of the others, counted; so is one exported under a
name the first pod's family has (a counter `x` is x_total on /metrics and x on OTLP, as a gauge `x_total` or `x`
is). At most MAX_TARGETS pods are scraped (the rest, counted); of two pods with one namespace and name (never so in
a true list), the second is left out, counted. hostNetwork pods and pods whose IP no pod can have are left out
(k8s/node_pods.py), counted.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from typing import ClassVar

from outrider.collectors.base import Collector, CollectorContext, owner_label_names
from outrider.collectors.workload_metrics import BudgetSpent, annotated_endpoint, page_metrics, scrape, url
from outrider.ground.config import ConfigError
from outrider.k8s.node_pods import NodePods, Pod, api_server_url
from outrider.metrics.catalog import K8S_OWNER
from outrider.metrics.family import Family
from outrider.metrics.foreign import MAX_SERIES, ForeignDefinitions, ForeignMetric

MAX_PARALLEL = 16
# One pod's page at most (a sidecar's may be 8 MiB); an inference server's /metrics is some hundreds of KiB
MAX_PAGE_BYTES = 1 << 20
# All pods' pages of one sweep together: what the node agent holds of them at most (the chart's limit is 128 MiB)
MAX_SWEEP_BYTES = 8 << 20
MAX_TARGETS = 512  # the kubelet's max-pods is 110 by default, rarely above 250
BACKOFF_SWEEPS = (0, 1, 3, 7)  # sweeps skipped after the 1st, 2nd, 3rd, 4th and later failures in a row


class Target:
    """One pod's endpoint: where to scrape it and the identity its series get."""

    __slots__ = ("identity", "ip", "path", "port", "who")

    def __init__(self, pod: Pod, port: int, path: str) -> None:
        self.ip, self.port, self.path = pod.ip, port, path
        self.identity = (pod.namespace, pod.name, pod.container_of(port))
        self.who = f"{pod.namespace}/{pod.name}"

    @property
    def url(self) -> str:
        return url(self.ip, self.port, self.path)


class _Budget:
    """The bytes the sweep's scrapes may still read, all threads together."""

    def __init__(self, total: int) -> None:
        self.left = total
        self._lock = threading.Lock()

    def charge(self, n: int) -> None:
        with self._lock:
            self.left -= n
            if self.left < 0:
                raise BudgetSpent(f"the sweep's {MAX_SWEEP_BYTES} bytes of pages (MAX_SWEEP_BYTES, all pods "
                                  "together) are spent")

    @property
    def spent(self) -> bool:
        with self._lock:
            return self.left <= 0


class AnnotatedPodsCollector(Collector):
    name = "annotated_pods"
    description = ("node agent: the pods of its node annotated outrider.dev/metrics-port, found through the API "
                   "server and scraped at their pod IPs (scrape_annotated_pods)")
    # Tests only (their pods are 127.0.0.x addresses): let loopback podIPs through. Never a setting.
    allow_loopback_pods: ClassVar[bool] = False

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        config = ctx.config
        self._timeout_s = config.collector_timeout_s
        self._per_metric = config.hook_max_series_per_metric
        names = owner_label_names(config)
        self._identity = frozenset(names[label.prom] for label in K8S_OWNER)
        self._defs = ForeignDefinitions(self.name, "A metric of a pod's own /metrics endpoint.", enrichment=names)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pods: NodePods | None = None
        self._sweep = 0
        # who -> (failures in a row, the first sweep it is tried again)
        self._failing: dict[str, tuple[int, int]] = {}
        if config.scrape_annotated_pods:
            self._pods = self._node_pods(config.k8s_api_server, config.k8s_node_name,
                                         config.k8s_service_account_dir, config.pod_discovery_interval_s)

    def _node_pods(self, api: str, node: str, account_dir: str, interval_s: float) -> NodePods:
        if not node:
            raise ConfigError("scrape_annotated_pods: needs this node's name: k8s_node_name, or NODE_NAME from the "
                              "Downward API (fieldRef spec.nodeName; the chart sets it)")
        api = api or api_server_url(os.environ)
        if not api:
            raise ConfigError("scrape_annotated_pods: no API server: set k8s_api_server (outside a pod there is no "
                              "KUBERNETES_SERVICE_HOST)")
        try:
            return NodePods(api, node, account_dir, self._timeout_s, interval_s, clock=self.ctx.clock.monotonic,
                            allow_loopback=self.allow_loopback_pods)
        except ValueError as e:
            raise ConfigError(f"k8s_api_server: {e}") from None

    def collect(self) -> list[Family]:
        if self._pods is None:
            return []
        failures, bad_items, host_network = self._pods.failures, self._pods.bad_items, self._pods.host_network
        pods = self._pods.pods()  # DiscoveryError (an OSError): no list young enough; the collector fails
        if self._pods.failures != failures:  # this sweep's ask failed, and the last list is kept
            self.drop("discovery", f"{self._pods.last_error_text}; the list of {self._pods.age_s:.0f} s ago is kept")
        if self._pods.bad_items != bad_items:
            self.drop("pod", f"{self._pods.bad_items - bad_items} items of the API server's pod list without a "
                             "pod's shape (metadata, spec, status.podIP an address a pod can have); left out")
        if self._pods.host_network != host_network:
            self.drop("host_network", f"{self._pods.host_network - host_network} hostNetwork pods left out: their "
                                      "podIP is the node's, so an annotation could aim the agent at any port of "
                                      "the node")
        self._sweep += 1
        targets = self._targets(pods)
        share = max(1, MAX_SERIES // len(targets)) if targets else MAX_SERIES
        per_target = self._scrape_all(targets, share)
        # One family per name it is exported under: a counter `x` is x_total on /metrics (as a gauge `x_total` is)
        # and x on OTLP (as a gauge `x` is); the exposition would merge a second family of one name into the first's
        # type. The first pod's claims the names, and another pod's family that shares one clashes with it.
        metrics: dict[str, list[tuple[Target, ForeignMetric]]] = {}
        claimed: dict[str, str] = {}  # a name on /metrics or OTLP -> the family (as its first pod names it) holding it
        for target in targets:  # in the targets' order (namespace, name): the first pod's type wins a clash
            for family, m in per_target.get(target.who, {}).items():
                names = (family, f"{family}_total") if m.kind == "counter" else (family,)
                first = next((claimed[n] for n in names if n in claimed), None)
                if first is None:  # a family left out in a clash claims nothing
                    first = family
                    claimed.update(dict.fromkeys(names, family))
                metrics.setdefault(first, []).append((target, m))
        # each pod is within its own caps already: the overall ones only trim rounding
        return self._defs.families({family: self._merged(family, parts) for family, parts in metrics.items()},
                                   MAX_SERIES, self.drop)

    def _targets(self, pods: list[Pod]) -> list[Target]:
        out: list[Target] = []
        seen: set[tuple[str, str]] = set()
        for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
            who = f"{pod.namespace}/{pod.name}"
            if (pod.namespace, pod.name) in seen:
                self.drop(f"duplicate:{who}", f"{who}: twice in the API server's list (at {pod.ip} too); the second "
                                              "is left out")
                continue
            seen.add((pod.namespace, pod.name))
            endpoint = annotated_endpoint(pod.annotations, self.drop, whose=who)
            if endpoint is None or not endpoint[0]:
                continue
            if len(out) >= MAX_TARGETS:
                self.drop("targets", f"more than {MAX_TARGETS} annotated pods on the node: from {who} on, the rest "
                                     "are not scraped")
                break
            out.append(Target(pod, *endpoint))
        return out

    def _queue(self, targets: list[Target]) -> list[Target]:
        """The targets to scrape this sweep, in order: those that answered last time (or are new) first, those that
        failed after them; one failing for several sweeps in a row is skipped for BACKOFF_SWEEPS between tries."""
        current = {t.who for t in targets}
        for who in [w for w in self._failing if w not in current]:
            del self._failing[who]
        due = [t for t in targets if self._failing.get(t.who, (0, 0))[1] <= self._sweep]
        for t in targets:
            if t not in due:
                self.log.debug("%s: %s failed %d sweeps in a row; not tried this sweep", self.name, t.who,
                               self._failing[t.who][0])
        return sorted(due, key=lambda t: t.who in self._failing)  # stable: (namespace, name) within each

    def _failed(self, target: Target) -> None:
        fails = self._failing.get(target.who, (0, 0))[0] + 1
        self._failing[target.who] = (fails, self._sweep + 1 + BACKOFF_SWEEPS[min(fails, len(BACKOFF_SWEEPS)) - 1])

    def _scrape_all(self, targets: list[Target], share: int) -> dict[str, dict[str, ForeignMetric]]:
        """Each target's metrics (cut to its caps), by pod, parsed as each page comes; those that failed or did not
        answer in time are dropped, by pod."""
        queue = self._queue(targets)
        if not queue:
            return {}
        pool = self._pool
        if pool is None:
            pool = self._pool = concurrent.futures.ThreadPoolExecutor(MAX_PARALLEL,
                                                                      thread_name_prefix="outrider-scrape")
        ends = time.monotonic() + self._timeout_s
        budget = _Budget(MAX_SWEEP_BYTES)
        futures: dict[concurrent.futures.Future[str], Target] = {}
        try:
            for t in queue:
                futures[pool.submit(self._scrape, t, budget)] = t
        except RuntimeError:  # closed meanwhile: no new scrapes
            pass
        out: dict[str, dict[str, ForeignMetric]] = {}
        pending = set(futures)
        try:
            for future in concurrent.futures.as_completed(futures, timeout=max(0.0, ends - time.monotonic())):
                pending.discard(future)
                target = futures[future]
                if future.cancelled():
                    continue
                try:
                    page = future.result()
                except BudgetSpent as e:
                    self.drop(f"budget:{target.who}", f"{target.who}: {target.url}: {e}; not read, left out this "
                                                      "sweep")
                    continue
                except Exception as e:  # ScrapeError, or what no scrape should raise: that pod's loss alone
                    self._failed(target)
                    self.drop(f"scrape:{target.who}", f"{target.who}: {e}; its series are left out")
                    continue
                self._failing.pop(target.who, None)
                metrics = page_metrics(page, target.url, self.drop)
                del page  # the text goes before the next page is parsed
                out[target.who] = self._capped(target, metrics, share)
        except concurrent.futures.TimeoutError:
            pass
        for future in pending:
            target = futures[future]
            if future.cancel() or future.cancelled():  # never got a thread (or the collector is closing)
                self.drop(f"unscraped:{target.who}", f"{target.who}: {target.url}: not scraped, no thread free "
                                                     f"within collector_timeout_s ({self._timeout_s:g} s; more than "
                                                     f"{MAX_PARALLEL} pods were slow); tried first next sweep")
                continue
            self._failed(target)  # a running one ends at its own deadline
            self.drop(f"scrape:{target.who}", f"{target.who}: {target.url}: no page within collector_timeout_s "
                                              f"({self._timeout_s:g} s, all pods together); left out this sweep")
        return out

    def _scrape(self, target: Target, budget: _Budget) -> str:
        if budget.spent:
            raise BudgetSpent(f"the sweep's {MAX_SWEEP_BYTES} bytes of pages (MAX_SWEEP_BYTES, all pods together) "
                              "are spent")
        return scrape(target.ip, target.port, target.path, self._timeout_s, MAX_PAGE_BYTES, budget.charge)

    def _capped(self, target: Target, metrics: dict[str, ForeignMetric], share: int) -> dict[str, ForeignMetric]:
        """One pod's metrics within its caps: hook_max_series_per_metric per metric, `share` in all (by family
        name, then labels); each cut named by the pod."""
        out: dict[str, ForeignMetric] = {}
        left = share
        for family in sorted(metrics):
            m = metrics[family]
            series = sorted(m.buckets) if m.kind == "histogram" else sorted(m.values)
            keep = min(len(series), self._per_metric, left)
            if keep < len(series):
                if keep == self._per_metric:
                    self.drop(f"cap:{target.who}:{family}", f"{target.who}: {family}: past the cap of "
                                                            f"{self._per_metric} series per metric; the rest are "
                                                            "left out")
                else:
                    self.drop(f"share:{target.who}", f"{target.who}: past its share of {share} series (MAX_SERIES, "
                                                     f"{MAX_SERIES}, over the node's annotated pods): from "
                                                     f"{family} on, the rest are left out")
                    if keep:
                        self._cut(m, set(series[keep:]))
                        out[family] = m
                    break
                self._cut(m, set(series[keep:]))
            left -= keep
            out[family] = m
        return out

    @staticmethod
    def _cut(m: ForeignMetric, cut: set[tuple[str, ...]]) -> None:
        for table in (m.values, m.buckets, m.sums, m.stamps):
            for labels in [k for k in table if k in cut]:
                del table[labels]

    def _merged(self, family: str, parts: list[tuple[Target, ForeignMetric]]) -> ForeignMetric:
        """One family of many pods: the first pod's type and help, the union of their label names (each pod's
        renamed away from the identity labels), each series' labels followed by its pod's identity."""
        kind, help_text = parts[0][1].kind, parts[0][1].help
        renamed = []
        for target, m in parts:
            if m.kind != kind:
                self.drop(f"kind:{family}", f"{family}: a {m.kind} in {target.who} but a {kind} in "
                                            f"{parts[0][0].who}; {target.who}'s is left out")
                continue
            renamed.append((target, m, self._renamed(m.label_names)))
        names = tuple(sorted({n for _, _, own in renamed for n in own}))
        out = ForeignMetric(kind, help_text, names)
        for target, m, own in renamed:
            where = [own.index(n) if n in own else -1 for n in names]

            def key(labels: tuple[str, ...], where: list[int] = where, target: Target = target) -> tuple[str, ...]:
                return (*(labels[i] if i >= 0 else "" for i in where), *target.identity)

            for labels, v in m.values.items():
                out.values[key(labels)] = v
            for labels, buckets in m.buckets.items():
                out.buckets[key(labels)] = buckets
            for labels, total in m.sums.items():
                out.sums[key(labels)] = total
        return out

    def _renamed(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The workload's label names, each that is an identity label's renamed exported_<name> (Prometheus's
        honor_labels: false), prefixed again while the new name is taken."""
        taken = set(names) | self._identity
        out = []
        for n in names:
            if n in self._identity:
                while n in taken:
                    n = f"exported_{n}"
                taken.add(n)
            out.append(n)
        return tuple(out)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
