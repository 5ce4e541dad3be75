"""Every form in which a receiver's secret can come back, in every place a notifier's failure goes.

A receiver that refuses a request often says why by echoing it: the URL it was asked for (whole, without its scheme,
its path, its query, the Slack token that is its last segment), the credentials (user:password, the Authorization
header). A notifier bug raises with the URL in its message, and the dispatcher logs the traceback. Each form is
planted on its own, so that forgetting one form in `url_secrets` or the notifier's secrets fails the test named for
it, and each is looked for in the outcome, the log records (tracebacks included) and the metrics.
"""

from __future__ import annotations

import base64
import http.server
import logging
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from outrider.metrics.exposition import render
from outrider.notify import Dispatcher, parse_receivers
from outrider.notify.base import Notifier, url_secrets
from tests.helpers import wait_until
from tests.notify.test_delivery import alert

TEAM, BOT, TOKEN = "T0TEAMSECRET", "B0BOTSECRET", "sl4ckW3bh00kT0kenSECRET"
QUERY = "sig=qu3rySECRETvalue"
PASSWORD = "p@ss:w0rd SECRET"  # a password that must be percent-encoded in a URL: both spellings are secrets
QUOTED_PASSWORD = urllib.parse.quote(PASSWORD, safe="")
BEARER = "bearer-T0kenSECRET-9f8e"
ROUTING_KEY = "R0UT1NGkeySECRET0123456789abcdef"
BASIC = base64.b64encode(f"outrider:{PASSWORD}".encode()).decode()


class Echo:
    """An HTTP receiver on 127.0.0.1 that refuses every request with a body saying `say(request)`."""

    def __init__(self, code: int, say: Callable[[http.server.BaseHTTPRequestHandler], str]) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.seen.append(self.headers.get("Authorization", ""))
                body = say(self).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.seen: list[str] = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.hostport = f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def echo() -> Iterator[Callable[..., Echo]]:
    started: list[Echo] = []

    def start(code: int, say: Callable[[http.server.BaseHTTPRequestHandler], str]) -> Echo:
        started.append(Echo(code, say))
        return started[-1]
    yield start
    for e in started:
        e.close()


def slack_url(hostport: str) -> str:
    return f"http://{hostport}/services/{TEAM}/{BOT}/{TOKEN}?{QUERY}"


# What each receiver echoes: (receiver type, the form's name, what the receiver says, the secrets it must not show)
def slack_forms(hostport: str) -> dict[str, tuple[str, list[str]]]:
    url = slack_url(hostport)
    return {
        "whole URL": (f"cannot post to {url}", [TOKEN, TEAM, BOT, QUERY]),
        "URL without its scheme": (f"no route {url.split('://', 1)[1]}", [TOKEN, TEAM, BOT, QUERY]),
        "path and query": (f"POST /services/{TEAM}/{BOT}/{TOKEN}?{QUERY} refused", [TOKEN, TEAM, BOT, QUERY]),
        "path without the query": (f"unknown path /services/{TEAM}/{BOT}/{TOKEN}", [TOKEN, TEAM, BOT]),
        "path segment": (f"invalid_token {TOKEN}", [TOKEN]),
        "query": (f"bad signature {QUERY}", [QUERY]),
    }


FORMS = ["whole URL", "URL without its scheme", "path and query", "path without the query", "path segment", "query"]


