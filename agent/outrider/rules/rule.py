"""Rule groups as the agent evaluates them: recording rules, alerting rules and their alert state.

The state machine is Prometheus's (rules/alerting.go): a new result is pending; it fires once it has been active
for `for`; when its result is gone it resolves, unless it has fired and `keep_firing_for` holds it; a resolved
alert is remembered for 15 minutes (so a notifier can resend the resolve). A rule outside the embedded PromQL
subset, or with a template outside the supported one, is refused at load time with the rule's name and the
construct, and the message says it still works in Prometheus.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outrider.rules import promql
from outrider.rules.promql import Evaluator, PromQLError
from outrider.rules.store import STALE, Labels, SeriesStore
from outrider.rules.templates import Template, TemplateError

if TYPE_CHECKING:
    import promql_parser as pp

RESOLVED_RETENTION_MS = 15 * 60 * 1000
DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000,
            "y": 31_536_000_000}


class RuleLoadError(ValueError):
    """A rule file or rule the embedded evaluator cannot take; the message names the file, group and rule."""


def _describe(e: Exception) -> str:
    return str(e) if isinstance(e, PromQLError) else f"internal error: {type(e).__name__}: {e}"


def parse_duration(text: str | int | float) -> int:
    """A Prometheus duration ('1h30m', '90s') in milliseconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return int(text * 1000)
    s = str(text).strip()
    if s == "0":
        return 0
    pos, total = 0, 0
    for m in DURATION.finditer(s):
        if m.start() != pos:
            break
        total += int(m.group(1)) * UNITS_MS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"not a duration: {text!r} (expected e.g. 30s, 5m, 1h30m)")
    return total


class Alert:
    __slots__ = ("active_at", "annotations", "fired_at", "keep_firing_since", "labels", "resolved_at", "state",
                 "value")

    def __init__(self, labels: Labels, annotations: dict[str, str], active_at: int, value: float) -> None:
        self.labels = labels
        self.annotations = annotations
        self.state = "pending"
        self.active_at = active_at
        self.fired_at = 0
        self.resolved_at = 0
        self.keep_firing_since = 0
        self.value = value

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.labels)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) if k != "labels" else dict(self.labels) for k in self.__slots__}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Alert:
        a = cls(tuple(sorted((str(k), str(v)) for k, v in data["labels"].items())),
                {str(k): str(v) for k, v in data.get("annotations", {}).items()}, int(data["active_at"]),
                float(data.get("value", 0.0)))
        a.state = str(data.get("state", "pending"))
        for key in ("fired_at", "resolved_at", "keep_firing_since"):
            setattr(a, key, int(data.get(key, 0)))
        return a


def _sha256_without_openssl() -> Callable[[bytes], Any]:
    """CPython's built-in SHA-256 (_sha2 from 3.12, _sha256 before): hashlib would load OpenSSL's libcrypto, about
    3 MiB of RSS in an agent that hashes nothing else. The digest is the same, so fingerprints do not change."""
    for name in ("_sha2", "_sha256"):
        try:
            return importlib.import_module(name).sha256  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            continue
    import hashlib

    return hashlib.sha256


_sha256 = _sha256_without_openssl()


def fingerprint(labels: Labels) -> str:
    digest: str = _sha256("\x00".join(f"{k}\x01{v}" for k, v in labels).encode()).hexdigest()
    return digest[:16]


@dataclass
class RecordingRule:
    name: str
    expr_text: str
    expr: pp.Expr
    labels: dict[str, str]
    last_error: str = ""

    def evaluate(self, ev: Evaluator, store: SeriesStore, ts: int) -> None:
        try:
            vec = ev.vector(self.expr, ts)
        except Exception as e:  # PromQLError, or a bug: never the end of the other rules' evaluation
            self.last_error = _describe(e)
            vec = []
        else:
            self.last_error = ""
        out: dict[Labels, float] = {}
        for s in vec:
            labels = dict(s.labels)
            labels.update(self.labels)
            labels["__name__"] = self.name
            key = tuple(sorted((k, v) for k, v in labels.items() if v != ""))
            if key in out:
                self.last_error = "vector contains metrics with the same labelset after applying rule labels"
                out = {}
                break
            out[key] = s.value
        for key, value in out.items():
            store.add(key, ts, value)
        store.mark_stale(self.name, set(out), ts)


