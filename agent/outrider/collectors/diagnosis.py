"""Diagnosis collector: the bottleneck verdict over a sliding window of sweeps, with its evidence, as metrics.

It listens to every finished sweep, keeps a compact snapshot of each for `diagnosis_window_s`, and reports the
verdict between the oldest and the newest in the next sweep (so it trails the data by one sweep).
"""

from __future__ import annotations

import collections
import time

from outrider.collectors.base import Collector, CollectorContext
from outrider.diagnosis.bottleneck import CLASSES, Verdict, classify
from outrider.diagnosis.signals import signals, snapshot
from outrider.metrics.family import Family


class DiagnosisCollector(Collector):
    name = "diagnosis"
    description = "why the job is slow: a bottleneck verdict with its evidence over a sliding window"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.window_s = ctx.config.diagnosis_window_s
        self._snaps: collections.deque[tuple[float, dict[str, float]]] = collections.deque()
        self.verdict: Verdict | None = None
        ctx.listeners.append(self._on_sweep)

    def _on_sweep(self, families: list[Family]) -> None:
        now = time.monotonic()
        self._snaps.append((now, snapshot(families)))
        while len(self._snaps) > 2 and now - self._snaps[1][0] >= self.window_s:
            self._snaps.popleft()
        if len(self._snaps) >= 2:
            (t0, old), (t1, new) = self._snaps[0], self._snaps[-1]
            self.verdict = classify(signals(old, new, t1 - t0))

    def collect(self) -> list[Family]:
        v = self.verdict
        if v is None:
            return []
        verdict = Family("outrider_bottleneck")
        for cls in CLASSES:
            verdict.add(1 if cls == v.cls else 0, cls)
        evidence = Family("outrider_diagnosis_signal")
        for name, value in sorted(v.evidence.items()):
            evidence.add(value, name)
        return [verdict, evidence]
