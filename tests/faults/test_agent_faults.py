"""Faults around the real agent: SIGKILL at arbitrary points (mid-sweep, mid-evaluation, mid-write) and restart,
the outbox's disk full, and planted secrets that must appear nowhere but at their receiver: the receivers' secrets,
the OTLP endpoint's password and headers, and a watched command line's credentials, looked for in the logs, /metrics,
`config show`, the OTLP exports, the alerts API and the notifications."""

from __future__ import annotations

import base64
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.tmpfs import fill, small_tmpfs
from tests.helpers import REPO, AgentProcess, after_more, http_get, outrider_cmd, sleeper, wait_until
from tests.notify.receivers import PAGERDUTY_SCHEMA, WEBHOOK_SCHEMA, ScriptedReceiver
from tests.servers import OtlpGrpcReceiver, OtlpHttpReceiver

pytestmark = pytest.mark.integration

STEPS_RULE = """
groups:
  - name: faults
    rules:
      - alert: ManySteps
        expr: sum by (job, instance) (outrider_train_steps_total) > 100
        labels: {severity: warning}
        annotations: {summary: "{{ $value }} steps"}
"""


def steps_total(text: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(r"^outrider_train_steps_total(?:\{[^}]*\})? (\S+)$", text, re.M))


def test_sigkill_at_arbitrary_points_counts_nothing_twice_and_loses_no_alert(tmp_path: Path) -> None:
    rules, receivers, hold = tmp_path / "r.yaml", tmp_path / "receivers.yaml", tmp_path / "hold"
    rules.write_text(STEPS_RULE)
    spool, state = tmp_path / "spool", tmp_path / "state"
    rng = random.Random(7)
    with ScriptedReceiver(WEBHOOK_SCHEMA) as hook:
        receivers.write_text(f"receivers:\n  - {{name: hook, type: webhook, url: '{hook.url}/'}}\n")
        env = {"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_STATE_DIR": str(state), "OUTRIDER_RULE_FILES": str(rules),
               "OUTRIDER_RULE_INTERVAL_S": "0.2", "OUTRIDER_RECEIVERS_FILE": str(receivers),
               "OUTRIDER_FLUSH_INTERVAL_S": "0.1"}
        agent = AgentProcess(env=env, interval_s=0.2)
        base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
        workload = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "hook" / "workload.py"), "--steps", "400", "--step-sleep", "0.01",
             "--hold", str(hold)], env={**base, "OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.1"})
        try:
            for _ in range(5):  # killed at arbitrary points of its sweep, evaluation and state writes
                time.sleep(rng.uniform(0.3, 1.2))
                agent.stop(signal.SIGKILL)
                agent = AgentProcess(env=env, interval_s=0.2)
            wait_until(lambda: steps_total(agent.metrics()) == 400, timeout_s=60, what="all 400 steps counted")
            # not 400 plus what earlier agents had already seen, however many more sweeps read the shards
            assert steps_total(after_more(agent, "outrider_agent_sweeps_total", 3)) == 400
            hold.write_text("")
            assert workload.wait(timeout=30) == 0
            wait_until(lambda: "outrider_hook_processes{state=\"running\"} 0" in agent.metrics(), timeout_s=30,
                       what="the workload's exit noticed")
            assert steps_total(agent.metrics()) == 400  # retired, still counted once
            wait_until(lambda: hook.accepted(), timeout_s=10, what="the page")
            after_more(agent, "outrider_rule_evaluations_total", 5)  # time enough to page a second time
            wait_until(lambda: re.search(r'^outrider_notify_queued\{receiver="hook",type="webhook"\} 0$',
                                         agent.metrics(), re.M), timeout_s=30, what="nothing left queued")
            text = agent.metrics()
        finally:
            workload.kill()
            workload.wait()
            agent.stop()
    firing = [b for b in hook.accepted() if b["status"] == "firing"]
    # one alert through five kills, never lost; delivery is at least once: a page its receiver confirmed just before
    # a kill, whose outbox entry was not yet removed, is delivered again by the next agent: the same alert (its
    # fingerprint and start), which Alertmanager and PagerDuty's dedup_key fold, never a new one
    assert 1 <= len(firing) <= 1 + 5, firing
    assert len({(a["fingerprint"], a["startsAt"]) for b in firing for a in b["alerts"]}) == 1, firing
    assert 'outrider_alerts{alertname="ManySteps",alertstate="firing"' in text


WATCHED_RULE = """
groups:
  - name: faults
    rules:
      - alert: WorkloadRunning
        expr: outrider_watched_up == 1
        for: 3s
        labels: {severity: warning}
"""


