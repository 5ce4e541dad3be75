"""What the agent measured of a run through the hook, over the whole run: steps, step time, throughput, data wait,
requests, latency and errors, from the final sweep's histograms and counters (cumulative since each process
started). Every `outrider run` summary and every report shows it, rendered by `rows()`; a run whose command never
called `outrider.instrument()` says so instead of showing nothing."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from outrider.metrics import units
from outrider.metrics.family import Family, HistogramValue, merged_histogram
from outrider.metrics.quantile import histogram_quantile

STEP, WAIT, REQUEST = ("outrider_train_step_duration_seconds", "outrider_train_data_wait_seconds",
                       "outrider_request_duration_seconds")


@dataclass
class Measured:
    training_processes: int = 0
    steps: float = 0.0
    samples: float = 0.0
    tokens: float = 0.0
    step_p50_s: float | None = None
    step_p99_s: float | None = None
    samples_per_s: float | None = None  # per second in the training loop (step work and data wait)
    time_to_first_step_s: float | None = None
    data_wait_p50_s: float | None = None
    data_wait_fraction: float | None = None
    requests: float = 0.0
    routes: list[str] = field(default_factory=list)
    latency_p50_s: float | None = None
    latency_p90_s: float | None = None
    latency_p99_s: float | None = None
    client_errors: float = 0.0
    server_errors: float = 0.0

    def rows(self) -> list[tuple[str, str]]:
        """(topic, what was measured) lines, in human units; the same for the summary and the report."""
        out: list[tuple[str, str]] = []
        if self.steps:
            parts = [f"{units.count(self.steps)} steps"]
            if self.step_p50_s is not None and self.step_p99_s is not None:
                parts.append(f"step time p50 {units.seconds(self.step_p50_s)}, p99 {units.seconds(self.step_p99_s)}")
            if self.samples_per_s:
                parts.append(units.rate(self.samples_per_s, "samples"))
            if self.training_processes > 1:
                parts.append(f"{self.training_processes} processes")
            out.append(("training", ", ".join(parts)))
            if self.data_wait_fraction is not None and self.data_wait_p50_s is not None:
                out.append(("", f"data-loader wait p50 {units.seconds(self.data_wait_p50_s)}, "
                                f"{units.percent(self.data_wait_fraction)} of the loop waiting for data"))
            if self.time_to_first_step_s is not None:
                out.append(("", f"first step {units.seconds(self.time_to_first_step_s)} after instrument()"))
        if self.requests:
            where = f" on {', '.join(self.routes)}" if self.routes else ""
            errors = self.client_errors + self.server_errors
            detail = (f" ({units.count(self.client_errors)} 4xx, {units.count(self.server_errors)} 5xx)"
                      if errors else "")
            out.append(("inference", f"{units.count(self.requests)} requests{where}, latency p50 "
                                     f"{units.seconds(self.latency_p50_s or 0.0)}, p90 "
                                     f"{units.seconds(self.latency_p90_s or 0.0)}, p99 "
                                     f"{units.seconds(self.latency_p99_s or 0.0)}; {units.count(errors)} errors"
                                     f"{detail}"))
        if not out:
            out.append(("hook", "nothing: no process of the command called outrider.instrument() (the process "
                                "tree's CPU, memory and I/O above are measured without it)"))
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measured:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _sum(families: list[Family], name: str, label: str = "", value: str = "") -> float:
    total = 0.0
    for f in families:
        if f.defn.name != name:
            continue
        at = f.defn.label_names.index(label) if label else -1
        for labels, v in f.samples:
            if isinstance(v, float) and (at < 0 or labels[at] == value):
                total += v
    return total


def _series(families: list[Family], name: str) -> list[tuple[tuple[str, ...], HistogramValue]]:
    return [(labels, v) for f in families if f.defn.name == name for labels, v in f.samples
            if isinstance(v, HistogramValue) and v.count]


def measure(families: list[Family]) -> Measured:
    m = Measured()
    step, wait = merged_histogram(families, STEP), merged_histogram(families, WAIT)
    if step is not None and step.count:
        m.training_processes = len(_series(families, STEP))
        m.steps = _sum(families, "outrider_train_steps_total") or float(step.count)
        m.samples = _sum(families, "outrider_samples_total")
        m.tokens = _sum(families, "outrider_tokens_total")
        m.step_p50_s, m.step_p99_s = histogram_quantile(0.5, step), histogram_quantile(0.99, step)
        waited = wait.sum if wait is not None else 0.0
        loop_s = (step.sum + waited) / max(1, m.training_processes)  # the processes' loops ran side by side
        if m.samples and loop_s > 0:
            m.samples_per_s = m.samples / loop_s
        if wait is not None and wait.count:
            m.data_wait_p50_s = histogram_quantile(0.5, wait)
            m.data_wait_fraction = wait.sum / (wait.sum + step.sum) if wait.sum + step.sum > 0 else None
        firsts = [v for f in families if f.defn.name == "outrider_train_time_to_first_step_seconds"
                  for _, v in f.samples if isinstance(v, float)]
        m.time_to_first_step_s = max(firsts) if firsts else None
    req = merged_histogram(families, REQUEST)
    if req is not None and req.count:
        m.requests = float(req.count)
        route_at = next((f.defn.label_names.index("route") for f in families if f.defn.name == REQUEST), 0)
        m.routes = sorted({labels[route_at] for labels, _ in _series(families, REQUEST) if labels[route_at]})
        m.latency_p50_s = histogram_quantile(0.5, req)
        m.latency_p90_s = histogram_quantile(0.9, req)
        m.latency_p99_s = histogram_quantile(0.99, req)
        m.client_errors = _sum(families, "outrider_requests_total", "status_class", "4xx")
        m.server_errors = _sum(families, "outrider_requests_total", "status_class", "5xx")
    return m
