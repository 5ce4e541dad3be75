"""Names the agent owns are refused from the public API: a stalled workload that publishes outrider_hook_stalled 0
(or its own steps, latency or ALERTS) cannot hide or fake what the agent says, nor can `up 0` or `scrape_*` make
Prometheus record the agent's target as down; the refusal is warned about once and counted in
outrider_hook_dropped_total{reason="reserved_name"}."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.ground.config import Config
from outrider.metrics.exposition import render
from tests.helpers import samples, value

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 300  # the stall takes about a second to be seen; this only stops a test that would wait forever

WORKLOAD = textwrap.dedent("""
    import sys, time
    import outrider

    outrider.instrument()
    for _ in range(5):
        with outrider.step():
            time.sleep(0.01)
    # the workload's attempts at the agent's names, each twice (the second is cached: one refusal per name)
    for _ in range(2):
        outrider.gauge("outrider_hook_stalled").set(0)
        outrider.gauge("outrider_hook_stalled", {"why": "hide"}).set(0)
        outrider.counter("outrider_train_steps").inc(1000)
        outrider.histogram("outrider_latency_seconds", {"name": "db"}).observe(99.0)
        outrider.gauge("ALERTS", {"alertname": "x"}).set(1)
        outrider.gauge("up").set(0)
        outrider.gauge("scrape_duration_seconds").set(99)
    outrider.record_latency(0.002, "db")  # the hook's own function still reaches the real series
    outrider.gauge("queue_depth").set(7)  # and the workload's own names are published
    print("ready", flush=True)
    sys.stdin.readline()  # no step from here on: a stall
""")


def test_a_stalled_workload_cannot_publish_the_agents_names(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    env = {**os.environ, "OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_STANDALONE": "false",
           "OUTRIDER_STALL_FLOOR_S": "1", "OUTRIDER_FLUSH_INTERVAL_S": "0.1", "RANK": "0",
           "PYTHONPATH": os.pathsep.join([str(REPO / "agent"), str(REPO)])}
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        collector = HookCollector(CollectorContext(Config(spool_dir=str(spool), flush_interval_s=0.1)))
        deadline = time.monotonic() + HANG_GUARD_S
        text = ""
        while time.monotonic() < deadline:
            text = render(collector.collect()).decode()
            if value(samples(text), "outrider_hook_stalled", rank="0") == 1:
                break
            time.sleep(0.2)
        proc.stdin.write("end\n")
        proc.stdin.flush()
        _, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    parsed = samples(text)
    stalled = {labels: v for (n, labels), v in parsed.items() if n == "outrider_hook_stalled"}
    assert stalled == {(("rank", "0"),): 1}, "the real stall, and only it"
    assert value(parsed, "outrider_train_steps_total", rank="0", training_job="") == 5
    assert value(parsed, "outrider_latency_seconds_count", name="db", rank="0", training_job="") == 1
    assert value(parsed, "outrider_latency_seconds_sum", name="db", rank="0", training_job="") < 1
    assert not any(n in ("ALERTS", "up", "scrape_duration_seconds") for n, _ in parsed)
    assert value(parsed, "queue_depth", rank="0", training_job="") == 7
    assert value(parsed, "outrider_hook_dropped_total", reason="reserved_name", rank="0", training_job="") == 7
    warnings = [line for line in err.splitlines() if "reserved_name" in line]
    assert len(warnings) == 1 and "outrider_hook_stalled" in warnings[0], err
