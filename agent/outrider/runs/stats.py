"""The statistics `outrider compare` judges two runs with, standard library only: intervals for the ratio of run B's
statistic to run A's, at LEVEL (95%), from the steps and requests themselves and from counts over time.

- Distributions (step time, data wait, request latency): a Poisson bootstrap over the items a sketch holds. Every
  recorded step is counted Poisson(1) times in a resample, so a bucket holding c steps holds Poisson(c) in it: one
  draw per bucket, O(buckets) per resample whatever the number of steps (Hanley & MacGibbon 2006: the Poisson
  bootstrap, asymptotically the multinomial one). Each resample gives every statistic at once (quantiles at the
  sketch's ranks, the mean); resamples of A and B are independent, and the interval is the percentile interval of
  their ratios.
- Ratios of sums over intervals of time (a counter's growth over seconds: steps/s; a part over its whole: the data
  wait's share): the ratio-of-sums estimate with its linearised variance, on the log scale, and Student's t with
  Welch's degrees of freedom, so a run whose counters were read six times still has an honest interval.
- Rare events (errors): the exact conditional interval of a ratio of Poisson rates (given the total, B's count is
  binomial; Clopper-Pearson), defined when run A had none.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import mul

from outrider.shared.sketch import quantile_rank

LEVEL = 0.95
RESAMPLES = 2000
SEED = 7
NORMAL_ABOVE = 1000.0  # a bucket holding more is drawn from the normal approximation of its Poisson (skew < 3%)
MEAN = "mean"
Statistic = float | str  # a quantile (0 < q < 1) or MEAN


@dataclass(frozen=True)
class Interval:
    """B's statistic over A's (ratio), and the interval around it (low may be 0, high infinite)."""

    ratio: float
    low: float
    high: float

    @property
    def significant(self) -> bool:
        return not self.low <= 1.0 <= self.high


class _Buckets:
    """A distribution as (value, count) points, ready to be resampled."""

    def __init__(self, points: Sequence[tuple[float, int]]) -> None:
        kept = [(v, c) for v, c in points if c > 0]
        self.values = [v for v, _ in kept]
        self.counts = [c for _, c in kept]
        # per bucket: (first count of its table, cumulative Poisson probabilities) or None: the normal approximation
        self.tables = [_poisson_table(c) if c <= NORMAL_ABOVE else None for c in self.counts]

    def draw(self, rng: random.Random) -> list[int]:
        out = []
        uniform, gauss = rng.random, rng.gauss
        for c, table in zip(self.counts, self.tables):
            if table is None:
                out.append(max(0, round(c + math.sqrt(c) * gauss())))
            else:
                first, cumulative = table
                out.append(first + min(len(cumulative) - 1, bisect_left(cumulative, uniform())))
        return out

    def statistics(self, counts: Sequence[int], stats: Sequence[Statistic]) -> list[float] | None:
        """Each statistic of the items counted so; None when there are none. A quantile is the value of the rank
        Sketch.quantile reads (sketch.quantile_rank)."""
        cumulative = list(accumulate(counts))
        total = cumulative[-1] if cumulative else 0
        if total <= 0:
            return None
        out = []
        for s in stats:
            if s == MEAN:
                out.append(sum(map(mul, counts, self.values)) / total)
            else:
                rank = quantile_rank(float(s), total)
                out.append(self.values[min(len(self.values) - 1, bisect_left(cumulative, rank))])
        return out


def _poisson_table(mu: float) -> tuple[int, list[float]]:
    """The cumulative probabilities of Poisson(mu) from mu - 10 sd - 10 to mu + 10 sd + 10 (the rest: < 1e-20)."""
    spread = 10.0 * math.sqrt(mu) + 10.0
    first, last = max(0, int(mu - spread)), int(mu + spread) + 1
    log_mu = math.log(mu)
    cumulative, total = [], 0.0
    for k in range(first, last + 1):
        total += math.exp(k * log_mu - mu - math.lgamma(k + 1))
        cumulative.append(total)
    return first, [p / total for p in cumulative]


def bootstrap(points: Sequence[tuple[float, int]], stats: Sequence[Statistic], resamples: int = RESAMPLES,
              seed: int = SEED) -> list[list[float]]:
    """For each statistic, its value in each of `resamples` Poisson-bootstrap resamples of the points ((value,
    count) pairs: Sketch.points()); resamples that drew no item are left out."""
    buckets = _Buckets(points)
    rng = random.Random(seed)
    out: list[list[float]] = [[] for _ in stats]
    for _ in range(resamples):
        values = buckets.statistics(buckets.draw(rng), stats)
        if values is None:
            continue
        for column, v in zip(out, values):
            column.append(v)
    return out


def of_points(points: Sequence[tuple[float, int]], stats: Sequence[Statistic]) -> list[float] | None:
    """The statistics of the points themselves."""
    buckets = _Buckets(points)
    return buckets.statistics(buckets.counts, stats)


def percentile_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of b[i] / a[i] over paired resamples (pairs where a[i] is 0 are left out)."""
    ratios = sorted(y / x for x, y in zip(a, b) if x > 0)
    if not ratios:
        return 0.0, math.inf
    tail = (1.0 - level) / 2.0
    return ratios[int(tail * (len(ratios) - 1))], ratios[math.ceil((1.0 - tail) * (len(ratios) - 1))]


