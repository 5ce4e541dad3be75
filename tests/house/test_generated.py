"""Generated, not copied: every generated file (the metrics reference, the dashboards' JSON and the chart's copies,
the chart's rule file) and every generated part of a page (docs/configuration.md's table, docs/alerts.md's alerts,
docs/architecture.md's layers and layout) equals what scripts/generate.py makes from its source."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers import REPO

GENERATE = [sys.executable, str(REPO / "scripts" / "generate.py")]


def test_no_generated_file_has_drifted_from_its_source() -> None:
    r = subprocess.run([*GENERATE, "--check"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{r.stdout}{r.stderr}"


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    for part in ("agent", "alerts", "dashboards", "docs", "helm", "scripts"):
        shutil.copytree(REPO / part, copy / part, symlinks=True)
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    return copy


def _check(copy: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(copy / "scripts" / "generate.py"), "--check"], capture_output=True,
                          text=True, timeout=300)


def test_the_check_names_a_file_that_drifted(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    table = copy / "docs" / "configuration.md"
    table.write_text(table.read_text().replace("| `interval_s` |", "| `interval_seconds` |"))
    (copy / "helm" / "outrider" / "files" / "dashboards" / "outrider-host.json").write_text("{}\n")
    r = _check(copy)
    assert r.returncode == 1
    assert "drifted: docs/configuration.md" in r.stdout
    assert "drifted: helm/outrider/files/dashboards/outrider-host.json" in r.stdout
    subprocess.run([sys.executable, str(copy / "scripts" / "generate.py")], check=True, capture_output=True,
                   timeout=300)
    assert table.read_text() == (REPO / "docs" / "configuration.md").read_text(), "writing mends what drifted"


def test_a_changed_rule_or_contract_drifts_the_pages_made_from_it(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    rules = copy / "alerts" / "outrider.rules.yaml"
    rules.write_text(rules.read_text().replace("      - alert: TrainingStalled\n",
                                               "      - alert: TrainingStalledRenamed\n", 1))
    pyproject = copy / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("layers = [\n", 'layers = [\n    "newfloor",\n', 1))
    r = _check(copy)
    assert r.returncode == 1
    assert "drifted: docs/alerts.md" in r.stdout and "drifted: docs/architecture.md" in r.stdout


def _rows(page: str) -> dict[str, list[str]]:
    """The alerts reference's rows, by alert: their cells."""
    rows = {}
    for line in (REPO / page).read_text().splitlines():
        if line.startswith("| `") and line.count(" | ") >= 5:
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def test_the_alerts_reference_has_every_alert_with_its_severity_for_and_runbook() -> None:
    rows = _rows("docs/alerts.md")
    wanted = {}
    for group in yaml.safe_load((REPO / "alerts" / "outrider.rules.yaml").read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                wanted[rule["alert"]] = rule
    assert set(rows) == set(wanted)
    for name, rule in wanted.items():
        _, severity, wait, _, _, runbook = rows[name]
        assert severity == rule["labels"]["severity"], name
        assert wait.split()[0] == rule.get("for", "0s"), name
        path = rule["annotations"]["runbook_url"].split("/blob/main/", 1)[1]
        assert runbook.endswith(f"(../{path})"), name
    assert "`outrider:requests:rate5m`" in rows["InferenceLatencyP99Regression"][4]
    assert rows["Watchdog"][4] == "no series"
