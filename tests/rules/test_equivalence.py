"""Equivalence of the embedded evaluator with Prometheus: every promtool test case in alerts/tests is replayed
through the embedded evaluator, and promtool itself then checks the evaluator's firing alerts (labels and
annotations) at every evaluation step of every case, for every alert in the rule file. A rule or test case added
later is covered with no change here."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
import yaml

from outrider.rules.promtest import as_promtool_expectations, run_file
from tests.conftest import need_binary
from tests.helpers import REPO

TESTS = sorted((REPO / "alerts" / "tests").glob("*.test.yaml"))


def promtool_test(spec: dict, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "embedded.test.yaml"
    path.write_text(yaml.safe_dump(spec, width=1000))
    return subprocess.run([need_binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True)


@pytest.mark.parametrize("path", TESTS, ids=lambda p: p.name)
def test_embedded_evaluator_passes_the_promtool_cases(path: Path) -> None:
    failures = [f for case in run_file(path, compat=2) for f in case.failures]
    assert failures == []


@pytest.mark.parametrize("path", TESTS, ids=lambda p: p.name)
def test_promtool_agrees_with_the_embedded_evaluator_at_every_step(path: Path, tmp_path: Path) -> None:
    spec = as_promtool_expectations(path)
    checks = sum(len(case["alert_rule_test"]) for case in spec["tests"])
    firing = sum(len(t["exp_alerts"]) for case in spec["tests"] for t in case["alert_rule_test"]
                 if t["alertname"] != "Watchdog")  # it fires at every step of every case
    assert checks > 1000 and firing > 50  # every step x every alert, and alerts do fire in these scenarios
    r = promtool_test(spec, tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_cross_check_can_fail(tmp_path: Path) -> None:
    """One firing alert dropped from the evaluator's answer: promtool must notice."""
    spec = as_promtool_expectations(REPO / "alerts" / "tests" / "hardware.test.yaml")
    broken = copy.deepcopy(spec)
    step = next(t for case in broken["tests"] for t in case["alert_rule_test"] if t["exp_alerts"])
    step["exp_alerts"] = []
    r = promtool_test(broken, tmp_path)
    assert r.returncode != 0 and step["alertname"] in r.stdout + r.stderr


def test_outrider_rules_test_and_check_commands(tmp_path: Path) -> None:
    from tests.helpers import outrider_cmd

    ok = subprocess.run(outrider_cmd("rules", "test", "--promql-compat", "2", *map(str, TESTS)), capture_output=True,
                        text=True)
    assert ok.returncode == 0 and "SUCCESS" in ok.stdout, ok.stdout + ok.stderr
    spec = yaml.safe_load(TESTS[0].read_text())
    spec["rule_files"] = [str((TESTS[0].parent / f).resolve()) for f in spec["rule_files"]]
    case = next(c for c in spec["tests"] if any(t.get("exp_alerts") for t in c.get("alert_rule_test", [])))
    test = next(t for t in case["alert_rule_test"] if t.get("exp_alerts"))
    test["exp_alerts"][0]["exp_labels"]["severity"] = "not-the-severity"
    wrong = tmp_path / "wrong.test.yaml"
    wrong.write_text(yaml.safe_dump(spec))
    bad = subprocess.run(outrider_cmd("rules", "test", str(wrong)), capture_output=True, text=True)
    assert bad.returncode == 1 and f"FAILED: {wrong} test" in bad.stdout and test["alertname"] in bad.stdout
    check = subprocess.run(outrider_cmd("rules", "check"), capture_output=True, text=True)
    assert check.returncode == 0 and "rules the agent can evaluate" in check.stdout, check.stdout + check.stderr
