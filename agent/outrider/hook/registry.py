"""The hook's series registry: creates series on first use, refuses bad or excessive ones, and lays them out for
the shard.

Recording never takes a lock (hook/series.py). Registration takes one, but nobody ever waits for it: it is a
try-lock. Whoever cannot take it (a signal handler, __del__ or GC callback that interrupted a registration of the
same thread, whose dicts are then half-updated; or another thread registering at that moment) gets a complete,
working series that is parked in a pending dict, and the next registration or flush that takes the lock registers
it. Parked for a key that got registered meanwhile, it becomes a twin of that series and is published as part of
it. So no registration can deadlock, and no update is lost, whoever interrupts whom.

A refused registration returns a no-op series and counts the reason, so user input never raises or grows without
bound. Its warning (once per reason) is logged by the publisher at the next flush, never on the caller's path:
that path may be a signal handler, and a signal handler that writes to a stream the interrupted code was writing
to fails (or worse).

Names the agent owns are refused from the public API: the outrider_ prefix (every name in the agent's metric
catalog has it; the hook's own series are registered with builtin=True), and the few the agent writes without it.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Literal, overload

from outrider.hook.series import DURATION_BOUNDS, Counter, Dropped, Gauge, Histogram, NoopSeries, Series, log_aside
from outrider.hook.settings import KEYS
from outrider.shared import spool

LOG = logging.getLogger("outrider.hook")
RESERVED_PREFIX = "outrider_"
MAX_SERIES = 2000  # series a process registers at most (its label sets per metric: hook_max_series_per_metric)
KINDS: dict[str, type[Series]] = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


class Registry:
    def __init__(self, max_series_per_metric: int = KEYS["hook_max_series_per_metric"],
                 max_series: int = MAX_SERIES) -> None:
        self.max_series_per_metric = max_series_per_metric
        self.max_series = max_series
        self.drop = Dropped()
        self._warned: set[str] = set()
        self._warnings: collections.deque[str] = collections.deque(maxlen=64)  # logged by the next flush
        self.lock = threading.Lock()  # a try-lock (see the module's docstring); never the hot path
        self._series: dict[SeriesKey, Series] = {}
        # Parked registrations: key -> (series, capped). dict.setdefault and popitem are atomic, which is all the
        # callers that could not take the lock need.
        self._pending: dict[SeriesKey, tuple[Series, bool]] = {}
        self._label_names: dict[str, tuple[str, ...]] = {}
        self._kinds: dict[str, str] = {}
        self._per_metric: dict[str, int] = {}

    # Typed by kind: _get gives the kind asked for (KINDS[kind], or a hit of that kind) or a refused NoopSeries; a
    # kind known only at run time, any of the three
    @overload
    def series(self, kind: Literal["counter"], name: str, labels: dict[str, str] | None = ...,
               bounds: tuple[float, ...] = ..., builtin: bool = ...) -> Counter | NoopSeries: ...
    @overload
    def series(self, kind: Literal["gauge"], name: str, labels: dict[str, str] | None = ...,
               bounds: tuple[float, ...] = ..., builtin: bool = ...) -> Gauge | NoopSeries: ...
    @overload
    def series(self, kind: Literal["histogram"], name: str, labels: dict[str, str] | None = ...,
               bounds: tuple[float, ...] = ..., builtin: bool = ...) -> Histogram | NoopSeries: ...
    @overload
    def series(self, kind: str, name: str, labels: dict[str, str] | None = ...,
               bounds: tuple[float, ...] = ..., builtin: bool = ...) -> Counter | Gauge | Histogram | NoopSeries: ...
    def series(self, kind: str, name: str, labels: dict[str, str] | None = None,
               bounds: tuple[float, ...] = DURATION_BOUNDS, builtin: bool = False) -> Series | NoopSeries:
        """The series for name and labels, created on first use; a no-op series (counted) when refused.

        builtin: the hook's own series (an outrider_ name); the caps still apply, for labels from user input."""
        return self._get(kind, name, labels, bounds, builtin, capped=True)

    def builtin_counter(self, name: str, labels: dict[str, str] | None = None) -> Counter | NoopSeries:
        """A counter the hook itself keeps (steps, drops): outside the user's caps."""
        s = self._get("counter", name, labels, (), builtin=True, capped=False)
        return s if isinstance(s, Counter | NoopSeries) else NoopSeries(name)

    def _get(self, kind: str, name: str, labels: dict[str, str] | None, bounds: tuple[float, ...], builtin: bool,
             capped: bool) -> Series | NoopSeries:
        try:
            labels = labels or {}
            if not builtin and isinstance(name, str) and name.startswith(RESERVED_PREFIX):
                return self._refused("reserved_name", name, labels)  # before the lookup: the agent's own exist
            key = (name, tuple(sorted(labels.items())))
            hit = self._series.get(key)
            if hit is None:
                parked = self._pending.get(key)
                hit = parked[0] if parked is not None else None
            if hit is not None:
                return hit if hit.kind == kind else self._refused("inconsistent_kind", name, labels)
            reason = self._invalid(kind, name, labels, builtin)
            if reason:
                return self._refused(reason, name, labels)
            new: Series
            if kind == "histogram":
                # durations (the default bounds) are also recorded in the log-bucketed sketch
                new = Histogram(name, dict(labels), len(bounds) + 2, self.drop, tuple(bounds),
                                sketched=tuple(bounds) == DURATION_BOUNDS)
            else:
                new = KINDS[kind](name, dict(labels), 1, self.drop)
            if not self.lock.acquire(blocking=False):
                got = self._pending.setdefault(key, (new, capped))[0]
                return got if got.kind == kind else self._refused("inconsistent_kind", name, labels)
            try:
                self._drain()
                hit = self._series.get(key)
                if hit is None:
                    reason = self._over(kind, name, labels, capped)
                    if reason:
                        return self._refused(reason, name, labels)
                    self._add(key, new)
                    return new
                return hit if hit.kind == kind else self._refused("inconsistent_kind", name, labels)
            finally:
                self.lock.release()
        except Exception:
            self.drop("registration_error")
            return NoopSeries(str(name))

    def _add(self, key: SeriesKey, s: Series) -> None:  # the caller holds the lock
        self._per_metric[s.name] = self._per_metric.get(s.name, 0) + 1
        self._label_names.setdefault(s.name, tuple(sorted(s.labels)))
        self._kinds.setdefault(s.name, s.kind)
        self._series[key] = s  # last: a reader that finds it finds it complete

    def _drain(self) -> None:
        """Registers the parked series (the caller holds the lock)."""
        while self._pending:
            try:
                key, (s, capped) = self._pending.popitem()
            except KeyError:
                break
            hit = self._series.get(key)
            if hit is None:
                reason = self._over(s.kind, s.name, s.labels, capped)
                if reason:
                    self._refused(reason, s.name, s.labels)  # its updates are dropped with it, as counted
                else:
                    self._add(key, s)
            elif hit.kind == s.kind and hit.bounds == s.bounds:
                hit.twins.append(s)
            else:
                self._refused("inconsistent_kind", s.name, s.labels)

    def _refused(self, reason: str, name: Any, labels: Any) -> NoopSeries:
        self.drop(reason)
        if reason not in self._warned:
            self._warned.add(reason)
            self._warnings.append(f"outrider: metric {name!r} with labels {labels!r} refused ({reason}); further "
                                  "refusals are only counted in outrider_hook_dropped_total")
        return NoopSeries(str(name))

    def _invalid(self, kind: str, name: str, labels: dict[str, str], builtin: bool) -> str:
        """Why a registration is refused whatever is registered already ("" when it is not)."""
        if kind not in KINDS:
            return "invalid_kind"
        # What a shard may hold is the spool's rule (its reader drops the rest); the hook adds its own refusals:
        # colons, which Prometheus's naming guide keeps for recording rules (the reader accepts its whole grammar),
        # and the agent's outrider_ names.
        if isinstance(name, str) and ":" in name:
            return "invalid_name"
        reason = spool.name_refusal(name)[0]
        if reason:
            return reason
        if not builtin and name.startswith(RESERVED_PREFIX):
            return "reserved_name"
        for k, v in labels.items():
            reason = spool.label_refusal(name, k, v)[0]
            if reason:
                return reason
        return ""

    def _over(self, kind: str, name: str, labels: dict[str, str], capped: bool) -> str:
        """Why a registration is refused given what is registered (the caller holds the lock)."""
        known = self._label_names.get(name)
        if known is not None and known != tuple(sorted(labels)):
            return "inconsistent_label_names"
        known_kind = self._kinds.get(name)
        if known_kind is not None and known_kind != kind:
            return "inconsistent_kind"
        if not capped:
            return ""
        if self._per_metric.get(name, 0) >= self.max_series_per_metric:
            return "series_limit_per_metric"
        if len(self._series) >= self.max_series:
            return "series_limit"
        return ""

    def layout(self) -> tuple[list[list[Any]], list[float], list[list[int]]]:
        """Every series that has data, as shard directory entries and their values (summed over threads), and the
        sketches of duration histograms: [entry index, offset, buckets] each, their values after every series'
        (the zero bucket's count, then index and count per bucket, ascending: shared/spool.py's format).

        The publisher's (one flush at a time). Registers what was parked when it can take the lock, else at the
        next flush: a parked series loses nothing meanwhile, its values are cumulative."""
        if self.lock.acquire(blocking=False):
            try:
                self._drain()
                for reason, count in list(self.drop.counts.items()):
                    key = ("outrider_hook_dropped_total", (("reason", reason),))
                    s = self._series.get(key)
                    if s is None:
                        s = Counter(key[0], {"reason": reason}, 1, self.drop)
                        self._add(key, s)
                    if isinstance(s, Counter):
                        s.set_total(count)
            finally:
                self.lock.release()
        self.log_warnings()
        entries: list[list[Any]] = []
        values: list[float] = []
        sketched: list[tuple[int, dict[int, float], float]] = []
        for s in list(self._series.values()):
            if not s.has_data():
                continue
            entries.append([s.name, s.kind, s.labels, len(values), list(s.bounds)])
            if isinstance(s, Histogram):
                counted = s.counts()
                values.extend(counted.cells)
                if counted.sketch is not None:
                    sketched.append((len(entries) - 1, counted.sketch, counted.zero))
            else:
                values.extend(s.total())
        sketches: list[list[int]] = []
        for index, buckets, zero in sketched:
            sketches.append([index, len(values), len(buckets)])
            values.append(zero)
            for i in sorted(buckets):
                values.append(float(i))
                values.append(buckets[i])
        return entries, values, sketches

    def log_warnings(self) -> None:
        """The refusals' warnings, from the publisher (see the module's docstring), through a logging thread."""
        while self._warnings:
            try:
                log_aside(LOG, logging.WARNING, "%s", self._warnings.popleft())
            except Exception:  # an emptied deque, or no thread to log from: never the workload's problem
                break

    def has_data(self) -> bool:
        return any(s.has_data() for s in list(self._series.values())) or bool(self._pending)

    def reset_after_fork(self) -> None:
        """A forked child keeps the registrations (its handles stay valid) with zeroed values."""
        self.lock = threading.Lock()  # the parent's holder (another thread) does not exist here
        for s in [*self._series.values(), *(p[0] for p in list(self._pending.values()))]:
            s.reset_after_fork()
        self.drop.clear()
