"""`outrider compare` value by value, in process, on records built by hand: each sentence whole (the verdict, which
way is better, the noise band's edges, an infinite ratio), what each statistic needs, the distributions' intervals
where the resamples cannot spread (one value each: the interval is exactly the sketch's error), the counters' rates,
shares and errors where every interval is alike (an interval of zero width), the per-sweep means, and which way a
record that lacks something is compared, said on each line. test_compare.py judges the same on recorded jobs."""

from __future__ import annotations

import math

import pytest

from outrider.metrics.family import HistogramValue
from outrider.runs import compare as cmp
from outrider.runs import stats
from outrider.runs.compare import (
    CLASSIC_NOTE,
    Comparison,
    Skipped,
    bootstrap_ratio,
    compare,
    compare_all,
    compare_distribution,
    from_counters,
    needed,
    steady,
)
from outrider.runs.distributions import RUN, STEADY
from outrider.runs.kpis import KPIS, Kpi
from outrider.runs.stats import Interval
from outrider.runs.store import RunRecord
from outrider.shared.sketch import BASE, Sketch
from tests.runs.jobs import histogram

STEP = KPIS["step_time_s"]
RATE = KPIS["steps_per_s"]
GPU = KPIS["gpu_util"]  # a number that does not judge


def said(kind: Kpi, a: float, b: float, ratio: float, low: float, high: float, note: str = "") -> Comparison:
    return Comparison(kind.key, kind, a, b, Interval(ratio, low, high), "9/9 sweeps", note)


def record(name: str = "a", started: float = 0.0) -> RunRecord:
    return RunRecord(name, ["job.py"], started, started + 100.0, 0, {})


def totals(per_s: float, times: range | list[float], start: float = 0.0) -> list[tuple[float, float]]:
    """A counter's running total at each sweep, growing per_s from `start`."""
    return [(float(t), per_s * (t - start)) for t in times]


# --- a comparison's sentence --------------------------------------------------------------------------------------

def test_a_step_time_that_went_down_is_faster_and_one_that_went_up_slower() -> None:
    faster = said(STEP, 0.010, 0.005, 0.5, 0.4, 0.6)
    assert faster.verdict == "better" and faster.significant and not faster.within_noise
    assert faster.sentence() == "step time: A 10 ms, B 5 ms: B is 50% faster (-50% [-60%, -40%]; 9/9 sweeps)"
    slower = said(STEP, 0.010, 0.015, 1.5, 1.4, 1.6, note="per sweep")
    assert slower.verdict == "worse"
    assert slower.sentence() == "step time: A 10 ms, B 15 ms: B is 50% slower (+50% [+40%, +60%]; 9/9 sweeps; " \
                                "per sweep)"


def test_a_rate_says_higher_or_lower_and_whether_that_is_better() -> None:
    up, down = said(RATE, 10.0, 20.0, 2.0, 1.5, 2.5), said(RATE, 10.0, 5.0, 0.5, 0.4, 0.6)
    assert (up.verdict, down.verdict) == ("better", "worse")
    assert up.sentence() == "step rate: A 10 steps/s, B 20 steps/s: B is 100% higher, better (+100% [+50%, " \
                            "+150%]; 9/9 sweeps)"
    assert down.sentence() == "step rate: A 10 steps/s, B 5 steps/s: B is 50% lower, worse (-50% [-60%, -40%]; " \
                              "9/9 sweeps)"
    fewer_errors = said(KPIS["server_errors_per_s"], 2.0, 1.0, 0.5, 0.4, 0.6)
    assert fewer_errors.verdict == "better" and "B is 50% lower, better (" in fewer_errors.sentence()


def test_a_number_that_does_not_judge_is_only_higher_or_lower() -> None:
    up, down = said(GPU, 0.4, 0.6, 1.5, 1.4, 1.6), said(GPU, 0.6, 0.3, 0.5, 0.4, 0.6)
    assert (up.verdict, down.verdict) == ("higher", "lower")
    assert up.sentence() == "GPU utilisation: A 40%, B 60%: B is 50% higher (+50% [+40%, +60%]; 9/9 sweeps)"
    assert down.sentence() == "GPU utilisation: A 60%, B 30%: B is 50% lower (-50% [-60%, -40%]; 9/9 sweeps)"


def test_an_interval_covering_no_change_is_no_significant_difference() -> None:
    for low, high in ((0.9, 1.1), (1.0, 1.1), (0.9, 1.0)):
        same = said(STEP, 0.010, 0.0101, 1.01, low, high)
        assert same.verdict == "same" and not same.significant and not same.within_noise
    assert said(STEP, 0.010, 0.0101, 1.01, 0.9, 1.1).sentence() == \
        "step time: A 10 ms, B 10.1 ms: no significant difference (+1% [-10%, +10%]; 9/9 sweeps)"


