"""collectors/annotated_pods in process, value by value: a node agent's collector over a real HTTP server standing in
for the API server (tests/fakes/kube_api.py) and real HTTP servers on loopback addresses as the pods' endpoints, all
in this process; each pod's series with its identity, what is left out and why (by each drop's key and text), the
caps shared among pods, the type clashes, the back-off of a failing pod, the sweep's byte budget and its wait."""

from __future__ import annotations

import http.server
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from outrider.collectors import annotated_pods
from outrider.collectors.annotated_pods import (
    BACKOFF_SWEEPS,
    MAX_PAGE_BYTES,
    MAX_PARALLEL,
    MAX_SWEEP_BYTES,
    MAX_TARGETS,
    AnnotatedPodsCollector,
    Target,
    _Budget,
)
from outrider.collectors.base import CollectorContext
from outrider.collectors.workload_metrics import BudgetSpent
from outrider.ground.clock import ManualClock
from outrider.ground.config import Config, ConfigError
from outrider.k8s.node_pods import DiscoveryError, Pod
from outrider.metrics.exposition import render
from outrider.metrics.family import Family
from outrider.metrics.foreign import MAX_SERIES
from tests.fakes.kube_api import NODE, ApiServer, item
from tests.fakes.pod_pages import Pages
from tests.helpers import record_drops

Key = tuple[str, tuple[tuple[str, str], ...]]


@pytest.fixture(autouse=True)
def loopback_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    # the tests' pods are 127.0.0.x addresses, which no pod has: let them through (never a setting)
    monkeypatch.setattr(AnnotatedPodsCollector, "allow_loopback_pods", True)


@pytest.fixture
def pages() -> Iterator[Pages]:
    with Pages() as p:
        yield p


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiServer]:
    server = ApiServer()
    server.account = tmp_path / "serviceaccount"  # type: ignore[attr-defined]
    server.account.mkdir()  # type: ignore[attr-defined]
    (server.account / "token").write_text("token")  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.stop()


class Made:
    """A collector on the stand-in API server, each of its drops kept (key, text) as well as counted."""

    def __init__(self, api: ApiServer, clock: ManualClock | None, settings: dict[str, Any]) -> None:
        ctx = CollectorContext(Config(**{
            "scrape_annotated_pods": True, "k8s_node_name": NODE, "k8s_api_server": api.url,
            "k8s_service_account_dir": str(api.account), **settings}))  # type: ignore[attr-defined]
        if clock is not None:
            ctx.clock = clock.clock()
        self.c = AnnotatedPodsCollector(ctx)
        self.drops = record_drops(self.c)

    def collect(self) -> list[Family]:
        return self.c.collect()

    def samples(self) -> dict[Key, float]:
        return parsed(render(self.collect()).decode())

    def keys(self) -> list[str]:
        return [k for k, _ in self.drops]


@pytest.fixture
def make(api: ApiServer) -> Iterator[Callable[..., Made]]:
    made: list[Made] = []

    def build(clock: ManualClock | None = None, **settings: Any) -> Made:
        made.append(Made(api, clock, settings))
        return made[-1]

    yield build
    for m in made:
        m.c.close()


