"""`outrider compare` end to end: pairs of real `outrider run`s of a workload that times itself
(tests/runs/timed_loop.py: steps or requests that sleep, each timed by the workload too), the two runs of a pair at
the same time so that both meet the same machine. A loop twice as fast is found twice as fast, with the ratio the
workload measured itself inside the interval; identical loops show no change; a service twice as fast that fails
one request in 25 is found faster, serving more, and worse for its errors.

Until the hook records its durations into sketches (HistogramValue.sketch is None for the hook's families), the
record keeps classic buckets only: compare then takes the mean by counts, the rates from the counters and the
percentiles per sweep, said to be coarse, and these tests check that much and end as xfail("...needs sketches").
Once sketches flow, the assertions after `if not sketched` run: the percentiles compared step by step, each
within 2% of the workload's own, its ratio inside the interval."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from outrider.runs.compare import Comparison, compare_all
from outrider.runs.store import RunRecord, RunStore
from tests.helpers import outrider_cmd
from tests.runs.jobs import assert_printed_in_human_units, own_quantile

pytestmark = pytest.mark.integration
LOOP = Path(__file__).with_name("timed_loop.py")
NEEDS_SKETCHES = "the hook records no sketches yet: the percentiles step by step need them (see the module)"


@dataclass
class Timed:
    record: RunRecord
    timed: list[float]  # what the workload timed itself, in order

    def compared(self, key: str) -> list[float]:
        """The workload's own durations that the comparison stands on: those after the warm-up the record dropped."""
        parts = self.record.distributions[key]
        return self.timed[parts["run"].count - parts["steady"].count:]


def run_pair(tmp: Path, a: list[str], b: list[str]) -> tuple[Timed, Timed, str]:
    """Runs A and B under `outrider run` at the same time, in one runs directory; returns both and what
    `outrider compare A B` printed."""
    runs = tmp / "runs"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_"))}
    started = []
    for name, args in (("a", a), ("b", b)):
        env = {**base, "OUTRIDER_RUNS_DIR": str(runs), "OUTRIDER_STATE_DIR": str(tmp / f"state-{name}"),
               "OUTRIDER_FLUSH_INTERVAL_S": "0.25"}
        cmd = outrider_cmd("run", "--listen", "127.0.0.1:0", "--interval", "0.5", "--summary-json",
                           str(tmp / f"{name}.json"), "--", sys.executable, str(LOOP), *args, str(tmp / f"{name}.out"))
        started.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in started:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    ids = [json.loads((tmp / f"{name}.json").read_text())["run_id"] for name in ("a", "b")]
    store = RunStore(runs)
    try:
        pair = [Timed(store.load(run_id), json.loads((tmp / f"{name}.out").read_text()))
                for run_id, name in zip(ids, ("a", "b"))]
    finally:
        store.close()
    shown = subprocess.run(outrider_cmd("compare", *ids, "--runs-dir", str(runs)), capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    return pair[0], pair[1], shown.stdout


def by_kpi(a: Timed, b: Timed) -> dict[str, Comparison]:
    return {c.kpi: c for c in compare_all(a.record, b.record)[0]}


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def sketched(t: Timed, key: str) -> bool:
    return t.record.distributions[key]["steady"].sketch is not None


def test_a_loop_twice_as_fast_is_found_so_with_its_own_ratio_inside(tmp_path: Path) -> None:
    a, b, shown = run_pair(tmp_path, ["train", "0.02", "400"], ["train", "0.01", "400"])
    assert_printed_in_human_units(shown)
    assert a.record.distributions["step_time"]["run"].count == 400, "every step of a process the run started"
    found = by_kpi(a, b)
    rate = found["steps_per_s"]
    own_rate = mean(a.timed) / mean(b.timed)
    assert rate.verdict == "better" and 0.8 * own_rate <= rate.ratio <= 1.2 * own_rate, rate.sentence()
    step_mean = found["step_time mean"]
    truth = mean(b.compared("step_time")) / mean(a.compared("step_time"))
    assert step_mean.verdict == "better" and step_mean.low <= truth <= step_mean.high, (truth, step_mean.sentence())
    if not sketched(a, "step_time"):
        assert found["step_p50_s"].note == "per sweep, from classic buckets, which are coarse: the record has no sketch"
        pytest.xfail(NEEDS_SKETCHES)
    for kpi, q in (("step_time p50", 0.5), ("step_time p99", 0.99)):
        c = found[kpi]
        own_a, own_b = own_quantile(a.compared("step_time"), q), own_quantile(b.compared("step_time"), q)
        assert c.verdict == "better" or q == 0.99, (own_b / own_a, c.sentence())  # a shared machine's tail: see below
        assert c.low <= own_b / own_a <= c.high, (own_b / own_a, c.sentence())
        assert abs(c.value_a / own_a - 1) <= 0.02 and abs(c.value_b / own_b - 1) <= 0.02, c.sentence()
    assert re.search(r"step time p50: A 2\d.* ms, B \d+.* ms: B is \d+% faster", shown), shown


def test_identical_loops_show_no_change(tmp_path: Path) -> None:
    """Both sleep 10 ms a step, at the same time: no change in step time (p50, mean) or step rate. Their p99 is not
    judged: the tails of sleeping on a shared machine are the machine's, not the loop's."""
    a, b, _ = run_pair(tmp_path, ["train", "0.01", "400"], ["train", "0.01", "400"])
    found = by_kpi(a, b)
    judged = ["steps_per_s", "samples_per_s", "step_time mean"]
    if sketched(a, "step_time"):
        judged.append("step_time p50")
    for kpi in judged:
        assert found[kpi].verdict in ("same", "noise"), found[kpi].sentence()
    if not sketched(a, "step_time"):
        pytest.xfail(NEEDS_SKETCHES)


def test_a_service_twice_as_fast_that_fails_one_request_in_25(tmp_path: Path) -> None:
    a, b, shown = run_pair(tmp_path, ["serve", "0.01", "500"], ["serve", "0.005", "1000", "25"])
    assert_printed_in_human_units(shown)
    found = by_kpi(a, b)
    rate = found["requests_per_s"]
    own_rate = (len(b.timed) / sum(b.timed)) / (len(a.timed) / sum(a.timed))
    assert rate.verdict == "better" and 0.8 * own_rate <= rate.ratio <= 1.2 * own_rate, rate.sentence()
    latency = found["latency mean"]
    truth = mean(b.compared("latency")) / mean(a.compared("latency"))
    assert latency.verdict == "better" and latency.low <= truth <= latency.high, (truth, latency.sentence())
    errors, share = found["server_errors_per_s"], found["server_error_share"]
    assert errors.verdict == "worse" and errors.value_a == 0 and "B is higher, worse, at least" in errors.sentence()
    assert share.value_b == pytest.approx(1 / 25, rel=0.3), share.sentence()
    if not sketched(a, "latency"):
        pytest.xfail(NEEDS_SKETCHES)
    for kpi, q in (("latency p50", 0.5), ("latency p90", 0.9), ("latency p99", 0.99)):
        c = found[kpi]
        own_a, own_b = own_quantile(a.compared("latency"), q), own_quantile(b.compared("latency"), q)
        # the p99 of a few hundred requests on a shared machine is a handful of the machine's slowest moments: its
        # interval must hold the truth, which may well be no significant change
        assert c.verdict == "better" or q == 0.99, (own_b / own_a, c.sentence())
        assert c.low <= own_b / own_a <= c.high, (own_b / own_a, c.sentence())
        assert abs(c.value_a / own_a - 1) <= 0.02 and abs(c.value_b / own_b - 1) <= 0.02, c.sentence()

