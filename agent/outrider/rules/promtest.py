"""Replays promtool rule unit-test files through the embedded evaluator (`outrider rules test FILE...`).

The same files `promtool test rules` runs (alerts/tests/*.test.yaml): input series in promtool's expanding notation
('0+120x90 10800x60', '_x5', 'stale'), every rule group evaluated at each evaluation_interval from 0, and the
firing alerts (labels and rendered annotations) compared at each eval_time with the expected ones. `timeline()`
gives the firing alerts at every step, which the equivalence test hands back to promtool as expectations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser as pp

from outrider.rules import promql
from outrider.rules.promql import Evaluator
from outrider.rules.rule import AlertingRule, Group, load_groups, parse_duration
from outrider.rules.store import STALE, SeriesStore, make_labels

NUM = r"(?:[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|Inf|inf|NaN|nan))"
EXPANDING = re.compile(rf"^({NUM})(?:([-+])({NUM}))?x(\d+)$")

MAX_SAMPLES = 1_000_000
Firing = list[tuple[dict[str, str], dict[str, str]]]


class PromTestError(ValueError):
    pass


def expand_values(text: str) -> list[float | None]:
    """promtool's series notation; None is a missing sample, STALE a staleness marker."""
    out: list[float | None] = []
    for token in str(text).split():
        if token == "_":
            out.append(None)
        elif token.startswith("_x") and token[2:].isdigit():
            out.extend([None] * _count(token[2:], text))
        elif token == "stale":
            out.append(STALE)
        elif m := EXPANDING.match(token):
            start, sign, step, times = m.groups()
            value = float(start)
            delta = float(step) * (-1 if sign == "-" else 1) if step else 0.0
            # Added step by step, as promtool's series parser does: '0+0.1x10' ends at 0.9999999999999999, and a
            # test comparing exactly must see the same double.
            for _ in range(_count(times, text) + 1):
                out.append(value)
                value += delta
        else:
            try:
                out.append(float(token))
            except ValueError:
                raise PromTestError(f"cannot read series value {token!r}") from None
    return out


def _count(digits: str, text: str) -> int:
    n = int(digits)
    if n > MAX_SAMPLES:
        raise PromTestError(f"series {text!r} expands to more than {MAX_SAMPLES} samples")
    return n


def parse_series(text: str) -> tuple[str, list[tuple[str, str]]]:
    node = promql.parse(text)
    if not isinstance(node, pp.VectorSelector) or node.name is None:  # the one node that has matchers
        raise PromTestError(f"cannot read series {text!r}")
    return node.name, [(m.name, m.value) for m in node.matchers.matchers]


@dataclass
class CaseResult:
    file: str
    index: int
    name: str
    failures: list[str] = field(default_factory=list)
    steps_ms: list[int] = field(default_factory=list)
    timeline: dict[int, dict[str, Firing]] = field(default_factory=dict)


def _key(alerts: Firing) -> list[tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]]:
    return sorted((tuple(sorted(lab.items())), tuple(sorted(ann.items()))) for lab, ann in alerts)


def read_test_file(path: Path) -> dict[str, Any]:
    """A promtool test file's top level: read as a config file is (never a hang on a FIFO, never a traceback for
    bytes that are not UTF-8 or YAML nested too deeply), with its rule files and test cases where they belong."""
    from outrider.ground.config import ConfigError, read_yaml_file

    try:
        spec = read_yaml_file(str(path), max_bytes=None)  # promtool takes a test file of any size
    except ConfigError as e:
        raise PromTestError(str(e)) from None
    rule_files, tests = spec.get("rule_files") or [], spec.get("tests") or []
    if not isinstance(rule_files, list) or not all(isinstance(f, str) for f in rule_files):
        raise PromTestError(f"{path}: rule_files: expected a list of file names")
    if not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        raise PromTestError(f"{path}: tests: expected a list of test cases (mappings)")
    try:
        parse_duration(spec.get("evaluation_interval", "1m"))
    except ValueError as e:
        raise PromTestError(f"{path}: evaluation_interval: {e}") from None
    return spec


def run_file(path: str | Path, compat: int = 3) -> list[CaseResult]:
    """Every test case of the file, evaluated as Prometheus `compat` (2 or 3) evaluates it."""
    path = Path(path)
    spec = read_test_file(path)
    eval_interval = parse_duration(spec.get("evaluation_interval", "1m"))
    rule_files = [path.parent / f for f in spec.get("rule_files") or []]
    results = []
    for i, case in enumerate(spec.get("tests") or []):
        groups = _ordered(load_groups(rule_files, eval_interval), spec)
        results.append(run_case(case, groups, eval_interval, str(path), i, compat))
    return results


def _ordered(groups: list[Group], spec: dict[str, Any]) -> list[Group]:
    """Groups in the file's group_eval_order (named groups first, in that order), else in file order."""
    order = {name: i for i, name in enumerate(spec.get("group_eval_order") or [])}
    return sorted(groups, key=lambda g: order.get(g.name, len(order)))


