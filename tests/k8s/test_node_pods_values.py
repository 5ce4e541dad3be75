"""k8s/node_pods in process, value by value: the PodList as the API server serves it (managed fields, statuses, init
containers and all) read into pods, each item that is not a pod's shape counted, and NodePods asking a real HTTP(S)
server on loopback, in this process, for every outcome of an ask (a list, each refusal and failure by its reason and
text, the kept list's age) under a clock the test moves."""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import json
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from outrider.k8s import node_pods
from outrider.k8s.node_pods import (
    KEEP_INTERVALS,
    MAX_TOKEN_BYTES,
    DiscoveryError,
    NodePods,
    Pod,
    PodList,
    api_server_url,
    pod_address,
    running_pods,
)
from tests.fakes.kube_api import NODE, TOKEN, ApiServer, item, pod_list
from tests.helpers import self_signed

# The addresses this process connects to, seen through the interpreter's own audit events (an audit hook stays for
# the process's life: it records only while a test listens)
_connects: list[Any] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect" and _connects is not None:
        _connects.append(args[1])


sys.addaudithook(_audit)


@contextlib.contextmanager
def connects() -> Iterator[list[Any]]:
    global _connects
    _connects = seen = []
    try:
        yield seen
    finally:
        _connects = None


# --- Pod, api_server_url, pod_address ----------------------------------------------------------------------------

def test_the_container_of_a_port_is_the_one_container_that_declares_it() -> None:
    p = Pod("shop", "a", "10.1.0.7", {}, (("shop", 8080), ("side", 9090), ("side", 9091), ("a", 7000), ("b", 7000),
                                         ("init", 8080), ("twice", 6000), ("twice", 6000)))
    assert p.container_of(9090) == "side"
    assert p.container_of(7000) == "", "two containers declare it"
    assert p.container_of(8080) == "", "a container and an init container declare it"
    assert p.container_of(6000) == "twice", "one container declaring it twice is still one"
    assert p.container_of(1234) == ""


