"""What a run's record keeps of its duration histograms (runs/distributions.py): what each series recorded from the
run's first sweep to its last, a process that started before the run counted from the run's start, one that
started during it counted whole; the steady part without at most the first 10% of the steps; the sketch only where
every series had one; and the store keeps it all, while an older runs.db opens as it is."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from outrider.ground.clock import ManualClock
from outrider.metrics.family import Family, HistogramValue
from outrider.runs.compare import compare
from outrider.runs.distributions import MAX_ROUTES, RunDistributions
from outrider.runs.store import RunStore
from tests.runs.jobs import Job, histogram, record

STEP = "outrider_train_step_duration_seconds"


def step_sweep(*series: tuple[str, list[float]], sketch: bool = True) -> list[Family]:
    """One sweep's step histogram: a series per rank, holding all the values that rank recorded so far."""
    fam = Family(STEP)
    for rank, values in series:
        fam.add(histogram(values, sketch), rank, "")
    return [fam]


def test_a_run_counts_what_each_series_recorded_from_its_first_sweep() -> None:
    d = RunDistributions()
    before = [0.5] * 500  # rank 0 started before the run: 500 steps already
    d.add(step_sweep(("0", before)))
    d.add(step_sweep(("0", before + [0.01] * 100), ("1", [0.02] * 50)))  # rank 1 started during the run
    assert d.totals["step_time"].count == 150
    d.add(step_sweep(("0", before + [0.01] * 150), ("1", [0.02] * 60)))
    total = d.totals["step_time"]
    assert total.count == 210 and total.sum == pytest.approx(150 * 0.01 + 60 * 0.02)
    assert total.sketch is not None and total.sketch.count == 210
    assert total.sketch.quantile(0.99) == pytest.approx(0.02, rel=0.011), "none of the 500 steps before the run"


def test_a_series_that_appears_again_is_a_new_process_counted_whole() -> None:
    """The hook collector keeps a finished process's values in its series for RETIRED_TTL_S: a series leaves the
    sweep only after that, and one with its labels later is a process that started from zero."""
    d = RunDistributions()
    d.add(step_sweep(("0", [0.01] * 5)))
    d.add(step_sweep(("0", [0.01] * 300)))
    d.add([])
    d.add(step_sweep(("0", [0.02] * 40)))
    assert d.totals["step_time"].count == 295 + 40


def test_the_sketch_is_kept_only_where_every_series_had_one() -> None:
    d = RunDistributions()
    d.add([])
    d.add(step_sweep(("0", [0.01] * 10)))
    assert d.totals["step_time"].sketch is not None
    fam = step_sweep(("0", [0.01] * 20))[0]
    fam.add(histogram([0.02] * 5, sketch=False), "1", "")
    d.add([fam])
    assert d.totals["step_time"].sketch is None and d.totals["step_time"].count == 25


def test_the_steady_part_drops_at_most_the_first_tenth_of_the_steps(tmp_path: Path) -> None:
    """1,000 steps, the first 100 ten times as slow, swept every 0.5 s: the steady part starts at the last sweep
    that had at most 100 steps, so it keeps the 900 steady steps and at most the last slow ones."""
    clock = ManualClock(epoch=1000.0)
    store = RunStore(tmp_path, clock=clock.clock())
    try:
        rec = record(store, clock, Job([0.1] * 100 + [0.01] * 900), sweep_s=0.5)
    finally:
        store.close()
    whole, steady = rec.distributions["step_time"]["run"], rec.distributions["step_time"]["steady"]
    assert whole.count == 1000 and 900 <= steady.count <= 910
    assert whole.sum / whole.count == pytest.approx(0.019)
    assert steady.sum / steady.count < 0.0105, "the slow start left out of the mean"


def test_a_run_of_400_steps_swept_every_5_s_keeps_every_step(tmp_path: Path) -> None:
    """Its first sweep with steps held more than 10% of them: nothing is dropped, not the 62% of them it held."""
    clock = ManualClock(epoch=1000.0)
    store = RunStore(tmp_path, clock=clock.clock())
    try:
        rec = record(store, clock, Job([0.02] * 400), sweep_s=5.0)
    finally:
        store.close()
    assert rec.distributions["step_time"]["steady"].count == 400
    assert rec.samples["step_time_count"][-1][1] == 400 and rec.samples["step_time_sum_s"][-1][1] == pytest.approx(8)


def test_a_long_run_keeps_few_warm_up_candidates_and_drops_just_under_a_tenth() -> None:
    d = RunDistributions()
    d.add([])
    values: list[float] = []
    for _ in range(3000):
        values += [0.01] * 7
        d.add(step_sweep(("0", values), sketch=False))
    assert len(d._marks["step_time"]) <= 50, "about log(10) / log(1.05) candidates, however long the run"
    steady = d.steady("step_time")
    assert steady is not None
    assert 0.9 * 21_000 <= steady.count <= 0.905 * 21_000, "between 9.5% and 10% dropped"


def test_request_latency_is_kept_whole_and_per_route_up_to_a_bound() -> None:
    d = RunDistributions()
    d.add([])
    fam = Family("outrider_request_duration_seconds")
    for i in range(MAX_ROUTES + 5):
        fam.add(histogram([0.001 * (i + 1)] * 3), f"/r{i}", "GET", "http", "200", "2xx", "", "")
    d.add([fam])
    assert d.totals["latency"].count == 3 * (MAX_ROUTES + 5)
    routes = [k for k in d.totals if k.startswith("latency:")]
    assert len(routes) == MAX_ROUTES and d.totals["latency:/r0"].count == 3


def test_the_store_keeps_the_distributions_and_an_older_runs_db_opens_as_it_is(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    db = sqlite3.connect(old / "runs.db")  # the tables of a runs.db from before runs kept their distributions
    db.executescript("""
        CREATE TABLE runs (id TEXT PRIMARY KEY, command TEXT, started REAL, ended REAL, exit_code INTEGER,
                           summary TEXT);
        CREATE TABLE samples (run_id TEXT, t REAL, name TEXT, value REAL);
        INSERT INTO runs VALUES ('r1', '["train.py"]', 0.0, 60.0, 0, NULL);
    """)
    db.executemany("INSERT INTO samples VALUES ('r1', ?, 'step_time_s', ?)", [(float(i), 0.1) for i in range(60)])
    db.commit()
    db.close()
    store = RunStore(old)
    try:
        rec = store.load("r1")
        assert rec.distributions == {}
        only = compare(rec, rec)[0]
        assert only.kpi == "step_time_s" and "recorded before runs kept their distributions" in only.note
        value = HistogramValue((0.01, 0.1), (3, 1, 0), 0.05, histogram([0.01, 0.01, 0.01, 0.02]).sketch)
        store.set_distribution("r1", "step_time", value, value)
        store.set_distribution("r1", "step_time", value + value, value)  # kept current: replaced
        again = store.load("r1").distributions["step_time"]
        assert again == {"run": value + value, "steady": value}
    finally:
        store.close()
