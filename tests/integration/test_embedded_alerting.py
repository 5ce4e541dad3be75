"""The agent alerting on its own, with no Prometheus: the built-in catalog evaluated in the agent, paging the real
Alertmanager (which delivers to a webhook) when a hooked workload stalls, with the stall's Python stacks in the
page; outrider_alerts on /metrics; and a webhook delivery interrupted by SIGKILL that still arrives after a restart."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, AgentProcess, after_more, outrider_cmd, sleeper, wait_until
from tests.notify.receivers import WEBHOOK_SCHEMA, ScriptedReceiver
from tests.servers import AlertmanagerServer, WebhookReceiver

pytestmark = pytest.mark.integration


def test_embedded_evaluator_pages_alertmanager_with_the_stack_dump_and_resolves(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    hook_env = {"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2"}
    with WebhookReceiver() as webhook, AlertmanagerServer(tmp_path / "am", webhook.url) as am:
        agent_env = {**hook_env, "OUTRIDER_ALERTMANAGER_URLS": am.url, "OUTRIDER_RULE_INTERVAL_S": "0.5",
                     "OUTRIDER_RULE_SETTINGS": "TrainingStalled.for=1s", "OUTRIDER_RESEND_INTERVAL_S": "2",
                     "OUTRIDER_ALERT_INSTANCE": "trainer-0", "OUTRIDER_STATE_DIR": str(tmp_path / "state")}
        with AgentProcess(env=agent_env, interval_s=0.3) as agent:
            base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
            workload = subprocess.Popen(
                [sys.executable, str(REPO / "tests" / "hook" / "workload.py"), "--steps", "40", "--step-sleep",
                 "0.05", "--hang-after", "10", "--hang-seconds", "20"],
                env={**base, **hook_env, "OUTRIDER_STALL_FLOOR_S": "1", "RANK": "3"})
            try:
                firing = wait_until(lambda: webhook.alert("TrainingStalled", "firing"), timeout_s=60, interval_s=0.5,
                                    what="the TrainingStalled page from the agent, through Alertmanager")
                assert firing["labels"] == {"alertname": "TrainingStalled", "severity": "critical",
                                            "job": "outrider", "instance": "trainer-0", "rank": "3"}
                assert firing["annotations"]["summary"] == (
                    "Training on trainer-0 (rank 3) has stopped making progress")
                source = (REPO / "tests" / "hook" / "workload.py").read_text().splitlines()
                line = next(i for i, text in enumerate(source, 1) if "time.sleep(args.hang_seconds)" in text)
                assert f'workload.py", line {line} in main' in firing["annotations"]["stack_dump"]  # where it hangs
                assert firing["annotations"]["stack_dump_file"].startswith(str(spool))
                text = agent.metrics()
                assert 'outrider_alerts{alertname="TrainingStalled",alertstate="firing"' in text
                shown = subprocess.run(outrider_cmd("alerts", "--url", agent.url), capture_output=True, text=True)
                assert re.search(r"FIRING\s+TrainingStalled\s+since \S+\s+\{instance=trainer-0, job=outrider, "
                                 r"rank=3, severity=critical\}\n\s+Training on trainer-0", shown.stdout), shown.stdout
                resolved = wait_until(lambda: webhook.alert("TrainingStalled", "resolved"), timeout_s=90,
                                      interval_s=0.5, what="the resolve once steps complete again")
                assert resolved["labels"] == firing["labels"]
                assert workload.wait(timeout=60) == 0
                assert 'outrider_notify_sent_total{receiver="alertmanager-0",type="alertmanager"}' in agent.metrics()
            finally:
                workload.kill()
                workload.wait()
    firings = [a for b in webhook.bodies for a in b["alerts"]
               if a["labels"]["alertname"] == "TrainingStalled" and a["status"] == "firing"]
    assert len({a["startsAt"] for a in firings}) == 1  # one episode, one alert (Alertmanager dedupes re-sends)
    _ = am


WATCHED_RULE = """
groups:
  - name: test
    rules:
      - alert: WorkloadRunning
        expr: outrider_watched_up == 1
        for: 1s
        labels: {severity: warning}
        annotations: {summary: "the workload on {{ $labels.instance }} runs"}
"""


def test_a_delivery_cut_by_sigkill_arrives_after_the_restart(tmp_path: Path) -> None:
    rules = tmp_path / "test.rules.yaml"
    rules.write_text(WATCHED_RULE)
    receivers = tmp_path / "receivers.yaml"
    state = tmp_path / "state"
    with ScriptedReceiver(WEBHOOK_SCHEMA, delay_s=4.0) as hook:
        receivers.write_text(f"receivers:\n  - name: hook\n    type: webhook\n    url: {hook.url}/\n")
        env = {"OUTRIDER_RULE_FILES": str(rules), "OUTRIDER_RULE_INTERVAL_S": "0.5", "OUTRIDER_STATE_DIR": str(state),
               "OUTRIDER_RECEIVERS_FILE": str(receivers), "OUTRIDER_ALERT_INSTANCE": "node-1"}
        workload = sleeper(120)
        try:
            first = AgentProcess("--pid", str(workload.pid), env=env)
            wait_until(lambda: len(hook.received) == 1, timeout_s=30, what="the first delivery attempt")
            first.stop(signal.SIGKILL)  # while the receiver still holds its answer back
            assert len(os.listdir(state / "outbox" / "hook")) == 1  # not confirmed: still in the outbox
            hook.delay_s = 0.0
            with AgentProcess("--pid", str(workload.pid), env=env) as second:
                wait_until(lambda: len(hook.received) >= 2, timeout_s=30, what="the delivery retried after restart")
                workload.kill()
                workload.wait()
                wait_until(lambda: any(r.body["status"] == "resolved" for r in hook.received), timeout_s=30,
                           what="the resolve")
                after_more(second, "outrider_rule_evaluations_total", 3)  # time to send anything more: nothing
                wait_until(lambda: 'outrider_notify_queued{receiver="hook",type="webhook"} 0' in second.metrics(),
                           timeout_s=30, what="nothing left queued")
                text = second.metrics()
        finally:
            workload.kill()
            workload.wait()
    assert hook.schema_errors == []
    events = [(r.body["status"], r.headers["Idempotency-Key"]) for r in hook.received]
    firing_keys = {key for status, key in events if status == "firing"}
    # the firing transition was delivered again (its first answer was never read) under the same key, so the
    # receiver can drop the repeat; no second firing transition was made, and the resolve came last, once
    assert len(firing_keys) == 1 and [s for s, _ in events].count("resolved") == 1
    assert events[-1][0] == "resolved"
    assert 'outrider_notify_queued{receiver="hook",type="webhook"} 0' in text