def test_noise_is_an_interval_reaching_within_two_percent_of_no_change() -> None:
    """Within NOISE: low under 1.02 for a rise, high over 1 / 1.02 for a fall; at the edges themselves, not."""
    rise = said(STEP, 0.010, 0.0105, 1.05, 1.0199, 1.08)
    assert rise.verdict == "noise" and rise.within_noise
    assert rise.sentence() == "step time: A 10 ms, B 10.5 ms: B is 5% slower, perhaps by no more than noise " \
                              "(2%) (+5% [+2%, +8%]; 9/9 sweeps)"
    assert said(STEP, 0.010, 0.0105, 1.05, 1.02, 1.08).verdict == "worse"
    fall = said(RATE, 10.0, 9.5, 0.95, 0.92, 0.9805)
    assert fall.verdict == "noise" and fall.sentence() == "step rate: A 10 steps/s, B 9.5 steps/s: B is 5% " \
        "lower, perhaps by no more than noise (2%) (-5% [-8%, -1.9%]; 9/9 sweeps)"
    assert said(RATE, 10.0, 9.5, 0.95, 0.92, 1.0 / 1.02).verdict == "worse"


def test_something_where_a_had_none_is_at_least_so_many_times_more() -> None:
    errors = said(KPIS["server_errors_per_s"], 0.0, 0.5, math.inf, 3.2, math.inf)
    assert errors.verdict == "worse"
    assert errors.sentence() == "server errors (5xx): A 0 errors/s, B 0.5 errors/s: B is higher, worse, at least " \
                                "3.2x (+∞ [+220%, +∞]; 9/9 sweeps)"
    barely = said(GPU, 0.0, 0.5, math.inf, 1.01, math.inf)
    assert barely.verdict == "noise" and barely.sentence() == "GPU utilisation: A 0%, B 50%: B is higher, at " \
        "least 1.01x, perhaps by no more than noise (2%) (+∞ [+1%, +∞]; 9/9 sweeps)"


def test_a_ratio_of_exactly_one_reads_as_its_interval_says() -> None:
    """An interval all above no change around a ratio of 1 (a bootstrap's can be): slower, higher (a number that
    judges nothing read "lower" by the ratio alone, and a rate "worse")."""
    assert said(STEP, 0.010, 0.010, 1.0, 1.01, 1.05).sentence() == "step time: A 10 ms, B 10 ms: B is 0% slower, " \
        "perhaps by no more than noise (2%) (+0% [+1%, +5%]; 9/9 sweeps)"
    assert said(GPU, 0.5, 0.5, 1.0, 1.01, 1.05).sentence() == "GPU utilisation: A 50%, B 50%: B is 0% higher, " \
        "perhaps by no more than noise (2%) (+0% [+1%, +5%]; 9/9 sweeps)"
    assert said(GPU, 0.5, 0.5, 1.0, 1.03, 1.05).verdict == "higher"
    assert said(RATE, 10.0, 10.0, 1.0, 1.03, 1.05).verdict == "better"
    assert said(RATE, 10.0, 10.0, 1.0, 0.95, 0.97).verdict == "worse"


def test_no_change_at_all_is_plus_zero() -> None:
    assert said(STEP, 0.010, 0.010, 1.0, 0.9, 1.1).sentence() == \
        "step time: A 10 ms, B 10 ms: no significant difference (+0% [-10%, +10%]; 9/9 sweeps)"


def test_what_was_not_compared_says_why_and_on_what() -> None:
    assert Skipped("x", "step time p99", "not enough data", "40/40 steps").sentence() == \
        "step time p99: not enough data (40/40 steps)"
    assert Skipped("x", "step time", "recorded in A only").sentence() == "step time: recorded in A only"


def test_a_quantile_needs_three_items_beyond_it_and_every_statistic_thirty() -> None:
    assert [needed(s) for s in ("mean", 0.5, 0.9, 0.95, 0.99, 0.999)] == [30, 30, 30, 60, 300, 3000]


# --- distributions --------------------------------------------------------------------------------------------------

def test_one_value_each_compares_within_exactly_the_sketchs_error() -> None:
    """Every resample of one value is that value: the percentiles' interval is the ratio widened by BASE both ways,
    the mean's the exact ratio; the warm-up each record dropped is said."""
    done, skipped = compare_distribution(histogram([0.01] * 40), histogram([0.02] * 40), "step_time", "step time",
                                         "steps", [0.5, "mean", 0.99], warmup=(2, 3))
    p50, mean = done
    assert (p50.kpi, p50.kind.label, mean.kpi) == ("step_time p50", "step time p50", "step_time mean")
    assert p50.value_b / p50.value_a == 2.0 and p50.value_a == pytest.approx(0.01, rel=0.011)
    assert (p50.ratio, p50.low, p50.high) == (2.0, 2.0 / BASE, 2.0 * BASE)
    assert (mean.value_a, mean.value_b) == (0.01, 0.02) and (mean.low, mean.high) == (2.0, 2.0)
    assert p50.sentence() == "step time p50: A 10 ms, B 20 ms: B is 100% slower (+100% [+96%, +104%]; 40/40 " \
                             "steps after 2/3 of warm-up)"
    assert [s.sentence() for s in skipped] == [
        "step time p99: not enough data (at least 300 steps each) (40/40 steps after 2/3 of warm-up)"]
    assert skipped[0].kpi == "step_time p99"


