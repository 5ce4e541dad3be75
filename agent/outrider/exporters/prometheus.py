"""The HTTP endpoint: /metrics (Prometheus text, or OpenMetrics or the protobuf exposition with native histograms by
content negotiation, gzip on request),
/api/v1/alerts (the agent's own pending and firing alerts, in Prometheus's API shape), /healthz (the sweep loop is
alive and current) and /readyz (the first sweep is done).

It serves what it is given as `Endpoints` (narrow callables the agent wires), knows nothing of the sampler or the
rule engine, and counts its own scrapes. Binds 127.0.0.1 unless the configuration says otherwise; the connection
handling and its bounds are http_server's.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from outrider.adapters.http_server import HttpServer, Limits, Request, Response
from outrider.exporters.rotation import TlsFiles
from outrider.metrics.exposition import CONTENT_TYPES, Format, format_value, negotiate
from outrider.metrics.family import Family

INDEX = b"""<html><head><title>Outrider</title></head><body><h1>Outrider agent</h1>
<p><a href="/metrics">/metrics</a> &middot; <a href="/api/v1/alerts">/api/v1/alerts</a> &middot;
<a href="/healthz">/healthz</a> &middot;
<a href="/readyz">/readyz</a></p></body></html>
"""
PROTECTED = ("/metrics", "/api/v1/alerts")  # probes (/healthz, /readyz) stay open for the kubelet


@dataclass(frozen=True)
class Endpoints:
    """What the endpoint serves. exposition(format, gzip) is the latest sweep rendered; alerts_json() the body of
    /api/v1/alerts; healthy() and ready() answer the probes; rendered(format, gzip) the exposition only if it needs
    no rendering."""

    exposition: Callable[[Format, bool], bytes]
    alerts_json: Callable[[], bytes]
    healthy: Callable[[], bool]
    ready: Callable[[], bool]
    # the latest sweep's body if it is rendered (and gzipped) already, else None: what the server's loop thread
    # answers itself; exposition() renders the rest on a worker
    rendered: Callable[[Format, bool], bytes | None] | None = None


class ActiveAlert(Protocol):
    @property
    def labels(self) -> Iterable[tuple[str, str]] | Mapping[str, str]: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...
    @property
    def state(self) -> str: ...
    @property
    def active_at(self) -> int: ...  # unix milliseconds
    @property
    def value(self) -> float: ...


def alerts_api_json(alerts: Iterable[ActiveAlert]) -> bytes:
    """Pending and firing alerts as Prometheus's /api/v1/alerts answers."""
    out = [{"labels": dict(a.labels), "annotations": dict(a.annotations), "state": a.state,
            "activeAt": datetime.fromtimestamp(a.active_at / 1000, tz=UTC).isoformat(),
            "value": format_value(a.value)} for a in alerts]
    return json.dumps({"status": "success", "data": {"alerts": out}}).encode()


def _never(a: bytes, b: bytes) -> bool:
    return False


