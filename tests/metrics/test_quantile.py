"""histogram_quantile matches Prometheus's interpolation."""

from __future__ import annotations

import math
from itertools import accumulate

import pytest

from outrider.metrics.family import HistogramValue
from outrider.metrics.quantile import histogram_quantile
from outrider.rules.promql import bucket_quantile


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