def test_the_mean_is_the_exact_one_with_the_bootstraps_spread_moved_onto_it() -> None:
    a, b = [0.010] * 20 + [0.030] * 20, [0.011] * 20 + [0.033] * 20
    (mean,), _ = compare_distribution(histogram(a), histogram(b), "k", "k", "steps", ["mean"], seed=3)
    assert mean.value_a == pytest.approx(0.02) and mean.value_b == pytest.approx(0.022)
    assert mean.ratio == pytest.approx(1.1) and mean.low < 1.1 < mean.high
    # the bootstrap's interval of the sketches' means (A's resamples from the seed, B's from the next), each end
    # multiplied by the exact ratio over the sketched one
    pa, pb = (Sketch.of_values(x).points() for x in (a, b))
    sketched = (Sketch.of_values(b).mean() or 0.0) / (Sketch.of_values(a).mean() or 1.0)
    low, high = stats.percentile_interval(stats.bootstrap(pa, ["mean"], stats.RESAMPLES, 3)[0],
                                          stats.bootstrap(pb, ["mean"], stats.RESAMPLES, 4)[0])
    assert abs(sketched / 1.1 - 1) > 1e-3, "the sketched means' ratio is not the exact one: the move shows"
    move = mean.ratio / sketched
    assert (mean.low, mean.high) == pytest.approx((low * move, high * move), rel=1e-12)
    again, _ = compare_distribution(histogram(a), histogram(b), "k", "k", "steps", ["mean"], seed=3)
    assert again == [mean], "the same draws each time"
    (same,), _ = compare_distribution(histogram(a), histogram(a), "k", "k", "steps", ["mean"])
    assert same.ratio == 1.0 and same.low < 1.0 < same.high, "A's and B's resamples are drawn apart"


def test_a_distribution_at_exactly_what_a_statistic_needs_is_compared_and_one_short_is_not() -> None:
    done, skipped = compare_distribution(histogram([0.01] * 30), histogram([0.02] * 29), "k", "k", "steps", [0.5])
    assert not done and skipped[0].counted == "30/29 steps"
    done, skipped = compare_distribution(histogram([0.01] * 30), histogram([0.02] * 30), "k", "k", "steps", [0.5])
    assert len(done) == 1 and not skipped and done[0].counted == "30/30 steps", "no warm-up: not said"
    done, _ = compare_distribution(histogram([0.01] * 30), histogram([0.02] * 30), "k", "k", "steps", [0.5],
                                   warmup=(0, 4))
    assert done[0].counted == "30/30 steps after 0/4 of warm-up"


def test_a_statistic_at_zero_in_either_run_has_no_ratio() -> None:
    done, skipped = compare_distribution(histogram([0.0] * 40), histogram([0.02] * 40), "k", "wait", "waits",
                                         [0.5, "mean"])
    assert not done
    assert [s.sentence() for s in skipped] == [
        "wait p50: A 0 s, B 20 ms: a ratio needs both above 0 (40/40 waits)",
        "wait mean: A 0 s, B 20 ms: a ratio needs both above 0 (40/40 waits)"]
    done, skipped = compare_distribution(histogram([0.02] * 40), histogram([0.0] * 40), "k", "wait", "waits", [0.5])
    assert not done and skipped[0].why == "A 20 ms, B 0 s: a ratio needs both above 0"
    assert skipped[0].kpi == "k p50"


def parts(values: list[float], dropped: int, sketch: bool = True) -> dict[str, HistogramValue]:
    """A distribution as a record keeps it: the whole run, and its steady part (the first `dropped` left out)."""
    return {RUN: histogram(values, sketch), STEADY: histogram(values[dropped:], sketch)}


def test_a_record_compares_its_steady_part_and_says_the_warm_up_it_dropped() -> None:
    a, b = record("a"), record("b")
    a.distributions["step_time"] = parts([0.5] * 4 + [0.01] * 40, 4)
    b.distributions["step_time"] = parts([0.02] * 40, 0)
    done, skipped = compare_all(a, b)
    p50 = {c.kpi: c for c in done}["step_time p50"]
    assert p50.counted == "40/40 steps after 4/0 of warm-up" and p50.value_b / p50.value_a == 2.0
    assert [s.kpi for s in skipped] == ["step_time p99"]


def test_a_record_that_kept_only_the_steady_part_says_no_warm_up() -> None:
    a, b = record("a"), record("b")
    a.distributions["step_time"] = {STEADY: histogram([0.01] * 40)}
    b.distributions["step_time"] = {RUN: histogram([0.02] * 44), STEADY: histogram([0.02] * 40)}
    p50 = {c.kpi: c for c in compare(a, b)}["step_time p50"]
    assert p50.counted == "40/40 steps after 0/4 of warm-up"


