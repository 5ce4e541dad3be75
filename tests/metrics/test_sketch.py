"""The log-bucketed sketch (outrider/shared/sketch.py), value by value: its buckets are OpenTelemetry's exponential
buckets at scale 5 (checked against the OpenTelemetry SDK's own exponential aggregation), every value is within 1.08% of
its bucket's representative, a batch counts as each value alone does, and quantiles are nearest-rank."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outrider.shared import sketch
from outrider.shared.sketch import (
    MAX_INDEX,
    MAX_VALUE,
    MIN_INDEX,
    MIN_VALUE,
    RELATIVE_ERROR,
    SCALE,
    Sketch,
    add_sorted,
    downscale,
    index,
    lower_bound,
    representative,
    upper_bound,
)


def test_the_scale_gives_the_documented_error_and_range() -> None:
    assert SCALE == 5 and sketch.BASE == 2 ** (1 / 32)
    assert pytest.approx(0.010830, abs=1e-6) == RELATIVE_ERROR
    assert (MIN_INDEX, MAX_INDEX) == (-957, 637) and MAX_INDEX - MIN_INDEX + 1 == 1595
    assert lower_bound(MIN_INDEX) < MIN_VALUE <= upper_bound(MIN_INDEX)
    assert lower_bound(MAX_INDEX) < MAX_VALUE <= upper_bound(MAX_INDEX)


@pytest.mark.parametrize(("value", "i"), [(1.0, -1), (2.0, 31), (0.5, -33), (0.25, -65), (1024.0, 319)])
def test_a_power_of_two_closes_its_bucket(value: float, i: int) -> None:
    assert index(value) == i and upper_bound(i) == value
    assert index(math.nextafter(value, math.inf)) == i + 1
    assert index(math.nextafter(value, 0.0)) == i


@pytest.mark.parametrize("value", [0.0, -1.0, MIN_VALUE, 1e-12, float("nan"), -math.inf])
def test_the_zero_bucket_takes_what_is_not_above_a_nanosecond(value: float) -> None:
    assert index(value) is None


def test_values_past_the_range_are_clamped_to_its_ends() -> None:
    assert index(MAX_VALUE) == index(1e12) == index(math.inf) == MAX_INDEX
    assert index(math.nextafter(MIN_VALUE, 1.0)) == MIN_INDEX
    assert index(MIN_VALUE * 1.0001) == MIN_INDEX


def test_every_value_is_within_the_relative_error_of_its_representative() -> None:
    rng = random.Random(3)
    worst = 0.0
    for _ in range(50_000):
        v = math.exp(rng.uniform(math.log(1e-5), math.log(3600)))
        i = index(v)
        assert i is not None and lower_bound(i) < v <= upper_bound(i)
        worst = max(worst, abs(representative(i) / v - 1))
    assert worst <= RELATIVE_ERROR and worst > 0.99 * RELATIVE_ERROR, "the bound is reached at the bucket ends"


def test_the_buckets_are_the_opentelemetry_sdks_exponential_buckets() -> None:
    """The SDK's exponential aggregation at scale 5 (max_scale=5) puts each value in the same bucket."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View

    rng = random.Random(5)
    values = [math.exp(rng.uniform(math.log(1e-4), math.log(100))) for _ in range(300)] + [1.0, 0.5, 4.0]
    for v in values:
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader], views=[View(
            instrument_name="d", aggregation=ExponentialBucketHistogramAggregation(max_size=160, max_scale=5))])
        provider.get_meter("t").create_histogram("d").record(v)
        point = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]
        assert point.scale == 5
        assert point.positive.offset == index(v), v
        provider.shutdown()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=-1.0, max_value=2e6, allow_nan=False), max_size=60))
def test_a_sorted_batch_counts_as_each_value_alone(values: list[float]) -> None:
    buckets: dict[int, float] = {}
    zero = add_sorted(sorted(values), buckets)
    alone: dict[int, float] = {}
    for v in values:
        i = index(v)
        if i is not None:
            alone[i] = alone.get(i, 0.0) + 1
    assert zero == sum(1 for v in values if index(v) is None)
    assert buckets == alone


def test_a_batch_adds_to_what_its_buckets_hold() -> None:
    buckets = {index(0.01): 5.0}
    add_sorted([0.01, 0.02], buckets)
    assert buckets == {index(0.01): 6.0, index(0.02): 1.0}


def test_of_keeps_positive_whole_counts_in_order_read_only() -> None:
    s = Sketch.of(2.0, {5: 3.0, -2: 1.0, 7: 0.0})
    assert s == Sketch.of(2, [(-2, 1), (5, 3)]) and list(s.buckets) == [-2, 5] and s.count == 6
    with pytest.raises(TypeError):
        s.buckets[1] = 1  # type: ignore[index]


def test_adding_merges_bucket_by_bucket_and_since_subtracts_floored_at_zero() -> None:
    a, b = Sketch.of_values([0.01, 0.01, 0.5, 0.0]), Sketch.of_values([0.01, 2.0, 0.0, 0.0])
    both = a + b
    assert both == Sketch.of_values([0.01, 0.01, 0.5, 0.0, 0.01, 2.0, 0.0, 0.0]) and both.count == 8
    assert both.since(a) == b and both.since(b) == a and both.since(both) == Sketch()
    restarted = Sketch.of_values([0.01])
    assert restarted.since(a) == Sketch(), "a bucket that went down adds nothing, nor does the zero bucket"


