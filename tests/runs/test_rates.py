"""Rates from counters over time (metrics/rate.py), as the run record, `outrider compare` and `outrider top` take
them: a counter that moves only when its source publishes (the hook's flush, a sweep of /metrics), read at moments
of the reader's choosing, gives the true rate on every read once it has changed twice, never 0 for a running job
and never a multiple of the truth; a job that stops falls to 0.

The demo's case: the hook flushed every second (its flush interval never reached it), the agent swept every half
second, so one sweep saw a second's steps and the next none, and `outrider compare` (keeping the sweeps with
steps) said 229 steps/s of a job doing 118."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from outrider.clock import ManualClock
from outrider.metrics.family import Family, HistogramValue
from outrider.metrics.rate import CounterHistory, intervals
from outrider.runs.compare import compare_all
from outrider.runs.recorder import RunRecorder
from outrider.runs.store import RunStore

TRUE = 118.0  # steps per second


def published(t: float, every_s: float, phase_s: float = 0.0, rate: float = TRUE) -> float:
    """The counter as its source last published it at time t: a job at `rate`, publishing every `every_s`."""
    return rate * every_s * math.floor((t - phase_s) / every_s) if t >= phase_s else 0.0


@pytest.mark.parametrize(("publish_s", "read_s", "phase_s"), [
    (1.0, 0.5, 0.23),  # the demo's sweeps against a hook that kept its default flush
    (5.0, 2.0, 0.7),  # outrider top's reads against an agent sweeping every 5 s
    (1.0, 5.0, 0.4),  # the default: a flush a second, a sweep every 5 s
    (1.0, 0.7, 0.1),  # reads that drift against the publications
])
def test_every_rate_once_known_is_the_true_one_never_zero_nor_a_multiple(publish_s: float, read_s: float,
                                                                       phase_s: float) -> None:
    h = CounterHistory()
    naive, rates = [], []
    last = None
    for i in range(200):
        t = i * read_s
        value = published(t, publish_s, phase_s)
        h.add(t, {"steps": value})
        if last is not None:
            naive.append((value - last) / read_s)
        last = value
        rates.append(h.rate("steps"))
    known = [r for r in rates if r is not None]
    assert rates.index(known[0]) <= 3 * max(1, round(publish_s / read_s)) + 1, "known after two changes"
    steady = known[len(known) // 10:]
    # the error is the reads' lag behind a publication (at most a read interval) over a window of at least four
    # updates: none here where reads and publications keep step, 14% where they drift (0.7 s against 1 s)
    assert all(abs(r - TRUE) <= 0.15 * TRUE for r in steady), (min(steady), max(steady))
    if read_s < publish_s:
        assert min(naive) == 0 and max(naive) >= 1.4 * TRUE, "what rates between consecutive reads said"


def test_a_counter_that_has_not_changed_twice_has_no_rate_and_one_that_has_never_moved_is_zero() -> None:
    h = CounterHistory()
    h.add(0.0, {"steps": 50.0, "requests": 0.0})
    h.add(1.0, {"steps": 60.0, "requests": 0.0})
    assert h.rate("steps") is None, "one change: not measured yet, never 0"
    assert h.rate("requests") is None and h.total("requests") == 0.0
    h.add(2.0, {"steps": 70.0, "requests": 0.0})
    assert h.rate("steps") == pytest.approx(10.0)


def test_a_job_that_stops_falls_to_zero() -> None:
    h = CounterHistory()
    for i in range(20):
        h.add(float(i), {"steps": 10.0 * i})
    assert h.rate("steps") == pytest.approx(10.0)
    for i in range(20, 30):
        h.add(float(i), {"steps": 190.0})
    assert h.rate("steps") == 0.0


def test_a_sum_that_goes_down_adds_nothing() -> None:
    """A process gone with its series takes its count out of the sum: the rate counts growth only."""
    h = CounterHistory()
    for i, v in enumerate((0.0, 10.0, 20.0, 5.0, 15.0, 25.0)):
        h.add(float(i), {"steps": v})
    assert h.total("steps") == 40.0
    assert h.rate("steps") is not None and h.rate("steps") >= 0


def test_a_share_is_on_the_window_of_its_whole() -> None:
    h = CounterHistory()
    for i in range(12):
        t = float(i)
        h.add(t, {"loop": published(t, 2.0, rate=1.0), "data_wait": published(t, 2.0, rate=0.4)})
    assert h.ratio("data_wait", "loop") == pytest.approx(0.4)


def test_compare_intervals_add_up_to_the_counters_growth() -> None:
    points = [(i * 0.5, published(i * 0.5, 1.0, 0.23)) for i in range(120)]
    got = intervals(points)
    assert len(got) >= 20
    assert sum(n for n, _ in got) / sum(s for _, s in got) == pytest.approx(TRUE, rel=0.02)
    assert all(s == pytest.approx(1.0) for _, s in got), "each from one update of the counter to the next"


def step_families(steps: float, loop_s: float) -> list[Family]:
    hist = HistogramValue((0.01, 0.1), (int(steps), 0, 0), steps / TRUE)
    return [Family("outrider_train_step_duration_seconds").add(hist, "", ""),
            Family("outrider_samples_total").add(32 * steps, "", ""),
            Family("outrider_train_loop_seconds_total").add(loop_s * 0.75, "", "", "step")
                                                         .add(loop_s * 0.25, "", "", "data_wait")]


def test_the_record_and_compare_say_the_true_rate_of_a_hook_flushing_slower_than_the_sweeps(
        tmp_path: Path) -> None:
    """The demo's case end to end through the recorder and the run store: sweeps every 0.5 s, the hook publishing
    every second."""
    clock = ManualClock(epoch=1000.0)
    store = RunStore(tmp_path, clock=clock.clock())
    try:
        records = []
        for _ in range(2):
            run_id = store.start_run(["train.py"])
            rec = RunRecorder(store, run_id, window_s=4.0, clock=clock.clock())
            for i in range(120):
                clock.now = i * 0.5
                steps = published(clock.now, 1.0, 0.23)
                rec(step_families(steps, steps / TRUE))
            records.append(store.load(run_id))
    finally:
        store.close()
    samples = records[0].samples
    assert all(abs(v - TRUE) < 0.15 * TRUE for _, v in samples["steps_per_s"][10:]), samples["steps_per_s"]
    assert all(abs(v - 32 * TRUE) < 0.15 * 32 * TRUE for _, v in samples["samples_per_s"][10:])
    assert all(v == pytest.approx(0.25) for _, v in samples["data_wait_fraction"])
    done, _ = compare_all(records[0], records[1])
    by_kpi = {c.kpi: c for c in done}
    assert by_kpi["steps_per_s"].value_a == pytest.approx(TRUE, rel=0.02)
    assert re.search(r"steps, \d+/\d+ intervals\)$", by_kpi["steps_per_s"].sentence())
    assert by_kpi["samples_per_s"].value_a == pytest.approx(32 * TRUE, rel=0.02)
    assert by_kpi["data_wait_fraction"].value_a == pytest.approx(0.25)
