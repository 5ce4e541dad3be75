"""Quantiles of histograms: from the log-bucketed sketch where the histogram has one (within 1.08% of the
value of that rank, outrider/sketch.py), else as Prometheus's histogram_quantile() computes them from classic
buckets: linear interpolation inside the bucket that holds the rank; the highest finite bound when the rank falls
in the +Inf bucket. Every percentile Outrider prints comes from `quantile`. And the median of a few values, as
`statistics.median` computes it (that module, with the `fractions` and `decimal` it imports, is 0.4 MiB of the
agent's RSS for one function)."""

from __future__ import annotations

from collections.abc import Iterable

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
    """As Prometheus's histogram_quantile() over classic buckets."""
    total = h.count
    if total == 0 or not 0 <= q <= 1:
        return None
    rank = q * total
    cumulative = h.cumulative()
    for i, cum in enumerate(cumulative):
        if cum >= rank:
            if i == len(h.bounds):  # the +Inf bucket
                return h.bounds[-1] if h.bounds else None
            lower = h.bounds[i - 1] if i > 0 else 0.0
            below = cumulative[i - 1] if i > 0 else 0
            in_bucket = cum - below
            if in_bucket == 0:
                return h.bounds[i]
            return lower + (h.bounds[i] - lower) * (rank - below) / in_bucket
    return None
