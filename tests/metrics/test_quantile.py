"""histogram_quantile matches Prometheus's interpolation."""

from __future__ import annotations

import pytest

from outrider.metrics.family import HistogramValue
from outrider.metrics.quantile import histogram_quantile


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
