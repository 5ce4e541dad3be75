"""The hook's series registry: creates series on first use, refuses bad or excessive ones, and lays them out for
the shard.

Registration takes a lock (rare); recording never does (hook/series.py). A refused registration returns a no-op
series and counts the reason, so user input never raises or grows without bound.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from outrider.hook.series import DURATION_BOUNDS, Counter, Dropped, Gauge, Histogram, NoopSeries, Series

LOG = logging.getLogger("outrider.hook")
NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
MAX_LABEL_VALUE = 128
RESERVED_LABELS = ("rank", "training_job", "le", "quantile")  # added by the agent, or owned by a histogram
KINDS: dict[str, type[Series]] = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


class Registry:
    def __init__(self, max_series_per_metric: int = 100, max_series: int = 2000) -> None:
        self.max_series_per_metric = max_series_per_metric
        self.max_series = max_series
        self.drop = Dropped()
        self._warned: set[str] = set()
        self.lock = threading.Lock()  # registration and publishing only, never the hot path
        self._series: dict[SeriesKey, Series] = {}
        self._label_names: dict[str, tuple[str, ...]] = {}
        self._per_metric: dict[str, int] = {}

    def series(self, kind: str, name: str, labels: dict[str, str] | None = None,
               bounds: tuple[float, ...] = DURATION_BOUNDS, builtin: bool = False) -> Any:
        """The series for name and labels, created on first use; a no-op series (counted) when refused."""
        try:
            labels = labels or {}
            key = (name, tuple(sorted(labels.items())))
            hit = self._series.get(key)
            if hit is not None:
                return hit
            with self.lock:
                hit = self._series.get(key)
                if hit is not None:
                    return hit
                reason = self._refuse(kind, name, labels, builtin)
                if reason:
                    self._refused(reason, name, labels)
                    return NoopSeries(name, labels, 1, self.drop)
                hist = kind == "histogram"
                s = KINDS[kind](name, dict(labels), len(bounds) + 2 if hist else 1, self.drop,
                                tuple(bounds) if hist else ())
                self._series[key] = s
                self._per_metric[name] = self._per_metric.get(name, 0) + 1
                self._label_names.setdefault(name, tuple(sorted(labels)))
                return s
        except Exception:
            self.drop("registration_error")
            return NoopSeries(str(name), {}, 1, self.drop)

    def _refused(self, reason: str, name: Any, labels: Any) -> None:
        self.drop(reason)
        if reason not in self._warned:
            self._warned.add(reason)
            LOG.warning("outrider: metric %r with labels %r refused (%s); further refusals are only counted in "
                        "outrider_hook_dropped_total", name, labels, reason)

    def _refuse(self, kind: str, name: str, labels: dict[str, str], builtin: bool) -> str:
        if kind not in KINDS:
            return "invalid_kind"
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            return "invalid_name"
        if not builtin and name.startswith("outrider_"):
            return "reserved_name"
        for k, v in labels.items():
            if not isinstance(k, str) or not LABEL_RE.fullmatch(k) or k.startswith("__") or k in RESERVED_LABELS:
                return "invalid_label_name"
            if not isinstance(v, str) or len(v) > MAX_LABEL_VALUE:
                return "invalid_label_value"
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: a path or variable that was not UTF-8
                return "invalid_label_value"
        known = self._label_names.get(name)
        if known is not None and known != tuple(sorted(labels)):
            return "inconsistent_label_names"
        if self._per_metric.get(name, 0) >= self.max_series_per_metric:
            return "series_limit_per_metric"
        if len(self._series) >= self.max_series:
            return "series_limit"
        return ""

    def builtin_counter(self, name: str, labels: dict[str, str] | None = None) -> Counter:
        """A counter the hook itself keeps (steps, drops): outside the user's caps."""
        s = self._series.get((name, tuple(sorted((labels or {}).items()))))
        if isinstance(s, Counter):
            return s
        with self.lock:
            return self._builtin(name, labels or {})

    def _builtin(self, name: str, labels: dict[str, str]) -> Counter:  # the caller holds the lock
        key = (name, tuple(sorted(labels.items())))
        s = self._series.get(key)
        if not isinstance(s, Counter):
            s = self._series[key] = Counter(name, dict(labels), 1, self.drop)
        return s

    def layout(self) -> tuple[list[list[Any]], list[float]]:
        """Every series that has data, as shard directory entries and their values (summed over threads)."""
        with self.lock:
            for reason, count in list(self.drop.counts.items()):
                self._builtin("outrider_hook_dropped_total", {"reason": reason}).set_total(count)
            series = list(self._series.values())
        entries: list[list[Any]] = []
        values: list[float] = []
        for s in series:
            if not s._all:
                continue
            entries.append([s.name, s.kind, s.labels, len(values), list(s.bounds)])
            values.extend(s.total())
        return entries, values

    def has_data(self) -> bool:
        return any(s._all for s in list(self._series.values()))

    def reset_after_fork(self) -> None:
        """A forked child keeps the registrations (its handles stay valid) with zeroed values."""
        self.lock = threading.Lock()
        for s in self._series.values():
            s.reset_after_fork()
        self.drop.counts.clear()

