"""The ground truth of the confusion matrix's single-process workloads, measured without Outrider
(OUTRIDER_DISABLED=1): each part of the loop timed around it in the script itself (zero_config.py --truth), alone
and beside a CPU hog. The labels the matrix checks the verdicts against must hold by these timings, on this
machine, under this load: the input workloads wait for data at least docs/diagnosis.md's 30% of the loop's own time (its
wall time less the time its thread waited for a CPU: neighbours stretch the step, never the wait for storage), the
Python-bound one spends at least half of its loop in the tokeniser (and building tensors from its lists), the waiting
one sleeps 80% of its own time or more (on this machine its tiny step waits for a CPU longer than it sleeps), the
checkpoint-heavy one spends at least docs/diagnosis.md's 30% of its loop inside torch.save, the inference service spends
80% of its serving loop or more in the model's forward (it is busy, never waiting for clients), and the compute and
host workloads barely wait for data (timing cannot tell those two apart: the size of their
operations does, which test_verdict_rules.py pins; nor can it tell the service's math from its overhead)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from outrider.diagnosis import bottleneck as b

# Each workload alone and beside a CPU hog: CI runs the hog half (the harder one, and a shared machine's case); the
# alone half is in the slow set (scripts/slow-tests.sh), for the time it takes
HOG = [pytest.param(False, id="alone", marks=pytest.mark.slow), pytest.param(True, id="beside_a_cpu_hog")]

pytestmark = pytest.mark.integration
SCRIPT = str(Path(__file__).with_name("zero_config.py"))
SECONDS = "6"


def truth(name: str, hog: bool) -> dict[str, float]:
    """Each part's share of the loop's wall time; `data_alone`: the data wait's share of the loop's own time (less
    the time its thread waited for a CPU, never less than its CPU time); `sleep_alone` likewise."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}, "OUTRIDER_DISABLED": "1"}
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if hog else None
    try:
        r = subprocess.run([sys.executable, SCRIPT, name, SECONDS, "--truth"], env=env, capture_output=True,
                           text=True, timeout=300)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    assert r.returncode == 0, r.stderr[-3000:]
    parts = json.loads(r.stdout.strip().splitlines()[-1])
    loop, cpu, delay = parts.pop("loop"), parts.pop("loop_cpu"), parts.pop("loop_delay")
    assert loop > 0
    shares = {part: seconds / loop for part, seconds in parts.items()}
    for part in ("data", "sleep"):
        waited = parts.get(part, 0.0)
        shares[f"{part}_alone"] = waited / (waited + max(loop - waited - delay, cpu))
    return shares


@pytest.mark.parametrize("hog", HOG)
@pytest.mark.parametrize(("name", "part", "low", "high"), [
    ("input", "data_alone", b.INPUT_WAIT, 1.0),
    ("input_io", "data_alone", b.INPUT_WAIT, 1.0),
    ("python", "python", b.PYTHON_SHARE, 1.0),
    ("sleeping", "sleep_alone", 0.8, 1.0),
    ("checkpoint", "checkpoint", b.CHECKPOINT_SHARE, 1.0),
    ("inference", "request", 0.8, 1.0),
    ("compute", "data", 0.0, 0.1),
    ("host", "data", 0.0, 0.1),
])
def test_the_labels_hold_without_outrider(name: str, part: str, low: float, high: float, hog: bool) -> None:
    pytest.importorskip("torch")
    shares = truth(name, hog)
    assert low <= shares.get(part, 0.0) <= high, shares
