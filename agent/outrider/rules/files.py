"""The rule catalog as files: where the built-in one is, reading a rule file and its tunables, and tuning
thresholds (`--set RULE.NAME=VALUE`). The evaluator (rule.py) and the exporters (export.py) both start here."""

from __future__ import annotations

import copy
import datetime
import re
from pathlib import Path
from typing import Any

import yaml

# The catalog ships inside the package (outrider/alerts, a link to the repository's alerts/ in a checkout, a copy
# in a wheel), so a pip-installed agent finds the rules its evaluator loads by default.
PACKAGED_ALERTS = Path(__file__).resolve().parents[1] / "alerts"
DURATION_RE = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
SEVERITIES = ("critical", "warning", "info")


class RulesError(ValueError):
    """A bad rule file, tunable or --set value; the message says which."""


def default_rules_path() -> Path:
    return PACKAGED_ALERTS / "outrider.rules.yaml"


def load_rules(path: Path | None = None) -> dict[str, Any]:
    """A rule file read as Prometheus reads it (see `rule_file`); every way it can be wrong is a RulesError naming
    the file (and the group, rule and field), never a traceback, and never a hang on a FIFO."""
    from outrider.ground.config import ConfigError, read_yaml_file

    path = path or default_rules_path()
    try:
        data = read_yaml_file(str(path))
    except ConfigError as e:
        raise RulesError(str(e)) from None
    return rule_file(data, str(path))


def load_tunables(path: Path | None = None) -> list[dict[str, Any]]:
    """The catalog's tunables (tunables.yaml beside the rule file); a rule file without one has none."""
    path = path or default_rules_path().with_name("tunables.yaml")
    try:
        return list(yaml.safe_load(path.read_text()) or [])
    except FileNotFoundError:
        return []


# --- a rule file as Prometheus reads it (rulefmt, strict) -------------------------------------------------------

GROUP_FIELDS = ("name", "interval", "limit", "query_offset", "labels", "rules")
RULE_FIELDS = ("record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations")
# Prometheus's durations: units from the largest down, each at most once (model.ParseDuration).
PROMETHEUS_DURATION = re.compile(r"(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000,
            "y": 31_536_000_000}
MAX_DURATION_MS = (2**63 - 1) // 1_000_000  # Go's time.Duration, nanoseconds in an int64


def rule_file(data: Any, source: str) -> dict[str, Any]:
    """The rule file checked field by field as Prometheus checks it (unknown fields, wrong types, empty or repeated
    group names, bad label and rule names, durations, fields a recording rule cannot have), and returned with
    every scalar as the text Prometheus reads (`name: 5` is the group "5"). A RulesError names the file, the group
    and the rule (by name, or by position when it has none) and the field."""
    if data is None:
        return {"groups": []}
    if not isinstance(data, dict):
        raise RulesError(f"{source}: a Prometheus rule file is a mapping with a 'groups' list, not {_kind(data)}")
    _no_unknown_fields(data, ("groups",), source)
    groups = data.get("groups")
    if groups is None:
        return {"groups": []}
    if not isinstance(groups, list):
        raise RulesError(f"{source}: groups: expected a list of groups, got {_kind(groups)}")
    out, seen = [], set()
    for i, group in enumerate(groups, 1):
        if group is None:  # an empty item: Prometheus skips it too
            continue
        checked = _group(group, source, i)
        if checked["name"] in seen:
            raise RulesError(f"{source}: group {checked['name']!r} is repeated in the same file (Prometheus refuses "
                             "it too: group names are unique within a file)")
        seen.add(checked["name"])
        out.append(checked)
    return {"groups": out}


