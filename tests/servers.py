"""Real servers for integration tests, on 127.0.0.1 free ports, polled for readiness, stopped by process id.

- PrometheusServer: Debian's `prometheus` binary.
- OtlpHttpReceiver / OtlpGrpcReceiver: OTLP receivers built from `opentelemetry-proto` (the protocol's own
  message and service definitions), standing in for an OpenTelemetry Collector.
- HostilePeer: a raw socket that answers every request a byte at a time, or with an endless body (the `peer`
  fixture of conftest.py, parametrized with the mode).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import subprocess
import threading
import urllib.parse
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from tests.conftest import need_binary
from tests.helpers import free_port, http_get, wait_until


class _ServerProcess:
    """A real server binary run by a test: its log in the work directory, stopped by its process id."""

    name = "server"
    proc: subprocess.Popen[bytes]
    workdir: Path
    url: str

    def _start(self, argv: list[str], workdir: Path) -> None:
        self.workdir = workdir
        self.log = open(workdir / f"{self.name}.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)

    def _alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited: " + (self.workdir / f"{self.name}.log").read_text()[-2000:])
        return True

    def _wait_ready(self, path: str, what: str) -> None:
        """Ready, or stopped by its pid before the failure propagates (no `with` block owns it yet)."""
        try:
            wait_until(lambda: self._alive() and http_get(self.url + path, timeout_s=1)[0] == 200, timeout_s=60,
                       what=what)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PrometheusServer(_ServerProcess):
    name = "prometheus"

    def __init__(self, workdir: Path, targets: list[str], scrape_interval_s: int = 1,
                 rule_files: list[str] | None = None, alertmanager: str | None = None,
                 flags: tuple[str, ...] = ()) -> None:
        """flags: more command-line flags (--enable-feature=native-histograms)."""
        binary = need_binary("prometheus")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": f"{scrape_interval_s}s", "evaluation_interval": f"{scrape_interval_s}s"},
            "scrape_configs": [{"job_name": "outrider", "static_configs": [{"targets": targets}]}],
        }
        if rule_files:
            config["rule_files"] = rule_files
        if alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
        (workdir / "prometheus.yml").write_text(json.dumps(config))
        self._start([binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
                     "--rules.alert.resend-delay=1s", *flags], workdir)
        self._wait_ready("/-/ready", "Prometheus /-/ready")

    def query(self, promql: str) -> list[dict[str, Any]]:
        status, _, body = http_get(self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", data
        return list(data["data"]["result"])

    def wait_for(self, promql: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Prometheus needs about 5 s for its first sample even at a 1 s interval: poll generously."""
        return wait_until(lambda: self.query(promql), timeout_s=timeout_s, interval_s=0.5, what=promql)



class AlertmanagerServer(_ServerProcess):
    """Debian's prometheus-alertmanager, routing everything to one webhook, fast (1 s group wait and interval)."""

    name = "alertmanager"

    def __init__(self, workdir: Path, webhook_url: str) -> None:
        binary = need_binary("prometheus-alertmanager")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "route": {"receiver": "test", "group_by": ["alertname", "instance"], "group_wait": "1s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "test", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
        }
        (workdir / "alertmanager.yml").write_text(json.dumps(config))
        self._start([binary, f"--config.file={workdir / 'alertmanager.yml'}", f"--storage.path={workdir / 'data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="], workdir)
        self._wait_ready("/-/ready", "Alertmanager /-/ready")


class WebhookReceiver:
    """A local HTTP server recording every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.bodies.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def alert(self, alertname: str, status: str) -> dict[str, Any] | None:
        """The first alert of that name and status (firing, resolved) Alertmanager delivered, if any."""
        for body in list(self.bodies):
            for alert in body["alerts"]:
                if alert["labels"]["alertname"] == alertname and alert["status"] == status:
                    return alert  # type: ignore[no-any-return]
        return None

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class OtlpHttpReceiver:
    """OTLP/HTTP with protobuf bodies on POST /v1/metrics. `fail_with` makes it answer that status instead;
    `delay_s` makes it answer that much later (a slow collector)."""

    def __init__(self, port: int | None = None) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.headers: list[dict[str, str]] = []
        self.fail_with: int | None = None
        self.delay_s = 0.0
        self.stopping = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver.stopping.wait(receiver.delay_s)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if receiver.fail_with:
                    self.send_response(receiver.fail_with)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                ok = self.path == "/v1/metrics" and self.headers.get("Content-Type") == "application/x-protobuf"
                if ok:
                    receiver.requests.append(ExportMetricsServiceRequest.FromString(body))
                    receiver.headers.append(dict(self.headers))
                reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                with contextlib.suppress(ConnectionError):  # an exporter that gave up on a slow answer
                    self.send_response(200 if ok else 400)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OtlpHttpReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class OtlpGrpcReceiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self) -> None:
        import grpc

        self.requests: list[ExportMetricsServiceRequest] = []
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        self._server.start()

    def Export(self, request: ExportMetricsServiceRequest, context: Any) -> Any:
        self.requests.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def stop(self) -> None:
        self._server.stop(grace=1)


def otlp_points(requests: list[ExportMetricsServiceRequest]) -> dict[str, list[tuple[Any, Any]]]:
    """{metric name: [(metric, data point)]} over all requests, in arrival order."""
    out: dict[str, list[tuple[Any, Any]]] = {}
    for req in requests:
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    for p in getattr(m, kind).data_points:
                        out.setdefault(m.name, []).append((m, p))
    return out


def attributes(kv_list: Any) -> dict[str, Any]:
    out = {}
    for kv in kv_list:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


TRICKLE_BODY = 8
TRICKLE_BYTES = 46  # the whole answer a trickling peer sends, one byte every TRICKLE_EVERY_S: 11.5 s in all
TRICKLE_EVERY_S = 0.25  # well inside any per-read timeout used below, so only a total deadline can end the call


@dataclass
class HostilePeer:
    """Answers every request on its port with `mode`: 'trickle' (a 200, a byte at a time) or 'flood' (200 with an
    endless body)."""

    mode: str
    sock: socket.socket = field(default_factory=lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    stop: threading.Event = field(default_factory=threading.Event)
    sent_bytes: int = 0
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> str:
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            if self.mode == "trickle":  # the status line, the headers and the body, each byte on its own
                answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % TRICKLE_BODY + b"\0" * TRICKLE_BODY
                for byte in answer:
                    if self.stop.wait(TRICKLE_EVERY_S):
                        return
                    conn.sendall(bytes([byte]))
                    self.sent_bytes += 1
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                             b"Content-Length: %d\r\n\r\n" % (1 << 30))
                block = b"\0" * 65536
                while not self.stop.is_set() and self.sent_bytes < 1 << 30:
                    conn.sendall(block)
                    self.sent_bytes += len(block)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        for t in self.threads:
            t.join(10)
