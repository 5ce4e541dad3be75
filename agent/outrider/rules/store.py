"""The evaluator's bounded sample store: only the series the loaded rules select, only as far back as they read.

Each series is two arrays (timestamps in ms, values as doubles: 16 bytes a sample). A metric name is kept only if
some rule selects it; its retention is the longest window any rule reads on it (range + offset, or the 5-minute
lookback + offset of an instant selector) plus one evaluation interval. Samples older than that are trimmed as
new ones arrive, so memory is bounded by (series x retention / sample interval), which `memory_bytes()` reports.

A series that disappears gets a staleness marker (a NaN with Prometheus's bit pattern), as Prometheus writes one
when a scrape no longer has a series: instant selectors stop seeing it at once rather than 5 minutes later.
"""

from __future__ import annotations

import bisect
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence

Labels = tuple[tuple[str, str], ...]

STALE_BITS = 0x7FF0000000000002  # Prometheus's value.StaleNaN
STALE = struct.unpack("<d", struct.pack("<Q", STALE_BITS))[0]


def is_stale(value: float) -> bool:
    return value != value and struct.unpack("<Q", struct.pack("<d", value))[0] == STALE_BITS


class Series:
    __slots__ = ("stale", "times", "values")

    def __init__(self) -> None:
        self.times = array("q")
        self.values = array("d")
        self.stale = 0  # staleness markers held (windows skip the scan for them when there are none)

    def append(self, t: int, v: float) -> bool:
        if self.times and t <= self.times[-1]:
            if t == self.times[-1]:  # the same instant again: the newer value wins
                if is_stale(self.values[-1]):
                    self.stale -= 1
                self.values[-1] = v
                self.stale += v != v and is_stale(v)
                return True
            return False  # out of order: dropped
        self.times.append(t)
        self.values.append(v)
        if v != v and is_stale(v):
            self.stale += 1
        return True

    def at(self, ref: int, lookback: int, left_open: bool) -> float | None:
        """The value an instant selector sees at ref: the latest sample in [ref - lookback, ref] (Prometheus 2), or
        in (ref - lookback, ref] (`left_open`, Prometheus 3), unless stale."""
        i = bisect.bisect_right(self.times, ref) - 1
        if i < 0 or self.times[i] < ref - lookback or (left_open and self.times[i] == ref - lookback):
            return None
        v = self.values[i]
        if v != v and is_stale(v):
            return None
        return v

    def window(self, start: int, end: int, left_open: bool) -> tuple[Sequence[int], Sequence[float]]:
        """Samples with start <= t <= end (Prometheus 2), or start < t <= end (`left_open`, Prometheus 3), staleness
        markers left out."""
        lo = (bisect.bisect_right if left_open else bisect.bisect_left)(self.times, start)
        hi = bisect.bisect_right(self.times, end)
        times, values = self.times[lo:hi], self.values[lo:hi]
        if self.stale:
            keep = [i for i, v in enumerate(values) if not (v != v and is_stale(v))]
            if len(keep) != len(values):
                return [times[i] for i in keep], [values[i] for i in keep]
        return times, values

    def trim(self, before: int) -> None:
        i = bisect.bisect_left(self.times, before)
        if i:
            if self.stale:
                self.stale -= sum(1 for v in self.values[:i] if v != v and is_stale(v))
            del self.times[:i]
            del self.values[:i]

    def last_is_stale(self) -> bool:
        return bool(self.values) and is_stale(self.values[-1])


class SeriesStore:
    """Series by name and label set. retention_ms maps metric names to how far back rules read them; a name not
    in it is not kept (None keeps every name, for replaying test files)."""

    def __init__(self, retention_ms: dict[str, int] | None = None, default_retention_ms: int = 0) -> None:
        self.retention_ms = retention_ms
        self.default_retention_ms = default_retention_ms
        self._series: dict[str, dict[Labels, Series]] = {}
        self.dropped_out_of_order = 0

    def wants(self, name: str) -> bool:
        return self.retention_ms is None or name in self.retention_ms

    def add(self, labels: Labels, t: int, v: float) -> None:
        """labels must be sorted and include __name__; empty label values are left out, as Prometheus does."""
        name = _name(labels)
        if not self.wants(name):
            return
        by_labels = self._series.setdefault(name, {})
        series = by_labels.get(labels)
        if series is None:
            series = by_labels[labels] = Series()
        if not series.append(t, v):
            self.dropped_out_of_order += 1

    def put(self, labels: Labels, series: Series) -> None:
        """A whole series (restored from a snapshot)."""
        self._series.setdefault(_name(labels), {})[labels] = series

    def mark_stale(self, name: str, keep: set[Labels], t: int) -> None:
        """A staleness marker at t on every live series of `name` not in `keep`."""
        for labels, series in self._series.get(name, {}).items():
            if labels not in keep and series.values and not series.last_is_stale():
                series.append(t, STALE)

    def names(self) -> Iterable[str]:
        return self._series.keys()

    def candidates(self, name: str | None) -> Iterable[tuple[Labels, Series]]:
        if name is not None:
            return self._series.get(name, {}).items()
        return (item for by_labels in self._series.values() for item in by_labels.items())

    def trim(self, now: int) -> None:
        """Drop samples older than each name's retention; forget series that have no sample left."""
        for name, by_labels in list(self._series.items()):
            keep = (self.retention_ms or {}).get(name, self.default_retention_ms)
            if self.retention_ms is None and not keep:
                continue
            gone = []
            for labels, series in by_labels.items():
                series.trim(now - keep)
                if not series.times or (series.last_is_stale() and len(series.times) == 1):
                    gone.append(labels)
            for labels in gone:
                del by_labels[labels]
            if not by_labels:
                del self._series[name]

    def series_count(self) -> int:
        return sum(len(v) for v in self._series.values())

    def sample_count(self) -> int:
        return sum(len(s.times) for v in self._series.values() for s in v.values())

    def memory_bytes(self) -> int:
        """Approximate bytes held: the arrays' buffers, the series objects and their label tuples."""
        total = 0
        for by_labels in self._series.values():
            total += sys.getsizeof(by_labels)
            for labels, series in by_labels.items():
                total += sys.getsizeof(series) + sys.getsizeof(series.times) + sys.getsizeof(series.values)
                total += sys.getsizeof(labels) + sum(sys.getsizeof(kv) for kv in labels)
        return total


def _name(labels: Labels) -> str:
    for k, v in labels:
        if k == "__name__":
            return v
    return ""


def make_labels(name: str, pairs: Iterable[tuple[str, str]]) -> Labels:
    out = {k: v for k, v in pairs if v != ""}
    out["__name__"] = name
    return tuple(sorted(out.items()))