def test_a_distribution_recorded_in_one_run_only_is_said_so() -> None:
    a, b = record("a"), record("b")
    a.distributions["step_time"] = parts([0.01] * 40, 0)
    b.distributions["latency"] = parts([0.01] * 40, 0)
    done, skipped = compare_all(a, b)
    assert not done
    assert [s.sentence() for s in skipped] == ["step time: recorded in A only", "request latency: recorded in B only"]
    assert [s.kpi for s in skipped] == ["step_time", "latency"]


def test_a_sketch_that_does_not_hold_every_item_is_no_sketch() -> None:
    """A histogram whose sketch counts fewer items than its buckets (a series without one merged in), in B only,
    compares as a record without sketches: the mean by counts, the percentiles per sweep."""
    a, b = record("a"), record("b")
    for rec, v in ((a, 0.01), (b, 0.02)):
        h = histogram([v] * 40)
        partial = HistogramValue(h.bounds, h.counts, h.sum, Sketch.of_values([v] * 39))
        rec.distributions["step_time"] = {RUN: partial, STEADY: partial} if rec is b else parts([v] * 40, 0)
        rec.samples["step_time_count"] = totals(10.0, range(0, 60, 5))
        rec.samples["step_time_sum_s"] = totals(10.0 * v, range(0, 60, 5))
        rec.samples["step_p50_s"] = [(float(t), v) for t in range(0, 60, 5)]
    found = {c.kpi: c for c in compare(a, b)}
    assert set(found) == {"step_time mean", "step_p50_s"}
    mean = found["step_time mean"]
    assert (mean.value_a, mean.value_b, mean.ratio) == pytest.approx((0.01, 0.02, 2.0))
    assert (mean.low, mean.high) == pytest.approx((2.0, 2.0)), "every interval alike"
    assert mean.counted == "9/9 intervals of steps"
    assert mean.note == "by sweep, weighted by its steps: the record has no sketch"
    assert mean.verdict == "worse" and mean.sentence() == "step time mean: A 10 ms, B 20 ms: B is 100% slower (+100% " \
        "[+100%, +100%]; 9/9 intervals of steps; by sweep, weighted by its steps: the record has no sketch)"
    assert found["step_p50_s"].note == CLASSIC_NOTE and found["step_p50_s"].counted == "11/11 sweeps"


def test_the_mean_by_counts_needs_three_updates_of_the_count() -> None:
    a, b = record("a"), record("b")
    for rec, updates in ((a, range(0, 20, 5)), (b, range(0, 25, 5))):
        rec.distributions["data_wait"] = parts([0.01] * 40, 0, sketch=False)
        rec.samples["data_wait_count"] = totals(10.0, updates)
        rec.samples["data_wait_sum_s"] = totals(0.1, updates)
    _, skipped = compare_all(a, b)
    assert skipped[0].kpi == "data_wait mean"
    assert [s.sentence() for s in skipped] == ["data-loader wait mean: not enough data (the count updated at too "
                                               "few sweeps: at least 3 each) (1/2 intervals of waits)"]


def test_requests_are_compared_per_route_where_both_runs_served_several() -> None:
    a, b = record("a"), record("b")
    for rec, v in ((a, 0.01), (b, 0.02)):
        rec.distributions["latency"] = parts([v] * 40, 0)
        rec.distributions["latency:/predict"] = parts([v] * 40, 0)
        rec.distributions["latency:"] = parts([2 * v] * 40, 0)
    a.distributions["latency:/predict"] = parts([0.01] * 43, 3)
    b.distributions["latency:/predict"] = parts([0.02] * 45, 5)
    a.distributions["latency:/only-a"] = parts([0.01] * 40, 0)
    done, skipped = compare_all(a, b)
    assert [c.counted for c in done][3:] == ["40/40 requests", "40/40 requests after 3/5 of warm-up"]
    assert [c.kind.label for c in done] == ["request latency p50", "request latency p90", "request latency mean",
                                            "request latency (no route) p50", "request latency /predict p50"]
    assert [c.kpi for c in done][3:] == ["latency: p50", "latency:/predict p50"]
    assert done[3].value_a == pytest.approx(0.02, rel=0.011) and done[4].value_a == pytest.approx(0.01, rel=0.011)
    assert [s.kpi for s in skipped] == ["latency p99", "latency: p99", "latency:/predict p99"]
    del b.distributions["latency:"]
    assert [c.kpi for c in compare(a, b)] == ["latency p50", "latency p90", "latency mean"], "one route: the whole"


def test_a_route_without_a_sketch_in_either_run_is_left_out() -> None:
    a, b = record("a"), record("b")
    for rec in (a, b):
        rec.distributions["latency"] = parts([0.01] * 40, 0)
        rec.distributions["latency:/x"] = parts([0.01] * 40, 0)
        rec.distributions["latency:/y"] = parts([0.01] * 40, 0)
    b.distributions["latency:/x"] = parts([0.01] * 40, 0, sketch=False)
    assert [c.kpi for c in compare(a, b)] == ["latency p50", "latency p90", "latency mean", "latency:/y p50"]
    a.distributions["latency:/y"] = parts([0.01] * 40, 0, sketch=False)
    assert [c.kpi for c in compare(a, b)] == ["latency p50", "latency p90", "latency mean"]