def _group(group: Any, source: str, position: int) -> dict[str, Any]:
    where = f"{source}: group {position}"
    if not isinstance(group, dict):
        raise RulesError(f"{where}: expected a mapping with 'name' and 'rules', got {_kind(group)}")
    name = _text(group.get("name"), where, "name")
    if not name:
        raise RulesError(f"{where}: the group has no name (Prometheus refuses it too)")
    where = f"{source}: group {name!r}"
    _no_unknown_fields(group, GROUP_FIELDS, where)
    out: dict[str, Any] = {}
    for key, value in group.items():
        if key == "name":
            out[key] = name
        elif key in ("interval", "query_offset"):
            out[key] = _duration(value, where, key)
        elif key == "limit":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise RulesError(f"{where}: limit: expected a whole number, got {_kind(value)}")
            out[key] = value or 0
        elif key == "labels":
            out[key] = _names_to_text(value, where, "labels")
        elif key == "rules":
            if value is not None and not isinstance(value, list):
                raise RulesError(f"{where}: rules: expected a list of rules, got {_kind(value)}")
            out[key] = [_rule(r, where, j) for j, r in enumerate(value or [], 1) if r is not None]
    return out


def _rule(rule: Any, where: str, position: int) -> dict[str, Any]:
    if not isinstance(rule, dict):
        raise RulesError(f"{where}, rule {position}: expected a mapping with 'alert' or 'record' and 'expr', got "
                         f"{_kind(rule)}")
    alert = _node_text(rule, "alert", f"{where}, rule {position}")
    record = _node_text(rule, "record", f"{where}, rule {position}")
    if alert and record:
        raise RulesError(f"{where}, rule {position}: has both 'alert' ({alert!r}) and 'record' ({record!r}); a rule "
                         "is one or the other")
    if not alert and not record:
        raise RulesError(f"{where}, rule {position}: needs one of 'alert' or 'record', with a name")
    where = f"{where}, alert {alert!r}" if alert else f"{where}, recording rule {record!r}"
    _no_unknown_fields(rule, RULE_FIELDS, where)
    if record and not METRIC_NAME.fullmatch(record):
        raise RulesError(f"{where}: {record!r} is not a valid metric name (letters, digits, _ and :, not starting "
                         "with a digit)")
    out: dict[str, Any] = {}
    for key, value in rule.items():
        if key in ("alert", "record"):
            if alert if key == "alert" else record:  # `alert: ''` beside a record is no alert
                out[key] = alert or record
        elif key == "expr":
            out[key] = _node_text(rule, key, where)
        elif key in ("for", "keep_firing_for"):
            out[key] = _duration(value, where, key)
            if record and _milliseconds(out[key]):
                raise RulesError(f"{where}: a recording rule has no '{key}'")
        elif key == "labels":
            out[key] = _names_to_text(value, where, key)
        elif key == "annotations":
            out[key] = _names_to_text(value, where, key)
            if record and out[key]:
                raise RulesError(f"{where}: a recording rule has no 'annotations'")
    if not out.get("expr", "").strip():
        raise RulesError(f"{where}: no expr")
    return out


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, bytes):
        return "binary data"
    return f"the {type(value).__name__} {value!r}"


