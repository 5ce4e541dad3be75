"""The running pods of this node, from the Kubernetes API server, for a node agent that scrapes their own endpoints.

`GET {api}/api/v1/pods?fieldSelector=spec.nodeName=NODE&resourceVersion=0` with the pod's service-account token:
the ClusterRole it needs is `pods: list`, where the kubelet's own /pods would need `nodes/proxy`, which also
lets its holder run commands in every pod of the node. RBAC cannot narrow `list` to the field selector: the token
may read every pod spec of the cluster (environment values included), which is why the chart grants it only when
asked (nodeAgent.annotatedPods.enabled). `resourceVersion=0` lets the API server answer from its
watch cache rather than etcd: a DaemonSet's agents on a thousand nodes, each asking every 30 s, cost it little.

Asked at most once per interval_s (never on every sweep), each ask bounded like every outbound call
(outrider/adapters/outbound.py): the whole of it (connect, TLS, request, every byte of the answer) within timeout_s, at
most MAX_RESPONSE_BYTES read, no redirect followed; an answer cut short (the deadline passed, or fewer bytes than its
Content-Length said) is a failed ask, never a list. The token is read again at each ask (the kubelet rotates a projected
token) and sent over HTTPS, verified against the service account's ca.crt, or over plain HTTP to loopback only (a
`kubectl proxy`, a test). A failed ask (no token, refused, past the deadline, not 200, not a PodList) is counted by
reason, its text kept for the caller to log; the last good list is kept for KEEP_INTERVALS (2) intervals (1 minute
at the default 30 s: a pod IP that went to another pod since is scraped under the old pod's name that long at most),
after which `pods()` raises DiscoveryError until an ask succeeds again.

Only what the caller needs is kept of each pod: its namespace, name and IP (status.podIP, which must be an IP
address, and one a pod can have: never loopback, link-local, unspecified or multicast), its `outrider.dev/`
annotations and its containers' TCP ports; a pod not Running, without an IP, or on another node (whatever the answer
says) is left out. A hostNetwork pod is left out and counted (`host_network`): its podIP is the node's own, so its
annotation could aim the agent at any port of the node, another tenant's service or the node's own. An item that is
not a pod's shape (strictly typed: metadata.name, metadata.namespace and status.podIP strings; a containerPort that
is not an int in 1..65535 is ignored) is counted, never fatal, whatever it raises.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from outrider.adapters import outbound
from outrider.k8s.downward import read_small_file

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ANNOTATION_PREFIX = "outrider.dev/"
# a node's pods, managed fields and all: 110 pods of 20 KiB each are 2 MiB; decoded, an answer takes some 10x its size
# in the agent's memory (the chart's limit is 128 MiB)
MAX_RESPONSE_BYTES = 8 << 20
MAX_TOKEN_BYTES = 64 << 10
KEEP_INTERVALS = 2


class DiscoveryError(OSError):
    """No list of the node's pods younger than KEEP_INTERVALS intervals: the caller has no targets."""


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    ip: str
    annotations: Mapping[str, str]  # the outrider.dev/ ones only
    container_ports: tuple[tuple[str, int], ...]  # (container name, containerPort) of each TCP port declared

    def container_of(self, port: int) -> str:
        """The container that declares `port`; "" where none does, or more than one does."""
        names = {name for name, p in self.container_ports if p == port}
        return names.pop() if len(names) == 1 else ""


def api_server_url(env: Mapping[str, str]) -> str:
    """The API server as a pod sees it (KUBERNETES_SERVICE_HOST/PORT, set in every pod); "" outside a pod."""
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return ""
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def running_pods(doc: Any, node: str, allow_loopback: bool = False) -> tuple[list[Pod], int]:
    """The Running pods with an IP on `node` in a PodList (decoded JSON), and how many items were not a pod's shape
    (a pod whose IP no pod can have among them). hostNetwork pods are left out uncounted here; `PodList` counts them.
    `allow_loopback` (tests only: their pods are loopback addresses) lets a loopback podIP through."""
    return PodList(doc, node, allow_loopback).result