@dataclass
class AlertingRule:
    name: str
    expr_text: str
    expr: pp.Expr
    hold_ms: int
    keep_firing_ms: int
    labels: dict[str, Template]
    annotations: dict[str, Template]
    active: dict[Labels, Alert] = field(default_factory=dict)
    last_error: str = ""

    def evaluate(self, ev: Evaluator, ts: int, external_labels: dict[str, str] | None = None) -> None:
        try:
            vec = ev.vector(self.expr, ts)
        except Exception as e:
            # Prometheus keeps the alerts as they are when an evaluation fails; so do we.
            self.last_error = _describe(e)
            return
        self.last_error = ""
        seen: dict[Labels, tuple[dict[str, str], float]] = {}
        for s in vec:
            sample_labels = dict(s.labels)
            labels = {k: v for k, v in sample_labels.items() if k != "__name__"}
            for k, t in self.labels.items():
                labels[k] = t.render(sample_labels, s.value, external_labels)
            labels["alertname"] = self.name
            key = tuple(sorted((k, v) for k, v in labels.items() if v != ""))
            if key in seen:
                self.last_error = "vector contains metrics with the same labelset after applying alert labels"
                return
            annotations = {k: t.render(sample_labels, s.value, external_labels) for k, t in self.annotations.items()}
            seen[key] = (annotations, s.value)
        for key, (annotations, value) in seen.items():
            alert = self.active.get(key)
            if alert is not None and alert.state != "inactive":
                alert.value, alert.annotations = value, annotations
                continue
            self.active[key] = Alert(key, annotations, ts, value)
        for key, alert in list(self.active.items()):
            if key not in seen:
                keep_firing = False
                if alert.state == "firing" and self.keep_firing_ms > 0:
                    if not alert.keep_firing_since:
                        alert.keep_firing_since = ts
                    if ts - alert.keep_firing_since < self.keep_firing_ms:
                        keep_firing = True
                if alert.state == "pending" or (alert.resolved_at and ts - alert.resolved_at > RESOLVED_RETENTION_MS):
                    del self.active[key]
                if alert.state != "inactive" and not keep_firing:
                    alert.state = "inactive"
                    alert.resolved_at = ts
                if not keep_firing:
                    continue
            else:
                alert.keep_firing_since = 0
            if alert.state == "pending" and ts - alert.active_at >= self.hold_ms:
                alert.state = "firing"
                alert.fired_at = ts

    def firing(self) -> list[Alert]:
        return [a for a in self.active.values() if a.state == "firing"]

    def write_alerts_series(self, store: SeriesStore, ts: int) -> None:
        """ALERTS and ALERTS_FOR_STATE, as Prometheus writes them, for rules that select them."""
        if not store.wants("ALERTS") and not store.wants("ALERTS_FOR_STATE"):
            return
        alerts_keys: set[Labels] = set()
        for_state_keys: set[Labels] = set()
        for alert in self.active.values():
            if alert.state == "inactive":
                continue
            key = tuple(sorted([*alert.labels, ("__name__", "ALERTS"), ("alertstate", alert.state)]))
            store.add(key, ts, 1.0)
            alerts_keys.add(key)
            fkey = tuple(sorted([*alert.labels, ("__name__", "ALERTS_FOR_STATE")]))
            store.add(fkey, ts, alert.active_at / 1000)
            for_state_keys.add(fkey)
        for name, keys in (("ALERTS", alerts_keys), ("ALERTS_FOR_STATE", for_state_keys)):
            for labels, series in store.candidates(name):
                if (dict(labels).get("alertname") == self.name and labels not in keys and series.values
                        and not series.last_is_stale()):
                    series.append(ts, STALE)


Rule = RecordingRule | AlertingRule


