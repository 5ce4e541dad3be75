"""The rule file in the real Prometheus, scraping the real agent watching a workload that stalls on purpose, firing
into the real Alertmanager, which delivers to a webhook: the alert arrives with its labels and annotations, then
its resolve."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, AgentProcess, outrider_cmd, wait_until
from tests.servers import AlertmanagerServer, PrometheusServer, WebhookReceiver

pytestmark = pytest.mark.integration


def test_training_stall_pages_through_alertmanager_and_resolves(tmp_path: Path) -> None:
    rules = tmp_path / "outrider.rules.yaml"  # the catalog, with this test's short `for`
    rules.write_text(subprocess.run(outrider_cmd("rules", "export", "--set", "TrainingStalled.for=1s"),
                                    capture_output=True, text=True, check=True).stdout)
    spool = tmp_path / "spool"
    hook_env = {"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2"}
    with WebhookReceiver() as webhook, AlertmanagerServer(tmp_path / "am", webhook.url) as am, \
            AgentProcess(env=hook_env, interval_s=0.3) as agent, \
            PrometheusServer(tmp_path / "prom", [f"127.0.0.1:{agent.port}"], rule_files=[str(rules)],
                             alertmanager=f"127.0.0.1:{am.port}") as prom:
        prom.wait_for('outrider_collector_success{collector="hook"} == 1')
        base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
        workload = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "hook" / "workload.py"), "--steps", "40", "--step-sleep", "0.05",
             "--hang-after", "10", "--hang-seconds", "25"],
            env={**base, **hook_env, "OUTRIDER_STALL_FLOOR_S": "1", "RANK": "3"})
        try:
            firing = wait_until(lambda: webhook.alert("TrainingStalled", "firing"), timeout_s=60, interval_s=0.5,
                                what="the TrainingStalled page at the webhook")
            assert firing["labels"] == {"alertname": "TrainingStalled", "severity": "critical", "job": "outrider",
                                        "instance": f"127.0.0.1:{agent.port}", "rank": "3"}
            assert firing["annotations"]["summary"] == (
                f"Training on 127.0.0.1:{agent.port} (rank 3) has stopped making progress")
            assert firing["annotations"]["runbook_url"].endswith("degradation.md#trainingstalled")
            assert "Python stacks" in firing["annotations"]["description"]
            resolved = wait_until(lambda: webhook.alert("TrainingStalled", "resolved"), timeout_s=90, interval_s=0.5,
                                  what="the resolve once steps complete again")
            assert resolved["labels"] == firing["labels"]
            assert resolved["endsAt"] > firing["startsAt"]
            assert workload.wait(timeout=60) == 0
        finally:
            workload.kill()
            workload.wait()
