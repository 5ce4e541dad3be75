"""A real service under `outrider run`, driven by a client that times itself (tests/runs/service_workload.py),
judged against the client's own count over its own time, and counted in sweeps, never in seconds: while the client
runs, every requests/s the run records over a window inside its run, and what `outrider top --once` shows, is the
client's count/time within 3%; once it stops, every sweep from the second after the stop records exactly 0, `top
--once` shows 0 req/s, and the run's verdict counts the rest as idle, not as active time. What a user saw before:
690-830 req/s held for 20 s after the client stopped, `top` showing it 10 s after the end, and those seconds
counted as active "balanced" time."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from outrider.runs.store import RunStore
from outrider.runs.verdict import IDLE, NO_VOTE
from tests.helpers import REPO, free_port, http_get, outrider_cmd, samples, wait_until

pytestmark = pytest.mark.integration
WORKLOAD = REPO / "tests" / "runs" / "service_workload.py"
PACE = 100.0  # the client's requests a second
SWEEP_S = 2.0  # the agent's interval; the hook keeps its default flush (1 s)


def sweeps_and_requests(url: str) -> tuple[float, float]:
    m = samples(http_get(url + "/metrics")[2].decode())
    return (sum(v for (n, _), v in m.items() if n == "outrider_agent_sweeps_total"),
            sum(v for (n, _), v in m.items() if n == "outrider_requests_total"))


def after_sweeps(url: str, n: int) -> None:
    """Return once the agent has swept n more times."""
    start = sweeps_and_requests(url)[0]
    wait_until(lambda: sweeps_and_requests(url)[0] >= start + n, timeout_s=60, what=f"{n} more sweeps")


def top_once(url: str) -> str:
    r = subprocess.run(outrider_cmd("top", "--url", url, "--once"), env={**os.environ, "COLUMNS": "200"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_services_requests_per_second_are_the_clients_while_it_runs_and_zero_after(tmp_path: Path) -> None:
    agent, service = free_port(), free_port()
    url = f"http://127.0.0.1:{agent}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_"))}
    env = {**base, "OUTRIDER_RUNS_DIR": str(tmp_path / "runs"), "OUTRIDER_STATE_DIR": str(tmp_path / "state")}
    summary, log = tmp_path / "summary.json", tmp_path / "run.log"
    with log.open("w") as out:  # a file, not a pipe nobody reads while it runs
        run = subprocess.Popen(outrider_cmd("run", "--listen", f"127.0.0.1:{agent}", "--interval", str(SWEEP_S),
                                            "--summary-json", str(summary), "--", sys.executable, str(WORKLOAD),
                                            "serve", str(service), str(tmp_path), str(PACE)),
                               env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: sweeps_and_requests(url)[1] > 0, timeout_s=60, what="the client's first requests")
        after_sweeps(url, 4)
        running = top_once(url)
        (tmp_path / "stop").touch()
        wait_until(lambda: (tmp_path / "client.json").exists(), timeout_s=60, what="the client's account")
        after_sweeps(url, 4)
        stopped = top_once(url)
        (tmp_path / "release").touch()
        run.wait(timeout=120)
    finally:
        (tmp_path / "stop").touch()
        (tmp_path / "release").touch()
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, log.read_text()
    client = json.loads((tmp_path / "client.json").read_text())
    truth = client["count"] / client["seconds"]
    assert truth > 0.5 * PACE, client

    shown = re.search(r"inference +([\d.,]+) req/s .* over ([\d.]+) s", running)
    assert shown, running
    assert float(shown.group(1).replace(",", "")) == pytest.approx(truth, rel=0.03), (running, client)
    assert float(shown.group(2)) == pytest.approx(SWEEP_S, rel=0.25), "the window: one sweep"
    assert re.search(r"inference +0 req/s", stopped), stopped

    run_id = json.loads(summary.read_text())["run_id"]
    store = RunStore(tmp_path / "runs")
    try:
        record = store.load(run_id)
    finally:
        store.close()
    rates = record.samples["requests_per_s"]
    times = [t for t, _ in rates]
    # windows inside the client's run: from the sweep before (less a flush: the publication it saw) to this one
    inside = [r for (t0, _), (t1, r) in itertools.pairwise(rates) if t0 - 1.0 >= client["started"]
              and t1 <= client["ended"]]
    assert len(inside) >= 2, (rates, client)
    assert all(r == pytest.approx(truth, rel=0.03) for r in inside), (inside, truth)
    after = [r for t, r in rates if t > client["ended"]]
    assert len(after) >= 4, (rates, client)
    assert after[1:] == [0.0] * (len(after) - 1), after

    first_after = next(t for t in times if t > client["ended"])
    timeline = record.timeline()
    assert timeline[-1].cls == IDLE and timeline[-1].start <= first_after, [(s.cls, s.start) for s in timeline]
    # the active time (what the verdict is judged on) ends by the first sweep after the stop
    assert all(s.end <= first_after for s in timeline if s.cls not in NO_VOTE), timeline