@dataclass(frozen=True)
class SumsRatio:
    """A ratio of sums over intervals (sum of parts over sum of wholes), its variance on the log scale, and the
    number of intervals."""

    value: float
    log_var: float
    n: int


def sums_ratio(intervals: Sequence[tuple[float, float]]) -> SumsRatio | None:
    """(part, whole) intervals -> the ratio of their sums and the linearised variance of its log (the ratio
    estimator's: residuals part - R * whole, n / (n - 1) of their squares over the squared sum of wholes); None
    with fewer than two intervals, or nothing in either sum."""
    n = len(intervals)
    parts, wholes = sum(p for p, _ in intervals), sum(w for _, w in intervals)
    if n < 2 or parts <= 0 or wholes <= 0:
        return None
    r = parts / wholes
    residuals = sum((p - r * w) ** 2 for p, w in intervals)
    return SumsRatio(r, n / (n - 1) * residuals / (wholes * wholes) / (r * r), n)


def sums_ratio_interval(a: SumsRatio, b: SumsRatio, level: float = LEVEL) -> Interval:
    """B's ratio of sums over A's: log difference +- Student's t (Welch-Satterthwaite degrees of freedom)."""
    var = a.log_var + b.log_var
    point = b.value / a.value
    if var <= 0:
        return Interval(point, point, point)
    df = var * var / (a.log_var**2 / (a.n - 1) + b.log_var**2 / (b.n - 1))
    half = t_quantile(0.5 + level / 2.0, df) * math.sqrt(var)
    return Interval(point, point * math.exp(-half), point * math.exp(half))


def poisson_ratio_interval(count_a: float, exposure_a: float, count_b: float, exposure_b: float,
                           level: float = LEVEL) -> Interval:
    """The ratio of two Poisson rates (count_b / exposure_b over count_a / exposure_a) with the exact conditional
    interval: given the total, B's count is binomial with p = rho e_b / (e_a + rho e_b) (Clopper-Pearson on p).
    With no event in A the ratio and the high end are infinite, the low end still says how much more B had."""
    na, nb = round(count_a), round(count_b)
    alpha = 1.0 - level
    scale = exposure_a / exposure_b
    point = nb / na * scale if na else math.inf
    p_low = beta_quantile(alpha / 2.0, nb, na + 1) if nb else 0.0
    p_high = beta_quantile(1.0 - alpha / 2.0, nb + 1, na) if na else 1.0
    low = p_low / (1.0 - p_low) * scale if p_low < 1.0 else math.inf
    high = p_high / (1.0 - p_high) * scale if p_high < 1.0 else math.inf
    return Interval(point, low, high)


# --- distribution functions: the regularised incomplete beta, Student's t, the beta quantile -------------------

def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) (continued fraction, modified Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (0.5 < p < 1), by bisection on its distribution function."""
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * high:
            break
    return (low + high) / 2.0


def beta_quantile(p: float, a: float, b: float) -> float:
    """The x with I_x(a, b) = p, by bisection."""
    low, high = 0.0, 1.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if betainc(a, b, mid) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-15:
            break
    return (low + high) / 2.0
