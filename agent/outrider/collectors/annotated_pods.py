"""The node agent's scrape of its node's annotated pods: each Running pod with `outrider.dev/metrics-port`, at its
pod IP, every sweep (opt-in: scrape_annotated_pods).

What the sidecar does for its own pod on loopback (collectors/workload_metrics.py), a node agent does for every pod
of its node: the pods come from the API server (k8s/node_pods.py: `pods: list` for spec.nodeName=k8s_node_name,
asked every pod_discovery_interval_s, never on every sweep), the port and path from each pod's annotations
(`outrider.dev/metrics-port`, `outrider.dev/metrics-path`, checked as the sidecar checks them), and the scrape, the
page's reading and its conversion are the sidecar's own code. Only the IPs the API server gave as podIPs are
scraped: the address is never the workload's to choose.

Bounded in total, not per pod: the scrapes run at once on at most MAX_PARALLEL threads, each within
collector_timeout_s and at most MAX_PAGE_BYTES (2 MiB), and the sweep waits for all of them together at most
collector_timeout_s (plus one ask of the API server, itself within collector_timeout_s, when one is due). A pod that
has not answered by then (it hangs, it trickles, or more than MAX_PARALLEL pods hang at once so that it never got a
thread) has no series this sweep; its scrape ends at its own deadline. A pod whose scrape fails is logged once by
name and counted in outrider_collector_errors_total{collector="annotated_pods"}; the other pods' series are exported
all the same, and outrider_collector_success stays 1. It is 0 when the agent has no list of its node's pods younger
than 10 discovery intervals (a failed ask keeps the last list that long: logged once, counted).

Every series gets its pod's identity as the agent's other series do: the owner labels (k8s_owner_namespace_label,
k8s_owner_pod_label, k8s_owner_container_label; exported_namespace, exported_pod, exported_container by default,
on OTLP k8s.namespace.name, k8s.pod.name, k8s.container.name), the container where exactly one of the pod's
containers declares the annotated port, else none. A workload label with one of those names is renamed as
Prometheus renames it when honor_labels is false: `exported_<name>` (and again while that is taken too). All pods'
series share one set of caps, the sidecar's: hook_max_series_per_metric per metric, MAX_SERIES in all
(metrics/foreign.py); a metric that one pod calls a counter and another a gauge is taken from the first pod (by
namespace and name) and left out of the others, counted. At most MAX_TARGETS pods are scraped (the rest, counted).
"""

from __future__ import annotations

import concurrent.futures
import os

from outrider.collectors.base import Collector, CollectorContext, owner_label_names
from outrider.collectors.workload_metrics import annotated_endpoint, page_metrics, scrape, url
from outrider.config import ConfigError
from outrider.k8s.node_pods import NodePods, Pod, api_server_url
from outrider.metrics.catalog import K8S_OWNER
from outrider.metrics.family import Family
from outrider.metrics.foreign import ForeignDefinitions, ForeignMetric

MAX_PARALLEL = 16
# One pod's page at most (a sidecar's may be 8 MiB): MAX_PARALLEL pages in flight at once stay within 32 MiB of the
# node agent's memory (the chart's limit is 128 MiB); an inference server's /metrics is some hundreds of KiB
MAX_PAGE_BYTES = 2 << 20
MAX_TARGETS = 512  # the kubelet's max-pods is 110 by default, rarely above 250


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


class AnnotatedPodsCollector(Collector):
    name = "annotated_pods"
    description = ("node agent: the pods of its node annotated outrider.dev/metrics-port, found through the API "
                   "server and scraped at their pod IPs (scrape_annotated_pods)")

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
            return NodePods(api, node, account_dir, self._timeout_s, interval_s, clock=self.ctx.clock.monotonic)
        except ValueError as e:
            raise ConfigError(f"k8s_api_server: {e}") from None

    def collect(self) -> list[Family]:
        if self._pods is None:
            return []
        failures, bad_items = self._pods.failures, self._pods.bad_items
        pods = self._pods.pods()  # DiscoveryError (an OSError): no list young enough; the collector fails
        if self._pods.failures != failures:  # this sweep's ask failed, and the last list is kept
            self.drop("discovery", f"{self._pods.last_error_text}; the list of {self._pods.age_s:.0f} s ago is kept")
        if self._pods.bad_items != bad_items:
            self.drop("pod", f"{self._pods.bad_items - bad_items} items of the API server's pod list without a "
                             "pod's shape (metadata, spec, status.podIP an address); left out")
        metrics: dict[str, list[tuple[Target, ForeignMetric]]] = {}
        for target, page in self._scrape_all(self._targets(pods)):
            for family, m in page_metrics(page, target.url, self.drop).items():
                metrics.setdefault(family, []).append((target, m))
        return self._defs.families({family: self._merged(family, parts) for family, parts in metrics.items()},
                                   self._per_metric, self.drop)

    def _targets(self, pods: list[Pod]) -> list[Target]:
        out: list[Target] = []
        for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
            endpoint = annotated_endpoint(pod.annotations, self.drop, whose=f"{pod.namespace}/{pod.name}")
            if endpoint is None or not endpoint[0]:
                continue
            if len(out) >= MAX_TARGETS:
                self.drop("targets", f"more than {MAX_TARGETS} annotated pods on the node: from "
                                     f"{pod.namespace}/{pod.name} on, the rest are not scraped")
                break
            out.append(Target(pod, *endpoint))
        return out

    def _scrape_all(self, targets: list[Target]) -> list[tuple[Target, str]]:
        """Each target's page, scraped at once; those that failed or did not answer in time are dropped, by pod."""
        if not targets:
            return []
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(MAX_PARALLEL, thread_name_prefix="outrider-scrape")
        futures = {self._pool.submit(scrape, t.ip, t.port, t.path, self._timeout_s, MAX_PAGE_BYTES): t for t in targets}
        concurrent.futures.wait(futures, timeout=self._timeout_s)
        pages = []
        for future, target in futures.items():
            if not future.done():
                future.cancel()  # one that never got a thread; a running one ends at its own deadline
                self.drop(f"scrape:{target.who}", f"{target.who}: {target.url}: no page within collector_timeout_s "
                                                  f"({self._timeout_s:g} s, all pods together); left out this sweep")
                continue
            try:
                pages.append((target, future.result()))
            except OSError as e:
                self.drop(f"scrape:{target.who}", f"{target.who}: {e}; its series are left out")
        return pages

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
