"""Every receiver type with a secret planted (a Slack webhook URL, a PagerDuty routing key, a bearer token, a basic
auth password, a password in an Alertmanager URL) driven through every way delivery fails, over real sockets on
127.0.0.1: connection refused, a 302 to another host, 400, 500, a TLS certificate from the wrong CA, a receiver that
hangs past the timeout, an answer that is not HTTP, a name that does not resolve. Each failure is counted and
retried with the normal backoff (a 400 dropped), a redirect is never followed, and no secret shows in any log record
(debug level, tracebacks included), metric, error message or shown configuration."""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from outrider.metrics.exposition import render
from outrider.notify import Dispatcher, NotifyConfigError, parse_receivers
from tests.helpers import free_port, self_signed, wait_until
from tests.notify.receivers import ScriptedReceiver
from tests.notify.test_delivery import alert

SLACK_TOKEN = "T0SECRET/B0SECRET/sl4ckW3bh00kT0ken"
ROUTING_KEY = "R0UT1NGkeySECRET0123456789abcdef"  # 32 characters, as PagerDuty's are
BEARER = "bearer-T0ken-9f8e7d6c"
BASIC_PASSWORD = "basic-Passw0rd-5c4b3a"
USERINFO_PASSWORD = "us3rinfo-Passw0rd-1a2b"
SECRETS = [SLACK_TOKEN, "sl4ckW3bh00kT0ken", ROUTING_KEY, BEARER, BASIC_PASSWORD, USERINFO_PASSWORD,
           base64.b64encode(f"outrider:{BASIC_PASSWORD}".encode()).decode(),
           base64.b64encode(f"outrider:{USERINFO_PASSWORD}".encode()).decode()]
RECEIVERS = ["pd", "slack", "hook", "am-basic", "am-userinfo"]


def receivers(base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ca_file: str | None = None,
              timeout_s: float = 0.5) -> list[dict[str, Any]]:
    """All five receivers, pointed at `base` (scheme://host:port)."""
    (tmp_path / "pd.key").write_text(ROUTING_KEY + "\n")
    (tmp_path / "am.password").write_text(BASIC_PASSWORD + "\n")
    monkeypatch.setenv("TEST_SLACK_URL", f"{base}/services/{SLACK_TOKEN}")
    monkeypatch.setenv("TEST_HOOK_TOKEN", BEARER)
    scheme, hostport = base.split("://")
    ca = {"ca_file": ca_file} if ca_file else {}
    specs: list[dict[str, Any]] = [
        {"name": "pd", "type": "pagerduty", "url": base + "/v2/enqueue", "routing_key_file": str(tmp_path / "pd.key")},
        {"name": "slack", "type": "slack", "url_env": "TEST_SLACK_URL", "group_wait_s": 0},
        {"name": "hook", "type": "webhook", "url": base + "/hook", "bearer_token_env": "TEST_HOOK_TOKEN", **ca},
        {"name": "am-basic", "type": "alertmanager", "url": base, "basic_auth_username": "outrider",
         "basic_auth_password_file": str(tmp_path / "am.password"), **ca},
        {"name": "am-userinfo", "type": "alertmanager", "url": f"{scheme}://outrider:{USERINFO_PASSWORD}@{hostport}",
         **ca},
    ]
    return [{**spec, "timeout_s": timeout_s} for spec in specs]


