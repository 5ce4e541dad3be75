"""Delivery through the dispatcher over real HTTP to local receivers: exact payload schemas, routing, retries
on 429/500/connection refused (in order, nothing lost, no duplicate trigger), no retry on 400, the outbox
surviving a restart, a full disk, and secrets kept out of logs and metrics."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from outrider.metrics.exposition import render
from outrider.notify import Dispatcher, Notification, parse_receivers
from outrider.notify.dispatcher import Route
from outrider.notify.outbox import Outbox
from outrider.notify.webhook import WebhookNotifier
from tests.helpers import free_port, wait_until
from tests.notify.receivers import PAGERDUTY_SCHEMA, SLACK_SCHEMA, WEBHOOK_SCHEMA, ScriptedReceiver

ROUTING_KEY = "R0UT1NGKEYsecret0123456789abcdef"  # 32 characters, as PagerDuty's are
SLACK_TOKEN = "T000/B000/slacksecretTOKEN42"


def alert(name: str, event: str, n: int = 0, severity: str = "critical", **labels: str) -> Notification:
    all_labels = {"alertname": name, "severity": severity, "job": "outrider", "instance": "node-1", **labels}
    fp = f"{abs(hash((name, tuple(sorted(labels.items()))))):016x}"[:16]
    return Notification(f"{fp}-{n}-{event}", event, all_labels,
                        {"summary": f"{name} on node-1", "description": "details",
                         "runbook_url": "https://example.com/runbook"},
                        1_700_000_000.0, 1_700_000_600.0 if event == "resolved" else 0.0, fp, time.time(), 1.0)


def dispatcher(tmp_path: Path, spec: list[dict], **kw: float) -> Dispatcher:
    d = Dispatcher(parse_receivers({"receivers": spec}, "test"), str(tmp_path), retry_initial_s=kw.get("initial", 0.05),
                   retry_max_s=kw.get("max", 0.2), resend_interval_s=kw.get("resend", 60.0))
    d.start()
    return d


def test_pagerduty_trigger_and_resolve_with_a_stable_dedup_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "pd.key"
    key_file.write_text(ROUTING_KEY + "\n")
    with ScriptedReceiver(PAGERDUTY_SCHEMA, ok_status=202) as pd:
        d = dispatcher(tmp_path, [{"name": "pd", "type": "pagerduty", "url": pd.url + "/v2/enqueue",
                                   "routing_key_file": str(key_file)}])
        d.notify(alert("GPULost", "firing", gpu="3"))
        d.notify(alert("GPULost", "resolved", gpu="3"))
        wait_until(lambda: len(pd.accepted()) == 2, timeout_s=10, what="trigger and resolve")
        d.stop()
    assert pd.schema_errors == []
    trigger, resolve = pd.accepted()
    assert trigger["event_action"] == "trigger" and resolve["event_action"] == "resolve"
    assert trigger["dedup_key"] == resolve["dedup_key"]
    assert trigger["payload"]["severity"] == "critical" and trigger["payload"]["source"] == "node-1"
    assert trigger["links"][0]["href"] == "https://example.com/runbook"
    assert pd.received[0].path == "/v2/enqueue"
    # the same alert on another GPU is another incident
    assert alert("GPULost", "firing", gpu="3").fingerprint != alert("GPULost", "firing", gpu="4").fingerprint


def test_slack_and_webhook_payloads_and_routing_by_severity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with ScriptedReceiver(SLACK_SCHEMA) as slack, ScriptedReceiver(WEBHOOK_SCHEMA) as hook:
        monkeypatch.setenv("TEST_SLACK_URL", slack.url + "/services/" + SLACK_TOKEN)
        d = dispatcher(tmp_path, [
            {"name": "slack", "type": "slack", "url_env": "TEST_SLACK_URL", "match": {"severity": "warning"},
             "group_wait_s": 0},
            {"name": "hook", "type": "webhook", "url": hook.url + "/alerts", "match_re": {"alertname": "GPU.*"}},
        ])
        d.notify(alert("GPUThermalThrottling", "firing", severity="warning"))
        d.notify(alert("HostOOMKills", "firing", severity="critical"))  # neither route takes it
        d.notify(alert("GPULost", "firing", severity="critical"))
        wait_until(lambda: len(slack.accepted()) == 1 and len(hook.accepted()) == 2, timeout_s=10,
                   what="routed deliveries")
        wait_until(d.idle, timeout_s=10, what="every outbox drained: nothing left to retry or deliver late")
        d.stop()
    assert slack.schema_errors == [] and hook.schema_errors == []
    assert len(slack.received) == 1 and "GPUThermalThrottling" in slack.accepted()[0]["text"]
    names = [b["alerts"][0]["labels"]["alertname"] for b in hook.accepted()]
    assert names == ["GPUThermalThrottling", "GPULost"]
    keys = [r.headers.get("Idempotency-Key") for r in hook.received]
    assert all(keys) and len(set(keys)) == 2


def test_receiver_down_then_back_gets_everything_in_order_without_duplicates(tmp_path: Path) -> None:
    port = free_port()  # nothing listens yet: connection refused
    d = dispatcher(tmp_path, [{"name": "hook", "type": "webhook", "url": f"http://127.0.0.1:{port}/"}])
    sent = []
    for i in range(5):
        for event in ("firing", "resolved"):
            n = alert(f"Alert{i}", event, n=i)
            sent.append((n.alertname, event))
            d.notify(n)
    wait_until(lambda: d.deliveries[0].failed["retry"] >= 3, timeout_s=10, what="failed attempts while down")
    assert len(d.deliveries[0].outbox) == 10
    with ScriptedReceiver(WEBHOOK_SCHEMA, port=port) as hook:
        wait_until(lambda: len(hook.accepted()) == 10, timeout_s=15, what="the backlog delivered")
        d.stop()
    got = [(b["alerts"][0]["labels"]["alertname"], b["status"]) for b in hook.accepted()]
    assert got == sent  # in order, each exactly once
    assert hook.schema_errors == [] and len(d.deliveries[0].outbox) == 0
    assert os.listdir(tmp_path / "outbox" / "hook") == []


@pytest.mark.parametrize("status", [429, 500, 503])
def test_throttling_and_server_errors_are_retried(tmp_path: Path, status: int) -> None:
    def respond(n: int) -> tuple[int, dict[str, str]]:
        return (status, {"Retry-After": "0"}) if n < 3 else (200, {})

    with ScriptedReceiver(WEBHOOK_SCHEMA, respond=respond) as hook:
        d = dispatcher(tmp_path, [{"name": "hook", "type": "webhook", "url": hook.url}])
        d.notify(alert("GPULost", "firing"))
        wait_until(lambda: len(hook.accepted()) == 1, timeout_s=10, what="delivery after retries")
        d.stop()
    assert [r.status for r in hook.received] == [status, status, status, 200]
    assert d.deliveries[0].failed["retry"] == 3 and d.deliveries[0].sent == 1


def test_a_rejected_notification_is_dropped_logged_and_counted_not_retried(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with ScriptedReceiver(WEBHOOK_SCHEMA, respond=lambda n: (400, {}) if n == 0 else (200, {})) as hook:
        d = dispatcher(tmp_path, [{"name": "hook", "type": "webhook", "url": hook.url}])
        with caplog.at_level(logging.ERROR, logger="outrider.notify"):
            d.notify(alert("First", "firing"))
            d.notify(alert("Second", "firing"))
            wait_until(lambda: len(hook.received) == 2, timeout_s=10, what="two requests")
            wait_until(d.idle, timeout_s=10, what="the outbox drained: the 400 dropped, not kept for a retry")
        d.stop()
    assert [r.status for r in hook.received] == [400, 200]  # the 400 is not tried again, the next goes on
    assert d.deliveries[0].failed["rejected"] == 1
    assert any("rejected First firing" in r.getMessage() for r in caplog.records)
    text = render(d.families()).decode()
    assert 'outrider_notify_failed_total{receiver="hook",type="webhook",reason="rejected"} 1' in text
    assert 'outrider_notify_sent_total{receiver="hook",type="webhook"} 1' in text


def test_the_outbox_survives_a_restart_in_order(tmp_path: Path) -> None:
    port = free_port()
    spec = [{"name": "hook", "type": "webhook", "url": f"http://127.0.0.1:{port}/"}]
    first = dispatcher(tmp_path, spec)
    for i in range(3):
        first.notify(alert(f"A{i}", "firing"))
    wait_until(lambda: first.deliveries[0].failed["retry"] >= 1, timeout_s=10, what="a failed attempt")
    first.stop()
    files = sorted(os.listdir(tmp_path / "outbox" / "hook"))
    assert len(files) == 3 and all(os.stat(tmp_path / "outbox" / "hook" / f).st_mode & 0o777 == 0o600 for f in files)
    with ScriptedReceiver(WEBHOOK_SCHEMA, port=port) as hook:
        second = dispatcher(tmp_path, spec)
        second.notify(alert("A3", "firing"))
        wait_until(lambda: len(hook.accepted()) == 4, timeout_s=10, what="the restored outbox delivered")
        second.stop()
    assert [b["alerts"][0]["labels"]["alertname"] for b in hook.accepted()] == ["A0", "A1", "A2", "A3"]


def test_a_full_disk_holds_notifications_in_memory_and_recovers(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    box = Outbox(str(tmp_path / "box"))
    real_open = os.open

    def full(path: str, *args: int) -> int:
        if str(path).endswith(".tmp"):
            raise OSError(28, "No space left on device")
        return real_open(path, *args)

    monkeypatch.setattr(os, "open", full)
    box.put(alert("A", "firing"))
    box.put(alert("B", "firing"))
    assert box.write_errors == 2 and len(box) == 2 and box.in_memory_only() == 2
    box.persist_pending()
    assert box.in_memory_only() == 2  # still full
    monkeypatch.setattr(os, "open", real_open)
    box.persist_pending()
    assert box.in_memory_only() == 0 and len(os.listdir(tmp_path / "box")) == 2
    restored = Outbox(str(tmp_path / "box"))
    assert [n.alertname for n in restored.peek(10)] == ["A", "B"]


def test_secrets_never_reach_logs_errors_or_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    key_file = tmp_path / "pd.key"
    key_file.write_text(ROUTING_KEY)

    def echo_400(n: int) -> tuple[int, dict[str, str]]:
        return 400, {}

    with ScriptedReceiver(PAGERDUTY_SCHEMA, respond=echo_400) as pd, ScriptedReceiver(respond=echo_400) as slack:
        monkeypatch.setenv("TEST_SLACK_URL", slack.url + "/services/" + SLACK_TOKEN)
        with caplog.at_level(logging.DEBUG):
            d = dispatcher(tmp_path, [
                {"name": "pd", "type": "pagerduty", "url": pd.url, "routing_key_file": str(key_file)},
                {"name": "slack", "type": "slack", "url_env": "TEST_SLACK_URL", "group_wait_s": 0}])
            d.notify(alert("GPULost", "firing"))
            wait_until(lambda: len(pd.received) == 1 and len(slack.received) == 1, timeout_s=10, what="attempts")
            wait_until(d.idle, timeout_s=10, what="both 400s handled (dropped and logged)")
            d.stop()
    assert pd.received[0].body["routing_key"] == ROUTING_KEY  # it was sent to the receiver...
    text = caplog.text + render(d.families()).decode()
    assert ROUTING_KEY not in text and SLACK_TOKEN not in text  # ...and written nowhere else
    assert "rejected GPULost" in caplog.text


def test_secrets_in_the_config_itself_are_refused() -> None:
    from outrider.notify import NotifyConfigError

    with pytest.raises(NotifyConfigError, match=r"routing_key_file.*routing_key_env|file .*environment"):
        parse_receivers({"receivers": [{"name": "pd", "type": "pagerduty", "routing_key": ROUTING_KEY}]}, "t")
    with pytest.raises(NotifyConfigError, match="TEST_UNSET_VARIABLE"):
        parse_receivers({"receivers": [{"name": "s", "type": "slack", "url_env": "TEST_UNSET_VARIABLE"}]}, "t")
    with pytest.raises(NotifyConfigError, match="type must be one of"):
        parse_receivers({"receivers": [{"name": "x", "type": "sms"}]}, "t")


def test_alertmanager_refresh_only_while_nothing_is_queued(tmp_path: Path) -> None:
    with ScriptedReceiver() as am:
        d = Dispatcher(parse_receivers({"receivers": [{"name": "am", "type": "alertmanager", "url": am.url}]}, "t"),
                       str(tmp_path), firing=lambda: [alert("GPULost", "firing")], resend_interval_s=0.2)
        d.start()
        wait_until(lambda: len(am.received) >= 3, timeout_s=10, what="re-sends")
        d.stop()
    body = am.received[0].body
    assert am.received[0].path == "/api/v2/alerts" and body[0]["labels"]["alertname"] == "GPULost"
    assert body[0]["endsAt"] > body[0]["startsAt"]  # a lease, not an open end


def test_webhook_notifier_type_checks_its_url() -> None:
    from outrider.notify import NotifyConfigError

    with pytest.raises(NotifyConfigError, match="http"):
        WebhookNotifier("w", {"url": "ftp://x"})
    assert Route(match={"severity": "critical"}).accepts({"severity": "critical"})
    assert not Route(match={"severity": "critical"}).accepts({"severity": "warning"})


def test_a_heartbeat_reaches_alertmanager_and_who_asks_for_it_never_a_pager_by_default(tmp_path: Path) -> None:
    """The Watchdog fires at every agent start: a pager that did not ask for it must not be paged."""
    from outrider.notify.dispatcher import parse_receivers

    watchdog = {"alertname": "Watchdog", "severity": "none"}
    routes = dict((n.name, r) for n, r in parse_receivers({"receivers": [
        {"name": "am", "type": "alertmanager", "url": "http://127.0.0.1:9093"},
        {"name": "hook", "type": "webhook", "url": "http://127.0.0.1:1/"},
        {"name": "deadman", "type": "webhook", "url": "http://127.0.0.1:2/", "match": {"severity": "none"}},
        {"name": "beat", "type": "webhook", "url": "http://127.0.0.1:3/", "heartbeats": True},
    ]}, "test"))
    assert routes["am"].accepts(watchdog) and routes["deadman"].accepts(watchdog) and routes["beat"].accepts(watchdog)
    assert not routes["hook"].accepts(watchdog)
    assert routes["hook"].accepts({"alertname": "GPULost", "severity": "critical"}), "everything else as before"


def test_http_receivers_take_bearer_or_basic_auth_and_a_private_ca(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import base64

    from outrider.notify import NotifyConfigError

    password = tmp_path / "am.password"
    password.write_text("s3cret-am-password\n")
    monkeypatch.setenv("TEST_HOOK_TOKEN", "hook-token-123")
    with ScriptedReceiver() as am, ScriptedReceiver(WEBHOOK_SCHEMA) as hook:
        d = dispatcher(tmp_path, [
            {"name": "am", "type": "alertmanager", "url": am.url, "basic_auth_username": "outrider",
             "basic_auth_password_file": str(password)},
            {"name": "hook", "type": "webhook", "url": hook.url, "bearer_token_env": "TEST_HOOK_TOKEN"}])
        d.notify(alert("GPULost", "firing"))
        wait_until(lambda: am.accepted() and hook.accepted(), timeout_s=10, what="both deliveries")
        d.stop()
    expected = "Basic " + base64.b64encode(b"outrider:s3cret-am-password").decode()
    assert am.received[0].headers["Authorization"] == expected
    assert hook.received[0].headers["Authorization"] == "Bearer hook-token-123"
    with pytest.raises(NotifyConfigError, match="needs basic_auth_password_env or basic_auth_password_file"):
        parse_receivers({"receivers": [{"name": "am", "type": "alertmanager", "url": "http://x",
                                        "basic_auth_username": "u"}]}, "t")
    with pytest.raises(NotifyConfigError, match="ca_file"):
        parse_receivers({"receivers": [{"name": "am", "type": "alertmanager", "url": "https://x",
                                        "ca_file": str(tmp_path / "missing.pem")}]}, "t")


def test_alertmanager_re_sends_only_what_its_route_takes(tmp_path: Path) -> None:
    firing = [alert("GPULost", "firing", severity="critical"), alert("CPUSaturated", "firing", severity="warning")]
    with ScriptedReceiver() as am:
        d = Dispatcher(parse_receivers({"receivers": [{"name": "am", "type": "alertmanager", "url": am.url,
                                                       "match": {"severity": "critical"}}]}, "t"),
                       str(tmp_path), firing=lambda: firing, resend_interval_s=0.2)
        d.start()
        wait_until(lambda: len(am.received) >= 2, timeout_s=10, what="re-sends")
        d.stop()
    assert {a["labels"]["alertname"] for r in am.received for a in r.body} == {"GPULost"}


def test_an_alert_storm_reaches_slack_as_a_few_grouped_messages(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with ScriptedReceiver(SLACK_SCHEMA) as slack:
        monkeypatch.setenv("TEST_SLACK_URL", slack.url + "/services/" + SLACK_TOKEN)
        d = dispatcher(tmp_path, [{"name": "slack", "type": "slack", "url_env": "TEST_SLACK_URL",
                                   "group_wait_s": 0.5}])
        storm = [alert("GPUThermalThrottling", "firing", severity="warning", gpu=str(i)) for i in range(30)]
        for n in storm:
            d.notify(n)
        wait_until(lambda: sum(len(b["blocks"]) - 1 for b in slack.accepted()) == 30, timeout_s=60,
                   what="all 30 alerts posted")
        d.stop()
    assert slack.schema_errors == []
    assert len(slack.received) == 2  # 20 + 10, not 30 messages
    first = slack.accepted()[0]
    assert first["text"].startswith("20 firing, 0 resolved: GPUThermalThrottling")
    texts = [blk["text"]["text"] for b in slack.accepted() for blk in b["blocks"][1:]]
    assert all(f"gpu={i}," in t for i, t in enumerate(texts))  # every alert, in order
