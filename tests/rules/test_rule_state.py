"""Alerting and recording rules on the real evaluator and store, step by step at their edges: `for` and
`keep_firing_for` to the millisecond, a pending alert that goes, the 15-minute memory of a resolved one, ALERTS and
ALERTS_FOR_STATE, a failed evaluation, label sets that collide, durations, and what a group refuses."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from outrider.rules.promql import Evaluator
from outrider.rules.rule import (
    RESOLVED_RETENTION_MS,
    Alert,
    AlertingRule,
    RecordingRule,
    RuleLoadError,
    fingerprint,
    parse_duration,
    parse_groups,
    retention,
)
from outrider.rules.store import SeriesStore, is_stale

T0 = 1_700_000_000_000


def rule(**spec: Any) -> Any:
    return parse_groups({"groups": [{"name": "g", "interval": "1s", "rules": [spec]}]}, "test")[0].rules[0]


class World:
    """A store every name is kept in, its evaluator, and x{a=...} set or removed at each instant."""

    def __init__(self) -> None:
        self.store = SeriesStore(None)
        self.ev = Evaluator(self.store)

    def x(self, ts: int, **values: float) -> None:
        for a, v in values.items():
            self.store.add((("__name__", "x"), ("a", a)), ts, v)
        self.store.mark_stale("x", {(("__name__", "x"), ("a", a)) for a in values}, ts)

    def step(self, r: AlertingRule, ts: int, **values: float) -> list[tuple[str, int, int, int]]:
        self.x(ts, **values)
        r.evaluate(self.ev, ts)
        r.write_alerts_series(self.store, ts)
        return [(a.state, a.active_at, a.fired_at, a.resolved_at) for a in r.active.values()]


def test_an_alert_is_pending_until_for_has_passed_to_the_millisecond() -> None:
    w, r = World(), rule(alert="A", expr="x > 0", **{"for": "2s"})
    assert w.step(r, T0, one=1) == [("pending", T0, 0, 0)]
    assert w.step(r, T0 + 1999, one=1) == [("pending", T0, 0, 0)]
    assert w.step(r, T0 + 2000, one=1) == [("firing", T0, T0 + 2000, 0)]
    assert [a.labels for a in r.firing()] == [(("a", "one"), ("alertname", "A"))]
    assert w.step(r, T0 + 3000, one=1) == [("firing", T0, T0 + 2000, 0)], "fired once, its time kept"


def test_an_alert_without_for_fires_at_once() -> None:
    w, r = World(), rule(alert="A", expr="x > 0")
    assert w.step(r, T0, one=1) == [("firing", T0, T0, 0)]


def test_a_pending_alert_whose_result_goes_is_forgotten_at_once() -> None:
    w, r = World(), rule(alert="A", expr="x > 0", **{"for": "1m"})
    w.step(r, T0, one=1)
    assert w.step(r, T0 + 1000) == []
    assert w.step(r, T0 + 2000, one=1) == [("pending", T0 + 2000, 0, 0)], "a new one, active from now"


def test_a_resolved_alert_is_remembered_for_15_minutes_and_a_new_one_starts_afresh() -> None:
    w, r = World(), rule(alert="A", expr="x > 0")
    w.step(r, T0, one=1)
    t1 = T0 + 1000
    assert w.step(r, t1) == [("inactive", T0, T0, t1)]
    assert w.step(r, t1 + RESOLVED_RETENTION_MS) == [("inactive", T0, T0, t1)], "still remembered at 15 minutes"
    assert w.step(r, t1 + RESOLVED_RETENTION_MS + 1) == []
    w, r = World(), rule(alert="A", expr="x > 0", **{"for": "1s"})
    w.step(r, T0, one=1)
    w.step(r, T0 + 1000, one=1)
    w.step(r, T0 + 2000)
    assert w.step(r, T0 + 3000, one=1) == [("pending", T0 + 3000, 0, 0)], "back after resolving: pending anew"


def test_keep_firing_for_holds_a_fired_alert_to_the_millisecond_and_a_return_resets_it() -> None:
    w, r = World(), rule(alert="A", expr="x > 0", keep_firing_for="3s")
    w.step(r, T0, one=1)
    t1 = T0 + 1000
    assert w.step(r, t1) == [("firing", T0, T0, 0)]
    assert r.active[(("a", "one"), ("alertname", "A"))].keep_firing_since == t1
    assert w.step(r, t1 + 2999) == [("firing", T0, T0, 0)]
    assert w.step(r, t1 + 3000) == [("inactive", T0, T0, t1 + 3000)]
    w, r = World(), rule(alert="A", expr="x > 0", keep_firing_for="3s")
    w.step(r, T0, one=1)
    w.step(r, T0 + 1000)
    w.step(r, T0 + 2000, one=1)
    assert r.active[(("a", "one"), ("alertname", "A"))].keep_firing_since == 0, "back: the hold starts again"
    assert w.step(r, T0 + 3000) == [("firing", T0, T0, 0)]
    assert w.step(r, T0 + 5999) == [("firing", T0, T0, 0)]
    assert w.step(r, T0 + 6000) == [("inactive", T0, T0, T0 + 6000)]


def test_keep_firing_for_does_not_hold_a_pending_alert() -> None:
    w, r = World(), rule(alert="A", expr="x > 0", keep_firing_for="1h", **{"for": "1h"})
    w.step(r, T0, one=1)
    assert w.step(r, T0 + 1000) == []


def test_an_active_alert_takes_each_new_value_and_annotation() -> None:
    w, r = World(), rule(alert="A", expr="x > 0", annotations={"summary": "at {{ $value }}"})
    w.step(r, T0, one=1)
    w.step(r, T0 + 1000, one=7)
    a = r.active[(("a", "one"), ("alertname", "A"))]
    assert (a.value, a.annotations, a.active_at) == (7.0, {"summary": "at 7"}, T0)


def test_alerts_series_say_each_alerts_state_and_go_stale_when_it_resolves() -> None:
    w, r = World(), rule(alert="A", expr="x > 0", **{"for": "1s"})
    w.step(r, T0, one=1)
    labels = (("__name__", "ALERTS"), ("a", "one"), ("alertname", "A"))
    series = dict(w.store.candidates("ALERTS"))
    assert list(series) == [(*labels, ("alertstate", "pending"))]
    for_state = dict(w.store.candidates("ALERTS_FOR_STATE"))
    assert [list(s.values) for s in for_state.values()] == [[T0 / 1000]]
    w.step(r, T0 + 1000, one=1)
    series = dict(w.store.candidates("ALERTS"))
    pending, firing = series[(*labels, ("alertstate", "pending"))], series[(*labels, ("alertstate", "firing"))]
    assert is_stale(pending.values[-1]) and list(firing.values) == [1.0]
    w.step(r, T0 + 2000)
    assert is_stale(firing.values[-1]) and len(pending.values) == 2, "stale once, not again"
    assert all(is_stale(s.values[-1]) for s in w.store.candidates("ALERTS_FOR_STATE") for s in [s[1]])


def test_alerts_series_are_written_only_where_a_rule_reads_them() -> None:
    store = SeriesStore({"x": 60_000})
    r = rule(alert="A", expr="x > 0")
    store.add((("__name__", "x"), ("a", "one")), T0, 1.0)
    r.evaluate(Evaluator(store), T0)
    r.write_alerts_series(store, T0)
    assert list(store.names()) == ["x"]
    store = SeriesStore({"x": 60_000, "ALERTS_FOR_STATE": 60_000})
    store.add((("__name__", "x"), ("a", "one")), T0, 1.0)
    r.evaluate(Evaluator(store), T0)
    r.write_alerts_series(store, T0)
    assert sorted(store.names()) == ["ALERTS_FOR_STATE", "x"]


def test_alerts_series_of_another_rule_are_left_alone() -> None:
    w = World()
    a, b = rule(alert="A", expr="x > 0"), rule(alert="B", expr="x > 5")
    w.x(T0, one=9)
    for r in (a, b):
        r.evaluate(w.ev, T0)
        r.write_alerts_series(w.store, T0)
    w.x(T0 + 1000, one=9)
    a.evaluate(w.ev, T0 + 1000)
    a.write_alerts_series(w.store, T0 + 1000)
    assert not any(is_stale(s.values[-1]) for _, s in w.store.candidates("ALERTS"))


def test_a_failed_evaluation_keeps_the_alerts_as_they_are_and_says_why() -> None:
    w, r = World(), rule(alert="A", expr="x * on(a) y")
    w.x(T0, one=1)
    w.store.add((("__name__", "y"), ("a", "one"), ("b", "1")), T0, 1.0)
    r.evaluate(w.ev, T0)
    assert r.last_error == "" and len(r.active) == 1
    w.store.add((("__name__", "y"), ("a", "one"), ("b", "2")), T0 + 1000, 1.0)
    w.store.add((("__name__", "y"), ("a", "one"), ("b", "1")), T0 + 1000, 1.0)
    w.x(T0 + 1000, one=1)
    r.evaluate(w.ev, T0 + 1000)
    assert r.last_error and "internal error" not in r.last_error
    assert [a.state for a in r.active.values()] == ["firing"]
    w.store.mark_stale("y", {(("__name__", "y"), ("a", "one"), ("b", "1"))}, T0 + 2000)
    w.store.add((("__name__", "y"), ("a", "one"), ("b", "1")), T0 + 2000, 1.0)
    w.x(T0 + 2000, one=1)
    r.evaluate(w.ev, T0 + 2000)
    assert r.last_error == "", "cleared by the next good evaluation"


def test_alert_labels_that_make_two_results_one_are_an_error_and_change_nothing() -> None:
    w, r = World(), rule(alert="A", expr="x > 0", labels={"a": "same"})
    w.x(T0, one=1, two=2)
    r.evaluate(w.ev, T0)
    assert r.last_error == "vector contains metrics with the same labelset after applying alert labels"
    assert r.active == {}


def test_alert_labels_rendered_empty_are_left_out_and_name_is_not_a_label() -> None:
    w, r = World(), rule(alert="A", expr="x > 0", labels={"a": "", "severity": "page"})
    w.x(T0, one=1)
    r.evaluate(w.ev, T0)
    assert list(r.active) == [(("alertname", "A"), ("severity", "page"))]


def test_a_recording_rule_writes_its_name_and_labels_and_marks_what_went_stale() -> None:
    w = World()
    r = rule(record="x:doubled", expr="x * 2", labels={"team": "ml", "a": ""})
    assert isinstance(r, RecordingRule)
    w.x(T0, one=1, two=2)
    r.evaluate(w.ev, w.store, T0)
    # the rule's empty label `a` removes `a`: both results share one label set, an error that writes nothing
    assert list(w.store.candidates("x:doubled")) == []
    assert r.last_error == "vector contains metrics with the same labelset after applying rule labels"
    w, r = World(), rule(record="x:doubled", expr="x * 2", labels={"team": "ml"})
    w.x(T0, one=1, two=2)
    r.evaluate(w.ev, w.store, T0)
    assert r.last_error == ""
    got = {labels: list(s.values) for labels, s in w.store.candidates("x:doubled")}
    assert got == {(("__name__", "x:doubled"), ("a", "one"), ("team", "ml")): [2.0],
                   (("__name__", "x:doubled"), ("a", "two"), ("team", "ml")): [4.0]}
    w.x(T0 + 1000, one=1)
    r.evaluate(w.ev, w.store, T0 + 1000)
    two = dict(w.store.candidates("x:doubled"))[(("__name__", "x:doubled"), ("a", "two"), ("team", "ml"))]
    assert is_stale(two.values[-1])


def test_a_recording_rule_that_fails_says_why_and_writes_nothing() -> None:
    w, r = World(), rule(record="r", expr="x * on(a) y")
    w.x(T0, one=1)
    w.store.add((("__name__", "y"), ("a", "one"), ("b", "1")), T0, 1.0)
    w.store.add((("__name__", "y"), ("a", "one"), ("b", "2")), T0, 1.0)
    r.evaluate(w.ev, w.store, T0)
    assert r.last_error and "internal error" not in r.last_error and list(w.store.candidates("r")) == []


@pytest.mark.parametrize(("text", "ms"), [
    ("0", 0), ("90s", 90_000), ("1h30m", 5_400_000), (" 5m ", 300_000), ("250ms", 250), ("2d", 172_800_000),
    ("1w", 604_800_000), ("1y", 31_536_000_000), (3, 3000), (1.5, 1500), ("1m1s1ms", 61_001),
])
def test_durations_in_milliseconds(text: Any, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "5", "5x", "m5", "1m 5s", "1m5", True, "-1s", "1.5m"])
def test_what_is_not_a_duration_is_refused(text: Any) -> None:
    with pytest.raises(ValueError, match=r"not a duration: .* \(expected e\.g\. 30s, 5m, 1h30m\)"):
        parse_duration(text)


def test_an_alert_round_trips_through_json_and_old_records_take_defaults() -> None:
    a = Alert((("alertname", "A"), ("pod", "p")), {"summary": "s"}, T0, 2.5)
    a.state, a.fired_at, a.resolved_at, a.keep_firing_since = "firing", T0 + 1, T0 + 2, T0 + 3
    b = Alert.from_json(a.to_json())
    assert b.to_json() == a.to_json() and b.labels == a.labels
    old = Alert.from_json({"labels": {"pod": "p", "alertname": "A"}, "active_at": "5"})
    assert (old.labels, old.annotations, old.active_at, old.value, old.state) == (
        (("alertname", "A"), ("pod", "p")), {}, 5, 0.0, "pending")
    assert (old.fired_at, old.resolved_at, old.keep_firing_since) == (0, 0, 0)


def test_a_fingerprint_is_the_sha256_of_the_label_pairs() -> None:
    labels = (("alertname", "A"), ("pod", "p"))
    assert fingerprint(labels) == hashlib.sha256(b"alertname\x01A\x00pod\x01p").hexdigest()[:16]
    assert Alert(labels, {}, 0, 0.0).fingerprint == fingerprint(labels)


@pytest.mark.parametrize(("key", "value"), [("limit", 5), ("query_offset", "1m"), ("labels", {"team": "ml"})])
def test_group_settings_the_agent_does_not_apply_are_refused(key: str, value: Any) -> None:
    with pytest.raises(RuleLoadError) as e:
        parse_groups({"groups": [{"name": "g", key: value, "rules": [{"alert": "A", "expr": "x"}]}]}, "f.yaml")
    assert str(e.value) == (f"f.yaml: group 'g': the group's '{key}' is not applied by the agent's embedded "
                            "evaluator; the group still works in Prometheus (evaluate it there, or leave it out of the "
                            "agent's rule_files)")


def test_group_settings_left_at_their_defaults_are_accepted() -> None:
    g = parse_groups({"groups": [{"name": "g", "limit": 0, "query_offset": "0", "labels": {},
                                  "rules": [{"alert": "A", "expr": "x"}]}]}, "f.yaml", 7000)[0]
    assert (g.name, g.file, g.interval_ms) == ("g", "f.yaml", 7000), "no interval: the default"
    assert parse_groups({"groups": [{"name": "g", "interval": "2s", "rules": []}]}, "f")[0].interval_ms == 2000


def test_a_group_without_interval_or_rules_takes_a_minute_and_has_no_rules() -> None:
    (g,) = parse_groups({"groups": [{"name": "g"}]}, "f.yaml")
    assert (g.name, g.file, g.interval_ms, g.rules) == ("g", "f.yaml", 60_000, [])


def test_a_rule_file_refused_says_which_file_and_why() -> None:
    with pytest.raises(RuleLoadError) as e:
        parse_groups({"groups": "x"}, "rules/f.yaml")
    assert str(e.value) == "rules/f.yaml: groups: expected a list of groups, got the str 'x'"
    with pytest.raises(RuleLoadError) as e:
        parse_groups({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "sum("}]}]}, "f.yaml")
    assert str(e.value) == "f.yaml: group 'g', alert 'A': cannot parse: unclosed left parenthesis"
    with pytest.raises(RuleLoadError) as e:
        parse_groups({"groups": [{"name": "g", "rules": [{"record": "r:x", "expr": "x +"}]}]}, "f.yaml")
    assert str(e.value).startswith("f.yaml: group 'g', recording rule 'r:x': cannot parse: ")
    with pytest.raises(RuleLoadError) as e:  # refused by Prometheus too: no "still works in Prometheus"
        parse_groups({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": 'x{a=~"a{1001}"}'}]}]}, "f.yaml")
    assert str(e.value) == ("f.yaml: group 'g', alert 'A': the pattern 'a{1001}' is not a regular expression RE2 "
                            "takes (invalid repetition size: {1001})")


def test_a_rule_names_itself_in_its_errors() -> None:
    with pytest.raises(RuleLoadError, match=r"^test: group 'g', recording rule 'r': "):
        rule(record="r", expr="sum(")
    with pytest.raises(RuleLoadError, match=r"^test: group 'g', alert 'A': "):
        rule(alert="A", expr="sum(")
    with pytest.raises(RuleLoadError) as e:
        rule(alert="A", expr='x{a=~"("}')
    assert "still works in Prometheus" not in str(e.value), "a bad regex is refused by Prometheus too"
    with pytest.raises(RuleLoadError, match=r"label team.*; the rule still works in Prometheus$"):
        rule(alert="A", expr="x", labels={"team": "{{ range $x }}{{ end }}"})


def test_the_store_keeps_each_name_as_far_back_as_any_rule_reads_it_plus_an_interval() -> None:
    groups = parse_groups({"groups": [
        {"name": "a", "interval": "30s", "rules": [{"record": "r", "expr": "rate(x[5m])"}]},
        {"name": "b", "interval": "1s", "rules": [{"alert": "A", "expr": "max_over_time(x[10m]) > y"}]}]}, "f")
    assert retention(groups, 15_000) == {"x": 600_000 + 15_000, "y": 300_000 + 15_000}
    assert retention(groups[:1], 10_000) == {"x": 300_000 + 30_000}, "the group's interval when it is longer"
    nameless = parse_groups({"groups": [{"name": "g", "rules": [{"alert": "N", "expr": '{job="j"}'}]}]}, "f")
    with pytest.raises(RuleLoadError, match="f: group 'g', rule 'N': a selector without a metric name"):
        retention(nameless, 1000)


def test_a_bug_in_evaluation_is_an_internal_error_not_the_end() -> None:
    class Broken(Evaluator):
        def vector(self, node: Any, ts: int) -> Any:
            raise ZeroDivisionError("boom")

    r = rule(alert="A", expr="x")
    r.evaluate(Broken(SeriesStore(None)), T0)
    assert r.last_error == "internal error: ZeroDivisionError: boom"
    rec = rule(record="r", expr="x")
    rec.evaluate(Broken(SeriesStore(None)), SeriesStore(None), T0)
    assert rec.last_error == "internal error: ZeroDivisionError: boom"


def test_a_promql_error_is_said_in_the_evaluators_own_words() -> None:
    from outrider.rules.promql import PromQLError

    w, r = World(), rule(alert="A", expr="x * on(a) y")
    w.x(T0, one=1)
    w.store.add((("__name__", "y"), ("a", "one"), ("b", "1")), T0, 1.0)
    w.store.add((("__name__", "y"), ("a", "one"), ("b", "2")), T0, 1.0)
    with pytest.raises(PromQLError) as e:
        w.ev.vector(r.expr, T0)
    r.evaluate(w.ev, T0)
    assert r.last_error == str(e.value) and r.last_error


def test_a_recording_rules_empty_label_is_left_out_of_what_it_writes() -> None:
    w, r = World(), rule(record="r", expr="x", labels={"team": ""})
    w.x(T0, one=1)
    r.evaluate(w.ev, w.store, T0)
    assert [labels for labels, _ in w.store.candidates("r")] == [(("__name__", "r"), ("a", "one"))]


def test_a_recording_rule_whose_labels_collide_marks_what_it_wrote_before_stale() -> None:
    w, r = World(), rule(record="r", expr="x", labels={"a": "same"})
    w.x(T0, one=1)
    r.evaluate(w.ev, w.store, T0)
    w.x(T0 + 1000, one=1, two=2)
    r.evaluate(w.ev, w.store, T0 + 1000)
    assert r.last_error == "vector contains metrics with the same labelset after applying rule labels"
    ((_, series),) = w.store.candidates("r")
    assert list(series.times) == [T0, T0 + 1000] and is_stale(series.values[-1])


def test_rule_files_load_with_their_path_settings_and_default_interval(tmp_path: Path) -> None:
    from outrider.rules.rule import load_groups

    p = tmp_path / "r.yaml"
    p.write_text("groups: [{name: g, rules: [{alert: A, expr: x}]}]\n")
    (g,) = load_groups([p])
    assert (g.file, g.interval_ms, g.rules[0].hold_ms) == (str(p), 60_000, 0)
    (g,) = load_groups([str(p)], 5000, settings=["A.for=2m"])
    assert (g.file, g.interval_ms, g.rules[0].hold_ms) == (str(p), 5000, 120_000)
    p.write_text("groups: [")
    with pytest.raises(RuleLoadError) as e:
        load_groups([p])
    assert str(e.value) == (f"file {p}: not valid YAML at line 1, column 10: expected the node content, but found "
                            "'<stream end>'")


def test_fingerprints_are_hashed_by_the_builtin_sha256_not_openssls() -> None:
    from outrider.rules.rule import _sha256_without_openssl

    sha256 = _sha256_without_openssl()
    assert sha256.__module__ in ("_sha2", "_sha256"), sha256.__module__
    assert sha256(b"x").hexdigest() == hashlib.sha256(b"x").hexdigest()


def test_a_store_that_keeps_only_alerts_gets_alerts() -> None:
    store = SeriesStore({"x": 60_000, "ALERTS": 60_000})
    r = rule(alert="A", expr="x > 0")
    store.add((("__name__", "x"), ("a", "one")), T0, 1.0)
    r.evaluate(Evaluator(store), T0)
    r.write_alerts_series(store, T0)
    assert sorted(store.names()) == ["ALERTS", "x"]


def test_a_resolved_alert_does_not_keep_the_others_out_of_alerts() -> None:
    w, r = World(), rule(alert="A", expr="x > 0")
    w.step(r, T0, one=1)
    w.step(r, T0 + 1000, two=1)  # `one` resolved (remembered, inactive) ahead of `two` in the rule's alerts
    live = {labels for labels, s in w.store.candidates("ALERTS") if not is_stale(s.values[-1])}
    assert live == {(("__name__", "ALERTS"), ("a", "two"), ("alertname", "A"), ("alertstate", "firing"))}


def test_a_group_evaluates_its_rules_with_the_external_labels_and_writes_their_alerts() -> None:
    (g,) = parse_groups({"groups": [{"name": "g", "rules": [
        {"record": "x:copy", "expr": "x"},
        {"alert": "A", "expr": "x > 0", "labels": {"cluster": "{{ $externalLabels.cluster }}"}}]}]}, "test")
    w = World()
    w.x(T0, one=1)
    g.evaluate(w.ev, w.store, T0, {"cluster": "c1"})
    assert [labels for labels, _ in w.store.candidates("x:copy")] == [(("__name__", "x:copy"), ("a", "one"))]
    ((labels, series),) = w.store.candidates("ALERTS")
    assert ("cluster", "c1") in labels and list(series.times) == [T0]


def test_alert_labels_are_rendered_from_the_samples_labels_value_and_external_labels() -> None:
    w = World()
    r = rule(alert="A", expr="x > 0", labels={"what": "{{ $labels.a }} at {{ $value }} in {{ $externalLabels.c }}"})
    w.x(T0, one=3)
    r.evaluate(w.ev, T0, {"c": "eu"})
    assert list(r.active) == [(("a", "one"), ("alertname", "A"), ("what", "one at 3 in eu"))]


def test_a_new_alert_starts_with_nothing_fired_resolved_or_held() -> None:
    a = Alert((("alertname", "A"),), {}, T0, 1.0)
    assert a.to_json() == {"active_at": T0, "annotations": {}, "fired_at": 0, "keep_firing_since": 0,
                           "labels": {"alertname": "A"}, "resolved_at": 0, "state": "pending", "value": 1.0}


def test_keep_firing_for_of_one_millisecond_holds_and_none_leaves_no_hold_behind() -> None:
    w, r = World(), rule(alert="A", expr="x > 0", keep_firing_for="1ms")
    w.step(r, T0, one=1)
    assert w.step(r, T0 + 1000) == [("firing", T0, T0, 0)], "held for its one millisecond"
    w, r = World(), rule(alert="A", expr="x > 0")
    w.step(r, T0, one=1)
    w.step(r, T0 + 1000)
    assert r.active[(("a", "one"), ("alertname", "A"))].keep_firing_since == 0


def test_every_result_becomes_an_alert_whatever_was_active_before_it() -> None:
    w, r = World(), rule(alert="A", expr="x > 0", **{"for": "1s"})
    w.step(r, T0, one=1)
    w.step(r, T0 + 1000, one=1, two=1)
    assert w.step(r, T0 + 2000, two=1, three=1) == [
        ("inactive", T0, T0 + 1000, T0 + 2000), ("firing", T0 + 1000, T0 + 2000, 0), ("pending", T0 + 2000, 0, 0)]


def test_annotations_see_the_external_labels() -> None:
    w, r = World(), rule(alert="A", expr="x > 0", annotations={"where": "{{ $externalLabels.c }}"})
    w.x(T0, one=1)
    r.evaluate(w.ev, T0, {"c": "eu"})
    assert [a.annotations for a in r.active.values()] == [{"where": "eu"}]


def test_a_rule_outside_the_subset_is_refused_in_exact_words() -> None:
    with pytest.raises(RuleLoadError) as e:
        rule(alert="A", expr="x @ 1700000000")
    assert str(e.value).startswith("test: group 'g', alert 'A': uses ")
    assert str(e.value).endswith(", which the agent's embedded evaluator does not support; the rule still works in "
                                 "Prometheus (evaluate it there, or leave it out of the agent's rule_files)")
    with pytest.raises(RuleLoadError) as e:
        rule(alert="A", expr='x{a=~"("}')
    assert str(e.value) == "test: group 'g', alert 'A': cannot parse: illegal regex for ("
    assert rule(record="r", expr=" x * 2 ").expr_text == "x * 2"
