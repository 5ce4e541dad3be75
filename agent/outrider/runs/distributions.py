"""What a run's duration histograms recorded during the run (runs/kpis.DISTRIBUTIONS: step time, data wait, request
latency, whole and per route, time to first token, inter-token latency), kept whole in its record for `outrider
compare`, which judges two runs step by step and request by request.

Each sweep, every series of those families (one per rank, route, status...) adds what it grew since the previous
sweep (HistogramValue.since, bucket by bucket) to the run's total: a series already there at the run's first sweep
counts from that sweep (a process that started before the run is counted from the run's start), one that appears
later counts whole (it started during the run). The hook collector keeps a finished process's values in its
series (merged series never go backwards while the agent lives), so a series leaves the sweep only when that is
long over, and one that appears again is a new process, counted whole. The total carries the classic buckets, the
exact count and sum, and the sketch (1.08%) where every series had one (otherwise None: a classic-only source).

Warm-up: besides the whole run, each distribution's steady part is kept: what was recorded after the last sweep
at which at most WARMUP (10%) of the run's items so far had been recorded. It drops at most the first 10% of the
steps, never more, and nothing when the first sweep with steps already held more than 10% of them: a run of 400
steps swept every 5 s keeps them all. The candidates for that sweep are compact snapshots of the total, one each
time it grew by MARK_GROWTH (5%) since the last: those below 10% of the total are let go as it grows, so a
distribution holds about log(10) / log(1.05) = 47 of them however long the run, and its warm-up is cut between
9.5% and 10% of its items wherever the sweeps allow."""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from outrider.metrics.family import Family, HistogramValue
from outrider.runs.kpis import DISTRIBUTIONS
from outrider.shared.sketch import Sketch

WARMUP = 0.1
MARK_GROWTH = 0.05
MAX_ROUTES = 20  # routes kept apart, per distribution kept by route; later routes count in the whole only
RUN, STEADY = "run", "steady"  # the parts the record keeps
_BY_METRIC = {d.metric: d for d in DISTRIBUTIONS.values()}


def to_json(h: HistogramValue) -> str:
    sketch = None if h.sketch is None else {"zero": h.sketch.zero, "buckets": [[i, c] for i, c in
                                                                               sorted(h.sketch.buckets.items())]}
    return json.dumps({"bounds": list(h.bounds), "counts": list(h.counts), "sum": h.sum, "sketch": sketch})


def from_json(text: str) -> HistogramValue:
    data = json.loads(text)
    sketch = data.get("sketch")
    return HistogramValue(tuple(float(b) for b in data["bounds"]), tuple(int(c) for c in data["counts"]),
                          float(data["sum"]),
                          None if sketch is None else Sketch.of(sketch["zero"], [(i, c) for i, c in sketch["buckets"]]))


@dataclass(frozen=True)
class _Mark:
    """A snapshot of a total, in arrays: 3.6 KB where the HistogramValue of a sketch of 184 buckets holds 16 KB."""

    count: int
    value_sum: float
    bounds: tuple[float, ...]
    counts: array[int]
    zero: int | None  # None: no sketch
    indexes: array[int]
    in_bucket: array[int]

    @staticmethod
    def of(h: HistogramValue) -> _Mark:
        s = h.sketch
        return _Mark(h.count, h.sum, h.bounds, array("q", h.counts), None if s is None else s.zero,
                     array("q", s.buckets.keys() if s is not None else ()),
                     array("q", s.buckets.values() if s is not None else ()))

    def value(self) -> HistogramValue:
        sketch = None if self.zero is None else Sketch.of(self.zero, zip(self.indexes, self.in_bucket))
        return HistogramValue(self.bounds, tuple(self.counts), self.value_sum, sketch)


def _merged(values: list[HistogramValue]) -> HistogramValue | None:
    """The sum of histograms in one pass (HistogramValue + builds a sketch per addition); those of other bounds
    than the first (a custom source) cannot be merged bucketwise and are left out; the sketch only where all had
    one."""
    if not values:
        return None
    first = values[0]
    kept = [v for v in values if v.bounds == first.bounds]
    counts = [sum(column) for column in zip(*(v.counts for v in kept))]
    sketch = None
    if all(v.sketch is not None for v in kept):
        buckets: dict[int, int] = {}
        for v in kept:
            assert v.sketch is not None
            for i, c in v.sketch.buckets.items():
                buckets[i] = buckets.get(i, 0) + c
        sketch = Sketch.of(sum(v.sketch.zero for v in kept if v.sketch is not None), buckets)
    return HistogramValue(first.bounds, tuple(counts), sum(v.sum for v in kept), sketch)


class RunDistributions:
    """The run's totals of DISTRIBUTIONS, fed every sweep (`add`), with their steady parts (see the module)."""

    def __init__(self, warmup_fraction: float = WARMUP) -> None:
        self.warmup_fraction = warmup_fraction
        self.totals: dict[str, HistogramValue] = {}
        self._last: dict[tuple[str, tuple[str, ...]], HistogramValue] = {}  # (metric, labels) -> last sweep's value
        self._swept = False
        # per distribution: [the warm-up mark (None: the run's start), later snapshots that may become it]
        self._marks: dict[str, list[_Mark | None]] = {}
        self._saved: dict[str, int] = {}  # the count each distribution had when `changed` last gave it

    def add(self, families: list[Family]) -> None:
        grown: dict[str, list[HistogramValue]] = {}
        seen: dict[tuple[str, tuple[str, ...]], HistogramValue] = {}
        for f in families:
            d = _BY_METRIC.get(f.defn.name)
            if d is None:
                continue
            route_at = f.defn.label_names.index("route") if d.by_route else -1
            for labels, v in f.samples:
                if not isinstance(v, HistogramValue):
                    continue
                series = (f.defn.name, labels)
                seen[series] = v
                before = self._last.get(series)
                if before is None and not self._swept:
                    continue  # there at the run's first sweep: counted from it
                delta = v.since(before)
                if not delta.count:
                    continue
                grown.setdefault(d.key, []).append(delta)
                if route_at >= 0:
                    grown.setdefault(f"{d.key}:{labels[route_at]}", []).append(delta)
        self._last = seen
        self._swept = True
        for key, deltas in grown.items():
            self._grow(key, deltas)

    def _grow(self, key: str, deltas: list[HistogramValue]) -> None:
        total = self.totals.get(key)
        if total is None and ":" in key:
            prefix = key.split(":", 1)[0] + ":"
            if sum(k.startswith(prefix) for k in self.totals) >= MAX_ROUTES:
                return
        total = _merged([*([total] if total is not None else []), *deltas])
        if total is None:
            return
        self.totals[key] = total
        marks = self._marks.setdefault(key, [None])
        last = marks[-1]
        if last is None or total.count >= (1.0 + MARK_GROWTH) * last.count:
            marks.append(_Mark.of(total))
        limit = self.warmup_fraction * total.count
        while len(marks) > 1 and (m := marks[1]) is not None and m.count <= limit:
            marks.pop(0)

    def steady(self, key: str) -> HistogramValue | None:
        total = self.totals.get(key)
        if total is None:
            return None
        mark = self._marks.get(key, [None])[0]
        return total.since(None if mark is None else mark.value())

    def changed(self) -> Iterator[tuple[str, HistogramValue, HistogramValue]]:
        """(key, the whole run, its steady part) of each distribution that grew since the last call."""
        for key, total in self.totals.items():
            if self._saved.get(key) != total.count:
                self._saved[key] = total.count
                steady = self.steady(key)
                yield key, total, steady if steady is not None else total