# --- counters ---------------------------------------------------------------------------------------------------------

def test_a_rate_from_counters_updated_every_sweep() -> None:
    """Steps at 10/s and 20/s, read every 5 s from 5 s to 50 s: the counter's updates from 0 at the run's start,
    the first within 10% of their span dropped, eight intervals alike (an interval of zero width)."""
    a, b = record("a"), record("b")
    a.samples["steps_total"] = totals(10.0, range(5, 55, 5))
    b.samples["steps_total"] = totals(20.0, range(5, 55, 5))
    assert from_counters(a, "steps_per_s") == [(50.0, 5.0)] * 8, "from 0 at the run's start: its first update too"
    (rate,), skipped = compare_all(a, b)
    assert rate.sentence() == "step rate: A 10 steps/s, B 20 steps/s: B is 100% higher, better (+100% [+100%, " \
                              "+100%]; 500/1,000 steps, 8/8 intervals)"
    assert not skipped


def test_a_first_reading_at_the_runs_start_or_of_nothing_yet_adds_no_interval() -> None:
    rec = record("a", started=5.0)
    rec.samples["steps_total"] = totals(10.0, range(5, 55, 5), start=5.0)
    assert from_counters(rec, "steps_per_s") == [(50.0, 5.0)] * 7, "the first point is the start's own"
    rec.samples["steps_total"] = totals(10.0, range(5, 55, 5))
    assert from_counters(rec, "steps_per_s") == [(50.0, 5.0)] * 7, "read at the start: already counted since"
    rec.samples["steps_total"] = []
    assert from_counters(rec, "steps_per_s") == []
    late = record("b")
    late.samples["data_wait_seconds_total"] = totals(0.02, range(5, 55, 5))
    late.samples["loop_seconds_total"] = totals(0.1, range(5, 55, 5))
    assert len(from_counters(late, "data_wait_fraction") or []) == 8, "a first reading of 0.5 s is an update too"
    epoch = record("c", started=1000.0)
    epoch.samples["steps_total"] = totals(10.0, range(1005, 1055, 5), start=1000.0)
    assert len(from_counters(epoch, "steps_per_s") or []) == 8, "a run started at a clock's time, not at 0"


def test_the_warm_up_fraction_of_the_counters_span_is_dropped() -> None:
    rec = record("a")
    rec.samples["steps_total"] = totals(10.0, range(5, 55, 5))
    assert len(from_counters(rec, "steps_per_s", warmup_fraction=0.0) or []) == 9
    assert len(from_counters(rec, "steps_per_s", warmup_fraction=0.5) or []) == 4


def test_a_last_interval_under_half_the_usual_is_dropped_and_one_at_half_is_kept() -> None:
    rec = record("a")
    for last, kept in ((52.4, 8), (52.5, 9)):
        rec.samples["steps_total"] = [*totals(10.0, range(5, 55, 5)), (last, 10.0 * last)]
        found = from_counters(rec, "steps_per_s") or []
        assert len(found) == kept, last
    rec.samples["steps_total"] = [(0.0, 0.0), (5.0, 50.0), (10.0, 100.0), (10.1, 101.0)]
    found = from_counters(rec, "steps_per_s", warmup_fraction=0.0) or []
    assert [(n, round(s, 9)) for n, s in found] == [(50.0, 5.0), (1.0, 0.1)], "one before it: none usual yet"


def test_the_usual_interval_is_the_median_of_those_before_the_last() -> None:
    """Intervals of 4, 6, 8, 10, 12 and 2 s, then a last one: under 4 s (half the median, 8 s) it is dropped, at 4 s
    kept; of three intervals, the last under half of the others' is dropped too."""
    rec = record("a")
    times = [0.0, 1.0, 5.0, 11.0, 19.0, 29.0, 41.0, 43.0]
    for last, kept in ((3.9, 6), (4.0, 7)):
        rec.samples["steps_total"] = [(t, 10.0 * t) for t in [*times, 43.0 + last]]
        found = from_counters(rec, "steps_per_s", warmup_fraction=0.0) or []
        assert len(found) == kept, last
    rec.samples["steps_total"] = [(t, 10.0 * t) for t in (0.0, 1.0, 6.0, 11.0, 12.0)]
    assert from_counters(rec, "steps_per_s", warmup_fraction=0.0) == [(50.0, 5.0), (50.0, 5.0)]


def test_only_the_counters_kpis_are_taken_from_counters_and_only_where_recorded() -> None:
    rec = record("a")
    assert from_counters(rec, "gpu_util") is None and from_counters(rec, "steps_per_s") is None
    rec.samples["data_wait_seconds_total"] = totals(0.2, range(5, 55, 5))
    assert from_counters(rec, "data_wait_fraction") is None, "a share needs its whole too"
    rec.samples["loop_seconds_total"] = totals(0.5, range(5, 55, 5))
    assert from_counters(rec, "data_wait_fraction") == [(1.0, 2.5)] * 8, "on the whole's growth, not seconds"
    assert len(from_counters(rec, "data_wait_fraction", warmup_fraction=0.5) or []) == 4