def test_outbox_on_a_full_disk_is_counted_and_recovers_when_space_returns(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "state", "256k", "tests/notify/test_delivery.py covers a full disk with a failing "
                     "write instead") as state:
        rules, receivers = tmp_path / "r.yaml", tmp_path / "receivers.yaml"
        rules.write_text(WATCHED_RULE)
        port_holder = ScriptedReceiver()  # reserve a port, then close it: the receiver is down at first
        port = port_holder.port
        port_holder.stop()
        receivers.write_text(f"receivers:\n  - {{name: hook, type: webhook, url: 'http://127.0.0.1:{port}/'}}\n")
        env = {"OUTRIDER_STATE_DIR": str(state), "OUTRIDER_RULE_FILES": str(rules), "OUTRIDER_RULE_INTERVAL_S": "0.3",
               "OUTRIDER_RECEIVERS_FILE": str(receivers)}
        workload = sleeper(120)
        try:
            with AgentProcess("--pid", str(workload.pid), "--no-collector.gpu", env={**env, "OUTRIDER_ALERT_LOG": "0"},
                              interval_s=0.3) as agent:
                wait_until(lambda: (state / "outbox" / "hook").is_dir(), timeout_s=10, what="the outbox")
                filler = fill(state)
                wait_until(lambda: "outrider_notify_outbox_write_errors_total{receiver=\"hook\",type=\"webhook\"} 1"
                           in agent.metrics(), timeout_s=20, what="the failed outbox write counted")
                assert 'outrider_notify_queued{receiver="hook",type="webhook"} 1' in agent.metrics()  # held in memory
                assert os.listdir(state / "outbox" / "hook") == []
                filler.unlink()  # space returns: the held notification goes to disk
                wait_until(lambda: len([f for f in os.listdir(state / "outbox" / "hook") if f.endswith(".json")]) == 1,
                           timeout_s=20, what="the notification written out")
                with ScriptedReceiver(WEBHOOK_SCHEMA, port=port) as hook:  # and the receiver comes back
                    wait_until(lambda: hook.accepted(), timeout_s=30, what="delivery after recovery")
                assert hook.accepted()[0]["alerts"][0]["labels"]["alertname"] == "WorkloadRunning"
                assert agent.proc.poll() is None
        finally:
            workload.kill()
            workload.wait()


ROUTING_KEY = "PLANTEDroutingKEY000000000000042"
SLACK_TOKEN = "T0PLANTED/B0PLANTED/slackTOKENplanted"
BEARER = "planted-bearer-token-7f3a"


def test_planted_secrets_appear_nowhere_but_at_their_receivers(tmp_path: Path) -> None:
    rules, receivers, key_file = tmp_path / "r.yaml", tmp_path / "receivers.yaml", tmp_path / "pd.key"
    rules.write_text(WATCHED_RULE)
    key_file.write_text(ROUTING_KEY)
    failing = {"respond": lambda n: (400 if n % 2 else 500, {"Retry-After": "0"})}
    with ScriptedReceiver(PAGERDUTY_SCHEMA, **failing) as pd, ScriptedReceiver(**failing) as slack, \
            ScriptedReceiver(**failing) as hook:
        receivers.write_text(
            "receivers:\n"
            f"  - {{name: pd, type: pagerduty, url: '{pd.url}/v2/enqueue', routing_key_file: '{key_file}'}}\n"
            "  - {name: chat, type: slack, url_env: PLANTED_SLACK_URL}\n"
            f"  - {{name: hook, type: webhook, url: '{hook.url}/', bearer_token_env: PLANTED_BEARER}}\n")
        env = {"OUTRIDER_RULE_FILES": str(rules), "OUTRIDER_RULE_INTERVAL_S": "0.3",
               "OUTRIDER_RECEIVERS_FILE": str(receivers), "OUTRIDER_LOG_LEVEL": "debug",
               "PLANTED_SLACK_URL": f"{slack.url}/services/{SLACK_TOKEN}", "PLANTED_BEARER": BEARER}
        workload = sleeper(60)
        try:
            with AgentProcess("--pid", str(workload.pid), env=env, interval_s=0.3) as agent:
                wait_until(lambda: all(len(r.received) >= 2 for r in (pd, slack, hook)), timeout_s=30,
                           what="failed deliveries to all three")
                metrics = agent.metrics()
                show = config_show(env)
                output = agent.output
        finally:
            workload.kill()
            workload.wait()
    assert pd.received[0].body["routing_key"] == ROUTING_KEY  # the secrets reached their receivers...
    assert hook.received[0].headers["Authorization"] == f"Bearer {BEARER}"
    assert slack.received[0].path == f"/services/{SLACK_TOKEN}"
    for secret in (ROUTING_KEY, SLACK_TOKEN, BEARER):  # ...and appear in no log, metric or shown config
        assert secret not in output and secret not in metrics and secret not in show
    assert "rejected" in output and "delivery failed" in output  # the failures were logged, without them


