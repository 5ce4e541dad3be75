"""`outrider compare` on jobs whose every step and request is known (tests/runs/jobs.py: recorded through the real
recorder and store, swept every 5 s as `outrider run` does by default): a 2x change in 400 steps is found, with the
job's own ratio inside every interval and every percentile within the sketch's 1.08% of the job's own; identical
jobs show no change; runs of 30 s compare every rate, share and error count; "not enough data" only when there are
too few steps; records without sketches, or from before runs kept their distributions, compare as before and say
so on every such line."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path
from statistics import NormalDist

import pytest

from outrider.ground.clock import ManualClock
from outrider.runs.compare import Comparison, bootstrap_ratio, compare, compare_all, steady
from outrider.runs.store import RunRecord, RunStore
from outrider.shared.sketch import RELATIVE_ERROR
from tests.runs.jobs import Job, own_quantile, record

STEP_STATS = {"step_time p50": 0.5, "step_time mean": "mean", "step_time p99": 0.99}


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[tuple[RunStore, ManualClock]]:
    clock = ManualClock(epoch=1000.0)
    store = RunStore(tmp_path, clock=clock.clock())
    yield store, clock
    store.close()


def steps(n: int, median_s: float, seed: int, sigma: float = 0.1) -> list[float]:
    rng = random.Random(seed)
    return [rng.lognormvariate(0.0, sigma) * median_s for _ in range(n)]


def own(values: list[float], stat: float | str) -> float:
    return sum(values) / len(values) if stat == "mean" else own_quantile(values, float(stat))


def by_kpi(done: list[Comparison]) -> dict[str, Comparison]:
    return {c.kpi: c for c in done}


def test_a_2x_change_in_400_steps_is_found_with_the_jobs_own_ratio_in_every_interval(
        recorded: tuple[RunStore, ManualClock]) -> None:
    """The issue's case: B truly 2.2x faster, 400 steps each (3.3 s and 1.5 s: the run's first sweep and its final
    one, so per sweep nothing could be compared)."""
    store, clock = recorded
    a_steps, b_steps = steps(400, 0.0081, 1), steps(400, 0.00369, 2)
    a, b = record(store, clock, Job(a_steps)), record(store, clock, Job(b_steps))
    found = by_kpi(compare(a, b))
    for kpi, stat in STEP_STATS.items():
        c = found[kpi]
        truth = own(b_steps, stat) / own(a_steps, stat)
        assert c.verdict == "better" and c.low <= truth <= c.high, (kpi, truth, c.sentence())
        assert c.high < 0.5, f"{kpi}: a 2.2x change told apart from a 2x one"
        assert c.counted == "400/400 steps"
    assert abs(found["step_time mean"].ratio - own(b_steps, "mean") / own(a_steps, "mean")) < 1e-9, "exact means"
    sentence = found["step_time p50"].sentence()
    assert re.fullmatch(r"step time p50: A 8\.\d+ ms, B 3\.\d+ ms: B is 5\d% faster \(-5\d% \[-\d+%, -\d+%\]; "
                        r"400/400 steps\)", sentence), sentence


def test_every_percentile_printed_is_within_the_sketchs_error_of_the_jobs_own(
        recorded: tuple[RunStore, ManualClock]) -> None:
    """Over the steps compared (the record's steady part: the job's steps after those it says it dropped as
    warm-up), within 1.08%; the medians within 2% of the job's own over all its steps."""
    store, clock = recorded
    a_steps, b_steps = steps(2000, 0.010, 3, sigma=0.5), steps(2000, 0.020, 4, sigma=0.5)
    requests = steps(3000, 0.004, 5, sigma=0.8)
    a = record(store, clock, Job(a_steps, requests=requests))
    b = record(store, clock, Job(b_steps, requests=requests))
    found = by_kpi(compare(a, b))
    dropped = re.search(r"after (\d+)/(\d+) of warm-up", found["step_time p50"].counted)
    assert dropped is not None and 0 < int(dropped[2]) <= 200, "B's first sweep held 194 of its 2,000 steps"
    for kpi, stat in STEP_STATS.items():
        for got, values, skip in ((found[kpi].value_a, a_steps, dropped[1]), (found[kpi].value_b, b_steps,
                                                                               dropped[2])):
            compared = values[int(skip):]
            assert abs(got / own(compared, stat) - 1) <= RELATIVE_ERROR + 1e-12, (kpi, got, own(compared, stat))
            if stat == 0.5:
                assert abs(got / own(values, stat) - 1) <= 0.02
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        got = found[f"latency {name}"].value_a
        assert abs(got / own_quantile(requests, q) - 1) <= RELATIVE_ERROR + 1e-12, name
    assert found["latency p50"].verdict == "same", "the same requests in both"


