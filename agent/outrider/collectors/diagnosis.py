"""Diagnosis collector: the bottleneck verdict over a sliding window of sweeps, with its evidence, as metrics.

It listens to every finished sweep, keeps a compact snapshot of each for `diagnosis_window_s`, and reports the
verdict between the oldest and the newest in the next sweep (so it trails the data by one sweep).
"""

from __future__ import annotations

from outrider.collectors.base import Collector, CollectorContext
from outrider.diagnosis.bottleneck import CLASSES
from outrider.diagnosis.window import VerdictWindow
from outrider.metrics.family import Family


class DiagnosisCollector(Collector):
    name = "diagnosis"
    description = "why the job is slow: a bottleneck verdict with its evidence over a sliding window"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.window = VerdictWindow(ctx.config.diagnosis_window_s)
        ctx.listeners.append(self._on_sweep)

    def _on_sweep(self, families: list[Family]) -> None:
        self.window.add(families)

    def collect(self) -> list[Family]:
        v = self.window.verdict
        if v is None:
            return []
        verdict = Family("outrider_bottleneck")
        for cls in CLASSES:
            verdict.add(1 if cls == v.cls else 0, cls)
        evidence = Family("outrider_diagnosis_signal")
        for name, value in sorted(v.evidence.items()):
            evidence.add(value, name)
        return [verdict, evidence]