CMD_KEY = "PLANTEDcmdlineAPIkey0042"
CMD_PASSWORD = "PLANTEDdbPASSWORD0042"
OTLP_PASSWORD = "PLANTEDotlpPASSWORD0042"
OTLP_HEADER = "PLANTEDotlpHEADERkey0042"
OTLP_BASIC = base64.b64encode(f"otlp:{OTLP_PASSWORD}".encode()).decode()

PROCESS_RULE = """
groups:
  - name: faults
    rules:
      - alert: WatchedProcess
        expr: outrider_process_info == 1
        labels: {severity: warning}
        annotations: {summary: "{{ $labels.command }} runs"}
"""


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_planted_secrets_stay_out_of_otlp_the_alerts_api_and_notifications(tmp_path: Path, protocol: str) -> None:
    """A watched command line with an API key and a URL's password, alerted on (its command label goes into the
    alert, its annotation and the page); OTLP export to an endpoint with a password, with a secret header."""
    rules, receivers = tmp_path / "r.yaml", tmp_path / "receivers.yaml"
    rules.write_text(PROCESS_RULE)
    otlp = OtlpHttpReceiver() if protocol == "http/protobuf" else OtlpGrpcReceiver()
    workload = sleeper(60, extra=[f"--api-key={CMD_KEY}", "--db", f"postgres://train:{CMD_PASSWORD}@db/x"])
    try:
        with ScriptedReceiver(WEBHOOK_SCHEMA) as hook:
            receivers.write_text(f"receivers:\n  - {{name: hook, type: webhook, url: '{hook.url}/'}}\n")
            env = {"OUTRIDER_RULE_FILES": str(rules), "OUTRIDER_RULE_INTERVAL_S": "0.3",
                   "OUTRIDER_PROCESS_COMMAND_ARGUMENTS": "true",  # the arguments, redacted, go everywhere below
                   "OUTRIDER_RECEIVERS_FILE": str(receivers), "OUTRIDER_LOG_LEVEL": "debug",
                   "OUTRIDER_OTLP_ENDPOINT": f"http://otlp:{OTLP_PASSWORD}@127.0.0.1:{otlp.port}",
                   "OUTRIDER_OTLP_PROTOCOL": protocol, "OUTRIDER_OTLP_INTERVAL_S": "0.3",
                   "OTEL_EXPORTER_OTLP_HEADERS": f"api-key={OTLP_HEADER}"}
            with AgentProcess("--pid", str(workload.pid), "--no-collector.gpu", env=env, interval_s=0.3) as agent:
                wait_until(lambda: hook.accepted(), timeout_s=30, what="the page")
                wait_until(lambda: len(otlp.requests) >= 2, timeout_s=30, what="two OTLP exports")
                status, _, body = http_get(agent.url + "/api/v1/alerts")
                assert status == 200
                alerts = body.decode()
                metrics = agent.metrics()
                show = config_show(env)
                output = agent.output
    finally:
        workload.kill()
        workload.wait()
        otlp.stop()
    exports = "\n".join(str(r) for r in otlp.requests)
    pages = json.dumps(hook.accepted())
    # what is looked in is what it must be: the command line (redacted) in the exports, the alert and the page
    assert "--api-key=<redacted>" in exports and "train:<redacted>@db" in exports
    assert '"alertname":"WatchedProcess"' in alerts.replace(" ", "") and "--api-key=<redacted>" in alerts
    assert "--api-key=<redacted>" in pages and "train:<redacted>@db" in pages
    assert "otlp:<secret>@127.0.0.1" in show
    if isinstance(otlp, OtlpHttpReceiver):
        headers = {k.lower(): v for k, v in otlp.headers[0].items()}
        assert headers["api-key"] == OTLP_HEADER, "the header reached its receiver"
        assert headers["authorization"] == f"Basic {OTLP_BASIC}", "and the password, as basic auth"
    places = {"exports": exports, "alerts API": alerts, "notifications": pages, "logs": output, "/metrics": metrics,
              "config show": show}
    found = [(secret, where) for secret in (CMD_KEY, CMD_PASSWORD, OTLP_PASSWORD, OTLP_HEADER, OTLP_BASIC)
             for where, text in places.items() if secret in text]
    assert found == []


def config_show(env: dict[str, str]) -> str:
    """What `outrider config show` prints under the agent's environment."""
    return subprocess.run(outrider_cmd("config", "show"), capture_output=True, text=True,
                          env={**os.environ, **env}).stdout
