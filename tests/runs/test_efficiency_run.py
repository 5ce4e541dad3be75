"""MFU and goodput of real runs under `outrider run`, against what the workload knows of itself.

- MFU: a CPU training loop of known FLOPs per step (a stack of Linear layers, on one thread) steps for 2.5 s of its
  own clock and records when each of its steps ended. Its own MFU is its FLOPs over its own wall time per step,
  against the peak the run judged it by (the CPU's, measured by `outrider run` before the command:
  outrider/ground/peaks.py, its share for one thread), over the same last stretch of its steps as the run's MFU covers
  (`mfu_timed_s`: the run leaves out the steps before the first count is published, which on a loaded machine run slower
  or faster than the rest); the run's summary must agree within 5%. The peak cancels: the test judges the FLOPs and the
  timing, never the machine.
- Goodput: a launcher (as torchrun's elastic agent does) starts a training process, SIGKILLs it once it has stepped
  a while, waits a known dead time and starts another of the same training job. Both record when each step ended;
  the restart is the time from the first process's last step to the second's first, and must be within a sweep of
  that. (The first process stops stepping a second before the kill, so that its last step is published: a SIGKILL
  loses what a process did since the hook's last flush, and the restart then runs from the last step published.)
Ratios and differences of the workload's own clock, never a wall-clock threshold: a loaded machine stretches both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import outrider_cmd

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

INTERVAL_S = 0.5  # the agent's sweeps
FLUSH_S = 0.25  # the hook's flushes

TRAIN = r"""
import json, os, sys, time
started = time.time()
import torch
import outrider

out, steps, d, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), 4
b, for_s = d, float(sys.argv[4]) if len(sys.argv) > 4 else float("inf")  # steps, or seconds of them if fewer
outrider.instrument()
torch.set_num_threads(1)  # 2 threads spin-waiting on 2 shared cores run 20x slower now and then
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(d, d) for _ in range(layers)])
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(b, d)
with open(out, "w") as fh:
    fh.write(json.dumps({"started": started, "flops": 2 * b * d * d * (3 * layers - 1)}) + "\n")
    fh.flush()
    first = None
    for i in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        end = time.perf_counter()
        fh.write(json.dumps({"end": end, "wall": time.time()}) + "\n")
        fh.flush()
        first = first or end
        if end - first > for_s:
            break
        if os.path.exists(out + ".pause"):  # the launcher is about to kill it: no step after this one
            time.sleep(3600)
"""

LAUNCHER = r"""
import json, os, signal, subprocess, sys, time

train, first, second, dead_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
env = dict(os.environ, OUTRIDER_TRAINING_JOB="restarted-job")
child = subprocess.Popen([sys.executable, train, first, "100000", "64"], env=env)
while True:  # until it has stepped a while (its own record)
    time.sleep(0.05)
    try:
        if sum(1 for _ in open(first)) > 20:
            break
    except OSError:
        pass
open(first + ".pause", "w").close()
time.sleep(1.0)  # its last step is published (the hook flushes every 0.25 s)
child.send_signal(signal.SIGKILL)
child.wait()
time.sleep(dead_s)
second_child = subprocess.Popen([sys.executable, train, second, "10", "64"], env=env)
sys.exit(second_child.wait())
"""


def records(path: Path) -> tuple[dict, list[dict]]:  # type: ignore[type-arg]
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]
    return lines[0], lines[1:]


def run(tmp_path: Path, *command: str, measure_peak: bool = False) -> dict:  # type: ignore[type-arg]
    summary = tmp_path / "summary.json"
    env = dict(os.environ, OUTRIDER_FLUSH_INTERVAL_S=str(FLUSH_S), OUTRIDER_CPU_PEAK_MEASURE=str(measure_peak).lower())
    r = subprocess.run(outrider_cmd("run", "--listen", "127.0.0.1:0", "--interval", str(INTERVAL_S), "--quiet",
                                    "--summary-json", str(summary), "--", sys.executable, *command),
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(summary.read_text())["measured"]["training"]  # type: ignore[no-any-return]


def test_the_runs_mfu_is_the_workloads_own_within_5_percent(tmp_path: Path) -> None:
    script, own = tmp_path / "train.py", tmp_path / "own.jsonl"
    script.write_text(textwrap.dedent(TRAIN))
    measured = run(tmp_path, str(script), str(own), "100000", "256", "2.5", measure_peak=True)
    head, steps = records(own)
    assert measured["steps"] == len(steps)
    peak = measured["peak_flops"]
    assert peak and measured["peak_dtype"] == "fp32", "the CPU's measured peak (its share for the loop's 1 thread)"
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "outrider" / "cpu_peak.json"
    assert cache.exists(), "measured once, and kept for the next runs"
    ends = [s["end"] for s in steps]
    covered = [end for end in ends if ends[-1] - end <= measured["mfu_timed_s"]]  # the run's last stretch of steps
    assert len(covered) >= 20, "the run judged a stretch of steps, not one or two"
    own_mfu = head["flops"] * (len(covered) - 1) / (covered[-1] - covered[0]) / peak
    assert measured["mfu"] == pytest.approx(own_mfu, rel=0.05), (measured["mfu"], own_mfu)


def test_a_killed_and_restarted_jobs_restart_is_its_dead_time_within_a_sweep(tmp_path: Path) -> None:
    train, launcher = tmp_path / "train.py", tmp_path / "launcher.py"
    train.write_text(textwrap.dedent(TRAIN))
    launcher.write_text(textwrap.dedent(LAUNCHER))
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    measured = run(tmp_path, str(launcher), str(train), str(first), str(second), "1.5")
    head1, steps1 = records(first)
    _, steps2 = records(second)
    truth = steps2[0]["wall"] - steps1[-1]["wall"]  # the last step of the killed process to the next first step
    assert truth > 1.5, "the launcher's dead time is in it"
    assert measured["restarts"] == 1
    restart = measured["badput_s"]["restart"]
    assert restart == pytest.approx(truth, abs=INTERVAL_S), (restart, truth)
    # everything accounted spans the first process's start to the second's last step
    good = measured["goodput"]
    total = sum(measured["badput_s"].values()) / (1.0 - good)
    span = steps2[-1]["wall"] - head1["started"]
    assert total == pytest.approx(span, abs=INTERVAL_S + FLUSH_S), (total, span)
    assert 0.0 < good < 1.0
