"""Rates from counters over a stated window (metrics/rate.py), as the run record, `outrider top` and the demo take
them: a counter's growth between two of the hook's publications over the time between them by the publisher's own
clock (its heartbeats), whatever the reads' timing; exactly 0 from the first window that begins after the work
stopped; and no active time in a run's verdict where nothing ran.

The cases that made it so: the demo's hook flushed every second while the agent swept every half second, so one
sweep saw a second's steps and the next none, and `outrider compare` said 229 steps/s of a job doing 118; and a
service's requests/s stayed at 690-830 req/s for 20 s after its client stopped (a window of four updates, ended
only after two missed ones), those seconds counted as active "balanced" time in the run's verdict."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from outrider.ground.clock import ManualClock
from outrider.metrics.catalog import CATALOG
from outrider.metrics.family import Family, HistogramValue
from outrider.metrics.rate import HEARTBEAT, CounterHistory, Sample, intervals
from outrider.runs.compare import compare_all
from outrider.runs.recorder import RunRecorder
from outrider.runs.store import RunRecord, RunStore

TRUE = 118.0  # steps per second
EPOCH = 1_700_000_000.0  # the publishers' wall clock at the readers' 0
STEPS = {"steps": ("outrider_train_steps_total", {})}


def published(t: float, every_s: float, phase_s: float = 0.0, rate: float = TRUE,
              stop_s: float = math.inf) -> tuple[float, float]:
    """(when it last published, what it published) at time t, of a job counting at `rate` until `stop_s` and
    publishing every `every_s` from `phase_s`."""
    if t < phase_s:
        return -math.inf, 0.0
    at = phase_s + every_s * math.floor((t - phase_s) / every_s)
    return at, rate * min(at, stop_s)


def hook_read(metric: str, processes: Sequence[tuple[float, float]], rank: str = "") -> list[Sample]:
    """One read of a counter summed over the processes of one rank (what the hook collector serves), with each
    process's heartbeat: processes as (when it published, its value)."""
    labels = {"training_job": "", "rank": rank}
    out: list[Sample] = [(metric, labels, sum(v for _, v in processes))]
    out += [(HEARTBEAT, {**labels, "pid": str(100 + i)}, EPOCH + at) for i, (at, _) in enumerate(processes)
            if at > -math.inf]
    return out


@pytest.mark.parametrize(("publish_s", "read_s", "phase_s"), [
    (1.0, 0.5, 0.23),  # the demo's sweeps against a hook that kept its default flush
    (1.0, 5.0, 0.4),  # the default: a flush a second, a sweep every 5 s
    (1.0, 0.7, 0.1),  # reads that drift against the publications
    (1.0, 3.0, 0.95),  # a sweep that lands just after or just before a flush
])
def test_every_rate_once_known_is_the_true_one_whatever_the_reads_timing(publish_s: float, read_s: float,
                                                                       phase_s: float) -> None:
    h = CounterHistory(STEPS)
    naive, rates = [], []
    last: tuple[float, float] | None = None
    for i in range(200):
        t = i * read_s + 0.09 * (i * 7919 % 10)  # a sweep starts late by what the one before it took
        at, value = published(t, publish_s, phase_s)
        h.add(t, hook_read("outrider_train_steps_total", [(at, value)]))
        if last is not None:
            naive.append((value - last[1]) / (t - last[0]))
        last = t, value
        rates.append(h.rate("steps"))
    known = [r for r in rates if r is not None]
    assert rates.index(known[0]) <= 2 + math.ceil(publish_s / read_s), "known from the second publication seen"
    assert all(r == pytest.approx(TRUE, rel=1e-9) for r in known), (min(known), max(known))
    # what the reads' own timing said of the same counter: 0 or a multiple, or a flush's worth off
    assert max(abs(r - TRUE) for r in naive[5:]) >= 0.15 * TRUE


