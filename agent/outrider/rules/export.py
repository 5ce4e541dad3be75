"""`outrider rules export`: the one rule file as it is (tuned), as a Kubernetes PrometheusRule, or converted to
Grafana alert-rule file provisioning. Converted, never hand-copied: every format comes from the same file."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from outrider.rules.files import RulesError, apply_settings, load_rules, load_tunables


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