def test_identical_jobs_show_no_change(recorded: tuple[RunStore, ManualClock]) -> None:
    """Twenty pairs of jobs drawn alike (400 steps, 2,000 requests each), 140 statistics: no change, but for what
    95% intervals show by chance (measured: 136 the same, 3 significant but perhaps within noise, 1 worse: a p99
    of 2,000 requests, +11% [+2.2%, +19%])."""
    store, clock = recorded
    verdicts: dict[str, list[str]] = {}
    for seed in range(20):
        a = record(store, clock, Job(steps(400, 0.01, seed), requests=steps(2000, 0.003, 100 + seed, 0.3)))
        b = record(store, clock, Job(steps(400, 0.01, 50 + seed), requests=steps(2000, 0.003, 200 + seed, 0.3)))
        done, _ = compare_all(a, b)
        step_level = [c for c in done if c.kpi.startswith(("step_time", "latency"))]
        assert len(step_level) == 7
        for c in step_level:
            verdicts.setdefault(c.kpi, []).append(c.verdict)
    every = [v for vs in verdicts.values() for v in vs]
    assert every.count("same") >= 0.9 * len(every), verdicts
    assert sum(v in ("better", "worse") for v in every) <= 0.05 * len(every), verdicts
    assert {v for kpi in ("step_time p50", "step_time mean") for v in verdicts[kpi]} <= {"same", "noise"}


def test_runs_of_30_s_compare_every_rate_share_and_error_count(recorded: tuple[RunStore, ManualClock]) -> None:
    """30 s of training (B steps twice as fast, waits half as long for data) and 30 s of serving (B serves twice
    as fast and fails one request in 50 with a 5xx): step rate, throughput, data wait as a share and as a
    distribution, request rate and errors all compared, none skipped."""
    store, clock = recorded
    a = record(store, clock, Job([0.016] * 1500, waits=[0.004] * 1500, requests=[0.01] * 3000))
    b = record(store, clock, Job([0.008] * 3000, waits=[0.002] * 3000, requests=[0.005] * 6000,
                                 statuses=[500 if i % 50 == 0 else 200 for i in range(6000)]))
    done, skipped = compare_all(a, b)
    found = by_kpi(done)
    assert not skipped, [s.sentence() for s in skipped]
    for kpi in ("steps_per_s", "samples_per_s", "requests_per_s"):
        assert found[kpi].verdict == "better" and found[kpi].low <= 2.0 <= found[kpi].high, found[kpi].sentence()
        assert "4/4 intervals" in found[kpi].counted
    assert found["data_wait_fraction"].verdict == "same", "the same share of the loop: 20%"
    assert found["data_wait p50"].verdict == "better" and found["data_wait mean"].ratio == pytest.approx(0.5)
    errors = found["server_errors_per_s"]
    assert errors.verdict == "worse" and errors.value_a == 0 and "B is higher, worse, at least" in errors.sentence()
    assert found["server_error_share"].value_b == pytest.approx(0.02, rel=0.05)
    assert "client_errors_per_s" not in found, "no 4xx in either: nothing to say"


