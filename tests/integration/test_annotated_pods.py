"""A node agent's scrape of its node's annotated pods (scrape_annotated_pods): the pods from a stand-in for the
Kubernetes API server, each pod's endpoint a real prometheus_client service bound to its own loopback address (all
of 127/8 is loopback on Linux) as its pod IP, and prometheus_client's own parser as the oracle of every value the
agent exports, with the pod's identity. Then what must not be scraped, a failed discovery, a pod that hangs, a label
that collides with the identity's, and the caps shared by all pods."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import ssl
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from prometheus_client.parser import text_string_to_metric_families

from outrider.collectors import annotated_pods
from outrider.collectors.annotated_pods import (
    MAX_PAGE_BYTES,
    MAX_PARALLEL,
    MAX_SWEEP_BYTES,
    AnnotatedPodsCollector,
)
from outrider.collectors.base import CollectorContext
from outrider.collectors.workload_metrics import ScrapeError, scrape
from outrider.exporters.otlp import to_metrics_data
from outrider.ground.clock import ManualClock
from outrider.ground.config import Config, ConfigError, load
from outrider.k8s.node_pods import KEEP_INTERVALS, DiscoveryError, NodePods, running_pods
from outrider.metrics.exposition import render
from outrider.metrics.family import Family
from tests import helpers
from tests.fakes.pod_pages import Pages
from tests.helpers import http_get, reap, samples, self_signed, served_by_agent, wait_until

pytestmark = pytest.mark.integration

NODE = "node-a"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.stand-in-service-account-token"
Key = tuple[str, tuple[tuple[str, str], ...]]

SERVICE = r'''
import sys, time
from prometheus_client import Counter, Gauge, Histogram, Summary, start_http_server

addr, port, ready, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
REQUESTS = Counter("shop_requests", "Requests served.", ["route"])
LATENCY = Histogram("shop_latency_seconds", "Request latency.", ["route"], buckets=(0.01, 0.1, 1.0))
JOBS = Gauge("shop_jobs", "Jobs by the worker pod that runs them.", ["pod", "exported_pod"])
SIZES = Summary("shop_body_bytes", "Request body sizes.")
for i in range(n):
    route = "/pay" if i % 3 else "/cart"
    REQUESTS.labels(route).inc()
    LATENCY.labels(route).observe(0.05 * i)
    SIZES.observe(100 * i)
JOBS.labels(f"worker-{n}", "upstream").set(n)
start_http_server(port, addr=addr)
open(ready, "w").close()
time.sleep(300)
'''


# The agent refuses loopback pod IPs (a pod never has one); the tests' pods are 127.0.0.x addresses, so each test
# lets them through with the collector's class attribute (never a setting: no configuration can turn the check off),
# the agent process too, and the test of the refusal sets it back.
LOOPBACK_AGENT = ("import runpy; from outrider.collectors.annotated_pods import AnnotatedPodsCollector; "
                  "AnnotatedPodsCollector.allow_loopback_pods = True; runpy.run_module('outrider', "
                  "run_name='__main__', alter_sys=True)")


@pytest.fixture(autouse=True)
def loopback_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AnnotatedPodsCollector, "allow_loopback_pods", True)
    monkeypatch.setattr(helpers, "outrider_cmd", lambda *args: [sys.executable, "-c", LOOPBACK_AGENT, *args])


def free_port_on(ip: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def pod(name: str, ip: str, port: int | str | None, *, namespace: str = "shop", node: str = NODE,
        phase: str = "Running", container_port: int | None = None) -> dict[str, Any]:
    """A pod as the API server serves it in a PodList (the fields the agent reads, and some it must not mind)."""
    annotations = {"kubectl.kubernetes.io/default-container": "shop"}
    if port is not None:
        annotations["outrider.dev/metrics-port"] = str(port)
    ports = [{"name": "metrics", "containerPort": container_port, "protocol": "TCP"}] if container_port else []
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "4711",
                     "labels": {"app": "shop"}, "annotations": annotations,
                     "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1"}]},
        "spec": {"nodeName": node, "serviceAccountName": "default",
                 "containers": [{"name": "shop", "image": "shop:1", "ports": ports},
                                {"name": "outrider", "image": "outrider:1",
                                 "ports": [{"containerPort": 9477, "protocol": "TCP"}]}]},
        "status": {"phase": phase, "hostIP": "10.0.0.1", "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}]},
    }


@dataclass
class ApiServer:
    """Stands in for the Kubernetes API server's HTTP contract for `GET /api/v1/pods`: TLS with a certificate the
    service account's ca.crt verifies, a bearer token checked (401 otherwise), `fieldSelector=spec.nodeName=X`
    honoured as the API server honours it (every pod without one), a PodList answer. `failing` makes it answer
    503; `requests` counts the lists it served or refused."""

    directory: Path
    pods: list[dict[str, Any]] = field(default_factory=list)
    failing: bool = False
    answer: Any = None  # served instead of the PodList where set
    requests: int = 0
    queries: list[dict[str, list[str]]] = field(default_factory=list)
    url: str = ""
    account_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        cert, key = self_signed(self.directory / "tls")
        self.account_dir = self.directory / "serviceaccount"
        self.account_dir.mkdir()
        (self.account_dir / "ca.crt").write_bytes(cert.read_bytes())
        (self.account_dir / "token").write_text(TOKEN + "\n")
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api.requests += 1
                parts = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(parts.query)
                api.queries.append(query)
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._answer(401, {"kind": "Status", "status": "Failure", "reason": "Unauthorized"})
                if api.failing:
                    return self._answer(503, {"kind": "Status", "status": "Failure", "reason": "ServiceUnavailable"})
                if parts.path != "/api/v1/pods":
                    return self._answer(404, {"kind": "Status", "status": "Failure", "reason": "NotFound"})
                items = api.pods
                for selector in query.get("fieldSelector", []):
                    fieldname, _, wanted = selector.partition("=")
                    assert fieldname == "spec.nodeName", selector
                    items = [p for p in items if p["spec"]["nodeName"] == wanted]
                if api.answer is not None:
                    return self._answer(200, api.answer)
                self._answer(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "4711"},
                                   "items": items})

            def _answer(self, status: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self._server.server_address[1]}"

    def settings(self, **more: Any) -> dict[str, Any]:
        return {"scrape_annotated_pods": True, "k8s_node_name": NODE, "k8s_api_server": self.url,
                "k8s_service_account_dir": str(self.account_dir), **more}

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path / "api")
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Service:
    ip: str
    port: int

    def page(self) -> str:
        status, _, body = http_get(f"http://{self.ip}:{self.port}/metrics")
        assert status == 200
        return body.decode()


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Service]]:
    """Real prometheus_client services, one per loopback address, each with its own counts (so each pod's values
    are its own): a, b (listed, Running, annotated), pending (annotated, not Running), plain (Running, no
    annotation), elsewhere (annotated, on another node)."""
    tmp = tmp_path_factory.mktemp("services")
    script = tmp / "shop.py"
    script.write_text(SERVICE)
    out, procs = {}, []
    try:
        for n, (name, ip) in enumerate([("a", "127.0.0.2"), ("b", "127.0.0.3"), ("pending", "127.0.0.4"),
                                        ("plain", "127.0.0.5"), ("elsewhere", "127.0.0.6")], start=4):
            port, ready = free_port_on(ip), tmp / f"{name}.ready"
            procs.append(subprocess.Popen([sys.executable, str(script), ip, str(port), str(ready), str(n)]))
            out[name] = Service(ip, port)
            wait_until(ready.exists, timeout_s=60, what=f"service {name} to serve its /metrics")
        yield out
    finally:
        for p in procs:
            p.kill()
        reap(procs)


def node_pods(services: dict[str, Service]) -> list[dict[str, Any]]:
    s = services
    return [pod("shop-a", s["a"].ip, s["a"].port, container_port=s["a"].port),  # the port is container shop's
            pod("shop-b", s["b"].ip, s["b"].port, namespace="batch"),  # no container declares the port
            pod("shop-pending", s["pending"].ip, s["pending"].port, phase="Pending"),
            pod("shop-plain", s["plain"].ip, None),
            pod("shop-misannotated", s["plain"].ip, "eighty"),
            pod("shop-elsewhere", s["elsewhere"].ip, s["elsewhere"].port, node="node-b")]


def oracle(page: str, identity: dict[str, str], renamed: dict[str, str]) -> dict[Key, float]:
    """A pod's own series as prometheus_client's parser reads its page, less what the agent leaves out (summaries),
    its labels renamed as Prometheus renames a scraped label that a target label takes, and the pod's identity
    added. (Its process_* and python_* series are exported too, but change from one scrape to the next.)"""
    out = {}
    for fam in text_string_to_metric_families(page):
        if fam.type == "summary" or not fam.name.startswith("shop_"):
            continue
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            labels = {renamed.get(k, k): v for k, v in s.labels.items()}
            out[(s.name, tuple(sorted({**labels, **identity}.items())))] = s.value
    return out


def exported(text: str) -> dict[Key, float]:
    return {k: v for k, v in samples(text).items() if k[0].startswith("shop_") and not k[0].endswith("_created")}


DEFAULT_RENAMED = {"exported_pod": "exported_exported_pod"}  # the workload's own `exported_pod`; `pod` is free


def test_the_node_agent_exports_what_each_annotated_pod_serves_with_its_identity(
        api: ApiServer, services: dict[str, Service]) -> None:
    api.pods = node_pods(services)
    a, b = services["a"], services["b"]
    want = {**oracle(a.page(), {"exported_namespace": "shop", "exported_pod": "shop-a",
                                "exported_container": "shop"}, DEFAULT_RENAMED),
            **oracle(b.page(), {"exported_namespace": "batch", "exported_pod": "shop-b"}, DEFAULT_RENAMED)}
    assert want[("shop_jobs", (("exported_container", "shop"), ("exported_exported_pod", "upstream"),
                               ("exported_namespace", "shop"), ("exported_pod", "shop-a"), ("pod", "worker-4")))] == 4
    env = {"OUTRIDER_SCRAPE_ANNOTATED_PODS": "true", "NODE_NAME": NODE, "OUTRIDER_K8S_API_SERVER": api.url,
           "OUTRIDER_K8S_SERVICE_ACCOUNT_DIR": str(api.account_dir)}
    text, left_out = served_by_agent(env, "shop_requests_total", "the pods' series on the agent's /metrics",
                                     "annotated_pods")
    assert exported(text) == want, "every counter, gauge and histogram sample of each pod, and no other pod's"
    assert left_out >= 1, "the summary, counted"
    assert api.requests >= 1, "the pods came from the API server"


Make = Callable[..., AnnotatedPodsCollector]


@pytest.fixture
def make(api: ApiServer) -> Iterator[Make]:
    """Collectors on the stand-in API server, with the settings given (and a test's clock), closed at the end."""
    made: list[AnnotatedPodsCollector] = []

    def build(clock: ManualClock | None = None, **settings: Any) -> AnnotatedPodsCollector:
        ctx = CollectorContext(Config(**api.settings(**settings)))
        if clock is not None:
            ctx.clock = clock.clock()
        made.append(AnnotatedPodsCollector(ctx))
        return made[-1]

    yield build
    for c in made:
        c.close()


def label_values(fams: list[Family], label: str = "exported_pod") -> set[str]:
    """The values of `label` across the families' exposition, as prometheus_client's parser reads it."""
    return {v for _, labels in samples(render(fams).decode()) for name, v in labels if name == label}


def scraped_pods(c: AnnotatedPodsCollector) -> set[str]:
    return label_values(c.collect())


def test_only_running_annotated_pods_of_this_node_at_their_listed_ips_are_scraped(
        api: ApiServer, services: dict[str, Service], make: Make) -> None:
    api.pods = node_pods(services)
    c = make()
    try:
        assert scraped_pods(c) == {"shop-a", "shop-b"}, "not the pending pod, the unannotated one, another node's"
        assert c.errors == 3, "the bad annotation, named by its pod; the summaries of a and b"
        # the stand-in serves a pod of another node when not asked for this node's only; the agent leaves it out
        shapeless = {"metadata": "not a pod's", "spec": {"nodeName": NODE},
                     "status": {"phase": "Running", "podIP": "127.0.0.9"}}
        pods, bad = running_pods({"kind": "PodList", "items": [*api.pods, shapeless]}, NODE, allow_loopback=True)
        assert sorted(p.name for p in pods) == ["shop-a", "shop-b", "shop-misannotated", "shop-plain"] and bad == 1
        api.pods = [pod("shop-a", "shop-a.example", services["a"].port)]
        assert scraped_pods(make()) == set(), "a pod IP must be an address, never a name to resolve"
    finally:
        c.close()


def test_the_pods_are_asked_for_once_an_interval_and_a_failed_ask_keeps_the_last_list(
        api: ApiServer, pages: Pages, caplog: pytest.LogCaptureFixture, make: Make) -> None:
    page = "# TYPE ready gauge\nready 1\n"
    api.pods = [pod("p0", "127.0.0.14", pages.serve("127.0.0.14", page)),
                pod("p1", "127.0.0.15", pages.serve("127.0.0.15", page))]
    clock = ManualClock()
    c = make(clock, pod_discovery_interval_s=30.0)
    assert KEEP_INTERVALS == 2, "a pod IP may go to another pod meanwhile: an old list mislabels its series"
    try:
        assert scraped_pods(c) == {"p0", "p1"} and api.requests == 1
        assert api.queries == [{"fieldSelector": [f"spec.nodeName={NODE}"], "resourceVersion": ["0"]}], \
            "this node's pods only, from the API server's cache"
        assert scraped_pods(c) == {"p0", "p1"} and api.requests == 1, "a sweep within the interval asks not"
        api.failing = True
        clock.now += 30.0
        assert scraped_pods(c) == {"p0", "p1"}, "the last good list, kept"
        assert api.requests == 2 and c.errors == 1, "the failed ask, counted"
        clock.now += 30.0 * (KEEP_INTERVALS - 1)
        assert scraped_pods(c) == {"p0", "p1"}, "still within KEEP_INTERVALS intervals of the last good one"
        assert api.requests == 3 and c.errors == 2, "each failed ask counted"
        assert sum("dropped reading discovery" in r.getMessage() for r in caplog.records) == 1, "logged once"
        clock.now += 30.0
        with pytest.raises(DiscoveryError, match="HTTP 503"):
            c.collect()  # too old: no targets, the collector fails (its success 0)
        api.failing = False
        clock.now += 30.0
        errors = c.errors
        assert scraped_pods(c) == {"p0", "p1"}, "back with the next good answer"
        assert c.errors == errors, "a good ask after failed ones is no failure"
    finally:
        c.close()


def test_a_refused_token_an_unreadable_one_and_a_garbled_answer_fail_discovery_with_a_clear_message(
        api: ApiServer, services: dict[str, Service], make: Make) -> None:
    api.pods = node_pods(services)
    api.answer = {"kind": "Status", "items": "no"}
    with pytest.raises(DiscoveryError, match="not a PodList"):
        make().collect()
    api.answer = None
    (api.account_dir / "token").write_text("someone-elses-token")
    with pytest.raises(DiscoveryError, match=r"HTTP 401 \(the service-account token was refused"):
        make().collect()
    (api.account_dir / "token").unlink()
    with pytest.raises(DiscoveryError, match="cannot read the service-account token"):
        make().collect()
    plain = NodePods("http://10.0.0.1:8080", NODE, str(api.account_dir), 1.0, 30.0)
    with pytest.raises(DiscoveryError, match="https, or plain http to loopback only"):
        plain.pods()  # refused before any connection: a token never crosses a network in the clear


@dataclass
class Rendezvous:
    """Pod endpoints that answer only once `parties` scrapes are open at the same time (so a scrape of one pod
    after another never gets an answer), and one that never answers at all."""

    parties: int
    hang_ip: str = "127.0.0.7"
    servers: list[socket.socket] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    hung: list[socket.socket] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.barrier = threading.Barrier(self.parties, timeout=60)

    def listen(self, ip: str, serve: Callable[[socket.socket], None]) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((ip, 0))
        sock.listen(16)
        sock.settimeout(0.2)
        self.servers.append(sock)

        def accept() -> None:
            while not self.stop.is_set():
                try:
                    conn, _ = sock.accept()
                except OSError:
                    continue
                threading.Thread(target=serve, args=(conn,), daemon=True).start()
        threading.Thread(target=accept, daemon=True).start()
        return int(sock.getsockname()[1])

    def answer_together(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError, threading.BrokenBarrierError):
            conn.recv(65536)
            self.barrier.wait()
            body = b"# TYPE met_together gauge\nmet_together 1\n"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (len(body), body))

    def never_answer(self, conn: socket.socket) -> None:
        self.hung.append(conn)  # held open, unanswered, until the test ends

    def close(self) -> None:
        self.stop.set()
        self.barrier.abort()
        for s in [*self.servers, *self.hung]:
            s.close()


