"""What `outrider run` prints is about the run: its summary lists the alerts that fired during it, never the Watchdog
(a heartbeat that always fires: news only at a dead man's switch when it stops), and says apart, as carried over,
an alert restored from the agent's saved state that fired in an earlier run and resolved in this one (its resolve
went out during this run, so it is said, but it is not this run's finding); `--quiet` prints no banner, no summary
and no log line under a warning, unless a log level was asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import outrider_cmd

pytestmark = pytest.mark.integration
RULE = "groups: [{{name: runs, rules: [{{alert: CarriedOver, expr: '{expr}', labels: {{severity: warning}}, " \
       "annotations: {{summary: 'held in run one'}}}}]}}]\n"


def outrider_run(tmp_path: Path, expr: str, *flags: str) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    """A short command under `outrider run`, with the built-in rules and CarriedOver (firing where `expr` holds),
    the alert state in this test's directory, kept from one run to the next."""
    rules, summary = tmp_path / "runs.rules.yaml", tmp_path / "summary.json"
    rules.write_text(RULE.format(expr=expr))
    summary.unlink(missing_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_"))}
    env = {**base, "OUTRIDER_RUNS_DIR": str(tmp_path / "runs"), "OUTRIDER_STATE_DIR": str(tmp_path / "state"),
           "OUTRIDER_RULE_FILES": f"builtin,{rules}", "OUTRIDER_RULE_INTERVAL_S": "0.2"}
    r = subprocess.run(outrider_cmd("run", "--listen", "127.0.0.1:0", "--interval", "0.2", "--summary-json",
                                    str(summary), *flags, "--", sys.executable, "-c", "import time; time.sleep(1.5)"),
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r, json.loads(summary.read_text())


def alert_lines(stderr: str) -> str:
    text = stderr[stderr.rindex("\nwhat the agent measured:"):]
    return text[text.index("\n  alerts "):text.index("\nverdict: ")]


def test_the_summary_lists_this_runs_alerts_not_the_watchdog_and_says_apart_what_was_carried_over(
        tmp_path: Path) -> None:
    first, summary = outrider_run(tmp_path, "vector(1)")
    shown = alert_lines(first.stderr)
    assert "CarriedOver (warning) fired at 0:0" in shown and "still firing at the end" in shown, shown
    assert "Watchdog" not in first.stderr and [a["name"] for a in summary["alerts"]] == ["CarriedOver"]

    second, summary = outrider_run(tmp_path, "vector(1) > 2")  # never holds: the restored alert resolves
    shown = alert_lines(second.stderr)
    assert shown.startswith("\n  alerts     none fired\n"), shown
    assert "carried over from before this run" in shown and "CarriedOver (warning) fired before the run, " \
                                                            "resolved at 0:0" in " ".join(shown.split()), shown
    assert summary["alerts"] == [] and [a["name"] for a in summary["carried_over"]] == ["CarriedOver"]
    assert "Watchdog" not in second.stderr


def test_quiet_prints_nothing_under_a_warning_unless_a_log_level_was_asked_for(tmp_path: Path) -> None:
    loud, _ = outrider_run(tmp_path, "vector(0) > 1")
    assert " INFO " in loud.stderr and "\nwhat the agent measured:" in loud.stderr, "what --quiet leaves out"
    quiet, summary = outrider_run(tmp_path, "vector(0) > 1", "--quiet")
    assert " INFO " not in quiet.stderr and "outrider: " not in quiet.stderr, quiet.stderr
    assert summary["exit_code"] == 0, "the summary still goes where --summary-json says"
    asked, _ = outrider_run(tmp_path, "vector(0) > 1", "--quiet", "--log-level", "info")
    assert " INFO " in asked.stderr and "what the agent measured" not in asked.stderr, asked.stderr
