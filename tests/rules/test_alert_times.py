"""The run summary tells when an alert became pending and when it fired (the page went out) apart: the real rule
engine with a `for`, the run recorder and the run store, as under `outrider run` (alerts v3, item 11)."""

from __future__ import annotations

from pathlib import Path

from outrider.metrics.catalog import Label, MetricDef
from outrider.metrics.family import Family
from outrider.rules.engine import RuleEngine
from outrider.rules.notification import Notification
from outrider.rules.rule import parse_groups
from outrider.runs.recorder import RunRecorder
from outrider.runs.store import AlertRecord, RunStore

GAUGE = MetricDef("test_memory_ratio", "test.memory.ratio", "1", "gauge", "a test gauge", (Label("pod", "pod"),),
                  "self")


def families(value: float) -> list[Family]:
    f = Family(GAUGE)
    f.add(value, "p0")
    return [f]


def test_the_summary_shows_pending_and_firing_times_apart(tmp_path: Path) -> None:
    rules = parse_groups({"groups": [{"name": "g", "interval": "1s", "rules": [
        {"alert": "NearLimit", "expr": "test_memory_ratio > 0.9", "for": "5s", "labels": {"severity": "warning"},
         "annotations": {"summary": "near its limit"}},
        {"alert": "AtOnce", "expr": "test_memory_ratio > 0.95", "labels": {"severity": "critical"}}]}]}, "test")
    store = RunStore(tmp_path / "runs")
    run_id = store.start_run(["train.py"])
    t0 = store.load(run_id).started
    recorder = RunRecorder(store, run_id)
    sent: list[Notification] = []

    def notify(n: Notification) -> None:
        sent.append(n)
        recorder.on_alert(n)

    clock_ms = int(t0 * 1000)
    engine = RuleEngine(rules, 1.0, None, notify=notify, clock=lambda: clock_ms)
    # high from 2 s (NearLimit pending), above 0.95 from 4 s (AtOnce fires at once), NearLimit fires at 7 s,
    # back to normal at 12 s
    for second in range(1, 16):
        clock_ms = int(t0 * 1000) + second * 1000
        value = 0.5 if second < 2 or second >= 12 else (0.92 if second < 4 else 0.97)
        engine.ingest(families(value), clock_ms)
        engine.evaluate(clock_ms)
    firing = {n.alertname: n for n in sent if n.event == "firing"}
    assert round(firing["NearLimit"].starts_at - t0) == 2 and round(firing["NearLimit"].fired_at - t0) == 7
    assert firing["AtOnce"].starts_at == firing["AtOnce"].fired_at

    store.finish_run(run_id, 0, {})
    for alerts in (recorder.alerts, RunStore(tmp_path / "runs").load(run_id).alerts):
        texts = sorted(a.text(t0) for a in alerts)
        assert texts == ["AtOnce (critical) fired at 0:04, resolved at 0:12 after 8 s",
                         "NearLimit (warning) pending at 0:02, fired at 0:07, resolved at 0:12 after 5 s: "
                         "near its limit"], texts


def test_a_notification_from_an_older_outbox_fires_at_its_start() -> None:
    """A queued notification written before fired_at existed reads back with the firing time unknown: the summary
    then says 'fired at' its start, as before."""
    old = {"id": "x", "event": "firing", "labels": {"alertname": "A"}, "starts_at": 100.0, "fingerprint": "f"}
    n = Notification.from_json(old)
    assert (n.fired_at, n.firing_since) == (0.0, 100.0)
    assert Notification.from_json(n.to_json()) == n
    assert AlertRecord("A", {}, "", 160.0, None, 100.0).text(40.0) == \
        "A pending at 1:00, fired at 2:00, still firing at the end"
    assert AlertRecord("A", {}, "", 160.0, None).text(40.0) == "A fired at 2:00, still firing at the end"
