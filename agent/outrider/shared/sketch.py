"""Distributions at a known relative error: the log-bucketed histogram every duration is recorded in, from the
hook's thread to the run's summary.

The buckets are OpenTelemetry's exponential-histogram buckets at scale SCALE, which are also Prometheus native
histograms' at schema SCALE: bucket `i` holds the values in (BASE**i, BASE**(i + 1)], BASE = 2 ** (2 ** -SCALE).
At scale 5 a bucket is 2.19% wide, and a quantile reported as its bucket's representative (the point whose
relative distance to both ends is equal) is within RELATIVE_ERROR = (BASE - 1) / (BASE + 1) = 1.08% of the true
value, for any distribution, at any rate, from MIN_VALUE to MAX_VALUE (the anchors: DDSketch's guarantee,
OpenTelemetry's ExponentialHistogram, Prometheus native histograms). Values at or below MIN_VALUE (a nanosecond)
and negative ones go to the zero bucket; values above MAX_VALUE (11 days) to the top bucket; so a series has at most
MAX_INDEX - MIN_INDEX + 1 buckets (1,597) whatever it records, and usually a few dozen.

Sketches merge by adding counts bucket by bucket, exactly: across threads, processes and sweeps, a merged sketch is
the sketch of all the values, with the same error bound. The module is standard library only and imports nothing
of outrider: the hook records with it, the spool carries it, the agent merges, exports and summarises it.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

SCALE = 5
BASE = math.pow(2.0, math.pow(2.0, -SCALE))
RELATIVE_ERROR = (BASE - 1.0) / (BASE + 1.0)
MIN_VALUE = 1e-9
MAX_VALUE = 1e6
_PER_OCTAVE = 1 << SCALE


def _raw_index(value: float) -> int:
    """The bucket of a positive value, unclamped: the i with BASE**i < value <= BASE**(i + 1). log2 is exact at
    powers of two (a bucket's upper bound then), and the bound computed from i is checked, so a value on a boundary
    goes to the bucket it closes, as OpenTelemetry's and Prometheus's do."""
    i = math.ceil(math.log2(value) * _PER_OCTAVE) - 1
    if value <= upper_bound(i - 1):
        return i - 1
    if value > upper_bound(i):
        return i + 1
    return i


def upper_bound(i: int) -> float:
    """The largest value in bucket i."""
    return math.pow(2.0, (i + 1) / _PER_OCTAVE)


def lower_bound(i: int) -> float:
    """The bound below bucket i (not in it)."""
    return math.pow(2.0, i / _PER_OCTAVE)


def quantile_rank(q: float, count: int) -> int:
    """The rank (from 1) of the value that is the q-quantile of count values: ceil(q * count), the first for q 0.
    Sketch.quantile's, and the bootstrap's over a sketch's points (runs/stats.py)."""
    return max(1, math.ceil(q * count))


def representative(i: int) -> float:
    """The value reported for bucket i: within RELATIVE_ERROR of every value in it (2ab / (a + b))."""
    lo, hi = lower_bound(i), upper_bound(i)
    return 2.0 * lo * hi / (lo + hi)


MIN_INDEX = _raw_index(MIN_VALUE)  # the bucket a value just above the zero bucket's threshold is counted in
MAX_INDEX = _raw_index(MAX_VALUE)


def index(value: float) -> int | None:
    """The bucket a value is counted in; None for the zero bucket (at or below MIN_VALUE, negative, or NaN)."""
    if not value > MIN_VALUE:
        return None
    if value >= MAX_VALUE:
        return MAX_INDEX
    return max(MIN_INDEX, min(MAX_INDEX, _raw_index(value)))


def downscale(buckets: Mapping[int, int], by: int) -> dict[int, int]:
    """Exponential buckets `by` scales coarser, exactly: bucket i at scale s lies inside bucket i >> by at scale
    s - by (2**by of them make one; >> floors, negative indices included), so each count moves whole."""
    if by <= 0:
        return dict(buckets)
    out: dict[int, int] = {}
    for i, c in buckets.items():
        j = i >> by
        out[j] = out.get(j, 0) + c
    return out


# Every bucket's upper bound, from MIN_INDEX - 1 up: the batch counter's boundaries without a power per bucket
_UPPER = [upper_bound(i) for i in range(MIN_INDEX - 1, MAX_INDEX + 1)]


def add_sorted(values: list[float], buckets: dict[int, float]) -> int:
    """Counts values (sorted ascending) into buckets; returns how many went to the zero bucket. The cost is one
    logarithm and one binary search per distinct bucket, not per value: recording batches is cheap where the
    values cluster, as durations do."""
    n = len(values)
    pos = bisect_right(values, MIN_VALUE)
    zero = pos
    upper, log2, ceil, low, get = _UPPER, math.log2, math.ceil, MIN_INDEX - 1, buckets.get
    while pos < n:
        v = values[pos]
        if not v < MAX_VALUE:  # the top bucket takes the rest (a NaN, which the hook refuses, would sort anywhere)
            buckets[MAX_INDEX] = get(MAX_INDEX, 0.0) + (n - pos)
            break
        i = ceil(log2(v) * _PER_OCTAVE) - 1
        if i < MIN_INDEX:
            i = MIN_INDEX
        elif i > MIN_INDEX and v <= upper[i - 1 - low]:  # a value on a boundary belongs to the bucket it closes
            i -= 1
        elif v > upper[i - low]:  # log2 rounded down (the first bucket's too: clamping it skipped this once)
            i += 1
        # at least the value at pos: a bucket chosen wrong by a float's last bit miscounts one value, never loops
        end = max(bisect_right(values, upper[i - low], pos), pos + 1)
        buckets[i] = get(i, 0.0) + (end - pos)
        pos = end
    return zero


@dataclass(frozen=True)
class Sketch:
    """A distribution's zero count and its bucket counts (index -> count, no zero counts), read-only."""

    zero: int = 0
    buckets: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))

    @staticmethod
    def of(zero: float, buckets: Mapping[int, float] | Iterable[tuple[int, float]]) -> Sketch:
        items = buckets.items() if isinstance(buckets, Mapping) else buckets
        return Sketch(int(zero), MappingProxyType({int(i): int(c) for i, c in sorted(items) if c > 0}))

    @staticmethod
    def of_values(values: Iterable[float]) -> Sketch:
        """The sketch of some values (tests, and what a workload timed itself, compared with what was recorded)."""
        buckets: dict[int, float] = {}
        zero = add_sorted(sorted(values), buckets)
        return Sketch.of(zero, buckets)

    @staticmethod
    def at_scale(scale: int, zero: int, buckets: Mapping[int, int]) -> Sketch | None:
        """The sketch of exponential buckets of another source at `scale` (OpenTelemetry's bucket index, (base**i,
        base**(i + 1)]; a Prometheus native histogram's is one more), exactly: at a finer scale each bucket lies
        inside one of ours. None where no sketch of them exists: a coarser scale (its buckets straddle ours), or a
        bucket outside MIN_INDEX..MAX_INDEX (values the sketch would have clamped, which it cannot say of counts)."""
        if scale < SCALE:
            return None
        ours = {i: c for i, c in downscale(buckets, scale - SCALE).items() if c > 0}
        if ours and not MIN_INDEX <= min(ours) <= max(ours) <= MAX_INDEX:
            return None
        return Sketch.of(zero, ours)

    @property
    def count(self) -> int:
        return self.zero + sum(self.buckets.values())

    def __add__(self, other: Sketch) -> Sketch:
        out = dict(self.buckets)
        for i, c in other.buckets.items():
            out[i] = out.get(i, 0) + c
        return Sketch.of(self.zero + other.zero, out)

    def since(self, earlier: Sketch) -> Sketch:
        """What was recorded after `earlier` (a cumulative sketch minus an older copy of itself); a bucket that
        went down (a process restarted) counts from zero."""
        out = {i: c - earlier.buckets.get(i, 0) for i, c in self.buckets.items()}
        return Sketch.of(max(0, self.zero - earlier.zero), {i: c for i, c in out.items() if c > 0})

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 <= q <= 1) within RELATIVE_ERROR: the representative of the bucket holding the value
        of rank ceil(q * count) (the zero bucket's is 0); None when empty."""
        total = self.count
        if total == 0 or not 0.0 <= q <= 1.0:
            return None
        rank = quantile_rank(q, total)
        seen = self.zero
        if seen >= rank:
            return 0.0
        order = sorted(self.buckets)
        for i in order[:-1]:
            seen += self.buckets[i]
            if seen >= rank:
                return representative(i)
        return representative(order[-1])  # rank <= count: the last bucket holds it

    def points(self) -> list[tuple[float, int]]:
        """(representative value, count) per bucket, ascending, the zero bucket as 0.0: the distribution as a
        weighted sample (for resampling, for a mean within RELATIVE_ERROR)."""
        out = [(0.0, self.zero)] if self.zero else []
        out.extend((representative(i), self.buckets[i]) for i in sorted(self.buckets))
        return out

    def mean(self) -> float | None:
        """The mean within RELATIVE_ERROR (the exact one is a histogram's sum over its count)."""
        total = self.count
        if not total:
            return None
        return sum(v * c for v, c in self.points()) / total