class PodList:
    """A PodList's pods on `node` (`pods`), its items without a pod's shape (`bad`), its hostNetwork pods left out
    (`host_network`)."""

    def __init__(self, doc: Any, node: str, allow_loopback: bool = False) -> None:
        items = doc.get("items") if isinstance(doc, dict) and doc.get("kind", "PodList") == "PodList" else None
        if not isinstance(items, list):
            raise ValueError("not a PodList (no list of items)")
        self.pods: list[Pod] = []
        self.bad = self.host_network = 0
        for item in items:
            try:
                pod = _pod(item, node, allow_loopback)
            except _HostNetwork:
                self.host_network += 1
                continue
            except Exception:  # any item that is not a pod's shape, whatever it raises (never the whole list)
                self.bad += 1
                continue
            if pod is not None:
                self.pods.append(pod)

    @property
    def result(self) -> tuple[list[Pod], int]:
        return self.pods, self.bad


class _HostNetwork(Exception):
    pass


def _pod(item: Any, node: str, allow_loopback: bool) -> Pod | None:
    meta, spec, status = item["metadata"], item.get("spec") or {}, item.get("status") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict) or not isinstance(status, dict):
        raise TypeError("metadata, spec and status are objects")
    if status.get("phase") != "Running" or spec.get("nodeName") != node or not status.get("podIP"):
        return None
    if spec.get("hostNetwork") is True:
        raise _HostNetwork()
    namespace, name, pod_ip = meta["namespace"], meta["name"], status["podIP"]
    if not all(isinstance(v, str) and v for v in (namespace, name, pod_ip)):
        raise TypeError("metadata.namespace, metadata.name and status.podIP are strings")
    ip = ipaddress.ip_address(pod_ip)  # ValueError for anything but an address: never a host name
    if not pod_address(ip, allow_loopback):
        raise ValueError(f"{pod_ip}: not an address a pod has")
    raw = meta.get("annotations") or {}
    if not isinstance(raw, dict):
        raise TypeError("metadata.annotations is an object")
    annotations = {k: v for k, v in raw.items()
                   if isinstance(k, str) and isinstance(v, str) and k.startswith(ANNOTATION_PREFIX)}
    ports = []
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        for p in (c.get("ports") or []):
            port = p.get("containerPort")
            if (p.get("protocol", "TCP") == "TCP" and type(port) is int and 1 <= port <= 65535
                    and isinstance(c.get("name"), str)):
                ports.append((c["name"], port))
    return Pod(namespace, name, str(ip), annotations, tuple(ports))


def pod_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_loopback: bool = False) -> bool:
    """Whether a pod can have this IP: not unspecified, link-local, multicast, nor loopback (an IPv4-mapped IPv6
    address judged as its IPv4 one) unless allow_loopback (tests only)."""
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    if ip.is_unspecified or ip.is_link_local or ip.is_multicast:
        return False
    return allow_loopback or not ip.is_loopback