def parsed(text: str) -> dict[Key, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def annotated(name: str, ip: str, port: int | str | None, *, namespace: str = "shop", path: str | None = None,
              container_port: int | None = None, **more: Any) -> dict[str, Any]:
    annotations = {"kubectl.kubernetes.io/default-container": "shop"}
    if port is not None:
        annotations["outrider.dev/metrics-port"] = str(port)
    if path is not None:
        annotations["outrider.dev/metrics-path"] = path
    containers = [{"name": "shop", "ports": [{"containerPort": container_port}] if container_port else []},
                  {"name": "outrider", "ports": [{"containerPort": 9477}]}]
    return item(name, ip, namespace=namespace, annotations=annotations, containers=containers, **more)


def gauge_page(name: str, value: float, labels: str = "") -> str:
    return f"# HELP {name} A gauge.\n# TYPE {name} gauge\n{name}{labels} {value}\n"


# --- what is scraped, with whose identity ------------------------------------------------------------------------

def test_each_annotated_pods_series_with_its_identity_as_prometheus_client_serves_them(
        api: ApiServer, pages: Pages, make: Callable[..., Made]) -> None:
    registry = CollectorRegistry()
    Counter("shop_requests", "Requests served.", ["route"], registry=registry).labels("/pay").inc(3)
    Gauge("shop_jobs", "Jobs.", ["pod"], registry=registry).labels("worker-1").set(4)
    h = Histogram("shop_latency_seconds", "Latency.", buckets=(0.1, 1.0), registry=registry)
    h.observe(0.05)
    h.observe(0.5)
    page = generate_latest(registry).decode()
    a = pages.serve("127.0.0.2", page)
    b = pages.serve("127.0.0.3", gauge_page("shop_jobs", 7, '{pod="w"}'))
    api.items = [annotated("shop-a", "127.0.0.2", a, container_port=a),
                 annotated("shop-b", "127.0.0.3", b, namespace="batch", path="/custom/metrics"),
                 annotated("shop-plain", "127.0.0.4", None)]
    m = make()
    got = {k: v for k, v in m.samples().items() if not k[0].endswith("_created")}  # a 0.0.4 page's own gauges
    identity_a = (("exported_container", "shop"), ("exported_namespace", "shop"), ("exported_pod", "shop-a"))
    identity_b = (("exported_namespace", "batch"), ("exported_pod", "shop-b"))
    assert got == {
        ("shop_requests_total", tuple(sorted((("route", "/pay"), *identity_a)))): 3.0,
        ("shop_jobs", tuple(sorted((("pod", "worker-1"), *identity_a)))): 4.0,
        ("shop_jobs", tuple(sorted((("pod", "w"), *identity_b)))): 7.0,
        ("shop_latency_seconds_bucket", tuple(sorted((("le", "0.1"), *identity_a)))): 1.0,
        ("shop_latency_seconds_bucket", tuple(sorted((("le", "1.0"), *identity_a)))): 2.0,
        ("shop_latency_seconds_bucket", tuple(sorted((("le", "+Inf"), *identity_a)))): 2.0,
        ("shop_latency_seconds_count", identity_a): 2.0,
        ("shop_latency_seconds_sum", identity_a): 0.55,
    }
    assert sorted(pages.hits) == ["127.0.0.2/metrics", "127.0.0.3/custom/metrics"]
    assert m.drops == []
    assert m.c._pods is not None and m.c._pods.asks == 1


def test_a_family_of_many_pods_has_the_union_of_their_labels_then_the_identity(
        api: ApiServer, pages: Pages, make: Callable[..., Made]) -> None:
    api.items = [annotated("a", "127.0.0.2", pages.serve("127.0.0.2", gauge_page("g", 1, '{route="/"}'))),
                 annotated("b", "127.0.0.3", pages.serve("127.0.0.3", gauge_page("g", 2, '{code="200",route="/x"}'))),
                 annotated("c", "127.0.0.4", pages.serve("127.0.0.4", gauge_page("g", 3)))]
    (fam,) = make().collect()
    assert fam.defn.name == "g" and fam.defn.help == "A gauge."
    assert fam.defn.label_names == ("code", "route", "exported_namespace", "exported_pod", "exported_container")
    assert sorted(fam.samples) == [(("", "", "shop", "c", ""), 3.0), (("", "/", "shop", "a", ""), 1.0),
                                   (("200", "/x", "shop", "b", ""), 2.0)]


def test_a_histogram_of_two_pods_keeps_each_pods_buckets_and_sum(api: ApiServer, pages: Pages,
                                                                 make: Callable[..., Made]) -> None:
    def page(n: int) -> str:
        return ("# TYPE lat histogram\n"
                f'lat_bucket{{r="x",le="1"}} {n}\nlat_bucket{{r="x",le="+Inf"}} {2 * n}\n'
                f'lat_sum{{r="x"}} {3 * n}\nlat_count{{r="x"}} {2 * n}\n')

    api.items = [annotated("a", "127.0.0.2", pages.serve("127.0.0.2", page(1))),
                 annotated("b", "127.0.0.3", pages.serve("127.0.0.3", page(5)))]
    got = make().samples()
    for pod, n in (("a", 1), ("b", 5)):
        ident = (("exported_namespace", "shop"), ("exported_pod", pod), ("r", "x"))
        assert got[("lat_bucket", tuple(sorted((("le", "1.0"), *ident))))] == n
        assert got[("lat_bucket", tuple(sorted((("le", "+Inf"), *ident))))] == 2 * n
        assert got[("lat_sum", ident)] == 3 * n and got[("lat_count", ident)] == 2 * n


@pytest.mark.parametrize(("names", "renamed"), [
    (("pod", "route"), ("exported_pod", "route")),
    (("pod", "exported_pod"), ("exported_exported_pod", "exported_pod")),
    (("exported_pod", "pod"), ("exported_pod", "exported_exported_pod")),
    (("pod", "exported_pod", "exported_exported_pod"), ("exported_exported_exported_pod", "exported_pod",
                                                        "exported_exported_pod")),
    (("namespace", "pod", "container"), ("exported_namespace", "exported_pod", "exported_container")),
    (("route",), ("route",)),
])
def test_a_workload_label_named_like_an_identity_label_is_renamed_as_prometheus_renames_it(
        api: ApiServer, make: Callable[..., Made], names: tuple[str, ...], renamed: tuple[str, ...]) -> None:
    m = make(k8s_owner_namespace_label="namespace", k8s_owner_pod_label="pod", k8s_owner_container_label="container")
    assert m.c._identity == frozenset({"namespace", "pod", "container"})
    assert m.c._renamed(names) == renamed


def test_the_default_identity_labels_and_a_workloads_of_those_names(api: ApiServer, pages: Pages,
                                                                   make: Callable[..., Made]) -> None:
    page = gauge_page("jobs", 3, '{exported_pod="x",pod="w"}')
    api.items = [annotated("train-0", "127.0.0.2", pages.serve("127.0.0.2", page), namespace="ml")]
    got = make().samples()
    assert got == {("jobs", (("exported_exported_pod", "x"), ("exported_namespace", "ml"), ("exported_pod", "train-0"),
                             ("pod", "w"))): 3.0}


# --- what is left out ---------------------------------------------------------------------------------------------

def test_off_by_default_no_api_server_is_asked(api: ApiServer) -> None:
    c = AnnotatedPodsCollector(CollectorContext(Config(k8s_node_name=NODE, k8s_api_server=api.url)))
    assert c._pods is None and c.collect() == [] and api.requests == []
    c.close()


def test_the_settings_it_needs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError) as e:
        AnnotatedPodsCollector(CollectorContext(Config(scrape_annotated_pods=True, k8s_api_server="https://10.0.0.1")))
    assert str(e.value) == ("scrape_annotated_pods: needs this node's name: k8s_node_name, or NODE_NAME from the "
                            "Downward API (fieldRef spec.nodeName; the chart sets it)")
    with pytest.raises(ConfigError) as e:
        AnnotatedPodsCollector(CollectorContext(Config(scrape_annotated_pods=True, k8s_node_name=NODE)))
    assert str(e.value) == ("scrape_annotated_pods: no API server: set k8s_api_server (outside a pod there is no "
                            "KUBERNETES_SERVICE_HOST)")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    clock = ManualClock(now=77.0)
    ctx = CollectorContext(Config(scrape_annotated_pods=True, k8s_node_name=NODE, collector_timeout_s=4.0,
                                  pod_discovery_interval_s=15.0, k8s_service_account_dir=str(tmp_path)))
    ctx.clock = clock.clock()
    c = AnnotatedPodsCollector(ctx)
    pods = c._pods
    assert pods is not None
    assert (pods.api_url, pods.node, pods.timeout_s, pods.interval_s, pods.token_file, pods.allow_loopback) == (
        "https://10.96.0.1:6443", NODE, 4.0, 15.0, f"{tmp_path}/token", True)
    assert pods._clock() == 77.0, "the context's monotonic clock"
    assert c._timeout_s == 4.0 and c._per_metric == Config().hook_max_series_per_metric