@dataclass
class Group:
    name: str
    file: str
    interval_ms: int
    rules: list[Rule]

    def evaluate(self, ev: Evaluator, store: SeriesStore, ts: int,
                 external_labels: dict[str, str] | None = None) -> None:
        for rule in self.rules:
            if isinstance(rule, RecordingRule):
                rule.evaluate(ev, store, ts)
            else:
                rule.evaluate(ev, ts, external_labels)
                rule.write_alerts_series(store, ts)


def load_groups(paths: Iterable[str | Path], default_interval_ms: int = 60_000,
                settings: list[str] | None = None) -> list[Group]:
    """Load Prometheus rule files; refuse, naming the rule and the construct, what the evaluator cannot run."""
    groups: list[Group] = []
    from outrider.rules.files import RulesError, apply_settings, load_rules, load_tunables

    for path in paths:
        try:
            data = load_rules(Path(path))
            if settings:
                data = apply_settings(data, settings, load_tunables())
        except RulesError as e:
            raise RuleLoadError(str(e)) from None
        groups.extend(parse_groups(data, str(path), default_interval_ms))
    return groups


def parse_groups(data: Any, source: str, default_interval_ms: int = 60_000) -> list[Group]:
    from outrider.rules.files import RulesError, rule_file

    try:
        checked = rule_file(data, source)
    except RulesError as e:
        raise RuleLoadError(str(e)) from None
    out = []
    for g in checked["groups"]:
        where = f"{source}: group {g['name']!r}"
        for key, unset in (("limit", 0), ("query_offset", "0"), ("labels", {})):
            if g.get(key, unset) not in (unset, "", None):
                raise RuleLoadError(f"{where}: the group's '{key}' is not applied by the agent's embedded evaluator; "
                                    "the group still works in Prometheus (evaluate it there, or leave it out of the "
                                    "agent's rule_files)")
        interval = parse_duration(g["interval"]) if g.get("interval") else 0
        rules = [_parse_rule(r, where) for r in g.get("rules", [])]
        out.append(Group(g["name"], source, interval or default_interval_ms, rules))
    return out


def _parse_rule(r: dict[str, Any], where: str) -> Rule:
    """One rule that files.rule_file has checked: its fields have the types Prometheus gives them."""
    name = r.get("alert") or r["record"]
    where = f"{where}, {'alert' if r.get('alert') else 'recording rule'} {name!r}"
    text = r["expr"].strip()
    try:
        expr = promql.parse(text)
    except PromQLError as e:
        raise RuleLoadError(f"{where}: {e}") from None
    try:
        promql.check(expr)
    except promql.PromQLRegexError as e:  # refused by Prometheus as well: no "still works in Prometheus"
        raise RuleLoadError(f"{where}: {e}") from None
    except PromQLError as e:
        raise RuleLoadError(f"{where}: uses {e}, which the agent's embedded evaluator does not support; the rule "
                            "still works in Prometheus (evaluate it there, or leave it out of the agent's "
                            "rule_files)") from None
    labels = dict(r.get("labels", {}))
    if r.get("record"):
        return RecordingRule(name, text, expr, labels)
    hold = parse_duration(r.get("for") or "0")
    keep = parse_duration(r.get("keep_firing_for") or "0")
    try:
        label_t = {k: Template(v, f"{where}: label {k}") for k, v in labels.items()}
        ann_t = {k: Template(v, f"{where}: annotation {k}") for k, v in r.get("annotations", {}).items()}
    except TemplateError as e:
        raise RuleLoadError(f"{e}; the rule still works in Prometheus") from None
    return AlertingRule(name, text, expr, hold, keep, label_t, ann_t)


def retention(groups: list[Group], interval_ms: int) -> dict[str, int]:
    """How far back (ms) the rules read each metric name: what the bounded store keeps."""
    out: dict[str, int] = {}
    for g in groups:
        for rule in g.rules:
            for vs, back in promql.selectors(rule.expr):
                name = promql.selector_name(vs)
                if name is None:
                    raise RuleLoadError(f"{g.file}: group {g.name!r}, rule {rule.name!r}: a selector without a "
                                        "metric name cannot be kept in the agent's bounded store")
                out[name] = max(out.get(name, 0), back + max(interval_ms, g.interval_ms))
    return out