@pytest.mark.parametrize("q", [0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 1.0])
def test_quantiles_are_the_nearest_ranks_value_within_the_error(q: float) -> None:
    rng = random.Random(11)
    values = sorted(rng.lognormvariate(-4, 1.2) for _ in range(1001))
    truth = values[max(1, math.ceil(q * len(values))) - 1]
    got = Sketch.of_values(values).quantile(q)
    assert got is not None and abs(got / truth - 1) <= RELATIVE_ERROR


def test_quantiles_of_the_zero_bucket_empty_sketches_and_bad_qs() -> None:
    s = Sketch.of_values([0.0, 0.0, 0.0, 1.0])
    assert s.quantile(0.75) == 0.0 and s.quantile(0.76) == representative(index(1.0) or 0)
    assert Sketch().quantile(0.5) is None and s.quantile(-0.1) is None and s.quantile(1.1) is None
    assert Sketch.of_values([0.02]).quantile(0.0) == representative(index(0.02) or 0), "rank 1 at q = 0"


def test_points_and_mean() -> None:
    s = Sketch.of_values([0.0, 0.01, 0.01, 0.04])
    assert s.points() == [(0.0, 1), (representative(index(0.01) or 0), 2), (representative(index(0.04) or 0), 1)]
    mean = s.mean()
    assert mean is not None and abs(mean / 0.015 - 1) <= RELATIVE_ERROR
    assert Sketch().mean() is None and Sketch().points() == []


def test_downscaling_moves_every_count_into_the_coarser_bucket_holding_it() -> None:
    assert downscale({-3: 1, -2: 2, -1: 3, 0: 4, 1: 5}, 1) == {-2: 1, -1: 5, 0: 9}, "(b^-3, b^-2] is in (b^-4, b^-2]"
    assert downscale({5: 1}, 0) == {5: 1} and downscale({7: 2}, -1) == {7: 2}


def test_another_sources_buckets_at_a_finer_scale_are_ours_exactly_and_coarser_ones_are_not() -> None:
    v = 0.0123
    fine = 8
    i = math.ceil(math.log2(v) * 2 ** fine) - 1  # the value's bucket at scale 8
    got = Sketch.at_scale(fine, 1, {i: 3, i + 1: 2})
    assert got is not None and got.zero == 1 and sum(got.buckets.values()) == 5
    assert set(got.buckets) <= {index(v), (index(v) or 0) + 1}
    assert Sketch.at_scale(SCALE, 0, {10: 1}) == Sketch.of(0, {10: 1})
    assert Sketch.at_scale(4, 0, {10: 1}) is None, "coarser buckets straddle ours"
    assert Sketch.at_scale(SCALE, 0, {MAX_INDEX + 1: 1}) is None and Sketch.at_scale(SCALE, 0, {MIN_INDEX - 1: 1}) \
        is None, "counts past the range cannot be clamped"


def test_every_bucket_bound_closes_its_bucket_and_the_next_float_opens_the_next() -> None:
    """log2 of a computed bound can round either way: the bucket is checked against the bounds themselves. A batch
    chooses a bucket only for the first value it has not counted yet, so each bound is also counted first in its
    batch (glibc's log2 rounds up past 20 of them, 2**(-30/32) to 2**(30/32): the bound is moved back into the
    bucket it closes)."""
    rounded_up = 0
    for i in range(MIN_INDEX, MAX_INDEX):
        u = upper_bound(i)
        above = math.nextafter(u, math.inf)
        assert index(u) == i and index(above) == i + 1, i
        buckets: dict[int, float] = {}
        add_sorted([math.nextafter(u, 0.0), u, above], buckets)
        assert buckets == {i: 2.0, i + 1: 1.0}, i
        first: dict[int, float] = {}
        add_sorted([u, above], first)
        assert first == {i: 1.0, i + 1: 1.0}, i
        rounded_up += math.ceil(math.log2(u) * 2**SCALE) - 1 > i
    assert rounded_up, "some bound's log2 rounds up, so the check that moves it back is exercised"


def test_values_just_above_the_zero_buckets_threshold_are_in_the_first_bucket() -> None:
    values = [math.nextafter(MIN_VALUE, 1.0), MIN_VALUE * 1.001, upper_bound(MIN_INDEX)]
    buckets: dict[int, float] = {}
    assert add_sorted(values, buckets) == 0 and buckets == {MIN_INDEX: 3.0}
    assert add_sorted([MIN_VALUE, upper_bound(MIN_INDEX + 1)], buckets) == 1
    assert buckets == {MIN_INDEX: 3.0, MIN_INDEX + 1: 1.0}


def test_the_ends_of_the_range_are_in_it_and_empty_buckets_beyond_them_do_not_matter() -> None:
    assert Sketch.at_scale(SCALE, 0, {MIN_INDEX: 1, MAX_INDEX: 2}) == Sketch.of(0, {MIN_INDEX: 1, MAX_INDEX: 2})
    assert Sketch.at_scale(SCALE, 0, {MIN_INDEX - 1: 0, 3: 1, MAX_INDEX + 1: 0}) == Sketch.of(0, {3: 1})


def test_a_quantile_in_the_last_bucket_and_in_the_one_before() -> None:
    s = Sketch.of_values([0.01] * 3 + [0.02] * 2 + [0.04])
    assert s.quantile(0.5) == representative(index(0.01) or 0)
    assert s.quantile(0.8) == representative(index(0.02) or 0)
    assert s.quantile(0.9) == s.quantile(1.0) == representative(index(0.04) or 0)
