"""Quantiles of histograms: from the log-bucketed sketch where the histogram has one (within 1.08% of the
value of that rank, outrider/shared/sketch.py), else as Prometheus's histogram_quantile() computes them from classic
buckets (`bucket_value`, which the rules' PromQL evaluator uses too): linear interpolation inside the bucket that
holds the rank; the highest finite bound when the rank falls in the +Inf bucket. Every percentile Outrider prints
comes from `quantile`. And the median of a few values, as `statistics.median` computes it (that module, with the
`fractions` and `decimal` it imports, is 0.4 MiB of the agent's RSS for one function)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from outrider.metrics.family import HistogramValue


def median(values: Iterable[float]) -> float:
    """The middle value, or the mean of the two middle ones; ValueError when there is none."""
    data = sorted(values)
    n = len(data)
    if not n:
        raise ValueError("no values to take the median of")
    mid = n // 2
    return data[mid] if n % 2 else (data[mid - 1] + data[mid]) / 2


def quantile(q: float, h: HistogramValue) -> float | None:
    """The q-quantile of the values a histogram holds: its sketch's where it has one, else its classic buckets'."""
    if h.sketch is not None and h.sketch.count:
        return h.sketch.quantile(q)
    return histogram_quantile(q, h)


def histogram_quantile(q: float, h: HistogramValue) -> float | None:
    """As Prometheus's histogram_quantile() over classic buckets; None where it says NaN or +-Inf."""
    total = h.count
    if total == 0 or not 0 <= q <= 1 or not h.bounds:
        return None
    value = bucket_value(q * total, (*h.bounds, math.inf), h.cumulative())
    return None if math.isnan(value) else value


def bucket_value(rank: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float:
    """The value of this rank among the cumulative counts of buckets with these upper bounds, ascending, at least
    two, the last +Inf, the counts never falling: Prometheus's bucketQuantile past its checks of the buckets (the
    rules' histogram_quantile makes them, rules/promql.py). Linear interpolation inside the bucket that holds the
    rank, from 0 in the first one (its bound when that is 0 or less), the highest finite bound in +Inf."""
    # sort.Search over all but the last bucket, as Prometheus does: none found means the last (also when counts
    # are negative, as arithmetic on histogram series can make them)
    b = next((i for i, c in enumerate(cumulative[:-1]) if c >= rank), len(cumulative) - 1)
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], cumulative[b]
    if b > 0:
        start = bounds[b - 1]
        count -= cumulative[b - 1]
        rank -= cumulative[b - 1]
    if count == 0:  # rank 0 (q = 0) in an empty first bucket: Go's 0/0
        return math.nan
    return start + (end - start) * (rank / count)
