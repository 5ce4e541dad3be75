"""histogram_quantile matches Prometheus's interpolation."""

from __future__ import annotations

import math
from itertools import accumulate

import pytest

from outrider.metrics.family import HistogramValue
from outrider.metrics.quantile import histogram_quantile, quantile
from outrider.rules.promql import bucket_quantile
from outrider.shared.sketch import Sketch


def test_interpolates_inside_the_bucket() -> None:
    h = HistogramValue(bounds=(0.1, 0.2, 0.4), counts=(10, 10, 20, 0), sum=5.0)
    assert histogram_quantile(0.25, h) == pytest.approx(0.1)      # rank 10: top of the first bucket
    assert histogram_quantile(0.5, h) == pytest.approx(0.2)
    assert histogram_quantile(0.75, h) == pytest.approx(0.3)      # halfway through (0.2, 0.4]
    assert histogram_quantile(0.05, h) == pytest.approx(0.02)     # the first bucket starts at 0


def test_inf_bucket_gives_the_highest_finite_bound_and_empty_gives_none() -> None:
    h = HistogramValue(bounds=(0.1, 1.0), counts=(1, 1, 8), sum=50.0)
    assert histogram_quantile(0.99, h) == 1.0
    assert histogram_quantile(0.5, HistogramValue((0.1,), (0, 0), 0.0)) is None