class NodePods:
    """Asks the API server for `node`'s pods at most once per interval_s, within timeout_s; `errors` counts failed
    asks by reason, `failures` all of them (a caller logs and counts each new one), `last_error_text` says the
    last. `clock` is the monotonic clock that times asks and the kept list's age. `allow_loopback` lets loopback
    podIPs through: for tests, whose pods are 127.0.0.x addresses, never a setting."""

    def __init__(self, api_url: str, node: str, service_account_dir: str, timeout_s: float, interval_s: float,
                 clock: Callable[[], float] = time.monotonic, allow_loopback: bool = False) -> None:
        parts = urllib.parse.urlsplit(api_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{api_url!r}: expected an http(s) URL of the API server")
        self.api_url = api_url
        self.node = node
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self.keep_s = KEEP_INTERVALS * interval_s
        self.token_file = os.path.join(service_account_dir, "token")
        self.ca_file = os.path.join(service_account_dir, "ca.crt")
        self.errors: dict[str, int] = {}
        self.failures = 0
        self.bad_items = 0  # items of good answers that were not a pod's shape, all asks together
        self.host_network = 0  # hostNetwork pods of good answers, left out, all asks together
        self.allow_loopback = allow_loopback
        self.asks = 0
        self.last_error_text = ""
        self._parts = parts
        self._path = (parts.path.rstrip("/") + "/api/v1/pods?" + urllib.parse.urlencode(
            {"fieldSelector": f"spec.nodeName={node}", "resourceVersion": "0"}))
        self._clock = clock
        self._pods: list[Pod] = []
        self._good_at: float | None = None
        self._next_ask = float("-inf")

    def pods(self) -> list[Pod]:
        """The node's Running pods with an IP, asked anew when the last ask is interval_s old; after a failed ask,
        the last good list while it is younger than keep_s; DiscoveryError when there is none."""
        now = self._clock()
        if now >= self._next_ask:
            self._next_ask = now + self.interval_s
            self.asks += 1
            try:
                doc = self._ask()
                try:
                    listed = PodList(doc, self.node, self.allow_loopback)
                except ValueError as e:
                    raise _Failed("invalid_response", f"{self.api_url} (pods of node {self.node}): {e}") from None
                self._pods = listed.pods
                self.bad_items += listed.bad
                self.host_network += listed.host_network
                self._good_at = now
            except _Failed as e:
                self.errors[e.reason] = self.errors.get(e.reason, 0) + 1
                self.failures += 1
                self.last_error_text = str(e)
        if self._good_at is None:
            raise DiscoveryError(f"no list of node {self.node}'s pods from the API server yet: {self.last_error_text}")
        if now - self._good_at > self.keep_s:
            self._pods = []
            raise DiscoveryError(f"no list of node {self.node}'s pods from the API server for over {self.keep_s:g} s "
                                 f"(the last one is no longer used): {self.last_error_text}")
        return self._pods

    @property
    def age_s(self) -> float:
        """Seconds since the last good answer (inf before the first)."""
        return float("inf") if self._good_at is None else self._clock() - self._good_at

    def _ask(self) -> Any:
        import ssl  # only once asked: an agent on its defaults loads no OpenSSL

        token = self._token()
        http_cls, https_cls = outbound.connection_classes()
        host, port = self._parts.hostname or "", self._parts.port
        where = f"{self.api_url} (pods of node {self.node})"
        with outbound.Deadline(self.timeout_s) as deadline:
            try:
                if self._parts.scheme == "https":
                    context = ssl.create_default_context(cafile=self.ca_file)
                    conn = https_cls(host, port or 443, timeout=self.timeout_s, context=context)
                else:
                    conn = http_cls(host, port or 80, timeout=self.timeout_s)
            except (OSError, ssl.SSLError) as e:
                raise _Failed("ca", f"{self.ca_file}: cannot load the API server's CA: {e}") from None
            try:
                conn.request("GET", self._path, headers={"Authorization": f"Bearer {token}",
                                                         "Accept": "application/json",
                                                         "Accept-Encoding": "identity"})
                response = conn.getresponse()
                if response.status != 200:
                    hint = {401: " (the service-account token was refused)",
                            403: " (does the agent's ClusterRole grant pods: list?)"}.get(response.status, "")
                    if 300 <= response.status < 400:
                        hint = " (redirects are not followed)"
                    raise _Failed(f"http_{response.status}", f"{where}: HTTP {response.status}{hint}")
                body = outbound.read_capped(response.read, MAX_RESPONSE_BYTES)
                if deadline.expired:  # its shutdown reads as the end of the answer
                    raise _Failed("timeout", f"{where}: no complete answer within {self.timeout_s:g} s")
                if response.length:  # read(n) returns what came when the answer ends short of its Content-Length
                    raise _Failed("truncated", f"{where}: the answer ended {response.length} bytes short of its "
                                               "Content-Length")
            except outbound.ResponseTooLarge:
                raise _Failed("too_large", f"{where}: an answer larger than {MAX_RESPONSE_BYTES} bytes") from None
            except _Failed:
                raise
            except Exception as e:  # OSError, ssl.SSLError, http.client.HTTPException: a failed ask, whichever
                if deadline.expired:
                    raise _Failed("timeout", f"{where}: no complete answer within {self.timeout_s:g} s") from None
                raise _Failed("unavailable", f"{where}: {e or type(e).__name__}") from None
            finally:
                conn.close()
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than the interpreter's stack
            raise _Failed("invalid_response", f"{where}: not JSON: {e}") from None

    def _token(self) -> str:
        if self._parts.scheme != "https" and not _loopback(self._parts.hostname or ""):
            raise _Failed("insecure", f"{self.api_url}: a bearer token goes over https, or plain http to loopback "
                                      "only")
        try:
            token = read_small_file(self.token_file, MAX_TOKEN_BYTES).decode("ascii").strip()
        except (OSError, ValueError) as e:
            raise _Failed("token", f"{self.token_file}: cannot read the service-account token ({e}; is "
                                   "automountServiceAccountToken off?)") from None
        if not token or len(token) > MAX_TOKEN_BYTES or not all("!" <= c <= "~" for c in token):
            raise _Failed("token", f"{self.token_file}: not a bearer token")
        return token


def _loopback(host: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return host == "localhost"


class _Failed(Exception):
    def __init__(self, reason: str, text: str) -> None:
        super().__init__(text)
        self.reason = reason
