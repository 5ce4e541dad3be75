"""The HTTP endpoint: /metrics (Prometheus text, or OpenMetrics by content negotiation, gzip on request),
/api/v1/alerts (the agent's own pending and firing alerts, in Prometheus's API shape), /healthz (the sweep loop is
alive and current) and /readyz (the first sweep is done).

Binds 127.0.0.1 unless the configuration says otherwise.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from outrider.metrics.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    format_value,
    wants_openmetrics,
)
from outrider.metrics.family import Family
from outrider.sampler import Sampler

LOG = logging.getLogger("outrider.exporters.prometheus")

INDEX = b"""<html><head><title>Outrider</title></head><body><h1>Outrider agent</h1>
<p><a href="/metrics">/metrics</a> &middot; <a href="/api/v1/alerts">/api/v1/alerts</a> &middot;
<a href="/healthz">/healthz</a> &middot;
<a href="/readyz">/readyz</a></p></body></html>
"""


def alerts_json(active_alerts: Callable[[], list[Any]] | None) -> bytes:
    """Pending and firing alerts of the agent's own rule evaluation, as Prometheus's /api/v1/alerts answers."""
    import json
    from datetime import datetime, timezone

    alerts = []
    for _, a in active_alerts() if active_alerts is not None else []:
        alerts.append({"labels": dict(a.labels), "annotations": dict(a.annotations), "state": a.state,
                       "activeAt": datetime.fromtimestamp(a.active_at / 1000, tz=timezone.utc).isoformat(),
                       "value": format_value(a.value)})
    return json.dumps({"status": "success", "data": {"alerts": alerts}}).encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    sampler: Sampler
    basic_auth: tuple[str, str] | None = None  # (user, password)
    active_alerts: Callable[[], list[Any]] | None = None
    scrapes: int = 0


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "outrider"
    sys_version = ""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        sampler = self.server.sampler
        if path in ("/metrics", "/api/v1/alerts") and not self._authorised():
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="outrider"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path == "/metrics":
            openmetrics = wants_openmetrics(self.headers.get("Accept"))
            use_gzip = "gzip" in (self.headers.get("Accept-Encoding") or "")
            self.server.scrapes += 1
            body = sampler.exposition(openmetrics, compressed=use_gzip)
            ctype = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
            self._send(200, body, ctype, "gzip" if use_gzip else None)
        elif path == "/api/v1/alerts":
            self._send(200, alerts_json(self.server.active_alerts), "application/json")
        elif path == "/healthz":
            ok = sampler.healthy()
            self._send(200 if ok else 503, b"ok\n" if ok else b"sweep loop stalled\n")
        elif path == "/readyz":
            ready = sampler.ready.is_set()
            self._send(200 if ready else 503, b"ready\n" if ready else b"first sweep not done\n")
        elif path == "/":
            self._send(200, INDEX, "text/html; charset=utf-8")
        else:
            self._send(404, b"not found\n")

    def _authorised(self) -> bool:
        expected = self.server.basic_auth
        if expected is None:
            return True
        header = self.headers.get("Authorization") or ""
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        # compare both in constant time, so neither the user nor the password leaks through timing
        ok_user = hmac.compare_digest(user.encode(), expected[0].encode())
        ok_password = hmac.compare_digest(password.encode(), expected[1].encode())
        return ok_user and ok_password

    def do_HEAD(self) -> None:
        self.do_GET()

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8",
              encoding: str | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        LOG.debug("%s " + format, self.client_address[0], *args)


class MetricsServer:
    """Serves the sampler's latest sweep. `start()` binds and serves on a daemon thread."""

    def __init__(self, sampler: Sampler, host: str, port: int, tls: tuple[str, str] | None = None,
                 basic_auth: tuple[str, str] | None = None,
                 active_alerts: Callable[[], list[Any]] | None = None) -> None:
        """tls: (certificate file, key file); basic_auth: (user, password) required on /metrics."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_cls = type("_BoundServer", (_Server,), {"address_family": family})
        self._httpd: _Server = server_cls((host, port), _Handler)
        self._httpd.sampler = sampler
        self._httpd.basic_auth = basic_auth
        self._httpd.active_alerts = active_alerts
        self.scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                context.load_cert_chain(*tls)
            except (OSError, ssl.SSLError) as e:
                self._httpd.server_close()
                raise OSError(getattr(e, "errno", None), f"cannot load TLS certificate {tls[0]}: {e}") from None
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
            self.scheme = "https"
        self._thread: threading.Thread | None = None

    def families(self) -> list[Family]:
        """Scrapes served so far, for the self collector."""
        return [Family("outrider_agent_scrapes_total").add(self._httpd.scrapes)]

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        shown = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{shown}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="outrider-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread = None
        self._httpd.server_close()
