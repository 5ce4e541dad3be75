"""`outrider rules export`: the one rule file as it is (tuned), as a Kubernetes PrometheusRule, or converted to
Grafana alert-rule file provisioning. Converted, never hand-copied: every format comes from the same file."""

from __future__ import annotations

import copy
import os
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
    return Path(os.environ.get("OUTRIDER_RULES_FILE") or PACKAGED_ALERTS / "outrider.rules.yaml")


def load_rules(path: Path | None = None) -> dict[str, Any]:
    path = path or default_rules_path()
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise RulesError(f"{path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise RulesError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
        raise RulesError(f"{path}: a Prometheus rule file needs a top-level 'groups' list")
    return data


def load_tunables(path: Path | None = None) -> list[dict[str, Any]]:
    path = path or default_rules_path().with_name("tunables.yaml")
    return list(yaml.safe_load(path.read_text()) or [])


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


def to_prometheus_rule(rules: dict[str, Any], name: str = "outrider", namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/name": "outrider",
                                                         "app.kubernetes.io/component": "alert-rules"}}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": metadata,
            "spec": {"groups": copy.deepcopy(rules["groups"])}}


_VALUE_PIPE = re.compile(r"\{\{\s*\$value\s*\|\s*(\w+)\s*\}\}")
_VALUE = re.compile(r"\{\{\s*\$value\s*\}\}")


def grafana_template(text: str) -> str:
    """Prometheus alert templates to Grafana's: $value is query A's value; the humanize functions are shared."""
    text = _VALUE_PIPE.sub(lambda m: "{{ " + m.group(1) + " $values.A.Value }}", text)
    return _VALUE.sub("{{ $values.A.Value }}", text)


def _seconds(duration: str) -> int:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return int(sum(int(n) * units[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration)))


def _uid(name: str) -> str:
    return ("outrider-" + re.sub(r"[^a-z0-9]+", "-", name.lower())).strip("-")[:40]


def to_grafana(rules: dict[str, Any], datasource_uid: str, folder: str = "Outrider",
               interval: str = "1m") -> dict[str, Any]:
    """Grafana alert-rule file provisioning. Each rule: query A is the Prometheus expression (a filter that returns
    the alerting series with their values); expression B turns "A returned this series" into 1; the condition
    fires on B. Recording rules are not converted: Grafana queries Prometheus, which must load the recording group
    (the PrometheusRule does)."""
    groups = []
    for group in rules["groups"]:
        converted = []
        for r in group.get("rules", []):
            if "alert" not in r:
                continue
            rule: dict[str, Any] = {
                "uid": _uid(r["alert"]),
                "title": r["alert"],
                "condition": "B",
                "data": [
                    {"refId": "A", "relativeTimeRange": {"from": 600, "to": 0}, "datasourceUid": datasource_uid,
                     "model": {"refId": "A", "expr": r["expr"].strip(), "instant": True, "range": False,
                               "datasource": {"type": "prometheus", "uid": datasource_uid}}},
                    {"refId": "B", "datasourceUid": "__expr__",
                     "model": {"refId": "B", "type": "math", "expression": "is_number($A)",
                               "datasource": {"type": "__expr__", "uid": "__expr__"}}},
                ],
                "noDataState": "OK",
                "execErrState": "Error",
                "for": r.get("for", "0m"),
                "labels": dict(r.get("labels", {})),
                "annotations": {k: grafana_template(str(v)) for k, v in r.get("annotations", {}).items()},
            }
            if r.get("keep_firing_for"):
                rule["keep_firing_for"] = r["keep_firing_for"]
            converted.append(rule)
        if converted:
            groups.append({"orgId": 1, "name": group["name"], "folder": folder,
                           "interval": group.get("interval", interval), "rules": converted})
    return {"apiVersion": 1, "groups": groups}


def export(fmt: str, settings: list[str], rules_path: Path | None = None, datasource_uid: str = "prometheus",
           namespace: str | None = None) -> str:
    rules = apply_settings(load_rules(rules_path), settings,
                           load_tunables(rules_path.with_name("tunables.yaml") if rules_path else None))
    if fmt == "prometheus":
        doc = rules
    elif fmt == "prometheusrule":
        doc = to_prometheus_rule(rules, namespace=namespace)
    elif fmt == "grafana":
        doc = to_grafana(rules, datasource_uid)
    else:
        raise RulesError(f"--format {fmt!r}: expected prometheus, prometheusrule or grafana")
    return yaml.safe_dump(doc, sort_keys=False, width=120)