def test_a_share_and_the_seconds_it_stands_on() -> None:
    a, b = record("a"), record("b")
    for rec, share in ((a, 0.2), (b, 0.1)):
        rec.samples["steps_total"] = totals(10.0, range(5, 55, 5))
        rec.samples["data_wait_seconds_total"] = totals(share, range(5, 55, 5))
        rec.samples["loop_seconds_total"] = totals(0.5, range(5, 55, 5))
    found = {c.kpi: c for c in compare(a, b)}
    assert found["data_wait_fraction"].sentence() == "data wait: A 40%, B 20%: B is 50% lower, better (-50% " \
        "[-50%, -50%]; 10 s/5 s waited, 8/8 intervals)"


def test_a_counter_one_run_never_moved_is_said_and_one_neither_moved_is_not() -> None:
    a, b = record("a"), record("b")
    a.samples["steps_total"] = totals(10.0, range(5, 55, 5))
    b.samples["steps_total"] = [(5.0, 0.0), (50.0, 0.0)]
    b.samples["tokens_total"] = [(5.0, 0.0), (50.0, 0.0)]
    _, skipped = compare_all(a, b)
    assert [(s.kpi, s.sentence()) for s in skipped] == [("steps_per_s", "step rate: B did none (500/0 steps, 8/0 "
                                                                        "intervals)")]
    del b.samples["steps_total"]
    assert [s.sentence() for s in compare_all(a, b)[1]] == ["step rate: B did none (500/0 steps, 8/0 intervals)"], \
        "a counter B never had"
    _, skipped = compare_all(b, a)
    assert [s.sentence() for s in skipped] == ["step rate: A did none (0/500 steps, 0/8 intervals)"]


def test_a_rate_needs_three_updates_of_its_counter_in_each_run() -> None:
    a, b = record("a"), record("b")
    a.samples["steps_total"] = totals(10.0, range(5, 55, 5))
    b.samples["steps_total"] = totals(10.0, [5.0, 10.0, 15.0])
    _, skipped = compare_all(a, b)
    assert [s.sentence() for s in skipped] == [
        "step rate: not enough data (the counter updated at too few sweeps: at least 3 each, 15 s at the default 5-s "
        "sweeps) (500/150 steps, 8/1 intervals)"]


def serving(rec: RunRecord, per_s: float, errors_per_s: float, name: str = "server_errors_total") -> None:
    rec.samples["requests_total"] = totals(per_s, range(5, 55, 5))
    rec.samples[name] = totals(errors_per_s, range(5, 55, 5))


def test_errors_per_second_and_per_request() -> None:
    a, b = record("a"), record("b")
    serving(a, 100.0, 1.0)
    serving(b, 100.0, 2.0)
    found = {c.kpi: c for c in compare(a, b)}
    assert list(found) == ["requests_per_s", "server_errors_per_s", "server_error_share"]
    per_s, share = found["server_errors_per_s"], found["server_error_share"]
    assert (per_s.value_a, per_s.value_b, per_s.ratio) == pytest.approx((1.0, 2.0, 2.0))
    assert per_s.counted == "40/80 errors in 40 s/40 s" and per_s.verdict == "worse"
    assert (share.value_a, share.value_b) == pytest.approx((0.01, 0.02))
    assert share.counted == "40/80 errors in 4,000/4,000 requests" and share.kind.label == "server errors (5xx) " \
                                                                                           "per request"
    assert (per_s.low, per_s.high) == pytest.approx((1.352, 3.001), abs=1e-3), "Clopper-Pearson's, 40 and 80"
    assert (share.low, share.high) == pytest.approx((per_s.low, per_s.high)), "the same counts, the same interval"


def test_errors_in_one_run_that_served_nothing_in_the_other_and_none_in_either() -> None:
    a, b = record("a"), record("b")
    serving(a, 100.0, 1.0)
    b.samples["requests_total"] = [(5.0, 0.0), (50.0, 0.0)]
    b.samples["server_errors_total"] = [(5.0, 0.0), (50.0, 0.0)]
    _, skipped = compare_all(a, b)
    assert ("server_errors_per_s", "server errors (5xx): B served no request") in [(s.kpi, s.sentence()) for s in
                                                                                    skipped]
    _, skipped = compare_all(b, a)
    assert "server errors (5xx): A served no request" in [s.sentence() for s in skipped]
    serving(b, 100.0, 0.0)
    serving(a, 100.0, 0.0)
    assert [c.kpi for c in compare(a, b)] == ["requests_per_s"], "no errors in either: nothing said"