def test_an_api_server_that_is_no_url_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError) as e:
        AnnotatedPodsCollector(CollectorContext(Config(scrape_annotated_pods=True, k8s_node_name=NODE,
                                                       k8s_api_server="https://")))
    assert str(e.value) == "k8s_api_server: 'https://': expected an http(s) URL of the API server"


def test_loopback_pods_are_refused_without_the_tests_allowance(api: ApiServer, pages: Pages,
                                                                make: Callable[..., Made],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AnnotatedPodsCollector, "allow_loopback_pods", False)
    api.items = [annotated("a", "127.0.0.2", pages.serve("127.0.0.2", gauge_page("g", 1)))]
    m = make()
    assert m.collect() == [] and pages.hits == [] and m.keys() == ["pod"]


def test_no_list_of_pods_fails_the_collector(api: ApiServer, make: Callable[..., Made]) -> None:
    api.status = 403
    with pytest.raises(DiscoveryError, match="HTTP 403"):
        make().collect()


def test_a_failed_ask_bad_items_and_host_network_pods_are_said_once_per_ask(
        api: ApiServer, pages: Pages, make: Callable[..., Made]) -> None:
    port = pages.serve("127.0.0.2", gauge_page("g", 1))
    api.items = [annotated("a", "127.0.0.2", port), "junk", 7,
                 annotated("proxy", "127.0.0.5", port, host_network=True),
                 annotated("exporter", "127.0.0.6", port, host_network=True),
                 annotated("exporter2", "127.0.0.7", port, host_network=True)]
    clock = ManualClock()
    m = make(clock, pod_discovery_interval_s=30.0)
    assert len(m.collect()) == 1
    assert m.drops == [
        ("pod", "2 items of the API server's pod list without a pod's shape (metadata, spec, status.podIP an address "
                "a pod can have); left out"),
        ("host_network", "3 hostNetwork pods left out: their podIP is the node's, so an annotation could aim the "
                         "agent at any port of the node")]
    m.drops.clear()
    clock.now += 10
    assert len(m.collect()) == 1 and m.drops == [], "not asked again: nothing new to say"
    api.status = 503
    clock.now += 20
    assert len(m.collect()) == 1, "the kept list"
    assert m.drops == [("discovery", f"{api.url} (pods of node {NODE}): HTTP 503; the list of 30 s ago is kept")]
    api.status = 200
    api.items = [annotated("a", "127.0.0.2", port), "junk", annotated("proxy", "127.0.0.5", port, host_network=True)]
    m.drops.clear()
    clock.now += 30
    assert len(m.collect()) == 1
    assert [why.split(" ", 1)[0] for _, why in m.drops] == ["1", "1"], "this ask's own, not all asks' together"


def test_pods_without_the_port_annotation_or_with_port_0_are_not_scraped(
        api: ApiServer, pages: Pages, make: Callable[..., Made]) -> None:
    port = pages.serve("127.0.0.2", gauge_page("g", 1))
    api.items = [annotated("plain", "127.0.0.2", None), annotated("zero", "127.0.0.2", 0),
                 annotated("empty", "127.0.0.2", "")]
    m = make()
    assert m.collect() == [] and pages.hits == [] and m.drops == []
    assert port


def test_a_bad_annotation_is_said_by_its_pod(api: ApiServer, pages: Pages, make: Callable[..., Made]) -> None:
    api.items = [annotated("bad", "127.0.0.2", "eighty"),
                 annotated("good", "127.0.0.3", pages.serve("127.0.0.3", gauge_page("g", 1)))]
    m = make()
    assert len(m.collect()) == 1
    assert m.keys() == ["annotation:shop/bad"]
    assert m.drops[0][1].startswith("shop/bad: annotations outrider.dev/metrics-port='eighty'")