def run_case(case: dict[str, Any], groups: list[Group], eval_interval: int, file: str = "",
             index: int = 0, compat: int = 3) -> CaseResult:
    result = CaseResult(file, index, str(case.get("name", f"test {index}")))
    interval = parse_duration(case.get("interval", eval_interval)) if case.get("interval") else eval_interval
    store = SeriesStore(None)
    for s in case.get("input_series") or []:
        name, pairs = parse_series(s["series"])
        labels = make_labels(name, pairs)
        for j, v in enumerate(expand_values(s.get("values", ""))):
            if v is not None:
                store.add(labels, j * interval, v)
    external = {str(k): str(v) for k, v in (case.get("external_labels") or {}).items()}
    alert_tests = case.get("alert_rule_test") or []
    expr_tests = case.get("promql_expr_test") or []
    by_time: dict[int, list[dict[str, Any]]] = {}
    for t in alert_tests:
        by_time.setdefault(parse_duration(t["eval_time"]), []).append(t)
    times = list(by_time) + [parse_duration(t["eval_time"]) for t in expr_tests]
    max_t = max(times, default=0)
    ev = Evaluator(store, compat=compat)
    alerting = [r for g in groups for r in g.rules if isinstance(r, AlertingRule)]
    ts = 0
    while ts <= max_t:
        for g in groups:
            g.evaluate(ev, store, ts, external)
        firing: dict[str, Firing] = {}
        for rule in alerting:
            for a in rule.firing():
                firing.setdefault(rule.name, []).append((dict(a.labels), dict(a.annotations)))
        result.steps_ms.append(ts)
        result.timeline[ts] = firing
        for t, tests in by_time.items():
            if ts <= t < ts + eval_interval:
                for test in tests:
                    name = test["alertname"]
                    want: Firing = []
                    for exp in test.get("exp_alerts") or []:
                        want_labels = {str(k): str(v) for k, v in (exp.get("exp_labels") or {}).items()}
                        want_labels.update(alertname=name)
                        annotations = exp.get("exp_annotations") or {}
                        want.append((want_labels, {str(k): str(v) for k, v in annotations.items()}))
                    got = firing.get(name, [])
                    if _key(got) != _key(want):
                        result.failures.append(f"{file} test {index}: {name} at {test['eval_time']}: expected "
                                               f"{_key(want)}, got {_key(got)}")
        for et in expr_tests:
            if parse_duration(et["eval_time"]) == ts:
                _check_expr(et, ev, ts, result)
        ts += eval_interval
    return result


def _check_expr(test: dict[str, Any], ev: Evaluator, ts: int, result: CaseResult) -> None:
    got = {tuple(sorted(s.labels)): s.value for s in ev.vector(promql.parse(test["expr"]), ts)}
    want = {}
    for exp in test.get("exp_samples") or []:
        text = exp.get("labels", "")
        if text.startswith("{"):
            node = promql.parse("x" + text)
            if not isinstance(node, pp.VectorSelector):  # `{a="1"}[5m]`, `{a="1"} + y`: not a label set
                raise PromTestError(f"cannot read labels {text!r}")
            want[tuple(sorted((m.name, m.value) for m in node.matchers.matchers))] = float(exp["value"])
        else:
            name, pairs = parse_series(text) if text else ("", [])
            want[make_labels(name, pairs) if name else ()] = float(exp["value"])
    # Exactly, as promtool compares (reflect.DeepEqual of the samples): no tolerance, and NaN never equals NaN.
    same = set(got) == set(want) and all(got[k] == want[k] for k in got)
    if not same:
        result.failures.append(f"{result.file} test {result.index}: expr {test['expr']!r} at {test['eval_time']}: "
                               f"expected {want}, got {got}")


def main(paths: list[str], compat: int = 3) -> int:
    failed = 0
    for p in paths:
        for r in run_file(p, compat):
            for f in r.failures:
                print("FAILED:", f)
            failed += len(r.failures)
    print("SUCCESS" if not failed else f"{failed} failure(s)")
    return 1 if failed else 0


def _duration_text(ms: int) -> str:
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def as_promtool_expectations(path: str | Path, compat: int = 2) -> dict[str, Any]:
    """The test file rewritten so that promtool checks, at every evaluation step and for every alert the rule
    files define, exactly the firing alerts the embedded evaluator produced (as Prometheus 2 evaluates them by
    default: the promtool CI runs is 2.42)."""
    path = Path(path).resolve()
    spec = read_test_file(path)
    eval_interval = parse_duration(spec.get("evaluation_interval", "1m"))
    rule_files = [str((path.parent / f).resolve()) for f in spec.get("rule_files") or []]
    names = [r.name for g in load_groups(rule_files, eval_interval) for r in g.rules if isinstance(r, AlertingRule)]
    out = {k: v for k, v in spec.items() if k not in ("tests", "rule_files")}
    out["rule_files"] = rule_files
    # Without an order promtool evaluates groups in map order, which varies from step to step.
    out["group_eval_order"] = [g.name for g in _ordered(load_groups(rule_files, eval_interval), spec)]
    out["tests"] = []
    for case, result in zip(spec.get("tests") or [], run_file(path, compat)):
        rewritten = {k: v for k, v in case.items() if k not in ("alert_rule_test", "promql_expr_test")}
        tests = []
        for ts in result.steps_ms:
            for name in names:
                alerts = result.timeline[ts].get(name, [])
                tests.append({"eval_time": _duration_text(ts), "alertname": name, "exp_alerts": [
                    {"exp_labels": {k: v for k, v in labels.items() if k != "alertname"},
                     "exp_annotations": annotations} for labels, annotations in alerts]})
        rewritten["alert_rule_test"] = tests
        out["tests"].append(rewritten)
    return out
