"""A job that hangs before its first step is paged with zero configuration: no torchrun, no OUTRIDER_ROLE, only
`outrider.instrument()`, under `outrider run`. It imports torch, builds a model and an optimizer, and waits on a
barrier no other party ever reaches. The hook knows it is training (it built an optimizer), so the first-step
timeout applies (shortened through OUTRIDER_FIRST_STEP_TIMEOUT_S); the agent's own rules page a real webhook
receiver with the hung line in the stacks; the summary says the process waited for its first step and the verdict
that it hung before it. The counterpart, the same job stepping normally for longer than the timeout, pages
nothing and is not called hung."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import outrider_cmd, wait_until
from tests.servers import WebhookReceiver

pytestmark = pytest.mark.integration
pytest.importorskip("torch")
FIRST_STEP_TIMEOUT_S = 8  # an optimizer's first build imports torch._dynamo: seconds on a loaded machine

HUNG = """
    import pathlib, threading
    import torch
    import outrider

    outrider.instrument()
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pathlib.Path({ready!r}).write_text("x")
    threading.Barrier(2).wait()  # the other party never comes
"""

STEPPING = """
    import time
    import torch
    import outrider

    outrider.instrument()
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    end = time.monotonic() + {seconds}
    while time.monotonic() < end:
        opt.zero_grad()
        model(torch.ones(4, 16)).sum().backward()
        opt.step()
        time.sleep(0.05)
"""


def start(tmp_path: Path, body: str, webhook: WebhookReceiver) -> tuple[subprocess.Popen[str], Path, Path]:
    prog = tmp_path / "workload.py"
    prog.write_text(textwrap.dedent(body))
    receivers = tmp_path / "receivers.yaml"
    receivers.write_text(f"receivers:\n  - name: oncall\n    type: webhook\n    url: {webhook.url}\n")
    summary = tmp_path / "summary.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "TORCHELASTIC_", "OTEL_"))}
    env.update({"OUTRIDER_FIRST_STEP_TIMEOUT_S": str(FIRST_STEP_TIMEOUT_S), "OUTRIDER_FLUSH_INTERVAL_S": "0.2",
                "OUTRIDER_RULE_INTERVAL_S": "0.5", "OUTRIDER_RULE_SETTINGS": "TrainingStalled.for=1s",
                "OUTRIDER_RECEIVERS_FILE": str(receivers), "OUTRIDER_ALERT_INSTANCE": "trainer-0",
                "OUTRIDER_STATE_DIR": str(tmp_path / "state"), "OUTRIDER_RUNS_DIR": str(tmp_path / "runs")})
    proc = subprocess.Popen(outrider_cmd("run", "--listen", "127.0.0.1:0", "--interval", "0.2", "--summary-json",
                                         str(summary), "--", sys.executable, str(prog)),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, prog, summary


def test_a_job_hung_on_a_barrier_before_its_first_step_is_paged_and_called_hung(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    with WebhookReceiver() as webhook:
        proc, prog, summary = start(tmp_path, HUNG.format(ready=str(ready)), webhook)
        try:
            firing = wait_until(lambda: webhook.alert("TrainingStalled", "firing"), timeout_s=90, interval_s=0.5,
                                what="the TrainingStalled page at the webhook")
            # built before the page, though on a crowded machine the file may land after it (the stack dump
            # below, taken when the stall was judged, shows the barrier's line: the hang after the build)
            wait_until(ready.exists, timeout_s=30, what="the workload to have built its model and optimizer")
            proc.send_signal(signal.SIGTERM)  # forwarded to the hung job: the run ends and writes its summary
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            proc.wait()
    assert firing["labels"]["alertname"] == "TrainingStalled" and firing["labels"]["instance"] == "trainer-0"
    line = next(i for i, text in enumerate(prog.read_text().splitlines(), 1) if "Barrier(2).wait()" in text)
    stacks = firing["annotations"]["stack_dump"]
    assert f'workload.py", line {line} in <module>' in stacks, "the page shows where it hangs"
    assert "no first step (a training process: it built an optimizer)" in stacks
    data = json.loads(summary.read_text())
    assert proc.returncode == 128 + signal.SIGTERM
    assert data["verdict"]["cls"] == "hung_before_first_step"
    waiting = data["measured"]["waiting"]
    assert waiting["stalled"] == ["-"] and waiting["longest_s"] > FIRST_STEP_TIMEOUT_S
    assert data["measured"]["training"] is None
    assert "called outrider.instrument()" not in err.split("what the agent measured:")[1].split("verdict:")[0]
    assert "no step completed: the training process waited" in err and "hung before its first step" in err
    assert "verdict: hung before its first step: the training process completed no step" in err
    assert any(a["name"] == "TrainingStalled" for a in data["alerts"])


def test_a_job_that_steps_normally_is_not_paged_nor_called_hung(tmp_path: Path) -> None:
    with WebhookReceiver() as webhook:
        proc, _, summary = start(tmp_path, STEPPING.format(seconds=FIRST_STEP_TIMEOUT_S + 4), webhook)
        try:
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == 0, err
        bodies = list(webhook.bodies)
    data = json.loads(summary.read_text())
    assert data["wall_s"] > FIRST_STEP_TIMEOUT_S + 1, "the risk window (timeout and the rule's `for`) was covered"
    assert not [a for b in bodies for a in b["alerts"] if a["labels"]["alertname"] == "TrainingStalled"]
    assert not [a for a in data["alerts"] if a["name"] in ("TrainingStalled", "TrainingFirstStepMissing")]
    assert data["verdict"]["cls"] != "hung_before_first_step"
    assert data["measured"]["training"]["steps"] > 10 and data["measured"]["waiting"] is None