def test_more_errors_is_worse_and_fewer_is_better(recorded: tuple[RunStore, ManualClock]) -> None:
    store, clock = recorded
    jobs = [Job(requests=[0.005] * 6000, statuses=[(500 if i % every == 0 else 200) for i in range(6000)])
            for every in (20, 100)]
    many, few = (record(store, clock, job) for job in jobs)
    worse, better = by_kpi(compare(few, many)), by_kpi(compare(many, few))
    for kpi in ("server_errors_per_s", "server_error_share"):
        assert worse[kpi].verdict == "worse" and "higher, worse" in worse[kpi].sentence()
        assert better[kpi].verdict == "better" and "lower, better" in better[kpi].sentence()
        assert better[kpi].low <= 0.2 <= better[kpi].high, better[kpi].sentence()


def test_not_enough_data_only_when_there_are_too_few_steps(recorded: tuple[RunStore, ManualClock]) -> None:
    store, clock = recorded
    few = compare_all(record(store, clock, Job(steps(20, 0.01, 1))), record(store, clock, Job(steps(20, 0.01, 2))))
    assert not [c for c in few[0] if c.kpi.startswith("step_time")]
    said = {s.kpi: s.sentence() for s in few[1]}
    assert said["step_time p50"] == "step time p50: not enough data (at least 30 steps each) (20/20 steps)"
    some = compare_all(record(store, clock, Job(steps(200, 0.01, 1))), record(store, clock, Job(steps(200, 0.02, 2))))
    assert {"step_time p50", "step_time mean"} <= set(by_kpi(some[0]))
    assert {s.kpi for s in some[1]} >= {"step_time p99", "steps_per_s"}, "p99 needs 300; the counters moved once"
    assert "not enough data (the counter updated at too few sweeps" in {s.kpi: s.sentence() for s in some[1]}[
        "steps_per_s"]


def test_a_record_without_sketches_compares_the_mean_by_counts_and_the_percentiles_per_sweep_and_says_so(
        recorded: tuple[RunStore, ManualClock]) -> None:
    """Classic buckets only (an older hook): the mean from the running count and sum, each sweep weighted by its
    steps; the percentiles per sweep from the classic buckets, said to be coarse."""
    store, clock = recorded
    a_steps, b_steps = [0.010] * 1500, [0.020] * 1500
    a = record(store, clock, Job(a_steps, sketches=False), sweep_s=1.0)
    b = record(store, clock, Job(b_steps, sketches=False), sweep_s=1.0)
    assert a.distributions["step_time"]["steady"].sketch is None
    found = by_kpi(compare(a, b))
    mean = found["step_time mean"]
    assert mean.verdict == "worse" and mean.low <= 2.0 <= mean.high and "the record has no sketch" in mean.note
    p50 = found["step_p50_s"]
    assert p50.note == "per sweep, from classic buckets, which are coarse: the record has no sketch"
    assert "step_time p50" not in found and "step_time_s" not in found, "the mean by counts, not per sweep"


# --- records from before runs kept their distributions: per sweep, as then --------------------------------------

def run(name: str, mean: float, n: int = 60, sd: float = 0.05, seed: int = 1) -> RunRecord:
    rng = random.Random(seed)
    rec = RunRecord(name, ["train.py"], 0.0, float(n), 0, {})
    rec.samples["step_time_s"] = [(float(i), max(1e-6, rng.gauss(mean, sd * mean))) for i in range(n)]
    rec.samples["samples_per_s"] = [(float(i), 32 / v) for i, v in rec.samples["step_time_s"]]
    return rec


def exact(name: str, mean: float, n: int = 60, sd: float = 0.05, seed: int = 1) -> RunRecord:
    """Samples whose mean and spread are exactly the given ones: normal quantiles, shuffled."""
    quantiles = [NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)]
    random.Random(seed).shuffle(quantiles)
    rec = RunRecord(name, ["train.py"], 0.0, float(n), 0, {})
    rec.samples["step_time_s"] = [(float(i), mean * (1 + sd * z)) for i, z in enumerate(quantiles)]
    rec.samples["samples_per_s"] = [(float(i), 32 / v) for i, v in rec.samples["step_time_s"]]
    return rec