def _text(value: Any, where: str, key: str) -> str:
    """A scalar as the text Prometheus reads from it; a list or mapping where text belongs is an error."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float, datetime.date)):
        return str(value)
    raise RulesError(f"{where}: {key}: expected text, got {_kind(value)}")


def _node_text(rule: dict[Any, Any], key: str, where: str) -> str:
    """alert, record and expr, which Prometheus reads as YAML nodes: a null there is the text "null" (`alert: null`
    is an alert named null, and `record: null` beside an alert makes a rule with both), and a list or mapping is no
    text at all (`record: []` beside an alert is an alert; `expr: {}` is an expression not set)."""
    if key in rule and rule[key] is None:
        return "null"
    if isinstance(rule.get(key), (list, dict)):
        return ""  # a yaml.Node's Value is a scalar's text only: a list or mapping there reads as not set
    return _text(rule.get(key), where, key)


def _duration(value: Any, where: str, key: str) -> str:
    if value is None:
        return "0"  # `for: null` is Prometheus' zero duration (a YAML null leaves a model.Duration unset)
    text = _text(value, where, key)
    if text == "0":
        return text
    if not text or not PROMETHEUS_DURATION.fullmatch(text):
        raise RulesError(f"{where}: {key}: {text!r} is not a Prometheus duration (e.g. 30s, 5m, 1h30m: units from "
                         "the largest down, no sign, no bare number but 0)")
    if _milliseconds(text) > MAX_DURATION_MS:
        raise RulesError(f"{where}: {key}: {text!r} is longer than Prometheus takes (about 292 years)")
    return text


def _milliseconds(duration: str) -> int:
    return sum(int(n) * _UNIT_MS[u] for n, u in re.findall(r"(\d+)(ms|y|w|d|h|m|s)", duration))


def _names_to_text(value: Any, where: str, key: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RulesError(f"{where}: {key}: expected a mapping of names to values, got {_kind(value)}")
    out = {}
    for name, text in value.items():
        name = _text(name, where, f"{key} name")
        if not LABEL_NAME.fullmatch(name):
            raise RulesError(f"{where}: {key}: {name!r} is not a valid name (letters, digits and _, not starting "
                             "with a digit)")
        if key == "labels" and name == "__name__":
            raise RulesError(f"{where}: labels: '__name__' is reserved (Prometheus refuses it too)")
        out[name] = _text(text, where, f"{key}.{name}")
    return out


def _no_unknown_fields(mapping: dict[Any, Any], known: tuple[str, ...], where: str) -> None:
    for key in mapping:
        if key not in known:
            raise RulesError(f"{where}: unknown field {key!r} (Prometheus refuses it too; known: {', '.join(known)})")


def alerts(rules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rules["groups"] for r in g.get("rules", []) if "alert" in r}


def apply_settings(rules: dict[str, Any], settings: list[str], tunables: list[dict[str, Any]]) -> dict[str, Any]:
    """--set RULE.NAME=VALUE: a tunable threshold, or RULE.for / RULE.keep_firing_for / RULE.severity."""
    rules = copy.deepcopy(rules)
    by_name = alerts(rules)
    for setting in settings:
        key, sep, value = setting.partition("=")
        rule_name, dot, name = key.partition(".")
        if not sep or not dot:
            raise RulesError(f"--set {setting!r}: expected RULE.NAME=VALUE")
        rule = by_name.get(rule_name)
        if rule is None:
            raise RulesError(f"--set {setting!r}: no alert named {rule_name!r}")
        if name in ("for", "keep_firing_for"):
            if not DURATION_RE.match(value):
                raise RulesError(f"--set {setting!r}: expected a Prometheus duration such as 30s, 5m, 1h")
            rule[name] = value
            continue
        if name == "severity":
            if value not in SEVERITIES:
                raise RulesError(f"--set {setting!r}: expected one of {', '.join(SEVERITIES)}")
            rule.setdefault("labels", {})["severity"] = value
            continue
        matching = [t for t in tunables if t["rule"] == rule_name and t["name"] == name]
        if not matching:
            known = sorted({t["name"] for t in tunables if t["rule"] == rule_name} | {"for", "severity"})
            raise RulesError(f"--set {setting!r}: {rule_name} has no tunable {name!r}; it has: {', '.join(known)}")
        try:
            float(value)
        except ValueError:
            raise RulesError(f"--set {setting!r}: expected a number") from None
        for t in matching:
            rule["expr"] = substitute(rule["expr"], t, value)
    return rules


def substitute(expr: str, tunable: dict[str, Any], value: str) -> str:
    pattern = re.compile(tunable["pattern"])
    found = list(pattern.finditer(expr))
    if not found or (len(found) > 1 and not tunable.get("all")):
        raise RulesError(f"tunable {tunable['rule']}.{tunable['name']}: pattern matches {len(found)} times")
    out, last = [], 0
    for m in found:
        out.append(expr[last:m.start(1)])
        out.append(value)
        last = m.end(1)
    out.append(expr[last:])
    return "".join(out)
