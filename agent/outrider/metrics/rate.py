"""Rates of cumulative counters, from the counters over time: what `outrider run` records per sweep (steps/s,
samples/s, tokens/s, requests/s, the share of the loop waiting for data), what `outrider top` shows, and what
`outrider compare` compares.

A counter moves only when its source publishes: the hook updates its shard every flush_interval_s, and an agent's
/metrics changes once a sweep. Read at moments of the reader's choosing, a counter seen twice a publication apart
grows by 0 or by two publications' worth, so a rate between consecutive reads alternates 0 and 2x (sweeps every
0.5 s of a hook flushing every second), or is 2.5x the truth (reads 2 s apart of /metrics that changes every 5 s).
So a rate here runs between two reads at which the counter **changed** (when a publication was first seen, the
same lag behind it at both ends), and spans at least SPAN_UPDATES of the counter's updates, at their recent median
interval: it is never computed from reads between which the counter could not move. A counter that stops moving
for more than twice its usual interval ends its window now, so a job that stops falls to 0 instead of keeping its
last rate; one that has not changed twice yet has no rate (None: not measured yet, never 0).

Counters are running totals of what each read added (a sum that goes down, a process gone with its series, adds
nothing), so a rate is never negative.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Mapping, Sequence

from outrider.metrics.quantile import median

SPAN_UPDATES = 4  # a rate spans at least this many updates of its counter
RECENT = 16  # updates whose median interval is the counter's usual one
STALE_UPDATES = 2.0  # no update for this many usual intervals: the window ends now (the job slowed or stopped)
KEEP = 512  # reads kept


class CounterHistory:
    """Reads of several counters taken together (one sweep, one /metrics read), as running totals."""

    def __init__(self, keep: int = KEEP) -> None:
        self._reads: collections.deque[tuple[float, dict[str, float]]] = collections.deque(maxlen=keep)
        self._raw: dict[str, float] = {}
        self._totals: dict[str, float] = {}

    def add(self, t: float, values: Mapping[str, float]) -> None:
        """One read at time t (seconds on any monotonic clock) of each counter's current value."""
        for name, value in values.items():
            last = self._raw.get(name)
            if last is None:
                self._totals[name] = 0.0  # first seen: what it held before is not this history's to count
            elif value > last:
                self._totals[name] += value - last
            self._raw[name] = value
        self._reads.append((t, dict(self._totals)))

    def __len__(self) -> int:
        return len(self._reads)

    def total(self, name: str) -> float:
        return self._totals.get(name, 0.0)

    def window(self, name: str) -> tuple[float, float] | None:
        """(start, end) times of the rate window of `name` (see the module's docstring); None before it has changed
        twice."""
        found = self._window(name)
        return None if found is None else (self._reads[found[0]][0], self._reads[found[1]][0])

    def rate(self, name: str) -> float | None:
        """Growth per second of `name` over its window; None before it has changed twice."""
        found = self._window(name)
        if found is None:
            return None
        (t0, a), (t1, b) = self._reads[found[0]], self._reads[found[1]]
        return (b.get(name, 0.0) - a.get(name, 0.0)) / (t1 - t0)

    def ratio(self, part: str, whole: str) -> float | None:
        """Growth of `part` over growth of `whole`, on the window of `whole` (the share of the loop's time waiting
        for data: both move at the same publications); None before `whole` has changed twice."""
        found = self._window(whole)
        if found is None:
            return None
        a, b = self._reads[found[0]][1], self._reads[found[1]][1]
        grown = b.get(whole, 0.0) - a.get(whole, 0.0)
        return (b.get(part, 0.0) - a.get(part, 0.0)) / grown if grown > 0 else None

    def _window(self, name: str) -> tuple[int, int] | None:
        changes, prev = [], None
        for i, (_, totals) in enumerate(self._reads):
            v = totals.get(name)
            if v is None:
                continue
            if prev is not None and v > prev:
                changes.append(i)
            prev = v
        times = [self._reads[i][0] for i in changes]
        found = window(times, self._reads[-1][0] if self._reads else 0.0)
        return None if found is None else (changes[found[0]], changes[found[1]] if found[1] >= 0 else
                                           len(self._reads) - 1)


def window(changes: Sequence[float], now: float) -> tuple[int, int] | None:
    """The rate window over the times a counter was first seen changed: (index of its start, index of its end, -1
    for "now", when the counter has not moved for STALE_UPDATES of its usual intervals); None with fewer than two."""
    if len(changes) < 2:
        return None
    gap = usual_interval(changes)
    end, end_t = len(changes) - 1, changes[-1]
    candidates = range(end - 1, -1, -1)
    if gap > 0 and now - end_t > STALE_UPDATES * gap:
        end, end_t = -1, now
        candidates = range(len(changes) - 1, -1, -1)
    span = SPAN_UPDATES * gap
    start = 0
    for j in candidates:
        if end_t - changes[j] >= span:
            start = j
            break
    if end >= 0 and start >= end:
        return None
    return start, end


def usual_interval(changes: Sequence[float]) -> float:
    """The median interval between a counter's recent updates."""
    recent = changes[-RECENT - 1:]
    return median(b - a for a, b in itertools.pairwise(recent))


def intervals(points: Iterable[tuple[float, float]], whole: Iterable[tuple[float, float]] | None = None,
              warmup_fraction: float = 0.1) -> list[tuple[float, float]]:
    """Consecutive (growth of the counter, seconds) over a recorded run (points: (time, running total) per sweep),
    each from one update of the counter to the next, between its first and last update with the first
    `warmup_fraction` of that span dropped: the samples a comparison of rates resamples. Their sums' ratio is the
    rate over the span, exactly; one interval alone may be off by the reads' lag behind a publication, which only
    widens the comparison's interval. With `whole`, (growth of the counter, growth of `whole`) on the updates of
    `whole`: shares such as the loop's data wait."""
    part = dict(points)
    base = sorted(dict(whole).items()) if whole is not None else sorted(part.items())
    changes = [t for (_, prev), (t, v) in itertools.pairwise(base) if v > prev]
    if len(changes) < 2:
        return []
    values = dict(base)
    begin = changes[0] + warmup_fraction * (changes[-1] - changes[0])
    kept = [t for t in changes if t >= begin]
    return [(part.get(t1, 0.0) - part.get(t0, 0.0), values[t1] - values[t0] if whole is not None else t1 - t0)
            for t0, t1 in itertools.pairwise(kept)]
