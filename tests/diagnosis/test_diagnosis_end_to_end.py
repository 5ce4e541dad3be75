"""CPU workloads with a known bottleneck under `outrider run` are classified correctly. (The report, the comparison
and `outrider top` are tested on a real run in tests/runs.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from outrider.runs.report import dominant_verdict
from outrider.runs.store import RunStore
from tests.helpers import outrider_cmd

pytestmark = pytest.mark.integration
WORKLOADS = str(Path(__file__).with_name("workloads.py"))
EXPECTED = {"starved": "input_bound", "compute": "compute_bound", "host": "host_bound"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Each workload run once under `outrider run`; returns the runs directory and workload -> run id."""
    pytest.importorskip("torch")
    runs = tmp_path_factory.mktemp("runs")
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    env = {**base, "OUTRIDER_RUNS_DIR": str(runs), "OUTRIDER_DIAGNOSIS_WINDOW_S": "5",
           "OUTRIDER_FLUSH_INTERVAL_S": "0.5"}
    ids = {}
    for name in EXPECTED:
        r = subprocess.run(outrider_cmd("run", "--listen", "127.0.0.1:0", "--interval", "1", "--", sys.executable,
                                        WORKLOADS, name, "14"), env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        line = next(line for line in r.stderr.splitlines() if line.strip().startswith("record"))
        ids[name] = line.split()[1].rstrip(":")
    return runs, ids


@pytest.mark.parametrize("workload", sorted(EXPECTED))
def test_known_bottlenecks_are_classified(recorded: tuple[Path, dict[str, str]], workload: str) -> None:
    runs, ids = recorded
    store = RunStore(runs)
    rec = store.load(ids[workload])
    assert dominant_verdict(rec) == EXPECTED[workload], rec.verdicts
    assert rec.values("process_cpu_cores") and rec.summary["exit_code"] == 0