# Bucket layouts at each edge of the interpolation: a first bound below, at and above 0, an empty first bucket,
# empty buckets between, one finite bucket only, all of it in +Inf; each at the ranks 0, inside, at a bound and 1.
@pytest.mark.parametrize(("bounds", "counts"), [
    ((0.1, 0.2, 0.4), (10, 10, 20, 0)), ((-1.0, 1.0), (5, 3, 2)), ((0.0, 1.0), (0, 4, 6)), ((1.0,), (0, 10)),
    ((1.0, 2.0, 4.0), (0, 5, 0, 5)), ((1.0, 2.0), (0, 0, 7)), ((-2.0, -1.0), (3, 0, 0)), ((0.5,), (4, 0)),
])
@pytest.mark.parametrize("q", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
def test_a_histograms_quantile_is_the_rules_histogram_quantile(bounds: tuple[float, ...], counts: tuple[int, ...],
                                                               q: float) -> None:
    """Reports and summaries print what an alert rule on the same buckets reads (Prometheus's, checked by promtool
    in tests/rules), NaN there being None here."""
    rules = bucket_quantile(q, list(zip((*bounds, math.inf), map(float, accumulate(counts)))))
    ours = histogram_quantile(q, HistogramValue(bounds, counts, 0.0))
    assert (None if math.isnan(rules) else rules) == ours


def test_the_median_is_statistics_median() -> None:
    """statistics (the oracle here) is not imported by the agent: its median is metrics/quantile.median."""
    import random
    import statistics

    from outrider.metrics.quantile import median

    rnd = random.Random(7)
    for n in range(1, 40):
        values = [rnd.choice([rnd.random(), rnd.randint(-3, 3), 0.5]) for _ in range(n)]
        assert median(values) == statistics.median(values), values
        assert median(iter(values)) == statistics.median(values)
    with pytest.raises(ValueError):
        median([])


# Prometheus's histogram_quantile worked by hand, so that the interpolation is pinned by values, not only by the
# rules' bucket_quantile (which computes it with the same bucket_value): (bounds, counts, q, the value; None: NaN)
WORKED = [
    ((0.1, 0.2, 0.4), (10, 10, 20, 0), 0.0, 0.0),     # rank 0 in a first bucket that starts at 0
    ((0.1, 0.2, 0.4), (10, 10, 20, 0), 0.25, 0.1),    # rank 10: the first bucket's top
    ((0.1, 0.2, 0.4), (10, 10, 20, 0), 0.3, 0.12),    # rank 12: 2 of 10 into (0.1, 0.2]
    ((0.1, 0.2, 0.4), (10, 10, 20, 0), 0.75, 0.3),    # rank 30: 10 of 20 into (0.2, 0.4]
    ((0.1, 0.2, 0.4), (10, 10, 20, 0), 1.0, 0.4),     # rank 40: the last finite bucket's top
    ((0.1, 1.0), (1, 1, 8), 0.15, 0.55),              # rank 1.5: half of (0.1, 1.0]
    ((0.1, 1.0), (1, 1, 8), 0.99, 1.0),               # in +Inf: the highest finite bound
    ((1.0, 2.0), (1, 0, 1), 0.5, 1.0),                # rank 1 is the first bucket's, not the empty next one's
    ((-1.0, 1.0), (5, 3, 2), 0.2, -1.0),              # in a first bucket whose bound is below 0: that bound
    ((0.0, 1.0), (0, 4, 6), 0.0, 0.0),                # ... or is 0, even when it is empty
    ((0.0, 1.0), (0, 4, 6), 0.2, 0.5),                # rank 2: half of (0, 1]
    ((1.0,), (0, 10), 0.0, None),                     # rank 0 in an empty first bucket: Go's 0/0
    ((1.0, 2.0), (0, 0, 7), 0.0, None),
    ((1.0, 2.0), (0, 0, 7), 0.5, 2.0),                # all of it in +Inf
    ((1.0, 2.0, 4.0), (0, 5, 0, 5), 0.25, 1.5),       # rank 2.5 in (1, 2] after an empty first bucket
    ((1.0, 2.0, 4.0), (0, 5, 0, 5), 0.5, 2.0),
    ((1.0, 2.0, 4.0), (0, 5, 0, 5), 0.6, 4.0),        # rank 6: past every finite bucket's count
    ((0.5,), (4, 0), 0.5, 0.25),                      # one finite bucket
    ((0.5,), (4, 0), 1.0, 0.5),
]


@pytest.mark.parametrize(("bounds", "counts", "q", "value"), WORKED)
def test_a_classic_histograms_quantile_is_prometheus_interpolation(bounds: tuple[float, ...],
                                                                   counts: tuple[int, ...], q: float,
                                                                   value: float | None) -> None:
    ours = histogram_quantile(q, HistogramValue(bounds, counts, 0.0))
    assert ours == (None if value is None else pytest.approx(value, abs=1e-12))


@pytest.mark.parametrize("q", [-0.01, 1.01, math.nan, -math.inf, math.inf])
def test_a_quantile_outside_0_to_1_is_none(q: float) -> None:
    h = HistogramValue(bounds=(0.1, 1.0), counts=(1, 1, 8), sum=50.0)
    assert histogram_quantile(q, h) is None
    assert quantile(q, h) is None


def test_a_histogram_with_the_inf_bucket_only_or_no_values_has_no_quantile() -> None:
    assert histogram_quantile(0.5, HistogramValue((), (5,), 1.0)) is None  # Prometheus: NaN
    assert histogram_quantile(0.5, HistogramValue((1.0,), (0, 0), 0.0)) is None
    assert histogram_quantile(0.5, HistogramValue((0.0, 1.0), (0, 0, 0), 0.0)) is None  # not the bound at 0


def test_one_value_has_quantiles() -> None:
    one = HistogramValue((1.0, 2.0), (0, 1, 0), 1.5)
    assert [histogram_quantile(q, one) for q in (0.25, 0.5, 1.0)] == [1.25, 1.5, 2.0]


def test_the_quantile_is_the_sketchs_where_there_is_one_with_values() -> None:
    """The sketch (within 1.08%) where it holds values; the classic buckets (here one wide bucket: 500 for the
    median of 1..100) where it is absent or empty."""
    values = [float(i) for i in range(1, 101)]
    classic = HistogramValue((1000.0,), (100, 0), sum(values))
    sketched = HistogramValue((1000.0,), (100, 0), sum(values), Sketch.of_values(values))
    assert quantile(0.5, classic) == pytest.approx(500.0)
    assert quantile(0.5, sketched) == Sketch.of_values(values).quantile(0.5) == pytest.approx(50, rel=0.0108)
    assert quantile(0.99, sketched) == pytest.approx(99, rel=0.0108)
    empty = HistogramValue((1000.0,), (100, 0), sum(values), Sketch.of_values([]))
    assert quantile(0.5, empty) == pytest.approx(500.0)


def test_the_median_of_nothing_says_so() -> None:
    from outrider.metrics.quantile import median

    with pytest.raises(ValueError, match=r"^no values to take the median of$"):
        median(iter(()))
    assert median([3.0]) == 3.0 and median([4.0, 1.0]) == 2.5 and median([5.0, 1.0, 3.0]) == 3.0