def test_two_pods_of_one_name_the_second_in_order_is_left_out(api: ApiServer, pages: Pages,
                                                             make: Callable[..., Made]) -> None:
    api.items = [annotated("same", "127.0.0.2", pages.serve("127.0.0.2", gauge_page("g", 1))),
                 annotated("same", "127.0.0.3", pages.serve("127.0.0.3", gauge_page("g", 2))),
                 annotated("same", "127.0.0.4", None)]
    m = make()
    (fam,) = m.collect()
    assert fam.samples == [(("shop", "same", ""), 1.0)]
    assert m.drops == [("duplicate:shop/same", "shop/same: twice in the API server's list (at 127.0.0.3 too); the "
                                               "second is left out"),
                       ("duplicate:shop/same", "shop/same: twice in the API server's list (at 127.0.0.4 too); the "
                                               "second is left out")]


def test_at_most_max_targets_pods_in_namespace_and_name_order(api: ApiServer, pages: Pages,
                                                              make: Callable[..., Made],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert MAX_TARGETS == 512
    monkeypatch.setattr(annotated_pods, "MAX_TARGETS", 2)
    port = pages.serve("127.0.0.2", gauge_page("g", 1))
    api.items = [annotated("c", "127.0.0.2", port), annotated("a", "127.0.0.2", port, namespace="z"),
                 annotated("b", "127.0.0.2", port), annotated("a", "127.0.0.2", port)]
    m = make()
    (fam,) = m.collect()
    assert [labels[1] for labels, _ in fam.samples] == ["a", "b"]
    assert m.drops == [("targets", "more than 2 annotated pods on the node: from shop/c on, the rest are not scraped")]
    api.items = [annotated("a", "127.0.0.2", port), annotated("b", "127.0.0.2", port),
                 annotated("c", "127.0.0.2", None)]
    m = make()
    assert len(m.collect()[0].samples) == 2 and m.drops == [], "an unannotated pod past the bound is no target"


def test_a_pod_whose_scrape_fails_costs_its_own_series(api: ApiServer, pages: Pages,
                                                       make: Callable[..., Made]) -> None:
    bad = pages.serve("127.0.0.2", "oops", status=500)
    api.items = [annotated("bad", "127.0.0.2", bad),
                 annotated("good", "127.0.0.3", pages.serve("127.0.0.3", gauge_page("g", 1)))]
    m = make()
    (fam,) = m.collect()
    assert fam.samples == [(("shop", "good", ""), 1.0)]
    assert m.drops == [("scrape:shop/bad", f"shop/bad: http://127.0.0.2:{bad}/metrics answered HTTP 500; its series "
                                           "are left out")]


# --- the caps -----------------------------------------------------------------------------------------------------

def wide(n: int, name: str = "wide", kind: str = "counter") -> str:
    suffix = "_total" if kind == "counter" else ""
    return f"# TYPE {name} {kind}\n" + "".join(f'{name}{suffix}{{n="{i:03d}"}} 1\n' for i in range(n))


def test_the_per_metric_cap_is_each_pods_own(api: ApiServer, pages: Pages, make: Callable[..., Made]) -> None:
    api.items = [annotated("p0", "127.0.0.2", pages.serve("127.0.0.2", wide(5) + wide(3, "narrow"))),
                 annotated("p1", "127.0.0.3", pages.serve("127.0.0.3", wide(4)))]
    m = make(hook_max_series_per_metric=4)
    fams = {f.defn.name: f for f in m.collect()}
    assert sorted(labels[:3] for labels, _ in fams["wide_total"].samples) == sorted(
        (f"{i:03d}", "shop", p) for i in range(4) for p in ("p0", "p1")), "each pod's first 4, by label values"
    assert len(fams["narrow_total"].samples) == 3
    assert m.drops == [("cap:shop/p0:wide", "shop/p0: wide: past the cap of 4 series per metric; the rest are "
                                            "left out")]


def test_each_pods_share_of_max_series(api: ApiServer, pages: Pages, make: Callable[..., Made],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert annotated_pods.MAX_SERIES == MAX_SERIES == 2000
    monkeypatch.setattr(annotated_pods, "MAX_SERIES", 10)
    api.items = [annotated("p0", "127.0.0.2", pages.serve("127.0.0.2", wide(3, "a") + wide(4, "b") + wide(2, "c"))),
                 annotated("p1", "127.0.0.3", pages.serve("127.0.0.3", wide(2, "a")))]
    m = make(hook_max_series_per_metric=100)
    fams = {f.defn.name: sorted(labels[:3] for labels, _ in f.samples) for f in m.collect()}
    assert fams == {"a_total": [("000", "shop", "p0"), ("000", "shop", "p1"), ("001", "shop", "p0"),
                                ("001", "shop", "p1"), ("002", "shop", "p0")],
                    "b_total": [("000", "shop", "p0"), ("001", "shop", "p0")]}, "5 each: a's 3 and 2 of b's"
    assert m.drops == [("share:shop/p0", "shop/p0: past its share of 5 series (MAX_SERIES, 10, over the node's "
                                         "annotated pods): from b on, the rest are left out")]


def test_a_share_spent_at_a_family_boundary_leaves_the_next_family_out_whole(
        api: ApiServer, pages: Pages, make: Callable[..., Made], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(annotated_pods, "MAX_SERIES", 3)
    api.items = [annotated("p0", "127.0.0.2", pages.serve("127.0.0.2", wide(3, "a") + wide(2, "b") + wide(1, "c")))]
    m = make(hook_max_series_per_metric=100)
    fams = {f.defn.name: len(f.samples) for f in m.collect()}
    assert fams == {"a_total": 3}
    assert m.drops == [("share:shop/p0", "shop/p0: past its share of 3 series (MAX_SERIES, 3, over the node's "
                                         "annotated pods): from b on, the rest are left out")]


def test_the_share_is_at_least_one_series(api: ApiServer, pages: Pages, make: Callable[..., Made],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(annotated_pods, "MAX_SERIES", 2)
    api.items = [annotated(f"p{i}", "127.0.0.2", pages.serve("127.0.0.2", wide(3, name)), namespace=f"n{i}")
                 for i, name in enumerate("abc")]
    m = make()
    fams = {f.defn.name: len(f.samples) for f in m.collect()}
    assert fams == {"a_total": 1, "b_total": 1, "c_total": 1}, "one each (2 // 3 is 0)"


def test_a_cap_equal_to_the_share_left_is_said_as_the_per_metric_cap(
        api: ApiServer, pages: Pages, make: Callable[..., Made], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(annotated_pods, "MAX_SERIES", 3)
    api.items = [annotated("p0", "127.0.0.2", pages.serve("127.0.0.2", wide(5, "a")))]
    m = make(hook_max_series_per_metric=3)
    assert {f.defn.name: len(f.samples) for f in m.collect()} == {"a_total": 3}
    assert m.keys() == ["cap:shop/p0:a"]


def test_a_histogram_past_the_cap_loses_whole_series_buckets_and_sums(
        api: ApiServer, pages: Pages, make: Callable[..., Made]) -> None:
    page = "# TYPE lat histogram\n" + "".join(
        f'lat_bucket{{r="{r}",le="+Inf"}} 1\nlat_sum{{r="{r}"}} 2\nlat_count{{r="{r}"}} 1\n' for r in "abc")
    api.items = [annotated("p0", "127.0.0.2", pages.serve("127.0.0.2", page))]
    m = make(hook_max_series_per_metric=2)
    got = m.samples()
    assert sorted({dict(labels)["r"] for _, labels in got}) == ["a", "b"]
    assert m.keys() == ["cap:shop/p0:lat"]


def test_cut_removes_the_series_from_every_table() -> None:
    from outrider.metrics.foreign import ForeignMetric

    m = ForeignMetric("histogram", "h", ("r",))
    for r in "ab":
        m.values[(r,)] = 1.0
        m.buckets[(r,)] = {1.0: 1.0}
        m.sums[(r,)] = 2.0
        m.stamps[(r,)] = 3.0
    AnnotatedPodsCollector._cut(m, {("b",)})
    assert (m.values, m.buckets, m.sums, m.stamps) == ({("a",): 1.0}, {("a",): {1.0: 1.0}}, {("a",): 2.0},
                                                       {("a",): 3.0})


# --- clashes between pods -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("first_page", "second_page", "first", "kept", "left_out"), [
    ("# TYPE clash counter\nclash_total 1\n", "# TYPE clash_total gauge\nclash_total 2\n", "clash", "counter",
     "gauge"),
    ("# TYPE clash_total gauge\nclash_total 2\n", "# TYPE clash counter\nclash_total 1\n", "clash_total", "gauge",
     "counter"),
    ("# TYPE clash counter\nclash_total 1\n", "# TYPE clash gauge\nclash 2\n", "clash", "counter", "gauge"),
    ("# TYPE clash gauge\nclash 2\n", "# TYPE clash counter\nclash_total 1\n", "clash", "gauge", "counter"),
])
def test_one_name_two_types_the_first_pods_is_kept(api: ApiServer, pages: Pages, make: Callable[..., Made],
                                                   first_page: str, second_page: str, first: str, kept: str,
                                                   left_out: str) -> None:
    api.items = [annotated("p0", "127.0.0.2", pages.serve("127.0.0.2", first_page)),
                 annotated("p1", "127.0.0.3", pages.serve("127.0.0.3", second_page))]
    m = make()
    fams = [f for f in m.collect() if f.samples]
    assert [(f.defn.type, [labels[-2] for labels, _ in f.samples]) for f in fams] == [(kept, ["p0"])]
    assert m.drops == [(f"kind:{first}", f"{first}: a {left_out} in shop/p1 but a {kept} in shop/p0; shop/p1's is "
                                         "left out")]


def test_a_gauge_named_like_a_counters_family_is_no_clash_on_the_metrics_page(
        api: ApiServer, pages: Pages, make: Callable[..., Made]) -> None:
    """A gauge `x` and a counter `x_total`'s family `x_total`... each name claimed once: a gauge `x_total_total`
    is no clash with a counter `x` (x_total)."""
    api.items = [annotated("p0", "127.0.0.2", pages.serve("127.0.0.2", "# TYPE x counter\nx_total 1\n")),
                 annotated("p1", "127.0.0.3", pages.serve("127.0.0.3", "# TYPE x_total_total gauge\n"
                                                                          "x_total_total 2\n"))]
    m = make()
    got = m.samples()
    assert got == {("x_total", (("exported_namespace", "shop"), ("exported_pod", "p0"))): 1.0,
                   ("x_total_total", (("exported_namespace", "shop"), ("exported_pod", "p1"))): 2.0}
    assert m.drops == []


# --- the queue, the back-off, the sweep's wait and budget ---------------------------------------------------------

def test_a_failing_pod_is_tried_after_1_3_then_7_sweeps_skipped(api: ApiServer, pages: Pages,
                                                                make: Callable[..., Made]) -> None:
    assert BACKOFF_SWEEPS == (0, 1, 3, 7)
    bad = pages.serve("127.0.0.2", "", status=500)
    api.items = [annotated("bad", "127.0.0.2", bad)]
    m = make()
    tried = []
    for sweep in range(1, 27):
        before = len(pages.hits)
        m.collect()
        if len(pages.hits) > before:
            tried.append(sweep)
    assert tried == [1, 2, 4, 8, 16, 24]
    assert m.c._failing["shop/bad"] == (6, 32)


def test_a_pod_that_answers_again_is_tried_every_sweep(api: ApiServer, pages: Pages,
                                                       make: Callable[..., Made]) -> None:
    state = {"status": 500}

    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        body = gauge_page("g", 1).encode()
        h.send_response(state["status"])
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    api.items = [annotated("flaky", "127.0.0.2", pages.serve("127.0.0.2", answer=answer))]
    m = make()
    m.collect()
    m.collect()
    assert m.c._failing == {"shop/flaky": (2, 4)}
    state["status"] = 200
    m.collect()
    assert len(pages.hits) == 2, "sweep 3 skipped"
    assert len(m.collect()) == 1 and m.c._failing == {}
    m.collect()
    assert len(pages.hits) == 4


def test_a_failing_pod_gone_from_the_list_is_forgotten(api: ApiServer, pages: Pages,
                                                       make: Callable[..., Made]) -> None:
    bad = pages.serve("127.0.0.2", "", status=500)
    good = pages.serve("127.0.0.3", gauge_page("g", 1))
    clock = ManualClock()
    api.items = [annotated("bad", "127.0.0.2", bad), annotated("good", "127.0.0.3", good)]
    m = make(clock, pod_discovery_interval_s=30.0)
    m.collect()
    m.collect()
    assert set(m.c._failing) == {"shop/bad"}
    api.items = [annotated("good", "127.0.0.3", good)]
    clock.now += 30
    m.collect()
    assert m.c._failing == {}
    api.items = [annotated("bad", "127.0.0.2", bad), annotated("good", "127.0.0.3", good)]
    clock.now += 30
    hits = pages.hits.count("127.0.0.2/metrics")
    m.collect()
    assert pages.hits.count("127.0.0.2/metrics") == hits + 1, "back on the list: tried at once"
    assert m.c._failing == {"shop/bad": (1, m.c._sweep + 1)}


def test_pods_that_failed_go_after_those_that_answered(api: ApiServer, pages: Pages, make: Callable[..., Made],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(annotated_pods, "MAX_PARALLEL", 1)  # one thread: the requests come in the queue's order
    bad = pages.serve("127.0.0.2", "", status=500)
    good = pages.serve("127.0.0.3", gauge_page("g", 1))
    api.items = [annotated("b", "127.0.0.3", good), annotated("a-bad", "127.0.0.2", bad),
                 annotated("c", "127.0.0.3", good, namespace="z")]
    m = make()
    m.collect()
    assert pages.hits == ["127.0.0.2/metrics", "127.0.0.3/metrics", "127.0.0.3/metrics"], "by namespace and name"
    pages.hits.clear()
    m.collect()
    assert pages.hits == ["127.0.0.3/metrics", "127.0.0.3/metrics", "127.0.0.2/metrics"], "the failed one last"
    assert m.c._pool is not None and m.c._pool._max_workers == 1


def test_a_pod_that_hangs_is_left_out_at_the_sweeps_deadline_and_one_without_a_thread_is_not_blamed(
        api: ApiServer, pages: Pages, make: Callable[..., Made], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(annotated_pods, "MAX_PARALLEL", 1)
    hang = pages.serve("127.0.0.2", answer=pages.hang)
    good = pages.serve("127.0.0.3", gauge_page("g", 1))
    api.items = [annotated("a", "127.0.0.2", hang), annotated("b", "127.0.0.2", hang),
                 annotated("c", "127.0.0.3", good)]
    m = make(collector_timeout_s=0.3)
    assert m.collect() == []
    texts = dict(m.drops)
    # b waits for a's thread: cancelled at the sweep's deadline, or started as a's scrape ends at its own (a moment
    # later) and then cut off; c, after it, never gets the thread
    assert len(m.drops) == 3 and {"scrape:shop/a", "unscraped:shop/c"} < set(texts)
    assert set(texts) - {"scrape:shop/a", "unscraped:shop/c"} in ({"unscraped:shop/b"}, {"scrape:shop/b"})
    assert texts["scrape:shop/a"] in (
        f"shop/a: http://127.0.0.2:{hang}/metrics: no page within collector_timeout_s (0.3 s, all pods together); "
        "left out this sweep",
        f"shop/a: http://127.0.0.2:{hang}/metrics: no complete answer within collector_timeout_s (0.3 s); its "
        "series are left out")
    assert texts["unscraped:shop/c"] == (
        f"shop/c: http://127.0.0.3:{good}/metrics: not scraped, no thread free within collector_timeout_s (0.3 s; "
        f"more than 1 pods were slow); tried first next sweep")
    assert "shop/c" not in m.c._failing and m.c._failing["shop/a"] == (1, 2)


def test_the_sweeps_byte_budget(api: ApiServer, pages: Pages, make: Callable[..., Made],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert (MAX_SWEEP_BYTES, MAX_PAGE_BYTES, MAX_PARALLEL) == (8 << 20, 1 << 20, 16)
    monkeypatch.setattr(annotated_pods, "MAX_PARALLEL", 1)
    page = gauge_page("g", 1)
    size = len(page.encode())
    monkeypatch.setattr(annotated_pods, "MAX_SWEEP_BYTES", size + 5)
    port = pages.serve("127.0.0.3", page)
    api.items = [annotated(f"p{i}", "127.0.0.3", port) for i in range(3)]
    m = make()
    (fam,) = m.collect()
    assert [labels[1] for labels, _ in fam.samples] == ["p0"]
    assert m.keys() == ["budget:shop/p1", "budget:shop/p2"]
    texts = dict(m.drops)
    assert texts["budget:shop/p1"] == (f"shop/p1: http://127.0.0.3:{port}/metrics: the sweep's {size + 5} bytes of "
                                       "pages (MAX_SWEEP_BYTES, all pods together) are spent; not read, left out "
                                       "this sweep")
    assert texts["budget:shop/p2"] == texts["budget:shop/p1"].replace("p1", "p2")
    assert len(pages.hits) == 2, "p2 is refused before it is asked"
    assert m.c._failing == {}, "a pod the budget left out is not failing"


def test_a_budget_spent_to_its_last_byte_refuses_the_next_page_unasked(
        api: ApiServer, pages: Pages, make: Callable[..., Made], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(annotated_pods, "MAX_PARALLEL", 1)
    page = gauge_page("g", 1)
    monkeypatch.setattr(annotated_pods, "MAX_SWEEP_BYTES", len(page.encode()))
    port = pages.serve("127.0.0.3", page)
    api.items = [annotated(f"p{i}", "127.0.0.3", port) for i in range(2)]
    m = make()
    assert len(m.collect()) == 1 and m.keys() == ["budget:shop/p1"] and len(pages.hits) == 1


def test_budget_charges_and_spent() -> None:
    b = _Budget(10)
    assert b.left == 10 and not b.spent
    b.charge(9)
    assert b.left == 1 and not b.spent
    b.charge(1)
    assert b.left == 0 and b.spent
    with pytest.raises(BudgetSpent) as e:
        b.charge(1)
    assert str(e.value) == (f"the sweep's {MAX_SWEEP_BYTES} bytes of pages (MAX_SWEEP_BYTES, all pods together) are "
                            "spent")
    assert b.left == -1 and b.spent


def test_a_page_past_max_page_bytes_costs_its_pod(api: ApiServer, pages: Pages, make: Callable[..., Made],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    head = "# TYPE big gauge\nbig 1\n"
    at = pages.serve("127.0.0.2", head + "#" * (MAX_PAGE_BYTES - len(head) - 1) + "\n")
    over = pages.serve("127.0.0.3", head + "#" * (MAX_PAGE_BYTES - len(head)) + "\n")
    api.items = [annotated("at", "127.0.0.2", at), annotated("over", "127.0.0.3", over)]
    m = make()
    (fam,) = m.collect()
    assert [labels[1] for labels, _ in fam.samples] == ["at"]
    assert m.keys() == ["scrape:shop/over"]
    assert f"a page larger than {MAX_PAGE_BYTES} bytes" in m.drops[0][1]


def test_an_empty_queue_starts_no_threads(api: ApiServer, make: Callable[..., Made]) -> None:
    api.items = []
    m = make()
    assert m.collect() == [] and m.c._pool is None


def test_close_ends_the_pool_and_a_later_sweep_starts_another(api: ApiServer, pages: Pages,
                                                              make: Callable[..., Made]) -> None:
    api.items = [annotated("a", "127.0.0.2", pages.serve("127.0.0.2", gauge_page("g", 1)))]
    m = make()
    m.collect()
    pool = m.c._pool
    assert pool is not None
    m.c.close()
    assert m.c._pool is None and pool._shutdown
    m.c.close()
    assert len(m.collect()) == 1 and m.c._pool is not None and m.c._pool is not pool


def test_a_target_is_its_pods_ip_port_path_and_identity() -> None:
    pod = Pod("batch", "train-0", "fd00::7", {}, (("main", 8080), ("side", 9090)))
    t = Target(pod, 8080, "/m")
    assert (t.ip, t.port, t.path, t.identity, t.who, t.url) == (
        "fd00::7", 8080, "/m", ("batch", "train-0", "main"), "batch/train-0", "http://[fd00::7]:8080/m")
    assert Target(pod, 7000, "/metrics").identity == ("batch", "train-0", "")


def test_the_first_pods_help_a_default_help_and_the_collectors_name(api: ApiServer, pages: Pages,
                                                                    make: Callable[..., Made]) -> None:
    api.items = [annotated("a", "127.0.0.2", pages.serve("127.0.0.2", "# HELP g First.\n# TYPE g gauge\ng 1\n")),
                 annotated("b", "127.0.0.3", pages.serve("127.0.0.3", "# HELP g Second.\n# TYPE g gauge\ng 2\n")),
                 annotated("c", "127.0.0.4", pages.serve("127.0.0.4", "# TYPE quiet gauge\nquiet 3\n"))]
    fams = {f.defn.name: f.defn for f in make().collect()}
    assert fams["g"].help == "First."
    assert fams["quiet"].help == "A metric of a pod's own /metrics endpoint."
    assert {d.collector for d in fams.values()} == {"annotated_pods"}


def test_a_malformed_line_is_said_with_its_pods_url(api: ApiServer, pages: Pages, make: Callable[..., Made]) -> None:
    port = pages.serve("127.0.0.2", "# TYPE g gauge\ng 1\ng{ 2\n")
    api.items = [annotated("a", "127.0.0.2", port, path="/m")]
    m = make()
    assert len(m.collect()) == 1
    ((key, why),) = m.drops
    assert key == "line" and why.startswith(f"http://127.0.0.2:{port}/m: 1 malformed lines left out (line 3: ")


def test_a_pod_skipped_by_its_back_off_is_logged_at_debug(api: ApiServer, pages: Pages, make: Callable[..., Made],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    import logging

    caplog.set_level(logging.DEBUG, logger="outrider.collectors.annotated_pods")
    api.items = [annotated("bad", "127.0.0.2", pages.serve("127.0.0.2", "", status=500))]
    m = make()
    for _ in range(3):
        m.collect()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert said == ["annotated_pods: shop/bad failed 2 sweeps in a row; not tried this sweep"]


def test_the_scrape_threads_are_named(api: ApiServer, pages: Pages, make: Callable[..., Made]) -> None:
    api.items = [annotated("a", "127.0.0.2", pages.serve("127.0.0.2", gauge_page("g", 1)))]
    m = make()
    m.collect()
    pool = m.c._pool
    assert pool is not None and pool._thread_name_prefix == "outrider-scrape"
    assert pool._max_workers == MAX_PARALLEL
    m.collect()
    assert m.c._pool is pool, "one pool for every sweep"


def test_close_during_a_sweep_keeps_the_page_that_came_and_asks_no_other(
        api: ApiServer, pages: Pages, make: Callable[..., Made], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(annotated_pods, "MAX_PARALLEL", 1)
    made: list[Made] = []
    body = gauge_page("g", 1).encode()

    def closing(h: http.server.BaseHTTPRequestHandler) -> None:
        made[0].c.close()  # while this pod's scrape waits for its page, the others still queued
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    a = pages.serve("127.0.0.2", answer=closing)
    other = pages.serve("127.0.0.3", gauge_page("g", 2))
    api.items = [annotated("a", "127.0.0.2", a), annotated("b", "127.0.0.3", other),
                 annotated("c", "127.0.0.3", other)]
    made.append(make(collector_timeout_s=0.5))
    m = made[0]
    (fam,) = m.collect()
    assert fam.samples == [(("shop", "a", ""), 1.0)]
    assert pages.hits == ["127.0.0.2/metrics"], "the pods still queued are never asked"
    assert sorted(m.keys()) == ["unscraped:shop/b", "unscraped:shop/c"] and m.c._failing == {}
    assert m.c._pool is None


def test_renamed_labels_never_take_one_name_twice(api: ApiServer, make: Callable[..., Made]) -> None:
    m = make(k8s_owner_pod_label="pod", k8s_owner_namespace_label="exported_pod")
    assert m.c._renamed(("pod", "exported_pod")) == ("exported_exported_pod", "exported_exported_exported_pod")


def test_a_pod_whose_type_clashes_costs_itself_not_the_pods_after_it(api: ApiServer, pages: Pages,
                                                                     make: Callable[..., Made]) -> None:
    counter, gauge = "# TYPE x counter\nx_total 1\n", "# TYPE x gauge\nx 2\n"
    api.items = [annotated("p0", "127.0.0.2", pages.serve("127.0.0.2", counter)),
                 annotated("p1", "127.0.0.3", pages.serve("127.0.0.3", gauge)),
                 annotated("p2", "127.0.0.4", pages.serve("127.0.0.4", counter))]
    m = make()
    (fam,) = m.collect()
    assert [labels[-2] for labels, _ in fam.samples] == ["p0", "p2"]
    assert m.keys() == ["kind:x"]


def test_a_gauge_named_like_another_pods_gauge_plus_total_is_its_own_family(api: ApiServer, pages: Pages,
                                                                          make: Callable[..., Made]) -> None:
    api.items = [annotated("p0", "127.0.0.2", pages.serve("127.0.0.2", gauge_page("y", 1))),
                 annotated("p1", "127.0.0.3", pages.serve("127.0.0.3", gauge_page("y_total", 2)))]
    m = make()
    assert {f.defn.name: [labels[-2] for labels, _ in f.samples] for f in m.collect()} == {"y": ["p0"],
                                                                                           "y_total": ["p1"]}
    assert m.drops == []


def test_a_name_the_agent_owns_is_refused(api: ApiServer, pages: Pages, make: Callable[..., Made]) -> None:
    api.items = [annotated("p0", "127.0.0.2", pages.serve("127.0.0.2", gauge_page("outrider_up", 1)
                                                            + gauge_page("mine", 2)))]
    m = make()
    assert [f.defn.name for f in m.collect()] == ["mine"]
    assert m.keys() == ["reserved:outrider_up"]
