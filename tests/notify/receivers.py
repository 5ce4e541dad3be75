"""Local HTTP receivers standing in for PagerDuty's Events API v2, Slack's incoming webhooks and a generic
webhook: real HTTP servers on 127.0.0.1 that check every body against the service's documented payload schema
(answering 400 with the errors, as the services do) and answer what a test scripts (429, 500, a slow reply)."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jsonschema

from tests.helpers import free_port

# PagerDuty Events API v2 (developer.pagerduty.com, "Send an Alert Event" / "Send a Resolve Event").
PAGERDUTY_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "object", "additionalProperties": False,
         "required": ["routing_key", "event_action", "payload"],
         "properties": {
             "routing_key": {"type": "string", "minLength": 32, "maxLength": 32},
             "event_action": {"const": "trigger"},
             "dedup_key": {"type": "string", "minLength": 1, "maxLength": 255},
             "client": {"type": "string"}, "client_url": {"type": "string"},
             "links": {"type": "array", "items": {"type": "object", "required": ["href"],
                                                  "properties": {"href": {"type": "string"},
                                                                 "text": {"type": "string"}}}},
             "images": {"type": "array"},
             "payload": {"type": "object", "additionalProperties": False,
                         "required": ["summary", "source", "severity"],
                         "properties": {
                             "summary": {"type": "string", "minLength": 1, "maxLength": 1024},
                             "source": {"type": "string", "minLength": 1},
                             "severity": {"enum": ["critical", "error", "warning", "info"]},
                             "timestamp": {"type": "string", "format": "date-time"},
                             "component": {"type": "string"}, "group": {"type": "string"},
                             "class": {"type": "string"}, "custom_details": {"type": "object"}}}}},
        {"type": "object", "additionalProperties": False,
         "required": ["routing_key", "event_action", "dedup_key"],
         "properties": {"routing_key": {"type": "string", "minLength": 32, "maxLength": 32},
                        "event_action": {"enum": ["resolve", "acknowledge"]},
                        "dedup_key": {"type": "string", "minLength": 1, "maxLength": 255}}},
    ]
}

# Slack incoming webhooks (api.slack.com/messaging/webhooks, Block Kit section blocks: mrkdwn text <= 3000).
SLACK_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["text"],
    "properties": {
        "text": {"type": "string", "minLength": 1, "maxLength": 40000},
        "blocks": {"type": "array", "maxItems": 50, "items": {
            "type": "object", "required": ["type", "text"],
            "properties": {"type": {"const": "section"},
                           "text": {"type": "object", "required": ["type", "text"],
                                    "properties": {"type": {"enum": ["mrkdwn", "plain_text"]},
                                                   "text": {"type": "string", "minLength": 1,
                                                            "maxLength": 3000}}}}}},
    },
}

# Alertmanager's webhook payload, version 4 (prometheus.io/docs/alerting/latest/configuration/#webhook_config).
WEBHOOK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["version", "groupKey", "status", "receiver", "groupLabels", "commonLabels", "commonAnnotations",
                 "externalURL", "alerts"],
    "properties": {
        "version": {"const": "4"}, "status": {"enum": ["firing", "resolved"]},
        "alerts": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["status", "labels", "annotations", "startsAt", "endsAt", "fingerprint"],
            "properties": {"status": {"enum": ["firing", "resolved"]},
                           "labels": {"type": "object", "required": ["alertname"],
                                      "additionalProperties": {"type": "string"}},
                           "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                           "startsAt": {"type": "string", "format": "date-time"},
                           "endsAt": {"type": "string"}}}},
    },
}


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    status: int
    at: float


class ScriptedReceiver:
    """Records every request; answers `respond(n)` for the n-th request (default 200 or 202), or 400 when the body
    breaks `schema`. `delay_s` holds each answer back (a slow receiver); `port` reuses a port (down, then back);
    `host` binds another loopback address (another host, for a redirect); `tls` serves HTTPS."""

    def __init__(self, schema: dict[str, Any] | None = None, ok_status: int = 200,
                 respond: Callable[[int], tuple[int, dict[str, str]]] | None = None, delay_s: float = 0.0,
                 port: int | None = None, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        self.schema, self.ok_status, self.respond, self.delay_s = schema, ok_status, respond, delay_s
        self.received: list[Received] = []
        self.schema_errors: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, headers = receiver._answer(raw, dict(self.headers), self.path)
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                body = b'{"status":"ok"}' if status < 300 else b'{"status":"error"}'
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST  # a followed redirect arrives as a GET

            def log_message(self, *args: object) -> None:
                pass

        self.port = port or free_port()
        self.url = f"{'https' if tls else 'http'}://{host}:{self.port}"
        self._server = ThreadingHTTPServer((host, self.port), Handler)
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _answer(self, raw: bytes, headers: dict[str, str], path: str) -> tuple[int, dict[str, str]]:
        with self._lock:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            status, extra = self.ok_status, {}
            if self.schema is not None:
                try:
                    jsonschema.validate(body, self.schema, format_checker=jsonschema.FormatChecker())
                except jsonschema.ValidationError as e:
                    self.schema_errors.append(e.message)
                    status = 400
            if status < 300 and self.respond is not None:
                status, extra = self.respond(len(self.received))
            self.received.append(Received(path, headers, body, status, time.monotonic()))
            return status, extra

    def accepted(self) -> list[Any]:
        with self._lock:
            return [r.body for r in self.received if r.status < 300]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ScriptedReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