def test_a_job_that_stops_reads_exactly_zero_from_the_second_sweep_after_its_last_step() -> None:
    """Counted by sweeps, not by time: the first sweep after the stop may still hold some of the work (its window
    begins at the publication before it); every later one reads 0."""
    for read_s, phase_s, stop_s in ((5.0, 0.4, 61.7), (5.0, 0.9, 60.05), (0.5, 0.23, 30.2), (2.0, 0.0, 30.0)):
        h = CounterHistory(STEPS)
        after: list[float | None] = []
        for i in range(int(stop_s / read_s) + 12):
            t = i * read_s
            h.add(t, hook_read("outrider_train_steps_total", [published(t, 1.0, phase_s, stop_s=stop_s)]))
            if t > stop_s:
                after.append(h.rate("steps"))
            elif i > 3:
                assert h.rate("steps") == pytest.approx(TRUE), (read_s, t)
        assert after[1:] and all(r == 0.0 for r in after[1 + math.ceil(1.0 / read_s):]), (read_s, after[:6])
        assert after[0] is not None and after[0] < TRUE


def test_a_rank_of_several_processes_is_timed_by_each_of_them_and_one_that_stops_publishing_drops_out() -> None:
    """Four workers of one service (one rank, summed), sweeps twice as fast as their flushes: every rate is the
    true one (each window waits for every worker's publication). Then one worker's publisher stops (a stopped
    process) while the others go on: the rate is theirs, not twice it."""
    h = CounterHistory(STEPS)
    phases = (0.0, 0.25, 0.5, 0.75)
    for i in range(120):
        t = 0.5 * i + 0.1
        h.add(t, hook_read("outrider_train_steps_total", [published(t, 1.0, p, rate=10.0) for p in phases]))
        if i > 4:
            assert h.rate("steps") == pytest.approx(40.0), t
    stopped = published(60.0, 1.0, 0.0, rate=10.0)  # its last publication, held from now on
    for i in range(120, 200):
        t = 0.5 * i + 0.1
        h.add(t, hook_read("outrider_train_steps_total",
                           [stopped] + [published(t, 1.0, p, rate=10.0) for p in phases[1:]]))
        if i > 126:
            assert h.rate("steps") == pytest.approx(30.0), t


def test_a_process_that_stops_publishing_or_ends_reads_zero() -> None:
    """Its counter keeps its last value (the agent keeps an ended process's totals), its heartbeat stops or goes:
    it counts nothing any more."""
    for ends in (False, True):
        h = CounterHistory(STEPS)
        for i in range(40):
            t = i + 0.6
            at, value = published(min(t, 20.0), 1.0, 0.5)
            read = hook_read("outrider_train_steps_total", [(at, value)])
            h.add(t, [s for s in read if not (ends and t > 20 and s[0] == HEARTBEAT)])
            if t < 20:
                assert t < 3 or h.rate("steps") == pytest.approx(TRUE)
            elif ends:
                assert h.rate("steps") is not None, "its end is known at once: no publisher, nothing counted"
        assert h.rate("steps") == 0.0


def test_ranks_are_timed_apart_and_summed() -> None:
    """Two ranks that publish at different moments, one at twice the other's rate: the job's rate is their sum."""
    h = CounterHistory(STEPS)
    for i in range(30):
        t = 5.0 * i
        h.add(t, hook_read("outrider_train_steps_total", [published(t, 1.0, 0.1, rate=10.0)], rank="0")
              + hook_read("outrider_train_steps_total", [published(t, 1.0, 0.8, rate=20.0)], rank="1"))
    assert h.rate("steps") == pytest.approx(30.0)


def test_what_the_agent_reads_itself_is_timed_by_the_reads() -> None:
    """The process tree's CPU is read from /proc at the sweep: no heartbeat, the read's own time."""
    h = CounterHistory({"cpu": ("outrider_watched_cpu_seconds_total", {})})
    for i in range(5):
        h.add(2.0 * i, [("outrider_watched_cpu_seconds_total", {"mode": "user"}, 1.5 * 2.0 * i)])
    assert h.rate("cpu") == pytest.approx(1.5)


