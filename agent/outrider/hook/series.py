"""The hook's hot path: counters, gauges and histograms that aggregate in process, with no lock and no system call.

Each thread updates its own cells (a plain list reached through a threading.local), so two threads never write the
same memory and no update is lost; the publisher thread sums the cells of all threads when it flushes. Cells of
threads that have ended stay in the sum. Every method swallows its own errors: the hook never raises into user
code; a bad value is dropped and counted.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable

# Upper bounds in seconds: 0.25 ms .. 10 min, about three per decade; fine enough for p50/p90/p99 of steps and
# requests, small enough to keep a histogram at 29 floats.
DURATION_BOUNDS: tuple[float, ...] = (
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
SIZE_BOUNDS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class Dropped:
    """Counts of measurements and registrations the hook refused, by reason."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1


class Series:
    """One label set of one metric. Subclasses implement the hot-path method."""

    __slots__ = ("_all", "_drop", "_last", "_local", "bounds", "kind", "labels", "name", "width")
    kind: str

    def __init__(self, name: str, labels: dict[str, str], width: int, drop: Callable[[str], None],
                 bounds: tuple[float, ...] = ()) -> None:
        self.name = name
        self.labels = labels
        self.width = width
        self._last = width - 1  # a histogram's sum: a non-negative index, which the interpreter's fast path needs
        self.bounds = bounds
        self._drop = drop
        self._local = threading.local()
        self._all: list[list[float]] = []  # every thread's cells; list.append is atomic

    def _cells(self) -> list[float]:
        cells = [0.0] * self.width
        self._local.c = cells
        self._all.append(cells)
        return cells

    def total(self) -> list[float]:
        """Sum over threads (the publisher's side; may trail the hot path by one update, never tears)."""
        out = [0.0] * self.width
        for cells in list(self._all):
            for i, v in enumerate(cells):
                out[i] += v
        return out

    def reset_after_fork(self) -> None:
        """A forked child starts from zero: its parent's counts stay the parent's."""
        self._local = threading.local()
        self._all = []


class Counter(Series):
    __slots__ = ()
    kind = "counter"

    def inc(self, amount: float = 1.0) -> None:
        try:
            if not amount >= 0:  # negative or NaN
                raise ValueError
            try:
                c = self._local.c
            except AttributeError:
                c = self._cells()
            c[0] += amount
        except Exception:
            self._drop("bad_value")

    def set_total(self, value: float) -> None:
        """For samplers that read a cumulative count elsewhere (allocator retries): not the hot path."""
        cells = self._all[0] if self._all else self._cells()
        cells[0] = float(value)


class Gauge(Series):
    """Last value wins; shared by all threads (a single store is atomic)."""

    __slots__ = ()
    kind = "gauge"

    def set(self, value: float) -> None:
        try:
            if value != value:
                raise ValueError
            cells = self._all[0] if self._all else self._cells()
            cells[0] = float(value)
        except Exception:
            self._drop("bad_value")

    def add(self, amount: float) -> None:
        try:
            cells = self._all[0] if self._all else self._cells()
            cells[0] += amount
        except Exception:
            self._drop("bad_value")

    def total(self) -> list[float]:
        return [self._all[0][0]] if self._all else [0.0]


class Histogram(Series):
    __slots__ = ()
    kind = "histogram"

    def observe(self, value: float, _bisect: Callable[..., int] = bisect_left) -> None:
        try:
            if value != value:  # NaN would poison the sum forever
                raise ValueError
            try:
                c = self._local.c
            except AttributeError:
                c = self._cells()
            # le semantics: a value equal to a bound falls in its bucket. 1.0, not 1: float + float is the
            # interpreter's specialised add, float + int the generic one (with c[-1], 20% of the call, measured)
            c[_bisect(self.bounds, value)] += 1.0
            c[self._last] += value
        except Exception:
            self._drop("bad_value")


class NoopSeries(Histogram, Counter, Gauge):
    """What a refused registration returns: every call is accepted and does nothing."""

    __slots__ = ()
    kind = "noop"

    def observe(self, value: float, _bisect: Callable[..., int] = bisect_left) -> None:
        pass

    def inc(self, amount: float = 1.0) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def add(self, amount: float) -> None:
        pass