def notifier(spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Notifier:
    ((n, _),) = parse_receivers({"receivers": [{"name": "r", "timeout_s": 5, **spec}]}, "test")
    return n


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("code", [400, 500])
def test_a_slack_url_echoed_in_any_form_is_scrubbed_from_the_outcome(
        form: str, code: int, echo: Callable[..., Echo], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    holder: dict[str, str] = {}
    server = echo(code, lambda h: holder["say"])
    said, secrets = slack_forms(server.hostport)[form]
    holder["say"] = said
    monkeypatch.setenv("TEST_SLACK_URL", slack_url(server.hostport))
    n = notifier({"type": "slack", "url_env": "TEST_SLACK_URL", "group_wait_s": 0}, monkeypatch, tmp_path)
    outcome = n.send([alert("GPULost", "firing")])
    assert outcome.kind == ("rejected" if code == 400 else "retry")
    assert f"HTTP {code}" in outcome.detail and "<secret>" in outcome.detail, outcome.detail
    assert [s for s in secrets if s in outcome.detail] == [], outcome.detail


@pytest.mark.parametrize(("form", "say", "secrets"), [
    ("password", lambda h: f"wrong password {PASSWORD}", [PASSWORD]),
    ("percent-encoded password", lambda h: f"wrong password {QUOTED_PASSWORD}", [QUOTED_PASSWORD]),
    ("user:password", lambda h: f"denied outrider:{QUOTED_PASSWORD}", [QUOTED_PASSWORD]),
    ("the URL with its credentials", lambda h: f"denied http://outrider:{QUOTED_PASSWORD}@{h.headers['Host']}/",
     [QUOTED_PASSWORD]),
    ("the Authorization header", lambda h: f"bad header {h.headers['Authorization']}", [BASIC, PASSWORD]),
])
def test_credentials_in_an_alertmanager_url_echoed_in_any_form_are_scrubbed(
        form: str, say: Callable[[http.server.BaseHTTPRequestHandler], str], secrets: list[str],
        echo: Callable[..., Echo], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server = echo(400, say)
    url = f"http://outrider:{QUOTED_PASSWORD}@{server.hostport}"
    n = notifier({"type": "alertmanager", "url": url}, monkeypatch, tmp_path)
    outcome = n.send([alert("GPULost", "firing")])
    assert server.seen == [f"Basic {BASIC}"], "sent as basic auth, decoded"
    assert "<secret>" in outcome.detail, outcome.detail
    assert [s for s in secrets if s in outcome.detail] == [], outcome.detail


@pytest.mark.parametrize(("form", "spec", "say", "secret"), [
    ("bearer token", {"type": "webhook", "bearer_token_env": "TEST_BEARER"},
     lambda h: f"token {h.headers['Authorization'].split()[1]} expired", BEARER),
    ("basic auth password", {"type": "webhook", "basic_auth_username": "outrider",
                             "basic_auth_password_env": "TEST_PASSWORD"}, lambda h: f"no user with {PASSWORD}",
     PASSWORD),
    ("basic auth header", {"type": "webhook", "basic_auth_username": "outrider",
                           "basic_auth_password_env": "TEST_PASSWORD"}, lambda h: h.headers["Authorization"], BASIC),
    ("routing key", {"type": "pagerduty", "routing_key_env": "TEST_ROUTING_KEY"},
     lambda h: f"invalid routing key {ROUTING_KEY}", ROUTING_KEY),
])
def test_header_and_body_secrets_echoed_back_are_scrubbed(
        form: str, spec: dict[str, Any], say: Callable[[http.server.BaseHTTPRequestHandler], str], secret: str,
        echo: Callable[..., Echo], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TEST_BEARER", BEARER)
    monkeypatch.setenv("TEST_PASSWORD", PASSWORD)
    monkeypatch.setenv("TEST_ROUTING_KEY", ROUTING_KEY)
    server = echo(400, say)
    n = notifier({**spec, "url": f"http://{server.hostport}/hook"}, monkeypatch, tmp_path)
    outcome = n.send([alert("GPULost", "firing")])
    assert outcome.kind == "rejected" and "<secret>" in outcome.detail, outcome.detail
    assert secret not in outcome.detail, outcome.detail


def test_url_secrets_lists_every_form_and_no_harmless_one() -> None:
    url = f"https://u:{QUOTED_PASSWORD}@hooks.example.com/services/{TEAM}/{BOT}/{TOKEN}?{QUERY}"
    forms = url_secrets(url)
    rest = url.split("://", 1)[1]
    assert forms[:2] == [url, rest], "the longest first: replaced before their parts"
    for form in (f"/services/{TEAM}/{BOT}/{TOKEN}?{QUERY}", f"/services/{TEAM}/{BOT}/{TOKEN}", TOKEN, QUERY,
                 QUOTED_PASSWORD, PASSWORD):
        assert form in forms, form
    assert "hooks.example.com" not in forms and "/" not in forms and "" not in forms
    # a short last segment is no token (it would scrub words out of every message): a path of "/" neither
    assert url_secrets("https://hooks.example.com/v1/send") == ["https://hooks.example.com/v1/send",
                                                                  "hooks.example.com/v1/send", "/v1/send"]
    assert url_secrets("https://hooks.example.com/") == ["https://hooks.example.com/", "hooks.example.com/"]
    assert TOKEN[:8] in url_secrets(f"https://h.example.com/{TOKEN[:8]}")
    assert TOKEN[:7] not in url_secrets(f"https://h.example.com/{TOKEN[:7]}")


@pytest.mark.parametrize("form", FORMS)
def test_a_notifier_bug_raising_with_the_url_logs_a_scrubbed_traceback_and_counts(
        form: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The stack dump the dispatcher logs when a notifier raises: each form in the exception's message."""
    from outrider.notify.slack import SlackNotifier

    hostport = "127.0.0.1:9"
    said, secrets = slack_forms(hostport)[form]
    monkeypatch.setenv("TEST_SLACK_URL", slack_url(hostport))

    def broken(self: SlackNotifier, notifications: list[Any]) -> dict[str, Any]:
        raise ValueError(said)

    monkeypatch.setattr(SlackNotifier, "payload", broken)
    with caplog.at_level(logging.DEBUG):
        d = Dispatcher(parse_receivers({"receivers": [{"name": "slack", "type": "slack",
                                                       "url_env": "TEST_SLACK_URL", "group_wait_s": 0}]}, "t"),
                       str(tmp_path), retry_initial_s=0.05, retry_max_s=0.2)
        d.start()
        try:
            d.notify(alert("GPULost", "firing"))
            wait_until(lambda: d.deliveries[0].failed["retry"] >= 2, timeout_s=30, what="two counted failures")
        finally:
            d.stop()
    formatter = logging.Formatter("%(message)s")
    logged = "\n".join(formatter.format(r) for r in caplog.records)
    assert "Traceback" in logged and "ValueError" in logged, "the stack dump is logged (at debug)"
    assert [s for s in secrets if s in logged] == [], logged
    metrics = render(d.families()).decode()
    assert [s for s in secrets if s in metrics] == []