def test_a_counter_without_two_publications_has_no_rate_and_one_that_has_never_moved_is_zero() -> None:
    h = CounterHistory({"steps": ("outrider_train_steps_total", {}), "requests": ("outrider_requests_total", {})})

    def read(at: float, steps: float) -> list[Sample]:
        return [*hook_read("outrider_train_steps_total", [(at, steps)]), ("outrider_requests_total", {}, 0.0)]

    h.add(0.0, read(0.0, 50.0))
    h.add(0.5, read(0.0, 50.0))
    assert h.rate("steps") is None, "one publication: not measured yet, never 0"
    h.add(1.0, read(1.0, 60.0))
    assert h.rate("steps") == pytest.approx(10.0) and h.rate("requests") == 0.0


def test_a_sum_that_goes_down_adds_nothing() -> None:
    """A process gone with its series takes its count out of the sum: the rate counts growth only."""
    h = CounterHistory(STEPS)
    for i, v in enumerate((0.0, 10.0, 20.0, 5.0, 15.0, 25.0)):
        h.add(float(i), hook_read("outrider_train_steps_total", [(float(i), v)]))
    assert h.total("steps") == 40.0
    assert h.rate("steps") == pytest.approx(10.0)


def test_a_share_is_on_the_window_of_its_whole() -> None:
    h = CounterHistory({"loop": ("outrider_train_loop_seconds_total", {}),
                        "data_wait": ("outrider_train_loop_seconds_total", {"part": "data_wait"})})
    for i in range(12):
        t = float(i)
        at, wall = published(t, 2.0, rate=1.0)
        labels = {"training_job": "", "rank": ""}
        h.add(t, [("outrider_train_loop_seconds_total", {**labels, "part": "step"}, 0.6 * wall),
                  ("outrider_train_loop_seconds_total", {**labels, "part": "data_wait"}, 0.4 * wall),
                  (HEARTBEAT, {**labels, "pid": "1"}, EPOCH + at)])
    assert h.ratio("data_wait", "loop") == pytest.approx(0.4)


def test_compare_intervals_add_up_to_the_counters_growth() -> None:
    points = [(i * 0.5, published(i * 0.5, 1.0, 0.23)[1]) for i in range(120)]
    got = intervals(points)
    assert len(got) >= 20
    assert sum(n for n, _ in got) / sum(s for _, s in got) == pytest.approx(TRUE, rel=0.02)
    assert all(s == pytest.approx(1.0) for _, s in got), "each from one update of the counter to the next"


def family(name: str, value: float | HistogramValue, **labels: str) -> Family:
    return Family(name).add(value, *(labels.get(n, "") for n in CATALOG[name].label_names))


def heartbeat(at: float) -> Family:
    return family(HEARTBEAT, EPOCH + at, pid="100")


def step_families(at: float, steps: float) -> list[Family]:
    hist = HistogramValue((0.01, 0.1), (int(steps), 0, 0), steps / TRUE)
    loop_s = steps / TRUE
    return [family("outrider_train_step_duration_seconds", hist), family("outrider_train_steps_total", steps),
            family("outrider_samples_total", 32 * steps),
            Family("outrider_train_loop_seconds_total").add(loop_s * 0.75, "", "", "step")
                                                       .add(loop_s * 0.25, "", "", "data_wait"),
            *([heartbeat(at)] if at > -math.inf else [])]


def test_the_record_and_compare_say_the_true_rate_of_a_hook_flushing_slower_than_the_sweeps(
        tmp_path: Path) -> None:
    """The demo's case end to end through the recorder and the run store: sweeps every 0.5 s, the hook publishing
    every second."""
    clock = ManualClock(epoch=EPOCH)
    store = RunStore(tmp_path, clock=clock.clock())
    try:
        records = []
        for _ in range(2):
            run_id = store.start_run(["train.py"])
            rec = RunRecorder(store, run_id, window_s=4.0, clock=clock.clock())
            for i in range(120):
                clock.now = i * 0.5
                rec(step_families(*published(clock.now, 1.0, 0.23)))
            records.append(store.load(run_id))
    finally:
        store.close()
    samples = records[0].samples
    assert all(v == pytest.approx(TRUE) for _, v in samples["steps_per_s"]), samples["steps_per_s"]
    assert all(v == pytest.approx(32 * TRUE) for _, v in samples["samples_per_s"])
    assert all(v == pytest.approx(0.25) for _, v in samples["data_wait_fraction"])
    done, _ = compare_all(records[0], records[1])
    by_kpi = {c.kpi: c for c in done}
    assert by_kpi["steps_per_s"].value_a == pytest.approx(TRUE, rel=0.02)
    assert re.search(r"steps, \d+/\d+ intervals\)$", by_kpi["steps_per_s"].sentence())
    assert by_kpi["samples_per_s"].value_a == pytest.approx(32 * TRUE, rel=0.02)
    assert by_kpi["data_wait_fraction"].value_a == pytest.approx(0.25)