def leaked(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def log_text(records: list[logging.LogRecord]) -> str:
    """Everything a handler could write: messages, tracebacks and stacks, formatted."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(formatter.format(r) + (r.stack_info or "") for r in records)


# --- the failing receivers -------------------------------------------------------------------------------------

@contextlib.contextmanager
def refused(tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    yield f"http://127.0.0.1:{free_port()}", None


def answering(code: int) -> Callable[[Path], contextlib.AbstractContextManager[tuple[str, str | None]]]:
    @contextlib.contextmanager
    def target(tmp_path: Path) -> Iterator[tuple[str, str | None]]:
        with ScriptedReceiver(respond=lambda n: (code, {})) as r:
            yield r.url, None
    return target


THIEF: list[ScriptedReceiver] = []


@contextlib.contextmanager
def redirect_elsewhere(tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    """302 to another host (another loopback address), which would accept anything."""
    with ScriptedReceiver(host="127.0.0.2") as thief, \
            ScriptedReceiver(respond=lambda n: (302, {"Location": thief.url + "/stolen"})) as r:
        THIEF[:] = [thief]
        yield r.url, None


@contextlib.contextmanager
def tls_wrong_ca(tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    (tmp_path / "server").mkdir()
    (tmp_path / "other").mkdir()
    cert, key = self_signed(tmp_path / "server")
    other_ca, _ = self_signed(tmp_path / "other")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with ScriptedReceiver(tls=context) as r:
        yield r.url, str(other_ca)


@contextlib.contextmanager
def hangs(tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    with ScriptedReceiver(delay_s=5.0) as r:  # each receiver's timeout is 0.5 s
        yield r.url, None


@contextlib.contextmanager
def not_http(tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    """A server that answers garbage: http.client raises BadStatusLine, which is no OSError."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(b"HELLO THERE\r\n\r\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", None
    finally:
        stop.set()
        t.join(5)
        listener.close()


@contextlib.contextmanager
def unresolvable(tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    yield "http://outrider-test.invalid:9", None  # RFC 6761: never resolves


FAILURES = {
    "connection refused": refused,
    "302 to another host": redirect_elsewhere,
    "400": answering(400),
    "500": answering(500),
    "TLS, wrong CA": tls_wrong_ca,
    "hangs past the timeout": hangs,
    "not HTTP": not_http,
    "DNS failure": unresolvable,
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_every_failure_is_counted_retried_and_leaks_no_secret(
        failure: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    rejected = failure == "400"
    # A hang is cut by the receiver's timeout_s, which bounds the whole delivery: counted as its own reason.
    reason = "rejected" if rejected else "deadline" if failure == "hangs past the timeout" else "retry"
    with FAILURES[failure](tmp_path) as (base, ca_file), caplog.at_level(logging.DEBUG):
        d = Dispatcher(parse_receivers({"receivers": receivers(base, tmp_path, monkeypatch, ca_file)}, "test"),
                       str(tmp_path / "state"), retry_initial_s=0.05, retry_max_s=0.2)
        d.start()
        try:
            d.notify(alert("GPULost", "firing"))
            if rejected:
                wait_until(lambda: all(x.failed["rejected"] >= 1 for x in d.deliveries), timeout_s=30,
                           what="every receiver's rejection")
            else:  # tried again and again with the normal backoff, not once in 5 minutes
                wait_until(lambda: all(x.failed.get(reason, 0) >= 2 for x in d.deliveries), timeout_s=30,
                           what="two counted failures per receiver")
        finally:
            d.stop(timeout_s=5)
    by_name = {x.notifier.name: x for x in d.deliveries}
    assert sorted(by_name) == sorted(RECEIVERS)
    for name, x in by_name.items():
        assert x.sent == 0, name
        assert len(x.outbox) == (0 if rejected else 1), f"{name}: a failed notification stays queued for a retry"
    metrics = render(d.families()).decode()
    for name in RECEIVERS:
        line = next(ln for ln in metrics.splitlines()
                    if ln.startswith("outrider_notify_failed_total{") and f'receiver="{name}"' in ln
                    and f'reason="{reason}"' in ln)
        assert float(line.rsplit(" ", 1)[1]) >= 1, line
    if failure == "302 to another host":
        assert THIEF[0].received == [], "the redirect was followed, credentials and all"
        assert any("redirect" in r.getMessage() for r in caplog.records)
    text = log_text(caplog.records)
    assert leaked(text) == [], text
    assert leaked(metrics) == []
    assert leaked(" ".join(str(x.notifier.__dict__.get("endpoint", "")) for x in d.deliveries)) == []


@pytest.mark.parametrize("bad", [
    "http://127.0.0.1:9/services/T0SECRET/B0SECRET/sl4ckW3bh00kT0ken with a space",
    "127.0.0.1:9/services/T0SECRET/B0SECRET/sl4ckW3bh00kT0ken",
    "hooks.slack.com/services/T0SECRET/B0SECRET/sl4ckW3bh00kT0ken",
    "http:///services/T0SECRET/B0SECRET/sl4ckW3bh00kT0ken",
    "https://hooks.slack.com:99999/services/T0SECRET/B0SECRET/sl4ckW3bh00kT0ken",
    "https://hooks.slack.com/services/T0SECRET/B0SECRET\t/sl4ckW3bh00kT0ken",
    "https://höoks.slack.com/services/T0SECRET/B0SECRET/sl4ckW3bh00kT0ken",
])
def test_a_bad_slack_url_fails_config_check_naming_the_receiver_not_the_url(
        bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from outrider.commands.cli import main

    monkeypatch.setenv("TEST_SLACK_URL", bad)
    receivers_file = tmp_path / "receivers.yaml"
    receivers_file.write_text("receivers:\n  - {name: team-chat, type: slack, url_env: TEST_SLACK_URL}\n")
    config = tmp_path / "outrider.yaml"
    config.write_text(f"receivers_file: {receivers_file}\n")
    assert main(["config", "check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "team-chat" in err and "webhook URL" in err and "Traceback" not in err, err
    assert leaked(err) == [] and "T0SECRET" not in err, err


@pytest.mark.parametrize(("spec", "message"), [
    ({"type": "webhook", "url": "ftp://hooks.example.com/x?token=SECRETQUERY"}, "http:// or https://"),
    ({"type": "webhook", "url": "https://hooks.example.com/x?token=SECRET QUERY"}, "whitespace"),
    ({"type": "alertmanager", "url": "http://:9093"}, "no host"),
    ({"type": "alertmanager", "url": "http://am:port"}, "malformed"),
    ({"type": "pagerduty", "url": "events.pagerduty.com/v2/enqueue?SECRETQUERY", "routing_key_env": "TEST_PD_KEY"},
     "http:// or https://"),
])
def test_every_receiver_url_is_checked_when_receivers_load(spec: dict[str, Any], message: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PD_KEY", ROUTING_KEY)
    with pytest.raises(NotifyConfigError, match=message) as e:
        parse_receivers({"receivers": [{"name": "r1", **spec}]}, "test")
    assert "'r1'" in str(e.value) and "SECRET" not in str(e.value)


def test_a_password_in_an_alertmanager_url_is_sent_as_basic_auth_and_shown_nowhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    from outrider.commands.cli import main
    from outrider.ground.config import load
    from outrider.wiring.alerting import receivers as build_receivers

    with ScriptedReceiver() as am:
        url = am.url.replace("http://", f"http://outrider:{USERINFO_PASSWORD}@")
        monkeypatch.setenv("OUTRIDER_ALERTMANAGER_URLS", url)
        assert main(["config", "show"]) == 0
        shown = capsys.readouterr().out
        assert "alertmanager_urls" in shown and "outrider:<secret>@127.0.0.1" in shown, shown
        assert USERINFO_PASSWORD not in shown
        with caplog.at_level(logging.DEBUG):
            routes = [(n, r) for n, r in build_receivers(load(env={"OUTRIDER_ALERTMANAGER_URLS": url}).config)
                      if n.type == "alertmanager"]
            d = Dispatcher(routes, str(tmp_path))
            d.start()
            d.notify(alert("GPULost", "firing"))
            wait_until(lambda: am.accepted(), timeout_s=10, what="the delivery")
            d.stop()
    expected = "Basic " + base64.b64encode(f"outrider:{USERINFO_PASSWORD}".encode()).decode()
    assert am.received[0].headers["Authorization"] == expected and am.received[0].path == "/api/v2/alerts"
    assert leaked(log_text(caplog.records) + render(d.families()).decode()) == []
    monkeypatch.setenv("TEST_HOOK_TOKEN", BEARER)
    with pytest.raises(NotifyConfigError, match="credentials both") as e:
        parse_receivers({"receivers": [{"name": "am", "type": "alertmanager", "url": url,
                                        "bearer_token_env": "TEST_HOOK_TOKEN"}]}, "t")
    assert leaked(str(e.value)) == []


def test_an_exception_inside_a_notifier_is_counted_and_retried_with_the_normal_backoff(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A bug (here: the payload builder raising with the secret URL in its message) must not stop delivery for
    5 minutes, go uncounted, or log a traceback carrying the secret."""
    from outrider.notify.slack import SlackNotifier

    monkeypatch.setenv("TEST_SLACK_URL", f"http://127.0.0.1:9/services/{SLACK_TOKEN}")

    def broken(self: SlackNotifier, notifications: list[Any]) -> dict[str, Any]:
        raise ValueError(f"cannot post to {self.url}")

    monkeypatch.setattr(SlackNotifier, "payload", broken)
    with caplog.at_level(logging.DEBUG):
        d = Dispatcher(parse_receivers({"receivers": [{"name": "slack", "type": "slack", "url_env": "TEST_SLACK_URL",
                                                       "group_wait_s": 0}]}, "t"),
                       str(tmp_path), retry_initial_s=0.05, retry_max_s=300.0)
        d.start()
        d.notify(alert("GPULost", "firing"))
        # the normal backoff (0.05, 0.1, 0.2 s ...) gets there at once; a wait of retry_max_s (300 s) never would
        wait_until(lambda: d.deliveries[0].failed["retry"] >= 3, timeout_s=30, what="three counted failures")
        d.stop()
    assert len(d.deliveries[0].outbox) == 1
    assert any("ValueError" in r.getMessage() for r in caplog.records)
    assert leaked(log_text(caplog.records)) == []