class MetricsServer:
    """Serves `endpoints` over HTTP(S). Binds on construction; `start()` serves on daemon threads."""

    def __init__(self, endpoints: Endpoints, host: str, port: int, tls: tuple[str, str] | None = None,
                 basic_auth: tuple[str, str] | Callable[[], tuple[str, str]] | None = None,
                 limits: Limits | None = None, protobuf: bool = True) -> None:
        """tls: (certificate file, key file), loaded again when they change (exporters/rotation.py); basic_auth:
        the (user, password) required on /metrics and /api/v1/alerts, or what gives the current ones on each
        request (rotation.BasicAuthFiles.current); protobuf: answer a scraper that asks for the protobuf exposition
        (native histograms) with it, else with the text formats."""
        self.endpoints = endpoints
        self.protobuf = protobuf
        self._basic_auth: Callable[[], tuple[str, str]] | None = None
        if callable(basic_auth):
            self._basic_auth = basic_auth
        elif basic_auth is not None:
            credentials = basic_auth
            self._basic_auth = lambda: credentials
        self._scrapes = 0
        self._lock = threading.Lock()
        self.tls_files: TlsFiles | None = None
        self.scheme = "http"
        if tls is not None:
            self.tls_files = TlsFiles(*tls)
            self.scheme = "https"
        self._compare: Callable[[bytes, bytes], bool] = _never
        if basic_auth is not None:
            import hmac  # only with basic auth: it loads OpenSSL's libcrypto (about 3 MiB of RSS)

            self._compare = hmac.compare_digest
        self._http = HttpServer(host, port, self._handle, self.tls_files.context if self.tls_files else None,
                                limits, self._quick)

    @property
    def scrapes(self) -> int:
        """/metrics requests answered (authorised ones)."""
        return self._scrapes

    def families(self) -> list[Family]:
        """The scrapes so far, the failed accepts and the connections the server closed, for the self collector
        (wiring/agent.py wires it as a reporter)."""
        errors = Family("outrider_agent_accept_errors_total")
        for reason, n in sorted(dict(self._http.accept_errors).items()):  # a copy: the loop thread adds to it
            errors.add(n, reason)
        closed = Family("outrider_agent_connections_closed_total")
        closed.add(self._http.evicted, "evicted").add(self._http.timed_out, "timed_out")
        return [Family("outrider_agent_scrapes_total").add(self._scrapes), errors, closed]

    @property
    def address(self) -> tuple[str, int]:
        return self._http.address

    @property
    def url(self) -> str:
        host, port = self.address
        shown = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{shown}:{port}"

    def start(self) -> None:
        self._http.start()

    def stop(self) -> None:
        self._http.stop()

    def _handle(self, request: Request) -> Response:
        response = self._answer(request, wait=True)
        assert response is not None  # waiting, every request has an answer
        return response

    def _quick(self, request: Request) -> Response | None:
        """On the server's loop thread: the answers that need no waiting (an exposition already rendered, the
        probes, the index, a refusal); None for the rest."""
        return self._answer(request, wait=False)

    def _answer(self, request: Request, wait: bool) -> Response | None:
        path = request.path
        if path in PROTECTED and not self._authorised(request.headers.get("authorization", "")):
            return Response(401, b"", (("WWW-Authenticate", 'Basic realm="outrider"'),))
        if path == "/metrics":
            fmt = negotiate(request.headers.get("accept"), self.protobuf)
            use_gzip = "gzip" in request.headers.get("accept-encoding", "")
            if wait:
                body: bytes | None = self.endpoints.exposition(fmt, use_gzip)
            else:
                rendered = self.endpoints.rendered
                body = rendered(fmt, use_gzip) if rendered is not None else None
            if body is None:
                return None
            with self._lock:
                self._scrapes += 1
            headers = [("Content-Type", CONTENT_TYPES[fmt])]
            if use_gzip:
                headers.append(("Content-Encoding", "gzip"))
            return Response(200, body, tuple(headers))
        if path == "/api/v1/alerts":  # the rule engine's state, under its lock: a worker's
            return Response(200, self.endpoints.alerts_json(), (("Content-Type", "application/json"),)) if wait \
                else None
        if path == "/healthz":
            ok = self.endpoints.healthy()
            return Response(200 if ok else 503, b"ok\n" if ok else b"sweep loop stalled\n")
        if path == "/readyz":
            ready = self.endpoints.ready()
            return Response(200 if ready else 503, b"ready\n" if ready else b"first sweep not done\n")
        if path == "/":
            return Response(200, INDEX, (("Content-Type", "text/html; charset=utf-8"),))
        return Response(404, b"not found\n")

    def _authorised(self, header: str) -> bool:
        if self._basic_auth is None:
            return True
        expected = self._basic_auth()
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        # compare both in constant time, so neither the user nor the password leaks through timing
        ok_user = self._compare(user.encode(), expected[0].encode())
        ok_password = self._compare(password.encode(), expected[1].encode())
        return ok_user and ok_password