def test_errors_are_counted_over_the_requests_span_however_seldom_their_counter_moved() -> None:
    """A run's ten errors all at 30 s: counted between the requests' updates, though the errors' own counter
    changed once (no span of its own); a last interval of requests cut short (the closing flush) cuts its errors."""
    a, b = record("a"), record("b")
    for rec in (a, b):
        serving(rec, 100.0, 0.0)
    b.samples["server_errors_total"] = [(float(t), 10.0 if t >= 30 else 0.0) for t in range(5, 55, 5)]
    found = {c.kpi: c for c in compare(a, b)}
    assert found["server_errors_per_s"].counted == "0/10 errors in 40 s/40 s"
    for rec in (a, b):
        rec.samples["requests_total"].append((50.5, 5050.0))
    a.samples["server_errors_total"] = [*totals(0.2, range(5, 55, 5)), (50.5, 100.0)]
    found = {c.kpi: c for c in compare(a, b)}
    assert found["server_errors_per_s"].counted == "8/10 errors in 40 s/40 s", "the last 0.5 s dropped, with its errors"


def test_client_errors_are_compared_as_their_own_class() -> None:
    a, b = record("a"), record("b")
    serving(a, 100.0, 1.0, "client_errors_total")
    serving(b, 100.0, 1.0, "client_errors_total")
    found = {c.kpi: c for c in compare(a, b)}
    assert list(found) == ["requests_per_s", "client_errors_per_s", "client_error_share"]
    assert found["client_errors_per_s"].verdict == "same"


def test_a_record_without_error_totals_compares_its_errors_per_sweep_and_says_so() -> None:
    a, b = record("a"), record("b")
    for rec, errors in ((a, 1.0), (b, 2.0)):
        rec.samples["requests_total"] = totals(100.0, range(5, 55, 5))
        rec.samples["server_errors_per_s"] = [(float(t), errors) for t in range(5, 55, 5)]
    b.samples["client_errors_total"] = totals(0.0, range(5, 55, 5))
    found = {c.kpi: c for c in compare(a, b)}
    assert found["server_errors_per_s"].note == "per sweep, each sweep weighing the same: A recorded before runs " \
                                                "kept their error counts"
    assert "server_error_share" not in found


# --- per sweep --------------------------------------------------------------------------------------------------------

def gauges(rec: RunRecord, kpi: str, values: list[float]) -> None:
    rec.samples[kpi] = [(float(t), v) for t, v in enumerate(values)]


def test_a_gauge_is_the_mean_of_its_sweeps_after_the_first_tenth() -> None:
    a, b = record("a"), record("b")
    gauges(a, "rss_bytes", [9e9] + [1e9] * 9)
    gauges(b, "rss_bytes", [9e9] + [2e9] * 9)
    (rss,), _ = compare_all(a, b)
    assert (rss.value_a, rss.value_b, rss.ratio, rss.low, rss.high) == (1e9, 2e9, 2.0, 2.0, 2.0)
    assert rss.counted == "9/9 sweeps" and rss.note == ""
    assert rss.sentence() == "job memory (RSS): A 954 MiB, B 1.86 GiB: B is 100% higher, worse (+100% [+100%, " \
                             "+100%]; 9/9 sweeps)"


def test_a_gauge_needs_five_sweeps_in_each_run_and_one_zero_in_a_has_no_ratio() -> None:
    a, b = record("a"), record("b")
    gauges(a, "gpu_util", [0.5] * 5)
    gauges(b, "gpu_util", [0.5] * 4)
    assert [(s.kpi, s.sentence()) for s in compare_all(a, b)[1]] == [
        ("gpu_util", "GPU utilisation: not enough data (at least 5 sweeps each after warm-up) (5/4 sweeps)")]
    assert compare_all(b, a)[1][0].counted == "4/5 sweeps"
    gauges(b, "gpu_util", [0.5] * 5)
    assert [c.kpi for c in compare(a, b)] == ["gpu_util"], "five each: compared"
    gauges(a, "gpu_util", [0.0] * 5)
    assert [(s.kpi, s.sentence()) for s in compare_all(a, b)[1]] == [
        ("gpu_util", "GPU utilisation: zero throughout A, B 50% (5/5 sweeps)")]
    gauges(b, "gpu_util", [0.0] * 6)
    assert compare_all(a, b) == ([], []), "zero in both: nothing to say"


def test_a_sweep_that_read_nothing_finite_is_left_out() -> None:
    rec = record("a")
    gauges(rec, "gpu_util", [math.nan, 0.5, math.inf, 0.25])
    assert steady(rec, "gpu_util") == [0.5, 0.25]
    gauges(rec, "gpu_util", [0.1 * i for i in range(20)])
    assert steady(rec, "gpu_util") == [0.1 * i for i in range(2, 20)]
    assert steady(rec, "gpu_util", warmup_fraction=0.5) == [0.1 * i for i in range(10, 20)]


def test_a_kpi_counts_only_the_sweeps_of_its_phase() -> None:
    rec = record("a")
    gauges(rec, "steps_per_s", [1.0] * 5 + [0.0] * 5)
    gauges(rec, "requests_per_s", [0.0] * 8 + [3.0] * 2)
    gauges(rec, "step_time_s", [0.1 * (i + 1) for i in range(10)])
    gauges(rec, "latency_p50_s", [0.1 * (i + 1) for i in range(10)])
    gauges(rec, "rss_bytes", [float(i) for i in range(10)])
    assert steady(rec, "step_time_s", warmup_fraction=0.0) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert steady(rec, "latency_p50_s", warmup_fraction=0.0) == pytest.approx([0.9, 1.0])
    assert steady(rec, "rss_bytes", warmup_fraction=0.0) == [0.0, 1.0, 2.0, 3.0, 4.0, 8.0, 9.0], "either phase"
    idle = record("b")
    gauges(idle, "rss_bytes", [1.0, 2.0])
    assert steady(idle, "rss_bytes", warmup_fraction=0.0) == [1.0, 2.0], "no activity at all: every sweep"


