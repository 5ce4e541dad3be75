"""The Kubernetes API server's contract for `GET /api/v1/pods`, for tests: a real HTTP(S) server on loopback in the
test's own process, and pods as the API server serves them in a PodList (managed fields, statuses and all)."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers import self_signed

NODE = "node-a"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.stand-in-service-account-token"


def item(name: str, ip: str = "10.1.0.7", *, namespace: str = "shop", node: str = NODE, phase: str = "Running",
         annotations: dict[str, Any] | None = None, containers: list[dict[str, Any]] | None = None,
         init: list[dict[str, Any]] | None = None, host_network: bool | None = None) -> dict[str, Any]:
    """A pod as the API server serves it in a PodList (what the agent reads among what it must not mind)."""
    spec: dict[str, Any] = {
        "nodeName": node, "serviceAccountName": "default", "restartPolicy": "Always",
        "containers": containers if containers is not None else [
            {"name": "shop", "image": "shop:1", "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}],
    }
    if init is not None:
        spec["initContainers"] = init
    if host_network is not None:
        spec["hostNetwork"] = host_network
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "4711",
                     "labels": {"app": "shop"},
                     "annotations": annotations if annotations is not None else {
                         "outrider.dev/metrics-port": "8080", "kubectl.kubernetes.io/default-container": "shop"},
                     "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1"}]},
        "spec": spec,
        "status": {"phase": phase, "hostIP": "10.0.0.1", "podIP": ip, "podIPs": [{"ip": ip}], "qosClass": "Burstable",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod_list(*items: Any) -> dict[str, Any]:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "4711"}, "items": list(items)}



class ApiServer:
    """The API server's contract for `GET /api/v1/pods` on loopback, in this process: `answer(handler)` writes each
    response (by default a PodList of `items`, or `status` with a Status object); `requests` keeps each request's
    path and headers."""

    def __init__(self, tls_dir: Path | None = None) -> None:
        self.items: list[Any] = []
        self.status = 200
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.answer: Callable[[http.server.BaseHTTPRequestHandler], None] = self.pod_list
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api.requests.append((self.path, dict(self.headers.items())))
                api.answer(self)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.block_on_close = False
        scheme = "http"
        if tls_dir is not None:
            cert, key = self_signed(tls_dir)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            self.cert = cert
            scheme = "https"
        self.port = self._server.server_address[1]
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True)
        self._thread.start()

    def pod_list(self, h: http.server.BaseHTTPRequestHandler) -> None:
        doc = pod_list(*self.items) if self.status == 200 else {"kind": "Status", "status": "Failure"}
        self.send(h, self.status, json.dumps(doc).encode())

    @staticmethod
    def send(h: http.server.BaseHTTPRequestHandler, status: int, body: bytes, length: int | None = None,
             headers: dict[str, str] | None = None) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body) if length is None else length))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
