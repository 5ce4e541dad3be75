"""The rule catalog as files: where the built-in one is, reading a rule file and its tunables, and tuning
thresholds (`--set RULE.NAME=VALUE`). The evaluator (rule.py) and the exporters (export.py) both start here."""

from __future__ import annotations

import copy
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