def test_the_api_server_as_a_pod_sees_it() -> None:
    assert api_server_url({}) == ""
    assert api_server_url({"KUBERNETES_SERVICE_PORT": "6443"}) == "", "no host: outside a pod"
    assert api_server_url({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == "https://10.96.0.1:443"
    assert api_server_url({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "6443"}) == \
        "https://10.96.0.1:6443"
    assert api_server_url({"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"}) == \
        "https://[fd00:10:96::1]:443"


@pytest.mark.parametrize(("ip", "loopback_allowed", "a_pods"), [
    ("10.1.0.7", False, True), ("fd00:1::7", False, True), ("::ffff:10.1.0.7", False, True),
    ("127.0.0.2", False, False), ("127.0.0.2", True, True), ("::1", False, False), ("::1", True, True),
    ("::ffff:127.0.0.2", False, False), ("::ffff:127.0.0.2", True, True),
    ("0.0.0.0", True, False), ("::", True, False), ("::ffff:0.0.0.0", True, False),
    ("169.254.1.1", True, False), ("fe80::1", True, False), ("::ffff:169.254.1.1", True, False),
    ("224.0.0.1", True, False), ("ff02::1", True, False), ("::ffff:224.0.0.1", True, False),
])
def test_the_addresses_a_pod_can_have(ip: str, loopback_allowed: bool, a_pods: bool) -> None:
    assert pod_address(ipaddress.ip_address(ip), loopback_allowed) is a_pods


def test_loopback_is_refused_by_default() -> None:
    assert pod_address(ipaddress.ip_address("127.0.0.1")) is False
    assert pod_address(ipaddress.ip_address("10.0.0.1")) is True


# --- PodList ------------------------------------------------------------------------------------------------------

def test_a_node_list_read_into_its_running_pods() -> None:
    doc = pod_list(
        item("shop-a", annotations={"outrider.dev/metrics-port": "8080", "outrider.dev/metrics-path": "/m",
                                    "kubectl.kubernetes.io/default-container": "shop", "outrider.dev/n": 3,
                                    "prometheus.io/scrape": "true"},
             containers=[{"name": "shop", "ports": [{"containerPort": 8080}, {"containerPort": 53, "protocol": "UDP"},
                                                    {"containerPort": 9090, "protocol": "TCP"}]},
                         {"name": "side"}, {"name": "nameless-port", "ports": None}],
             init=[{"name": "warm", "ports": [{"containerPort": 7000, "protocol": "TCP"}]}]),
        item("shop-b", "FD00:1:0::7", namespace="batch", annotations={}),
        item("shop-pending", phase="Pending"),
        item("shop-elsewhere", node="node-b"),
        item("shop-no-ip", ""),
    )
    listed = PodList(doc, NODE)
    a, b = listed.pods
    assert a == Pod("shop", "shop-a", "10.1.0.7", {"outrider.dev/metrics-port": "8080",
                                                   "outrider.dev/metrics-path": "/m"},
                    (("shop", 8080), ("shop", 9090), ("warm", 7000)))
    assert b == Pod("batch", "shop-b", "fd00:1::7", {}, (("shop", 8080),)), "the address as the address, not its text"
    assert listed.bad == 0 and listed.host_network == 0
    assert running_pods(doc, NODE) == ([a, b], 0)


def test_a_pod_without_annotations_spec_containers_or_ports() -> None:
    bare = item("bare")
    bare["metadata"]["annotations"] = None
    bare["spec"]["containers"] = None
    no_ports = item("no-ports", containers=[{"name": "shop", "ports": []}])
    (p, q), bad = running_pods(pod_list(bare, no_ports), NODE)
    assert (p.annotations, p.container_ports, q.container_ports, bad) == ({}, (), (), 0)
    no_meta_annotations = item("plain")
    del no_meta_annotations["metadata"]["annotations"]
    assert running_pods(pod_list(no_meta_annotations), NODE)[0][0].annotations == {}


@pytest.mark.parametrize(("port", "kept"), [(1, True), (65535, True), (0, False), (65536, False), (-80, False),
                                            ("8080", False), (8080.0, False), (True, False), (None, False)])
def test_a_container_port_must_be_an_int_in_1_to_65535(port: Any, kept: bool) -> None:
    (p,), bad = running_pods(pod_list(item("a", containers=[{"name": "c", "ports": [{"containerPort": port}]}])),
                             NODE)
    assert bad == 0
    assert p.container_ports == ((("c", port),) if kept else ())


def test_a_port_of_a_container_without_a_name_string_is_not_kept() -> None:
    (p,), _ = running_pods(pod_list(item("a", containers=[{"ports": [{"containerPort": 80}]},
                                                          {"name": 7, "ports": [{"containerPort": 81}]},
                                                          {"name": "c", "ports": [{"containerPort": 82,
                                                                                   "protocol": "SCTP"}]}])), NODE)
    assert p.container_ports == ()


def test_only_running_pods_with_an_ip_on_this_node_are_kept_and_none_of_the_rest_counted() -> None:
    for left_out in (item("p", phase="Pending"), item("p", phase="Succeeded"), item("p", phase="running"),
                     item("p", node="node-b"), item("p", node=""), item("p", "")):
        assert running_pods(pod_list(left_out), NODE) == ([], 0)
    no_status = item("p")
    no_status["status"] = None
    no_spec = item("p")
    no_spec["spec"] = None
    no_ip = item("p")
    del no_ip["status"]["podIP"]
    for left_out in (no_status, no_spec, no_ip):
        listed = PodList(pod_list(left_out), NODE)
        assert (listed.pods, listed.bad, listed.host_network) == ([], 0, 0)


def test_host_network_pods_are_left_out_and_counted_apart_from_the_bad() -> None:
    listed = PodList(pod_list(item("kube-proxy", host_network=True), item("shop", host_network=False),
                              item("node-exporter", "10.0.0.1", host_network=True, phase="Pending"),
                              item("odd", host_network="true")), NODE)  # type: ignore[arg-type]
    assert [p.name for p in listed.pods] == ["shop", "odd"], "only the boolean true is hostNetwork"
    assert (listed.host_network, listed.bad) == (1, 0), "a pod not Running is left out before its network is asked"
    assert running_pods(pod_list(item("kube-proxy", host_network=True)), NODE) == ([], 0), "uncounted there"


def _shaped(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    it = item("bad")
    change(it)
    return it


@pytest.mark.parametrize("bad", [
    "a pod", None, 7, [],
    {"spec": {"nodeName": NODE}, "status": {"phase": "Running", "podIP": "10.1.0.7"}},  # no metadata
    _shaped(lambda it: it.update(metadata=["shop", "bad"])),
    _shaped(lambda it: it.update(metadata=None)),
    _shaped(lambda it: it.update(spec=["x"])),
    _shaped(lambda it: it.update(status="Running")),
    _shaped(lambda it: it["metadata"].pop("namespace")),
    _shaped(lambda it: it["metadata"].pop("name")),
    _shaped(lambda it: it["metadata"].update(name="")),
    _shaped(lambda it: it["metadata"].update(namespace="")),
    _shaped(lambda it: it["metadata"].update(name=7)),
    _shaped(lambda it: it["metadata"].update(namespace=["shop"])),
    _shaped(lambda it: it["status"].update(podIP=167837703)),
    _shaped(lambda it: it["status"].update(podIP="shop.example")),
    _shaped(lambda it: it["status"].update(podIP="10.1.0.7:80")),
    _shaped(lambda it: it["status"].update(podIP="127.0.0.2")),
    _shaped(lambda it: it["status"].update(podIP="169.254.169.254")),
    _shaped(lambda it: it["status"].update(podIP="0.0.0.0")),
    _shaped(lambda it: it["metadata"].update(annotations=["outrider.dev/metrics-port=80"])),
    _shaped(lambda it: it["metadata"].update(annotations="outrider.dev/metrics-port")),
    _shaped(lambda it: it["spec"].update(containers=[{"name": "c", "ports": [80]}])),
    _shaped(lambda it: it["spec"].update(containers=["c"])),
    _shaped(lambda it: it["spec"].update(containers=7)),
])
def test_an_item_without_a_pods_shape_is_counted_and_the_rest_kept(bad: Any) -> None:
    listed = PodList(pod_list(item("before"), bad, item("after")), NODE)
    assert [p.name for p in listed.pods] == ["before", "after"]
    assert (listed.bad, listed.host_network) == (1, 0)


def test_loopback_pods_are_let_through_for_tests_only() -> None:
    doc = pod_list(item("a", "127.0.0.2"))
    assert running_pods(doc, NODE) == ([], 1)
    ((p,), bad) = running_pods(doc, NODE, allow_loopback=True)
    assert (p.ip, bad) == ("127.0.0.2", 0)
    assert [q.ip for q in PodList(doc, NODE, True).pods] == ["127.0.0.2"]


def test_annotations_kept_are_the_outrider_ones_with_string_keys_and_values() -> None:
    (p,), _ = running_pods(pod_list(item("a", annotations={
        "outrider.dev/metrics-port": "8080", "outrider.dev/x": None, "outrider.dev/y": ["1"],
        "prometheus.io/port": "9090", "foo/outrider.dev/z": "1", "Outrider.dev/w": "1", "outrider.dev": "1"})), NODE)
    assert p.annotations == {"outrider.dev/metrics-port": "8080"}


@pytest.mark.parametrize("doc", [None, [], "PodList", {"items": None}, {"kind": "PodList"},
                                 {"kind": "PodList", "items": {"a": item("a")}},
                                 {"kind": "Status", "status": "Failure", "items": []},
                                 {"kind": "Pod", "items": [item("a")]}])
def test_what_is_not_a_pod_list_is_refused_whole(doc: Any) -> None:
    with pytest.raises(ValueError, match=r"^not a PodList \(no list of items\)$"):
        PodList(doc, NODE)


def test_a_list_without_its_kind_is_read_as_one() -> None:
    assert [p.name for p in PodList({"items": [item("a")]}, NODE).pods] == ["a"]
    assert PodList({"kind": "PodList", "items": []}, NODE).result == ([], 0)


# --- NodePods: a real server on loopback --------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def account(tmp_path: Path) -> Path:
    d = tmp_path / "serviceaccount"
    d.mkdir()
    (d / "token").write_text(TOKEN + "\n")
    return d


def asker(api: ApiServer, account: Path, clock: Clock | None = None, *, interval_s: float = 30.0,
          timeout_s: float = 5.0, url: str | None = None, loopback: bool = True) -> NodePods:
    return NodePods(url or api.url, NODE, str(account), timeout_s, interval_s, clock=clock or Clock(),
                    allow_loopback=loopback)


def test_a_node_agent_asks_for_its_nodes_pods_with_its_token(api: ApiServer, account: Path) -> None:
    api.items = [item("shop-a", "127.0.0.2"), item("shop-b", "10.1.0.8", namespace="batch"),
                 item("elsewhere", node="node-b"), item("kube-proxy", host_network=True), "junk"]
    asks = asker(api, account)
    assert asks.age_s == float("inf")
    (a, b) = asks.pods()
    assert (a.name, a.ip, b.namespace, b.ip) == ("shop-a", "127.0.0.2", "batch", "10.1.0.8")
    ((path, headers),) = api.requests
    parts = urllib.parse.urlsplit(path)
    assert parts.path == "/api/v1/pods"
    assert urllib.parse.parse_qs(parts.query) == {"fieldSelector": [f"spec.nodeName={NODE}"],
                                                  "resourceVersion": ["0"]}
    assert headers["Authorization"] == f"Bearer {TOKEN}", "the token's file less its newline"
    assert headers["Accept"] == "application/json"
    assert headers["Accept-Encoding"] == "identity"
    assert sorted(headers) == ["Accept", "Accept-Encoding", "Authorization", "Host"], "these and no others"
    assert (asks.asks, asks.failures, asks.errors, asks.last_error_text) == (1, 0, {}, "")
    assert (asks.bad_items, asks.host_network) == (1, 1)
    assert asks.age_s == 0.0


def test_the_url_path_of_a_proxied_api_server_is_kept(api: ApiServer, account: Path) -> None:
    api.items = [item("a")]
    assert [p.name for p in asker(api, account, url=api.url + "/k8s/cluster-a/").pods()] == ["a"]
    assert urllib.parse.urlsplit(api.requests[0][0]).path == "/k8s/cluster-a/api/v1/pods"
    asker(api, account, url=api.url + "/k8s/clusterX//").pods()
    assert urllib.parse.urlsplit(api.requests[1][0]).path == "/k8s/clusterX/api/v1/pods", "only its slashes go"


def test_loopback_pods_are_refused_unless_allowed(api: ApiServer, account: Path) -> None:
    api.items = [item("shop-a", "127.0.0.2"), item("shop-b", "10.1.0.8")]
    asks = asker(api, account, loopback=False)
    assert [p.name for p in asks.pods()] == ["shop-b"] and asks.bad_items == 1


def test_asked_once_per_interval_and_the_list_kept_between(api: ApiServer, account: Path) -> None:
    clock = Clock()
    api.items = [item("a")]
    asks = asker(api, account, clock, interval_s=30)
    assert [p.name for p in asks.pods()] == ["a"]
    api.items = [item("b")]
    clock.now += 29.5
    assert [p.name for p in asks.pods()] == ["a"] and asks.asks == 1 and len(api.requests) == 1
    assert asks.age_s == 29.5
    clock.now += 0.5
    assert [p.name for p in asks.pods()] == ["b"] and asks.asks == 2, "at the interval exactly: asked again"
    assert asks.age_s == 0.0


def test_bad_items_and_host_network_pods_are_counted_over_every_ask(api: ApiServer, account: Path) -> None:
    clock = Clock()
    api.items = ["junk", item("kube-proxy", host_network=True), item("node-exporter", host_network=True)]
    asks = asker(api, account, clock, interval_s=10)
    assert asks.pods() == []
    clock.now += 10
    asks.pods()
    assert (asks.bad_items, asks.host_network) == (2, 4)


def test_a_failed_ask_keeps_the_last_list_for_two_intervals_then_none(api: ApiServer, account: Path) -> None:
    clock = Clock()
    api.items = [item("a")]
    asks = asker(api, account, clock, interval_s=30)
    assert asks.keep_s == KEEP_INTERVALS * 30 == 60
    asks.pods()
    api.status = 503
    clock.now += 30
    assert [p.name for p in asks.pods()] == ["a"], "the last list, 30 s old"
    assert asks.errors == {"http_503": 1} and asks.failures == 1
    assert asks.last_error_text == f"{api.url} (pods of node {NODE}): HTTP 503"
    clock.now += 30
    assert [p.name for p in asks.pods()] == ["a"], "60 s old: still kept"
    clock.now += 0.25
    with pytest.raises(DiscoveryError) as e:
        asks.pods()
    assert str(e.value) == (f"no list of node {NODE}'s pods from the API server for over 60 s (the last one is no "
                            f"longer used): {api.url} (pods of node {NODE}): HTTP 503")
    assert asks.errors == {"http_503": 2} and asks.failures == 2 and asks.asks == 3
    assert asks.age_s == 60.25
    api.status = 200
    clock.now += 30
    assert [p.name for p in asks.pods()] == ["a"], "asked again at the interval: a list again"
    assert asks.errors == {"http_503": 2} and asks.last_error_text.endswith("HTTP 503"), "the counts stay"


def test_the_kept_list_is_dropped_once_too_old(api: ApiServer, account: Path) -> None:
    clock = Clock()
    api.items = [item("a")]
    asks = asker(api, account, clock, interval_s=10)
    asks.pods()
    api.status = 500
    clock.now += 21
    with pytest.raises(DiscoveryError, match="for over 20 s"):
        asks.pods()
    clock.now += 1
    with pytest.raises(DiscoveryError, match="for over 20 s"):  # within the interval: not asked, and no list
        asks.pods()
    assert asks.asks == 2
    assert asks._pods == [], "the old list is not held once it is no longer used"


def test_no_list_before_the_first_good_answer(api: ApiServer, account: Path) -> None:
    api.status = 403
    clock = Clock()
    asks = asker(api, account, clock)
    with pytest.raises(DiscoveryError) as e:
        asks.pods()
    assert str(e.value) == (f"no list of node {NODE}'s pods from the API server yet: {api.url} (pods of node "
                            f"{NODE}): HTTP 403 (does the agent's ClusterRole grant pods: list?)")
    assert asks.age_s == float("inf")
    clock.now += 1
    with pytest.raises(DiscoveryError, match="yet"):
        asks.pods()
    assert asks.asks == 1 and asks.errors == {"http_403": 1}


@pytest.mark.parametrize(("status", "hint"), [
    (401, " (the service-account token was refused)"), (403, " (does the agent's ClusterRole grant pods: list?)"),
    (404, ""), (500, ""), (204, ""), (300, " (redirects are not followed)"), (301, " (redirects are not followed)"),
    (307, " (redirects are not followed)"), (399, " (redirects are not followed)"), (400, ""),
])
def test_an_answer_other_than_200_is_a_failure_by_its_status(api: ApiServer, account: Path, status: int,
                                                             hint: str) -> None:
    api.answer = lambda h: ApiServer.send(h, status, b"", headers={"Location": api.url + "/elsewhere"})
    asks = asker(api, account)
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert asks.errors == {f"http_{status}": 1}
    assert asks.last_error_text == f"{api.url} (pods of node {NODE}): HTTP {status}{hint}"
    assert len(api.requests) == 1, "no redirect followed"


def test_an_answer_that_is_no_pod_list_is_invalid(api: ApiServer, account: Path) -> None:
    api.answer = lambda h: ApiServer.send(h, 200, b'{"kind": "Status", "status": "Success"}')
    asks = asker(api, account)
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert asks.errors == {"invalid_response": 1}
    assert asks.last_error_text == f"{api.url} (pods of node {NODE}): not a PodList (no list of items)"


@pytest.mark.parametrize(("body", "why"), [(b"<html>proxy error</html>", "Expecting value"),
                                           (b"[" * 100_000, "maximum recursion depth"), (b"\xff\xfe", "")],
                         ids=["html", "nested", "not-utf-8"])
def test_an_answer_that_is_not_json_is_invalid(api: ApiServer, account: Path, body: bytes, why: str) -> None:
    api.answer = lambda h: ApiServer.send(h, 200, body)
    asks = asker(api, account)
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert asks.errors == {"invalid_response": 1}
    assert asks.last_error_text.startswith(f"{api.url} (pods of node {NODE}): not JSON: ")
    assert why in asks.last_error_text


def test_an_answer_past_the_cap_is_refused_unread(api: ApiServer, account: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_pods, "MAX_RESPONSE_BYTES", 4096)
    body = json.dumps(pod_list(*[item(f"p{i}") for i in range(2)])).encode()
    assert len(body) <= 4096
    api.answer = lambda h: ApiServer.send(h, 200, body)
    asks = asker(api, account, Clock(), interval_s=1)
    assert len(asks.pods()) == 2, "at most the cap: read"
    body = json.dumps(pod_list(*[item(f"p{i}") for i in range(10)])).encode()
    assert len(body) > 4096
    asks._clock.now += 1  # type: ignore[attr-defined]
    assert len(asks.pods()) == 2, "the last list kept"
    assert asks.errors == {"too_large": 1}
    assert asks.last_error_text == f"{api.url} (pods of node {NODE}): an answer larger than 4096 bytes"
    assert node_pods.MAX_RESPONSE_BYTES == 4096


def test_the_response_cap_is_8_mib() -> None:
    assert node_pods.MAX_RESPONSE_BYTES == 8 << 20 and MAX_TOKEN_BYTES == 64 << 10 and KEEP_INTERVALS == 2


def test_an_answer_short_of_its_content_length_is_a_failure(api: ApiServer, account: Path) -> None:
    body = json.dumps(pod_list(item("a"))).encode()
    api.answer = lambda h: ApiServer.send(h, 200, body, length=len(body) + 100)
    asks = asker(api, account)
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert asks.errors == {"truncated": 1}
    assert asks.last_error_text == (f"{api.url} (pods of node {NODE}): the answer ended 100 bytes short of its "
                                    "Content-Length")


def test_an_answer_without_content_length_is_read_to_its_end(api: ApiServer, account: Path) -> None:
    body = json.dumps(pod_list(item("a"))).encode()

    def close_delimited(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        h.wfile.write(body)

    api.answer = close_delimited
    assert [p.name for p in asker(api, account).pods()] == ["a"]


def _trickle(h: http.server.BaseHTTPRequestHandler, data: bytes, every_s: float) -> None:
    with contextlib.suppress(OSError):
        for i in range(len(data)):
            h.wfile.write(data[i:i + 1])
            h.wfile.flush()
            time.sleep(every_s)


def test_a_body_that_trickles_past_the_deadline_is_a_timeout(api: ApiServer, account: Path) -> None:
    def trickling(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()  # no Content-Length: the answer ends when the connection does
        h.wfile.flush()
        _trickle(h, json.dumps(pod_list(*[item(f"p{i}") for i in range(50)])).encode(), 0.01)

    api.answer = trickling
    asks = asker(api, account, timeout_s=0.3)
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert asks.errors == {"timeout": 1}
    assert asks.last_error_text == f"{api.url} (pods of node {NODE}): no complete answer within 0.3 s"


def test_headers_that_trickle_past_the_deadline_are_a_timeout(api: ApiServer, account: Path) -> None:
    api.answer = lambda h: _trickle(h, b"HTTP/1.1 200 OK\r\n" + b"X-Padding: " + b"p" * 5000 + b"\r\n\r\n", 0.01)
    asks = asker(api, account, timeout_s=0.3)
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert asks.errors == {"timeout": 1}
    assert asks.last_error_text == f"{api.url} (pods of node {NODE}): no complete answer within 0.3 s"


def test_a_status_line_that_trickles_past_the_deadline_is_a_timeout(api: ApiServer, account: Path) -> None:
    api.answer = lambda h: _trickle(h, b"HTTP/1.1" + b" " * 200, 0.02)  # cut short, the line is no status line
    asks = asker(api, account, timeout_s=0.3)
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert asks.errors == {"timeout": 1}
    assert asks.last_error_text == f"{api.url} (pods of node {NODE}): no complete answer within 0.3 s"


def test_a_server_that_closes_without_answering_is_unavailable(api: ApiServer, account: Path) -> None:
    api.answer = lambda h: None  # the handler returns: the connection closes with no response
    asks = asker(api, account)
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert asks.errors == {"unavailable": 1}
    assert asks.last_error_text == (f"{api.url} (pods of node {NODE}): Remote end closed connection without "
                                    "response")


def test_a_refused_connection_is_unavailable(account: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        asks = NodePods(f"http://127.0.0.1:{port}", NODE, str(account), 5, 30, clock=Clock())
        with pytest.raises(DiscoveryError):
            asks.pods()
    assert asks.errors == {"unavailable": 1}
    assert asks.last_error_text == f"http://127.0.0.1:{port} (pods of node {NODE}): [Errno 111] Connection refused"


@pytest.mark.parametrize(("url", "address"), [("http://127.0.0.1", ("127.0.0.1", 80)),
                                              ("https://127.0.0.1", ("127.0.0.1", 443)),
                                              ("http://127.0.0.1:1", ("127.0.0.1", 1)),
                                              ("https://127.0.0.1:2/", ("127.0.0.1", 2))])
def test_the_port_is_the_urls_or_its_schemes(tmp_path: Path, account: Path, url: str, address: Any) -> None:
    cert, _ = self_signed(tmp_path / "tls")
    (account / "ca.crt").write_bytes(cert.read_bytes())
    asks = NodePods(url, NODE, str(account), 5, 30, clock=Clock())
    with connects() as seen, pytest.raises(DiscoveryError):
        asks.pods()
    assert seen[-1] == address
    assert set(asks.errors) == {"unavailable"}, "nothing listens there in the tests' network"


def test_https_verified_against_the_service_accounts_ca(tmp_path: Path, account: Path) -> None:
    server = ApiServer(tmp_path / "tls")
    try:
        server.items = [item("a")]
        (account / "ca.crt").write_bytes(server.cert.read_bytes())
        asks = NodePods(server.url, NODE, str(account), 5, 30, clock=Clock())
        assert [p.name for p in asks.pods()] == ["a"]
        assert server.requests[0][1]["Authorization"] == f"Bearer {TOKEN}"
        # another CA: the server's certificate is not trusted, and no request is made
        other, _ = self_signed(tmp_path / "other")
        (account / "ca.crt").write_bytes(other.read_bytes())
        asks = NodePods(server.url, NODE, str(account), 5, 30, clock=Clock())
        with pytest.raises(DiscoveryError):
            asks.pods()
        assert asks.errors == {"unavailable": 1}
        assert "CERTIFICATE_VERIFY_FAILED" in asks.last_error_text
        assert asks.last_error_text.startswith(f"{server.url} (pods of node {NODE}): ")
        assert len(server.requests) == 1
    finally:
        server.stop()


def test_a_ca_that_cannot_be_loaded_is_said(tmp_path: Path, account: Path) -> None:
    asks = NodePods("https://127.0.0.1:1", NODE, str(account), 5, 30, clock=Clock())
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert asks.errors == {"ca": 1}
    assert asks.last_error_text.startswith(f"{account}/ca.crt: cannot load the API server's CA: ")
    assert "No such file or directory" in asks.last_error_text
    (account / "ca.crt").write_text("not a certificate")
    asks = NodePods("https://127.0.0.1:1", NODE, str(account), 5, 30, clock=Clock())
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert asks.errors == {"ca": 1}
    assert asks.last_error_text.startswith(f"{account}/ca.crt: cannot load the API server's CA: ")


@pytest.mark.parametrize("url", ["http://10.96.0.1", "http://kubernetes.default.svc:80", "http://[fd00::1]:8001",
                                 "http://localhost.example:8001"])
def test_a_token_never_goes_over_plain_http_beyond_loopback(account: Path, url: str) -> None:
    asks = NodePods(url, NODE, str(account), 5, 30, clock=Clock())
    with connects() as seen, pytest.raises(DiscoveryError):
        asks.pods()
    assert seen == [], "nothing is sent"
    assert asks.errors == {"insecure": 1}
    assert asks.last_error_text == f"{url}: a bearer token goes over https, or plain http to loopback only"


def test_https_to_any_host_may_carry_the_token(account: Path) -> None:
    asks = NodePods("https://kubernetes.default.svc", NODE, str(account), 5, 30, clock=Clock())
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert asks.errors == {"ca": 1}, "past the token's checks, to the CA (which this account lacks)"


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.9.9.9", "[::1]"])
def test_plain_http_to_loopback_carries_the_token(account: Path, host: str) -> None:
    asks = NodePods(f"http://{host}:1", NODE, str(account), 5, 30, clock=Clock())
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert set(asks.errors) == {"unavailable"}, "asked (and refused: nothing listens on port 1)"


@pytest.mark.parametrize(("content", "why"), [
    (None, "cannot read the service-account token ([Errno 2] No such file or directory: "),
    (b"", "not a bearer token"), (b"\n\n", "not a bearer token"), (b"two words", "not a bearer token"),
    (b"tab\tinside", "not a bearer token"), (b"del\x7f", "not a bearer token"),
    (b"\xe2\x82\xac", "cannot read the service-account token ('ascii' codec can't decode"),
    (b"x" * (64 << 10) + b"x", f"cannot read the service-account token (more than {64 << 10} bytes; "),
])
def test_a_token_that_cannot_be_read_or_is_no_bearer_token(api: ApiServer, account: Path, content: bytes | None,
                                                           why: str) -> None:
    token = account / "token"
    if content is None:
        token.unlink()
    else:
        token.write_bytes(content)
    asks = asker(api, account)
    with pytest.raises(DiscoveryError):
        asks.pods()
    assert api.requests == [], "never sent"
    assert asks.errors == {"token": 1}
    assert asks.last_error_text.startswith(f"{token}: {why}")
    if why.startswith("cannot"):
        assert asks.last_error_text.endswith("; is automountServiceAccountToken off?)")
    else:
        assert asks.last_error_text == f"{token}: not a bearer token"


def test_a_token_of_every_printable_character_and_at_its_cap_is_sent(api: ApiServer, account: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import http.client

    monkeypatch.setattr(http.client, "_MAXLINE", 1 << 20)  # the stand-in's header line limit: the API server's is 1 MiB
    printable = "".join(chr(c) for c in range(ord("!"), ord("~") + 1))
    for token, written in ((printable, f"  {printable}\r\n"), ("t" * MAX_TOKEN_BYTES, "t" * MAX_TOKEN_BYTES)):
        (account / "token").write_text(written)
        api.requests.clear()
        asker(api, account).pods()
        assert api.requests[0][1]["Authorization"] == f"Bearer {token}"


def test_the_token_is_read_again_at_each_ask(api: ApiServer, account: Path) -> None:
    clock = Clock()
    asks = asker(api, account, clock, interval_s=5)
    asks.pods()
    (account / "token").write_text("rotated")
    clock.now += 5
    asks.pods()
    assert [h["Authorization"] for _, h in api.requests] == [f"Bearer {TOKEN}", "Bearer rotated"]


@pytest.mark.parametrize("url", ["ftp://10.96.0.1", "10.96.0.1:443", "https://", "https:///api", "unix:///run/k.sock"])
def test_an_api_server_that_is_no_http_url_is_refused(account: Path, url: str) -> None:
    with pytest.raises(ValueError) as e:
        NodePods(url, NODE, str(account), 5, 30)
    assert str(e.value) == f"{url!r}: expected an http(s) URL of the API server"


def test_a_new_asker_knows_its_files_and_has_no_failures(account: Path) -> None:
    asks = NodePods("https://10.96.0.1", NODE, str(account), 4.0, 15.0)
    assert (asks.api_url, asks.node, asks.timeout_s, asks.interval_s, asks.keep_s) == (
        "https://10.96.0.1", NODE, 4.0, 15.0, 30.0)
    assert (asks.token_file, asks.ca_file) == (f"{account}/token", f"{account}/ca.crt")
    assert (asks.errors, asks.failures, asks.bad_items, asks.host_network, asks.asks, asks.last_error_text,
            asks.allow_loopback) == ({}, 0, 0, 0, 0, "", False)
    assert asks._clock is time.monotonic
    assert asks.age_s == float("inf")


def test_the_field_selector_is_url_encoded(api: ApiServer, account: Path) -> None:
    asks = NodePods(api.url, "node a&b=c", str(account), 5, 30, clock=Clock())
    asks.pods()
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(api.requests[0][0]).query)
    assert query == {"fieldSelector": ["spec.nodeName=node a&b=c"], "resourceVersion": ["0"]}


def test_every_bad_item_is_counted() -> None:
    listed = PodList(pod_list("junk", item("a"), None, _shaped(lambda it: it["status"].update(podIP="x"))), NODE)
    assert ([p.name for p in listed.pods], listed.bad) == (["a"], 3)


def test_metadata_that_is_no_object_is_bad_whatever_the_phase() -> None:
    pending = _shaped(lambda it: it.update(metadata=["shop", "bad"]))
    pending["status"]["phase"] = "Pending"
    assert running_pods(pod_list(pending), NODE) == ([], 1)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_connect_that_never_completes_ends_at_the_timeout(tmp_path: Path, account: Path, scheme: str) -> None:
    """A listener whose backlog is full: the kernel drops the SYNs, and only the socket's own timeout ends the
    connect (the deadline's shutdown reaches a socket once it is connected)."""
    cert, _ = self_signed(tmp_path / "tls")
    (account / "ca.crt").write_bytes(cert.read_bytes())
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        filler.connect(("127.0.0.1", port))  # the one connection a backlog of 0 queues: the next one waits
        asks = NodePods(f"{scheme}://127.0.0.1:{port}", NODE, str(account), 0.3, 30, clock=Clock())
        with pytest.raises(DiscoveryError):
            asks.pods()
    assert set(asks.errors) <= {"timeout", "unavailable"} and asks.failures == 1