def test_a_hanging_pod_does_not_hold_up_the_others_beyond_the_deadline(api: ApiServer, make: Make) -> None:
    peers = Rendezvous(parties=3)
    try:
        ips = ["127.0.0.8", "127.0.0.9", "127.0.0.10"]
        api.pods = [pod(f"met-{i}", ip, peers.listen(ip, peers.answer_together)) for i, ip in enumerate(ips)]
        api.pods.append(pod("hangs", peers.hang_ip, peers.listen(peers.hang_ip, peers.never_answer)))
        c = make(collector_timeout_s=5.0)
        outcome: list[Any] = []
        t = threading.Thread(target=lambda: outcome.append(c.collect()), daemon=True)
        t.start()
        t.join(120)  # a bound on the test, not the assertion
        assert not t.is_alive() and outcome, "the sweep came back although one pod never answers"
        assert label_values(outcome[0]) == {"met-0", "met-1", "met-2"}, \
            "the three pods were scraped at the same time (one after another, none would have been answered)"
        assert c.errors == 1, "the pod that hangs, counted (and logged by name)"
        c.close()
    finally:
        peers.close()


@pytest.fixture
def pages() -> Iterator[Pages]:
    with Pages() as p:
        yield p


def test_a_workload_label_named_like_an_identity_label_becomes_exported(
        api: ApiServer, pages: Pages, make: Make) -> None:
    page = ('# TYPE jobs gauge\njobs{pod="worker-1",exported_pod="x",namespace="batch",route="/"} 3\n'
            '# TYPE plain gauge\nplain{route="/"} 1\n')
    api.pods = [pod("train-0", "127.0.0.11", pages.serve("127.0.0.11", page), namespace="ml")]
    c = make(k8s_owner_namespace_label="namespace", k8s_owner_pod_label="pod",
                  k8s_owner_container_label="container")
    fams = c.collect()
    text = render(fams).decode()
    got = samples(text)
    # as Prometheus resolves it: `pod` would be exported_pod, which the workload has too, so exported_exported_pod
    assert got[("jobs", (("exported_exported_pod", "worker-1"), ("exported_namespace", "batch"), ("exported_pod", "x"),
                         ("namespace", "ml"), ("pod", "train-0"), ("route", "/")))] == 3, text
    assert got[("plain", (("namespace", "ml"), ("pod", "train-0"), ("route", "/")))] == 1
    data = to_metrics_data(fams, Resource({}), 0, 1)
    point = next(m for m in data.resource_metrics[0].scope_metrics[0].metrics if m.name == "plain").data.data_points[0]
    assert dict(point.attributes) == {"route": "/", "k8s.namespace.name": "ml", "k8s.pod.name": "train-0"}, \
        "on OTLP the identity is the semantic conventions' (no container: none declares the port)"
    c.close()


