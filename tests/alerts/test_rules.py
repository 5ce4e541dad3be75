"""The rule catalog: promtool accepts the file and its unit tests; every alert is complete, tested both ways,
documented, and uses only metrics the agent exports; exports are conversions of the same file."""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from outrider.metrics.catalog import CATALOG
from outrider.rules.export import to_grafana, to_prometheus_rule
from outrider.rules.files import RulesError, alerts, apply_settings, load_rules, load_tunables
from tests.conftest import need_binary
from tests.helpers import REPO

ALERTS = REPO / "alerts"
RULES = load_rules(ALERTS / "outrider.rules.yaml")
TESTS = sorted((ALERTS / "tests").glob("*.test.yaml"))


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([need_binary("promtool"), *args], capture_output=True, text=True, input=stdin)


def test_promtool_check_rules() -> None:
    r = promtool("check", "rules", str(ALERTS / "outrider.rules.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_unit_tests_pass() -> None:
    # one promtool per file, as many at once as there are CPUs: promtool tests its files one after another on one
    # core, and the files' hours of 15-second evaluations of the whole catalog take minutes in all
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        runs = dict(zip(TESTS, pool.map(lambda path: promtool("test", "rules", str(path)), TESTS)))
    failed = {path.name: r.stdout + r.stderr for path, r in runs.items() if r.returncode != 0}
    assert failed == {}


def test_every_alert_has_must_fire_and_must_not_fire_cases() -> None:
    fire: set[str] = set()
    quiet: set[str] = set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                (fire if t.get("exp_alerts") else quiet).add(t["alertname"])
    names = set(alerts(RULES))
    assert names - fire == set(), "alerts without a must-fire case"
    # Watchdog fires always: its silence is the alarm, so it has nothing to stay quiet about
    assert names - quiet == {"Watchdog"}, "alerts without a must-not-fire case"


def test_every_alert_is_complete_and_its_runbook_exists() -> None:
    for name, rule in alerts(RULES).items():
        assert "for" in rule, name
        # "none" only for the Watchdog, which a dead man's switch receives rather than a person, and the
        # InfoInhibitor, which only Alertmanager's inhibit rule reads
        allowed = ("none",) if name in ("Watchdog", "InfoInhibitor") else ("critical", "warning", "info")
        assert rule["labels"]["severity"] in allowed, name
        ann = rule["annotations"]
        assert ann["summary"] and ann["description"], name
        assert "$value" not in str(rule["labels"]), f"{name}: values belong in annotations, not labels"
        m = re.fullmatch(r"https://github\.com/outrider-dev/outrider/blob/main/alerts/runbooks/(\w+\.md)#([a-z0-9]+)",
                         ann["runbook_url"])
        assert m, f"{name}: runbook_url {ann['runbook_url']}"
        headings = {re.sub(r"[^a-z0-9]", "", line[3:].lower())
                    for line in (ALERTS / "runbooks" / m.group(1)).read_text().splitlines() if line.startswith("## ")}
        assert m.group(2) in headings, f"{name}: no heading for #{m.group(2)} in {m.group(1)}"


def test_rules_use_only_metrics_the_agent_exports() -> None:
    known = set(CATALOG) | {"up"}
    for group in RULES["groups"]:
        for rule in group["rules"]:
            for metric in re.findall(r"\b(outrider_[a-z0-9_]+)", rule["expr"]):
                base = re.sub(r"_(bucket|sum|count)$", "", metric)
                assert metric in known or base in known, f"{rule.get('alert') or rule['record']}: {metric}"


def test_every_tunable_matches_its_rule_once_with_its_default() -> None:
    by_name = alerts(RULES)
    for t in load_tunables(ALERTS / "tunables.yaml"):
        expr = by_name[t["rule"]]["expr"]
        found = re.findall(t["pattern"], expr)
        assert found and (len(found) == 1 or t.get("all")), t
        assert all(eval(v) == t["default"] for v in found), t  # the found text may be arithmetic: "4 * 3600"


def test_tuned_export_changes_only_what_was_asked_and_stays_valid(tmp_path: Path) -> None:
    tuned = apply_settings(RULES, ["GPUMemoryNearlyFull.ratio=0.9", "GPULost.for=30s",
                                   "LatencySLOBurnRateFast.slo_latency=1.0", "HostOOMKills.severity=warning"],
                           load_tunables(ALERTS / "tunables.yaml"))
    a, b = alerts(RULES), alerts(tuned)
    assert b["GPUMemoryNearlyFull"]["expr"].count("> 0.9\n") == 3 and "0.95" not in b["GPUMemoryNearlyFull"]["expr"]
    assert b["GPULost"]["for"] == "30s"
    assert b["LatencySLOBurnRateFast"]["expr"].count('le="1.0"') == 2
    assert b["HostOOMKills"]["labels"]["severity"] == "warning"
    changed = {n for n in a if a[n] != b[n]}
    assert changed == {"GPUMemoryNearlyFull", "GPULost", "LatencySLOBurnRateFast", "HostOOMKills"}
    out = tmp_path / "tuned.yaml"
    out.write_text(yaml.safe_dump(tuned))
    r = promtool("check", "rules", str(out))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(("setting", "message"), [
    ("GPULost.ratio=3", "has no tunable 'ratio'"),
    ("NoSuchAlert.for=1m", "no alert named"),
    ("GPULost.for=soon", "Prometheus duration"),
    ("GPUMemoryNearlyFull.ratio=high", "expected a number"),
    ("GPULost", "RULE.NAME=VALUE"),
])
def test_bad_settings_are_clear_errors(setting: str, message: str) -> None:
    with pytest.raises(RulesError, match=re.escape(message)):
        apply_settings(RULES, [setting], load_tunables(ALERTS / "tunables.yaml"))


def test_prometheusrule_carries_the_same_groups() -> None:
    doc = to_prometheus_rule(RULES, namespace="monitoring")
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert doc["metadata"]["namespace"] == "monitoring"
    assert doc["spec"]["groups"] == RULES["groups"]


def test_grafana_provisioning_is_a_conversion_of_every_alert() -> None:
    doc = to_grafana(RULES, "prom-uid")
    assert doc["apiVersion"] == 1
    rules = [r for g in doc["groups"] for r in g["rules"]]
    by_title = {r["title"]: r for r in rules}
    source = alerts(RULES)
    assert set(by_title) == set(source), "every alert, and no recording rule"
    assert len({r["uid"] for r in rules}) == len(rules) and all(len(r["uid"]) <= 40 for r in rules)
    for name, r in by_title.items():
        query, condition = r["data"]
        assert query["model"]["expr"] == source[name]["expr"].strip()
        assert query["datasourceUid"] == "prom-uid" and query["model"]["instant"] is True
        assert r["condition"] == condition["refId"] == "B" and condition["model"]["expression"] == "is_number($A)"
        assert r["for"] == source[name]["for"]
        assert r["labels"] == source[name]["labels"]
        assert "$value }}" not in str(r["annotations"]) and "| humanize" not in str(r["annotations"])
    assert "{{ humanizePercentage $values.A.Value }}" in by_title["GPUMemoryNearlyFull"]["annotations"]["description"]


def test_cli_export_formats(tmp_path: Path) -> None:
    """Each format the command prints is the conversion of the catalog, tuned by --set, and nothing else; the
    Prometheus one is a rule file promtool takes."""
    import sys

    tuned = apply_settings(RULES, ["GPULost.for=30s"], load_tunables(ALERTS / "tunables.yaml"))
    assert alerts(tuned)["GPULost"]["for"] == "30s" != alerts(RULES)["GPULost"]["for"]
    expected = {"prometheus": tuned, "prometheusrule": to_prometheus_rule(tuned),
                "grafana": to_grafana(tuned, "prometheus")}
    for fmt, doc in expected.items():
        r = subprocess.run([sys.executable, "-m", "outrider", "rules", "export", "--format", fmt,
                            "--set", "GPULost.for=30s"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert yaml.safe_load(r.stdout) == doc, fmt
        if fmt == "prometheus":
            (tmp_path / "exported.rules.yaml").write_text(r.stdout)
            check = promtool("check", "rules", str(tmp_path / "exported.rules.yaml"))
            assert check.returncode == 0, check.stdout + check.stderr
    r = subprocess.run([sys.executable, "-m", "outrider", "rules", "export", "--set", "GPULost.ratio=1"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "GPULost has no tunable" in r.stderr


def test_top_leaves_the_watchdog_heartbeat_out_of_the_firing_alerts() -> None:
    from outrider.commands.top import Reads, frame, parse, render_text

    def screen(text: str) -> str:
        reads = Reads()
        reads.add(0.0, parse(text))
        return render_text(frame(reads, "http://agent"), 120)

    shown = screen('outrider_alerts{alertname="Watchdog",alertstate="firing",severity="none"} 1\n'
                   'outrider_alerts{alertname="GPULost",alertstate="firing",severity="critical"} 1\n'
                   'outrider_alerts{alertname="DiskNearlyFull",alertstate="pending",severity="critical"} 1\n')
    assert re.search(r"alerts +GPULost *\n", shown), shown
    assert "none firing" in screen('outrider_alerts{alertname="Watchdog",alertstate="firing",severity="none"} 1\n')
