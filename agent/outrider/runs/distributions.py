"""What a run's duration histograms recorded during the run (runs/kpis.DISTRIBUTIONS: step time, data wait, request
latency, whole and per route, time to first token, inter-token latency), kept whole in its record for `outrider
compare`, which judges two runs step by step and request by request.

Each sweep, every series of those families (one per rank, route, status...) adds what it grew since the previous
sweep (HistogramValue.since, bucket by bucket) to the run's total: a series already there at the run's first sweep
counts from that sweep (a process that started before the run is counted from the run's start), one that appears
later counts whole (it started during the run). A series that leaves the sweep keeps what it added, and its last
value is remembered, so one that comes back is not counted twice. The total carries the classic buckets, the exact
count and sum, and the sketch (1.08%) where every series had one (otherwise None: a classic-only source).

Warm-up: besides the whole run, each distribution's steady part is kept: what was recorded after the last sweep
at which at most WARMUP (10%) of the run's items so far had been recorded. It drops at most the first 10% of the
steps, never more, and nothing when the first sweep with steps already held more than 10% of them: a run of 400
steps swept every 5 s keeps them all. The candidates for that sweep are snapshots of the total, thinned to at most
MAX_MARKS evenly spaced in count, so a long run's warm-up is cut within 2% of its steps (fewer dropped, never
more)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from outrider.metrics.family import Family, HistogramValue
from outrider.runs.kpis import DISTRIBUTIONS
from outrider.sketch import Sketch

WARMUP = 0.1
MAX_MARKS = 256
MAX_ROUTES = 20  # routes kept apart, per distribution kept by route; later routes count in the whole only
MAX_SERIES = 10_000  # series remembered (their last value)
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


class RunDistributions:
    """The run's totals of DISTRIBUTIONS, fed every sweep (`add`), with their steady parts (see the module)."""

    def __init__(self, warmup_fraction: float = WARMUP) -> None:
        self.warmup_fraction = warmup_fraction
        self.totals: dict[str, HistogramValue] = {}
        self._last: dict[tuple[str, tuple[str, ...]], HistogramValue] = {}  # (metric, labels) -> its last value
        self._swept = False
        # per distribution: [the warm-up mark (None: the run's start), later snapshots that may become it]
        self._marks: dict[str, list[HistogramValue | None]] = {}
        self._saved: dict[str, int] = {}  # the count each distribution had when `changed` last gave it

    def add(self, families: list[Family]) -> None:
        grown: dict[str, list[HistogramValue]] = {}
        for f in families:
            d = _BY_METRIC.get(f.defn.name)
            if d is None:
                continue
            route_at = f.defn.label_names.index("route") if d.by_route else -1
            for labels, v in f.samples:
                if not isinstance(v, HistogramValue):
                    continue
                series = (f.defn.name, labels)
                before = self._last.get(series)
                if before is not None or len(self._last) < MAX_SERIES:
                    self._last[series] = v
                if before is None and not self._swept:
                    continue  # there at the run's first sweep: counted from it
                delta = v.since(before)
                if not delta.count:
                    continue
                grown.setdefault(d.key, []).append(delta)
                if route_at >= 0:
                    grown.setdefault(f"{d.key}:{labels[route_at]}", []).append(delta)
        self._swept = True
        for key, deltas in grown.items():
            self._grow(key, deltas)

    def _grow(self, key: str, deltas: list[HistogramValue]) -> None:
        total = self.totals.get(key)
        if total is None and ":" in key:
            prefix = key.split(":", 1)[0] + ":"
            if sum(k.startswith(prefix) for k in self.totals) >= MAX_ROUTES:
                return
        for d in deltas:
            if total is None:
                total = d
            elif d.bounds == total.bounds:  # a series of other bounds (a custom source) cannot be merged bucketwise
                total = total + d
        if total is None:
            return
        self.totals[key] = total
        marks = self._marks.setdefault(key, [None])
        marks.append(total)
        limit = self.warmup_fraction * total.count
        while len(marks) > 1 and (marks[1] is None or marks[1].count <= limit):
            marks.pop(0)
        if len(marks) > MAX_MARKS:  # thinned to even steps in count: the warm-up cut within 4/MAX_MARKS of the run
            spacing, kept = 2.0 * total.count / MAX_MARKS, [marks[0]]
            for m in marks[1:-1]:
                last = kept[-1]
                if m is not None and m.count - (last.count if last is not None else 0) >= spacing:
                    kept.append(m)
            marks[:] = [*kept, marks[-1]]

    def steady(self, key: str) -> HistogramValue | None:
        total = self.totals.get(key)
        return None if total is None else total.since(self._marks.get(key, [None])[0])

    def changed(self) -> Iterator[tuple[str, HistogramValue, HistogramValue]]:
        """(key, the whole run, its steady part) of each distribution that grew since the last call."""
        for key, total in self.totals.items():
            if self._saved.get(key) != total.count:
                self._saved[key] = total.count
                steady = self.steady(key)
                yield key, total, steady if steady is not None else total