def test_each_pod_has_its_own_series_caps_and_a_type_clash_costs_the_second_pod(
        api: ApiServer, pages: Pages, make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    def wide(n: int, name: str = "wide") -> str:
        return f"# TYPE {name} counter\n" + "".join(f'{name}_total{{n="{i:03d}"}} 1\n' for i in range(n))

    api.pods = [pod("p0", "127.0.0.12", pages.serve("127.0.0.12", wide(150) + "# TYPE clash counter\nclash_total 1\n")),
                pod("p1", "127.0.0.13", pages.serve("127.0.0.13", wide(60) + "# TYPE clash gauge\nclash 2\n"))]
    c = make(hook_max_series_per_metric=100)
    got: list[str] = []
    c.drop = lambda key, why: got.append(str(why))  # type: ignore[method-assign]
    fams = {f.defn.name: f for f in c.collect()}
    per_pod = {p: sum(1 for labels, _ in fams["wide_total"].samples if labels[-2] == p) for p in ("p0", "p1")}
    assert per_pod == {"p0": 100, "p1": 60}, "hook_max_series_per_metric is each pod's: p0's 150 cost p1 none"
    assert [v for _, v in fams["clash_total"].samples] == [1.0], "p0's counter; p1's gauge of that name left out"
    assert len(got) == 2 and got[0].startswith("shop/p0: wide: past the cap of 100"), got  # the cap, the clash
    c.close()

    # MAX_SERIES is shared out evenly: with 100 in all, each of the two pods has 50, however many the other has
    monkeypatch.setattr(annotated_pods, "MAX_SERIES", 100)
    api.pods = [pod("p0", "127.0.0.12", pages.serve("127.0.0.12", wide(80, "a") + wide(10, "b"))),
                pod("p1", "127.0.0.13", pages.serve("127.0.0.13", wide(10, "a") + wide(10, "b")))]
    c = make(hook_max_series_per_metric=100)
    got.clear()
    c.drop = lambda key, why: got.append(str(why))  # type: ignore[method-assign]
    fams = {f.defn.name: f for f in c.collect()}
    pods_of = {name: [labels[-2] for labels, _ in fam.samples] for name, fam in fams.items()}
    assert sorted(pods_of["a_total"]) == ["p0"] * 50 + ["p1"] * 10 and pods_of["b_total"] == ["p1"] * 10
    assert len(got) == 1 and got[0].startswith("shop/p0: past its share of 50 series"), got
    c.close()


@pytest.mark.parametrize(("first_page", "second_page", "first", "kept", "left_out"), [
    ("# TYPE clash counter\nclash_total 1\n", "# TYPE clash_total gauge\nclash_total 2\n", "clash", "counter",
     "gauge"),
    ("# TYPE clash_total gauge\nclash_total 2\n", "# TYPE clash counter\nclash_total 1\n", "clash_total", "gauge",
     "counter"),
])
def test_a_gauge_under_the_name_another_pods_counter_is_exported_as_is_left_out_not_merged_into_it(
        api: ApiServer, pages: Pages, make: Make, first_page: str, second_page: str, first: str, kept: str,
        left_out: str) -> None:
    """A counter `clash` is exported as clash_total, the name a gauge `clash_total` has: one name on /metrics is one
    family, the first pod's (by namespace and name), and the other pod's is left out, counted, as a clash of one
    family name is; never its samples under the first pod's type."""
    api.pods = [pod("p0", "127.0.0.12", pages.serve("127.0.0.12", first_page)),
                pod("p1", "127.0.0.13", pages.serve("127.0.0.13", second_page))]
    c = make()
    got: list[str] = []
    c.drop = lambda key, why: got.append(str(why))  # type: ignore[method-assign]
    fams = [f for f in c.collect() if f.samples]
    assert [(f.defn.name, f.defn.type, [labels[-2] for labels, _ in f.samples]) for f in fams] == \
        [("clash_total", kept, ["p0"])], "p0's series only, under p0's type"
    assert got == [f"{first}: a {left_out} in shop/p1 but a {kept} in shop/p0; shop/p1's is left out"]
    text = render(fams).decode()
    assert text.count("# TYPE clash_total ") == 1 and "p1" not in text
    c.close()


def test_a_pods_page_is_read_to_one_mib_and_one_larger_costs_only_that_pods_series(
        api: ApiServer, pages: Pages, make: Make) -> None:
    """MAX_PAGE_BYTES and MAX_SWEEP_BYTES bound the node agent's memory, where the sidecar's one page may be 8 MiB."""
    assert MAX_PAGE_BYTES == 1 << 20

    assert len(big_page(MAX_PAGE_BYTES)) == MAX_PAGE_BYTES
    api.pods = [pod("at", "127.0.0.14", pages.serve("127.0.0.14", big_page(MAX_PAGE_BYTES))),
                pod("over", "127.0.0.15", pages.serve("127.0.0.15", big_page(MAX_PAGE_BYTES + 1)))]
    c = make()
    fams = {f.defn.name: f for f in c.collect()}
    assert label_values(list(fams.values())) == {"at"}
    assert c.errors == 1
    c.close()


def big_page(size: int) -> str:
    head = "# TYPE big gauge\nbig 1\n"
    return head + "#" * (size - len(head) - 1) + "\n"


def test_all_pods_together_read_at_most_the_sweeps_budget_and_the_pods_past_it_are_named(
        api: ApiServer, pages: Pages, make: Make) -> None:
    assert MAX_SWEEP_BYTES == 8 << 20
    n = MAX_SWEEP_BYTES // MAX_PAGE_BYTES + 3  # 11 pages of 1 MiB: 3 MiB past the budget
    names = [f"big-{i:02d}" for i in range(n)]
    api.pods = [pod(name, f"127.0.2.{i + 1}", pages.serve(f"127.0.2.{i + 1}", big_page(MAX_PAGE_BYTES)))
                for i, name in enumerate(names)]
    c = make(collector_timeout_s=30.0)
    got: dict[str, str] = {}
    c.drop = lambda key, why: got.__setitem__(key, str(why))  # type: ignore[method-assign]
    scraped = label_values(c.collect())
    assert len(scraped) <= MAX_SWEEP_BYTES // MAX_PAGE_BYTES, "never more than 8 MiB of pages a sweep"
    refused = {key.split("/", 1)[1] for key in got if key.startswith("budget:")}
    assert refused and refused | scraped == set(names) and not refused & scraped, got
    assert all("MAX_SWEEP_BYTES" in why and f"shop/{key.split('/', 1)[1]}" in why for key, why in got.items()), got
    c.close()


def test_the_settings_and_what_they_need() -> None:
    config = load(env={"OUTRIDER_SCRAPE_ANNOTATED_PODS": "yes", "NODE_NAME": "n-1",
                       "OUTRIDER_POD_DISCOVERY_INTERVAL_S": "15"}).config
    assert (config.scrape_annotated_pods, config.k8s_node_name, config.pod_discovery_interval_s) == (True, "n-1", 15)
    assert load(env={"NODE_NAME": "n-1", "OUTRIDER_K8S_NODE_NAME": "n-2"}).config.k8s_node_name == "n-2"
    for bad in ({"OUTRIDER_POD_DISCOVERY_INTERVAL_S": "0.5"}, {"OUTRIDER_K8S_API_SERVER": "10.0.0.1:443"}):
        with pytest.raises(ConfigError, match=r"POD_DISCOVERY_INTERVAL_S|K8S_API_SERVER"):
            load(env=bad)
    with pytest.raises(ConfigError, match="k8s_node_name"):
        AnnotatedPodsCollector(CollectorContext(Config(scrape_annotated_pods=True)))
    off = AnnotatedPodsCollector(CollectorContext(Config()))
    assert off.collect() == [], "off by default: no API server asked, nothing scraped"


def test_pods_that_hang_go_to_the_end_of_the_queue_and_a_pod_that_got_no_thread_is_not_blamed(
        api: ApiServer, pages: Pages, make: Make) -> None:
    """As many pods that hang as there are threads, sorted first: the first sweep's threads all wait on them, and
    the pods after them never get one (named as such, not as failed); from the next sweep on they go first."""
    peers = Rendezvous(parties=1)
    try:
        hang = peers.listen(peers.hang_ip, peers.never_answer)
        api.pods = [pod(f"a-hangs-{i:02d}", peers.hang_ip, hang) for i in range(MAX_PARALLEL)]
        api.pods += [pod(f"z-good-{i}", f"127.0.3.{i + 1}", pages.serve(f"127.0.3.{i + 1}", "# TYPE up gauge\nup 1\n"))
                     for i in range(2)]
        c = make(collector_timeout_s=1.0)
        keys: list[str] = []
        c.drop = lambda key, why: keys.append(key)  # type: ignore[method-assign]
        first = label_values(c.collect())
        good = {"z-good-0", "z-good-1"}
        blamed = {k.split("/", 1)[1] for k in keys if k.startswith("scrape:")} & good
        unscraped = {k.split("/", 1)[1] for k in keys if k.startswith("unscraped:")}
        # a good pod that never got a thread is named as such, not blamed as slow; one that got a thread only as a
        # hung pod's own deadline freed it, a moment before the sweep's, may be cut off (a loaded machine): blamed
        assert unscraped | blamed == good - first and not unscraped & blamed, keys
        for _ in range(2):
            keys.clear()
            assert label_values(c.collect()) == good, "the pods that answered go first: they are scraped"
            assert not any(k.startswith("unscraped:") for k in keys)
        c.close()
    finally:
        peers.close()


class _Truncating:
    """A server on a loopback address that answers 200 with the body's Content-Length and sends all of it but the
    last 8 bytes, then closes: a pod that dies mid-answer."""

    def __init__(self, ip: str, body: bytes) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((ip, 0))
        self.sock.listen(8)
        self.port = int(self.sock.getsockname()[1])
        self.body = body
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(self.body), self.body[:-8]))

    def close(self) -> None:
        self.sock.close()


