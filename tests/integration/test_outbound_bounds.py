"""Outbound calls against hostile peers on 127.0.0.1: a peer that answers one byte at a time, and one that answers
with an endless body. Each OTLP export and each notification ends within its own timeout as a counted failure
(the notification stays queued), whatever the peer does; the agent never reads an unbounded answer into memory.

The peers are raw sockets served by a thread of the test (an HTTP server would not misbehave on purpose); the
OTLP exporter and the notifiers are the agent's own, with the real OTel SDK exporter and urllib underneath."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from outrider.adapters.outbound import Deadline, ResponseTooLarge, read_capped, register_socket
from outrider.exporters.otlp import OtlpExporter
from outrider.ground.config import Config
from outrider.metrics.family import Family
from outrider.notify.webhook import WebhookNotifier
from tests.helpers import wait_until
from tests.notify.test_delivery import alert, dispatcher
from tests.servers import TRICKLE_BYTES, HostilePeer


def _exporter(endpoint: str, timeout_s: float) -> OtlpExporter:
    fam = Family("outrider_agent_scrapes_total")
    fam.add(1.0)
    return OtlpExporter(Config(otlp_endpoint=endpoint, otlp_timeout_s=timeout_s), lambda: [fam])


@pytest.mark.parametrize("peer", ["trickle"], indirect=True)
def test_an_otlp_peer_answering_a_byte_at_a_time_is_cut_at_the_export_timeout(peer: HostilePeer) -> None:
    exporter = _exporter(peer.start(), timeout_s=1.0)
    assert exporter.export_once() is False
    assert exporter.results == {"deadline": 1}, "counted by its reason, not as a success or a plain failure"
    assert peer.sent_bytes < TRICKLE_BYTES, "the export did not wait for the whole trickle"


@pytest.mark.parametrize("peer", ["flood"], indirect=True)
def test_an_otlp_peer_answering_an_endless_body_is_not_read_past_the_cap(peer: HostilePeer) -> None:
    exporter = _exporter(peer.start(), timeout_s=30.0)
    assert exporter.export_once() is False
    assert exporter.results == {"too_large": 1}
    assert peer.sent_bytes < 1 << 30, "the agent stopped reading (the peer's writes backed up)"


@pytest.mark.parametrize("peer", ["trickle"], indirect=True)
def test_a_webhook_answering_a_byte_at_a_time_is_a_counted_retry_and_the_alert_stays_queued(
        peer: HostilePeer, tmp_path: Path) -> None:
    url = peer.start()
    notifier = WebhookNotifier("hook", {"url": url + "/hook"}, 1.0)
    outcome = notifier.send([alert("TrainingStalled", "firing")])
    assert (outcome.kind, outcome.reason) == ("retry", "deadline"), outcome
    assert peer.sent_bytes < TRICKLE_BYTES

    d = dispatcher(tmp_path, [{"name": "hook", "type": "webhook", "url": url + "/hook", "timeout_s": 1}])
    try:
        d.notify(alert("TrainingStalled", "firing"))
        wait_until(lambda: d.deliveries[0].failed.get("deadline", 0) >= 1, timeout_s=60,
                   what="a delivery attempt cut at its deadline")
        one = d.deliveries[0]
        assert one.sent == 0 and len(one.outbox) == 1, "the notification is kept for the next attempt"
        fams = {f.defn.name: dict(f.samples) for f in d.families()}
        assert fams["outrider_notify_failed_total"][("hook", "webhook", "deadline")] >= 1
    finally:
        d.stop()


@pytest.mark.parametrize("peer", ["flood"], indirect=True)
def test_a_webhook_answering_an_endless_body_is_delivered_without_reading_it(peer: HostilePeer) -> None:
    notifier = WebhookNotifier("hook", {"url": peer.start() + "/hook"}, 10.0)
    assert notifier.send([alert("TrainingStalled", "firing")]).delivered
    assert peer.sent_bytes < 1 << 30


def test_read_capped_boundaries() -> None:
    data = b"x" * 100
    reader = iter([data[:60], data[60:], b""])
    assert read_capped(lambda n: next(reader), 100) == data, "exactly the cap is read whole"
    reader = iter([data[:60], data[60:], b"y", b""])
    with pytest.raises(ResponseTooLarge):
        read_capped(lambda n: next(reader), 100)


def test_a_deadline_shuts_down_a_blocked_read() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(30)  # a per-read timeout far longer than the deadline
        with Deadline(0.2) as d:
            register_socket(a)
            assert a.recv(1) == b"", "nothing is ever sent: only the deadline's shutdown ends this read"
        assert d.expired
    with Deadline(30) as d:
        pass
    assert not d.expired