def test_an_older_record_is_compared_per_sweep_and_every_such_line_says_so() -> None:
    results = by_kpi(compare(exact("a", 0.100, seed=1), exact("b", 0.088, seed=2)))
    step = results["step_time_s"]
    assert step.significant and 0.86 < step.ratio < 0.90 and step.low < 0.88 < step.high
    assert step.sentence().startswith("step time: A 100 ms, B 87.9 ms: B is 12% faster (-12% [")
    assert step.sentence().endswith("; 54/54 sweeps; per sweep, each sweep weighing the same: A and B recorded "
                                    "before runs kept their distributions)")
    assert results["samples_per_s"].note.endswith("A and B recorded before runs kept their counters")
    assert "higher, better" in results["samples_per_s"].sentence()


def test_an_older_record_against_a_new_one_is_compared_as_the_older_one_can_be(
        recorded: tuple[RunStore, ManualClock]) -> None:
    store, clock = recorded
    new = record(store, clock, Job(steps(3000, 0.01, 1)), sweep_s=0.5)
    old = exact("old", 0.010)
    found = by_kpi(compare(old, new))
    assert "step_time p50" not in found and found["step_time_s"].note.endswith(
        "A recorded before runs kept their distributions")


def test_equal_runs_per_sweep_are_no_significant_difference_most_of_the_time() -> None:
    false_alarms = 0
    for seed in range(60):
        r = compare(run("a", 0.1, seed=seed), run("b", 0.1, seed=1000 + seed))[0]
        false_alarms += r.significant
        if not r.significant:
            assert "no significant difference" in r.sentence()
    assert false_alarms <= 8, f"{false_alarms}/60 false alarms for a 95% interval"


def test_the_per_sweep_interval_is_calibrated() -> None:
    covered = 0
    trials = 60
    for seed in range(trials):
        rng = random.Random(seed)
        a = [rng.gauss(10.0, 1.0) for _ in range(40)]
        b = [rng.gauss(9.0, 1.0) for _ in range(40)]
        _, low, high = bootstrap_ratio(a, b, resamples=800, seed=seed)
        covered += low <= 0.9 <= high
    assert covered >= 0.85 * trials, f"95% intervals covered the true ratio in {covered}/{trials} trials"


def test_gauges_are_compared_per_sweep_in_human_units_and_too_few_sweeps_said() -> None:
    a, b = exact("a", 0.100, seed=1), exact("b", 0.088, seed=2)
    for rec, rss, p99 in ((a, 700 * 2**20, 0.0040), (b, 760 * 2**20, 0.0041)):
        rec.samples["rss_bytes"] = [(float(i), rss + 2**20 * (i % 3 - 1)) for i in range(60)]
        rec.samples["latency_p99_s"] = [(float(i), p99) for i in range(3)]  # too few sweeps to compare
        rec.samples["server_errors_per_s"] = [(float(i), 0.0) for i in range(60)]  # zero in both: left out
    done, skipped = compare_all(a, b)
    text = {r.kpi: r.sentence() for r in done}
    assert text["rss_bytes"].startswith("job memory (RSS): A 700 MiB, B 760 MiB: B is 8.6% higher, worse (+8.6% [")
    assert text["rss_bytes"].endswith("; 54/54 sweeps)"), "a gauge: per sweep is what it is, no note"
    assert [s.sentence() for s in skipped] == [
        "p99 latency: not enough data (at least 5 sweeps each after warm-up) (3/3 sweeps)"]
    assert "server_errors_per_s" not in text


def test_training_kpis_count_only_the_sweeps_with_steps() -> None:
    """A run that trains, then serves: its throughput is judged on its training sweeps, not diluted by zeros."""
    rec = RunRecord("a", ["job.py"], 0.0, 100.0, 0, {})
    rec.samples["steps_per_s"] = [(float(i), 10.0 if i < 50 else 0.0) for i in range(100)]
    rec.samples["samples_per_s"] = [(float(i), 320.0 if i < 50 else 0.0) for i in range(100)]
    rec.samples["requests_per_s"] = [(float(i), 0.0 if i < 50 else 5.0) for i in range(100)]
    rec.samples["process_cpu_cores"] = [(float(i), 1.0) for i in range(100)]
    assert steady(rec, "samples_per_s") == [320.0] * 45
    assert len(steady(rec, "process_cpu_cores")) == 90  # active in either phase: all 100, less the warm-up
