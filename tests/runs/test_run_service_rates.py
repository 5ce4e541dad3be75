"""A real service under `outrider run`, driven by a client that times itself (tests/runs/service_workload.py),
judged against the client's own count over its own clock, and counted in sweeps, never in seconds: while the
client runs, every requests/s the run records is the client's completions in that window over the window within
3% (the windows read from the agent's /metrics at every sweep: the hook's heartbeats), and what `outrider top
--once` shows is too; once it stops, every sweep from the second after the stop records exactly 0, `top --once`
shows 0 req/s, and the run's verdict counts no active time after the first sweep after the stop. What a user saw
before: 690-830 req/s held for 20 s after the client stopped, `top` showing it 10 s after the end, and those
seconds counted as active "balanced" time."""

from __future__ import annotations

import bisect
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from outrider.metrics.rate import HEARTBEAT
from outrider.runs.store import RunStore
from outrider.runs.verdict import IDLE, NO_VOTE
from tests.helpers import REPO, free_port, http_get, outrider_cmd, samples, wait_until

pytestmark = pytest.mark.integration
WORKLOAD = REPO / "tests" / "runs" / "service_workload.py"
PACE = 100.0  # the client's requests a second
SWEEP_S = 2.0  # the agent's interval; the hook keeps its default flush (1 s)


def sweeps_and_requests(url: str) -> tuple[float, float, float]:
    """The agent's sweeps so far, and the requests and the service's heartbeat its latest sweep saw."""
    m = samples(http_get(url + "/metrics")[2].decode())
    return (sum(v for (n, _), v in m.items() if n == "outrider_agent_sweeps_total"),
            sum(v for (n, _), v in m.items() if n == "outrider_requests_total"),
            max((v for (n, _), v in m.items() if n == HEARTBEAT), default=0.0))


class Sweeps(threading.Thread):
    """Reads the agent's /metrics every 50 ms while the run lasts: what each sweep saw (requests, heartbeat)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.seen: dict[float, tuple[float, float]] = {}  # sweep number -> (requests, heartbeat)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            try:
                sweep, requests, heartbeat = sweeps_and_requests(self.url)
            except OSError:
                continue
            self.seen.setdefault(sweep, (requests, heartbeat))

    def count(self) -> float:
        return max(self.seen, default=0.0)

    def windows(self) -> list[tuple[float, float, float]]:
        """(start, end, requests/s) of each window between two consecutive sweeps that both saw the service."""
        return [(h0, h1, (r1 - r0) / (h1 - h0)) for n, (r1, h1) in sorted(self.seen.items())
                for r0, h0 in [self.seen.get(n - 1, (0.0, 0.0))] if h0 and h1 > h0]


def after_sweeps(sweeps: Sweeps, n: int) -> None:
    """Return once the agent has swept n more times."""
    start = sweeps.count()
    wait_until(lambda: sweeps.count() >= start + n, timeout_s=60, what=f"{n} more sweeps")


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
    sweeps = Sweeps(url)
    try:
        wait_until(lambda: sweeps_and_requests(url)[1] > 0, timeout_s=60, what="the client's first requests")
        sweeps.start()
        after_sweeps(sweeps, 4)
        running = top_once(url)
        (tmp_path / "stop").touch()
        wait_until(lambda: (tmp_path / "client.json").exists(), timeout_s=60, what="the client's account")
        after_sweeps(sweeps, 4)
        stopped = top_once(url)
        (tmp_path / "release").touch()
        run.wait(timeout=120)
    finally:
        sweeps.done.set()
        (tmp_path / "stop").touch()
        (tmp_path / "release").touch()
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, log.read_text()
    client = json.loads((tmp_path / "client.json").read_text())
    completed = client["completed"]

    def client_rate(start: float, end: float) -> float:
        """The client's own completions in (start, end], per second."""
        return (bisect.bisect_right(completed, end) - bisect.bisect_right(completed, start)) / (end - start)

    inside = [(rate, client_rate(h0, h1)) for h0, h1, rate in sweeps.windows()
              if h0 >= client["started"] and h1 <= client["ended"]]
    assert len(inside) >= 2, (sweeps.seen, client["started"], client["ended"])
    assert all(rate == pytest.approx(truth, rel=0.03) for rate, truth in inside), inside

    shown = re.search(r"inference +([\d.,]+) req/s .* over ([\d.]+) s", running)
    assert shown, running
    truths = [truth for _, truth in inside]
    assert 0.97 * min(truths) <= float(shown.group(1).replace(",", "")) <= 1.03 * max(truths), (running, inside)
    assert float(shown.group(2)) == pytest.approx(SWEEP_S, rel=0.25), "the window: one sweep"
    assert re.search(r"inference +0 req/s", stopped), stopped

    run_id = json.loads(summary.read_text())["run_id"]
    store = RunStore(tmp_path / "runs")
    try:
        record = store.load(run_id)
    finally:
        store.close()
    rates = record.samples["requests_per_s"]
    recorded = [r for _, r in rates]
    # the record's rates are those windows' (the same sweeps)
    assert all(any(r == pytest.approx(rate, rel=1e-9) for r in recorded) for rate, _ in inside), (recorded, inside)
    after = [r for t, r in rates if t > client["ended"]]
    assert len(after) >= 4, (rates, client["ended"])
    assert after[1:] == [0.0] * (len(after) - 1), after

    first_after = next(t for t, _ in rates if t > client["ended"])
    timeline = record.timeline()
    assert timeline[-1].cls == IDLE and timeline[-1].start <= first_after, [(s.cls, s.start) for s in timeline]
    # the active time (what the verdict is judged on) ends by the first sweep after the stop
    assert all(s.end <= first_after for s in timeline if s.cls not in NO_VOTE), timeline
