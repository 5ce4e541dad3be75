"""Records a run as it goes: KPIs per sweep (from the difference with the previous sweep), verdict changes, and
events (stalls), into the run store."""

from __future__ import annotations

import time

from outrider.diagnosis.signals import signals, snapshot
from outrider.diagnosis.window import VerdictWindow
from outrider.metrics.family import Family, HistogramValue, merged_histogram
from outrider.metrics.quantile import histogram_quantile
from outrider.runs.store import RunStore


def _delta(new: HistogramValue | None, old: HistogramValue | None) -> HistogramValue | None:
    if new is None:
        return None
    if old is None or old.bounds != new.bounds:
        return new
    return HistogramValue(new.bounds, tuple(max(0, a - b) for a, b in zip(new.counts, old.counts)),
                          new.sum - old.sum)


class RunRecorder:
    def __init__(self, store: RunStore, run_id: str, window_s: float = 30.0) -> None:
        self.store = store
        self.run_id = run_id
        self.window = VerdictWindow(window_s)
        self._prev: tuple[float, dict[str, float], dict[str, HistogramValue | None]] | None = None
        self._last_verdict = ""
        self._stalled: set[str] = set()

    def __call__(self, families: list[Family]) -> None:
        now = time.monotonic()
        snap = snapshot(families)
        hists = {name: merged_histogram(families, name) for name in
                 ("outrider_train_step_duration_seconds", "outrider_request_duration_seconds")}
        t = time.time()
        prev, self._prev = self._prev, (now, snap, hists)
        kpis: dict[str, float] = {}
        for f in families:
            if f.defn.name == "outrider_watched_memory_rss_bytes" and f.samples:
                kpis["rss_bytes"] = float(f.samples[0][1])  # type: ignore[arg-type]
            if f.defn.name == "outrider_hook_stalled":
                for labels, v in f.samples:
                    rank = labels[0] or "-"
                    if v and rank not in self._stalled:
                        self._stalled.add(rank)
                        self.store.add_event(self.run_id, t, "stall", f"rank {rank} stalled")
                    elif not v and rank in self._stalled:
                        self._stalled.discard(rank)
                        self.store.add_event(self.run_id, t, "resume", f"rank {rank} resumed")
        if prev is not None:
            s = signals(prev[1], snap, now - prev[0])
            for key in ("steps_per_s", "samples_per_s", "requests_per_s", "process_cpu_cores"):
                kpis[key] = getattr(s, key)
            for key in ("step_time_s", "data_wait_fraction", "gpu_util", "gpu_mem_ratio", "host_cpu_util"):
                value = getattr(s, key)
                if value is not None:
                    kpis[key] = value
            step = _delta(hists["outrider_train_step_duration_seconds"],
                          prev[2]["outrider_train_step_duration_seconds"])
            if step is not None and step.count:
                kpis["step_p50_s"] = histogram_quantile(0.5, step) or 0.0
                kpis["step_p99_s"] = histogram_quantile(0.99, step) or 0.0
            req = _delta(hists["outrider_request_duration_seconds"], prev[2]["outrider_request_duration_seconds"])
            if req is not None and req.count:
                kpis["latency_p50_s"] = histogram_quantile(0.5, req) or 0.0
                kpis["latency_p99_s"] = histogram_quantile(0.99, req) or 0.0
        if kpis:
            self.store.add_samples(self.run_id, t, kpis)
        verdict = self.window.add(families, now)
        if verdict is not None and verdict.cls != self._last_verdict:
            self._last_verdict = verdict.cls
            self.store.add_verdict(self.run_id, t, verdict.cls, verdict.reason, verdict.evidence)