def test_the_per_sweep_bootstrap_resamples_whole_sweeps() -> None:
    assert bootstrap_ratio([2.0] * 5, [3.0] * 5) == (1.5, 1.5, 1.5)
    ratio, low, high = bootstrap_ratio([1.0, 2.0, 3.0], [2.0, 4.0, 6.0], resamples=400, seed=3)
    assert ratio == 2.0 and low < 2.0 < high and high / low > 1.5, "A and B resampled apart"
    xa, xb = [1.0 + 0.1 * i for i in range(20)], [2.0 + 0.3 * (i % 7) for i in range(20)]
    seeded = bootstrap_ratio(xa, xb, resamples=400, seed=3)
    assert bootstrap_ratio(xa, xb, resamples=400, seed=3) == seeded, "the same draws from the same seed"
    assert bootstrap_ratio(xa, xb, resamples=400, seed=4) != seeded
    narrow = bootstrap_ratio([1.0, 2.0, 3.0], [2.0, 4.0, 6.0], resamples=400, seed=3, level=0.5)
    assert low < narrow[1] <= narrow[2] < high


# --- which way each record is compared ------------------------------------------------------------------------------

def test_records_from_before_distributions_and_counters_say_so_on_every_line() -> None:
    old, new = record("old"), record("new")
    for rec in (old, new):
        gauges(rec, "step_time_s", [0.1] * 10)
        gauges(rec, "steps_per_s", [10.0] * 10)
    new.distributions["data_wait"] = parts([0.01] * 40, 0)
    new.samples["steps_total"] = totals(10.0, range(5, 55, 5))
    found = {c.kpi: c for c in compare(old, new)}
    assert list(found) == ["step_time_s", "steps_per_s"]
    assert found["step_time_s"].note == "per sweep, each sweep weighing the same: A recorded before runs kept " \
                                        "their distributions"
    assert found["steps_per_s"].note == "per sweep, each sweep weighing the same: A recorded before runs kept " \
                                        "their counters"
    found = {c.kpi: c for c in compare(new, old)}
    assert found["steps_per_s"].note.endswith(": B recorded before runs kept their counters")
    both_old = {c.kpi: c for c in compare(old, old)}
    assert both_old["step_time_s"].note.endswith(": A and B recorded before runs kept their distributions")


def test_every_statistic_in_the_order_a_person_reads_them() -> None:
    a, b = record("a"), record("b")
    for rec in (a, b):
        rec.distributions["step_time"] = parts([0.01] * 400, 0)
        rec.distributions["data_wait"] = parts([0.002] * 400, 0)
        rec.distributions["latency"] = parts([0.003] * 400, 0)
        rec.distributions["ttft"] = parts([0.05] * 400, 0)
        rec.distributions["inter_token"] = parts([0.004] * 400, 0)
        rec.samples["steps_total"] = totals(10.0, range(5, 55, 5))
        rec.samples["samples_total"] = totals(320.0, range(5, 55, 5))
        rec.samples["tokens_total"] = totals(5000.0, range(5, 55, 5))
        rec.samples["data_wait_seconds_total"] = totals(0.02, range(5, 55, 5))
        rec.samples["loop_seconds_total"] = totals(1.0, range(5, 55, 5))
        rec.samples["flops_peak_seconds_total"] = totals(0.4, range(5, 55, 5))
        rec.samples["flops_timed_seconds_total"] = totals(1.0, range(5, 55, 5))
        serving(rec, 100.0, 1.0)
        gauges(rec, "steps_per_s", [10.0] * 10)
        gauges(rec, "requests_per_s", [100.0] * 10)
        gauges(rec, "step_time_s", [0.01] * 10)
        gauges(rec, "server_errors_per_s", [1.0] * 10)
        gauges(rec, "gpu_util", [0.5] * 10)
        gauges(rec, "process_cpu_cores", [1.0] * 10)
    done, skipped = compare_all(a, b)
    assert [c.kpi for c in done] == [
        "step_time p50", "step_time mean", "step_time p99", "steps_per_s", "samples_per_s", "tokens_per_s",
        "data_wait p50", "data_wait mean", "data_wait_fraction", "mfu", "latency p50", "latency p90",
        "latency p99", "latency mean", "ttft p50", "ttft p99", "inter_token p50", "inter_token p99",
        "requests_per_s", "server_errors_per_s", "server_error_share", "process_cpu_cores", "gpu_util"]
    assert not skipped and all(c.note == "" for c in done)
    assert {c.verdict for c in done} == {"same"}
    assert cmp.compare(a, b) == done