def service_families(t: float, stop_s: float, rate: float = 700.0, cores: float = 2.0,
                     in_flight_until: float = 0.0) -> list[Family]:
    """A service under load until stop_s (2 CPU cores busy serving), at rest after: what the sweep at t sees of
    it (the hook publishing every second, the process's CPU read at the sweep); one request, waiting on something
    else, in flight until in_flight_until."""
    at, served = published(t, 1.0, 0.3, rate=rate, stop_s=stop_s)
    errors = 0.02 * served
    return [Family("outrider_requests_total")
            .add(served - errors, "/predict", "POST", "http", "200", "2xx", "", "")
            .add(errors, "/predict", "POST", "http", "400", "4xx", "", ""),
            family("outrider_requests_in_flight", 1.0 if at < in_flight_until else 0.0), heartbeat(at),
            family("outrider_watched_cpu_seconds_total", cores * min(t, stop_s), mode="user")]


def run_service(tmp_path: Path, in_flight_until: float = 0.0) -> tuple[RunRecorder, RunRecord, list[float]]:
    """A service busy for 40 s then at rest, swept every second for 60 s, through the recorder and the store."""
    clock = ManualClock(epoch=EPOCH)
    store = RunStore(tmp_path, clock=clock.clock())
    try:
        run_id = store.start_run(["serve.py"])
        rec = RunRecorder(store, run_id, window_s=30.0, clock=clock.clock())
        sweeps = [0.5 + i for i in range(61)]
        for t in sweeps:
            clock.now = t
            rec(service_families(t, stop_s=40.0, in_flight_until=in_flight_until))
        return rec, store.load(run_id), sweeps
    finally:
        store.close()


def test_a_service_that_stops_reads_zero_and_its_rest_is_never_active_time(tmp_path: Path) -> None:
    """A service busy for 40 s, then at rest for 20 s, swept every second with a 30 s diagnosis window (which
    still held the work for several sweeps after the stop and called them compute_bound): the record's requests/s
    is the service's own rate while it serves and 0 from the second sweep after the stop; the run's active time is
    its serving time, to the sweep; the rest is idle."""
    rec, record, sweeps = run_service(tmp_path)
    rates = dict(record.samples["requests_per_s"])
    serving = [rates[EPOCH + t] for t in sweeps if 3 <= t < 40]
    assert serving and all(r == pytest.approx(700.0) for r in serving), serving
    assert [rates[EPOCH + t] for t in sweeps if t > 41] == [0.0] * 20
    assert all(v == pytest.approx(0.02 * 700.0) for t, v in record.samples["client_errors_per_s"] if t < EPOCH + 40)
    v = rec.verdict()
    assert v.cls == "compute_bound"
    timeline = [(s.cls, s.start - EPOCH, s.end - EPOCH) for s in rec.timeline()]
    assert timeline[-2:] == [("compute_bound", timeline[-2][1], 40.5), ("idle", 40.5, 60.5)], timeline
    assert v.seconds["idle"] == pytest.approx(20.0)
    assert v.active_s == pytest.approx(40.5 - timeline[-2][1])


def test_a_request_in_flight_is_work_though_nothing_finished_and_no_cpu_was_used(tmp_path: Path) -> None:
    """The same service with one request still waiting on something else for 10 s after the load stopped: those
    sweeps are the window's verdict, not idle; idle begins with the first sweep that saw none in flight."""
    rec, _, _ = run_service(tmp_path, in_flight_until=50.0)
    idle = [(s.start - EPOCH, s.end - EPOCH) for s in rec.timeline() if s.cls == "idle"]
    assert idle == [(49.5, 60.5)], rec.timeline()