def test_a_page_cut_short_of_its_content_length_is_no_page(api: ApiServer, make: Make) -> None:
    body = b"# TYPE shop_requests counter\nshop_requests_total 1234567890\n"
    assert len(body) == 60
    server = _Truncating("127.0.0.16", body)
    try:
        with pytest.raises(ScrapeError, match="8 bytes short of its Content-Length"):
            scrape("127.0.0.16", server.port, "/metrics", 5.0)  # the sidecar's scrape, the same code
        api.pods = [pod("dying", "127.0.0.16", server.port)]
        c = make(collector_timeout_s=5.0)
        assert c.collect() == [] and c.errors == 1, "not shop_requests_total 12, as if it were all"
        c.close()
    finally:
        server.close()


def test_an_api_server_answer_cut_short_of_its_content_length_is_a_failed_ask(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    server = _Truncating("127.0.0.17", json.dumps({"kind": "PodList", "items": []}).encode() + b" " * 40)
    try:
        asks = NodePods(f"http://127.0.0.17:{server.port}", NODE, str(tmp_path), 5.0, 30.0)
        with pytest.raises(DiscoveryError, match="short of its Content-Length"):
            asks.pods()
        assert asks.errors == {"truncated": 1}
    finally:
        server.close()


def test_pod_ips_no_pod_has_and_hostnetwork_pods_are_never_scraped(
        api: ApiServer, pages: Pages, make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    def at(ip: str, **spec: Any) -> dict[str, Any]:
        p = pod("p", ip, 8080)
        p["spec"].update(spec)
        return p

    for ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1", "0.0.0.0", "::", "169.254.169.254", "fe80::1%eth0",
               "224.0.0.1", "ff02::1"):
        assert running_pods({"items": [at(ip)]}, NODE) == ([], 1), ip
    assert [p.ip for p in running_pods({"items": [at("10.1.2.3"), at("fd00::5")]}, NODE)[0]] == ["10.1.2.3", "fd00::5"]
    assert running_pods({"items": [at("10.1.2.3", hostNetwork=True)]}, NODE) == ([], 0), "left out, not a bad item"

    # through the collector: a hostNetwork pod's podIP is the node's own, so its annotation could name any port there
    port = pages.serve("127.0.0.18", "# TYPE node_secret gauge\nnode_secret 7\n")
    evil = pod("evil", "127.0.0.18", port, namespace="tenant")
    evil["spec"]["hostNetwork"] = True
    api.pods = [evil]
    c = make()
    keys: list[str] = []
    c.drop = lambda key, why: keys.append(key)  # type: ignore[method-assign]
    assert c.collect() == [] and c.collect() == [] and keys == ["host_network"], "counted once per list"
    c.close()
    # and without the tests' allowance, a loopback pod IP is refused as any agent refuses it
    monkeypatch.setattr(AnnotatedPodsCollector, "allow_loopback_pods", False)
    api.pods = [pod("loop", "127.0.0.18", port)]
    c = make()
    assert c.collect() == [] and c.errors == 1
    c.close()


def test_one_bad_item_costs_that_item_and_fields_are_typed_strictly() -> None:
    def item(mutate: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
        p = pod("p", "10.1.2.3", 8080, container_port=8080)
        mutate(p)
        return p

    def port(value: Any) -> Callable[[dict[str, Any]], Any]:
        return lambda p: p["spec"]["containers"][0]["ports"][0].__setitem__("containerPort", value)

    for bad in (lambda p: p["metadata"].__setitem__("name", None),
                lambda p: p["metadata"].__setitem__("namespace", {"a": 1}),
                lambda p: p["status"].__setitem__("podIP", 2130706433),
                lambda p: p["metadata"].__setitem__("annotations", ["outrider.dev/metrics-port"])):
        assert running_pods({"items": [item(bad), item(lambda p: None)]}, NODE)[1] == 1
    for ignored in (float("inf"), 8080.9, True, -5, 0, 70000, "8080", None):
        pods, bad = running_pods({"items": [item(port(ignored))]}, NODE)
        assert bad == 0 and pods[0].container_ports == (("outrider", 9477),), ignored
    # as JSON: Infinity and 1e400 (a float too large, inf) decode and are ignored, never raising out of pods()
    raw = json.dumps({"kind": "PodList", "items": [item(lambda p: None)]}).replace('"containerPort": 8080',
                                                                                  '"containerPort": 1e400')
    pods, bad = running_pods(json.loads(raw), NODE)
    assert bad == 0 and pods[0].container_of(8080) == ""
    odd = item(lambda p: p["metadata"]["annotations"].__setitem__("outrider.dev/metrics-port", 8080))
    assert dict(running_pods({"items": [odd]}, NODE)[0][0].annotations) == {}, "an annotation value is a string"


def test_two_pods_of_one_name_the_second_is_left_out(api: ApiServer, pages: Pages, make: Make) -> None:
    api.pods = [pod("same", "127.0.0.21", pages.serve("127.0.0.21", "# TYPE ready gauge\nready 1\n")),
                pod("same", "127.0.0.22", pages.serve("127.0.0.22", "# TYPE ready gauge\nready 2\n"))]
    c = make()
    fams = c.collect()
    assert [v for _, v in fams[0].samples] == [1.0] and c.errors == 1
    c.close()


def test_close_during_a_sweep_does_not_fail_it(api: ApiServer, make: Make) -> None:
    peers = Rendezvous(parties=1)
    try:
        hang = peers.listen(peers.hang_ip, peers.never_answer)
        api.pods = [pod(f"hangs-{i:02d}", peers.hang_ip, hang) for i in range(MAX_PARALLEL + 4)]
        c = make(collector_timeout_s=3.0)
        outcome: list[Any] = []
        errors: list[BaseException] = []

        def sweep() -> None:
            try:
                outcome.append(c.collect())
            except BaseException as e:  # what the sampler would count as the collector failed
                errors.append(e)

        t = threading.Thread(target=sweep, daemon=True)
        t.start()
        wait_until(lambda: len(peers.hung) >= MAX_PARALLEL, timeout_s=30, what="every thread on a pod that hangs")
        c.close()  # the pods still queued are cancelled
        t.join(60)
        assert not t.is_alive() and errors == [] and outcome == [[]]
    finally:
        peers.close()
