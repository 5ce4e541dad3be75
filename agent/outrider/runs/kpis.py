"""The numbers a run record keeps per sweep (its KPIs), each with a label, a unit and which way is better; and
labels for the diagnosis's evidence. The recorder writes these names, the report plots them, the comparison
compares them, and all of them print them through one formatter (outrider.metrics.units)."""

from __future__ import annotations

from dataclasses import dataclass

from outrider.metrics import units


@dataclass(frozen=True)
class Kpi:
    key: str
    label: str
    kind: str  # seconds | bytes | ratio | rate | cores | count
    what: str = ""  # the thing a rate counts: samples (per second)
    better: str = ""  # higher | lower | "" (neither: the number describes, it does not judge)
    phase: str = ""  # training | inference: the KPI means something only in sweeps with steps | requests

    def format(self, value: float) -> str:
        if self.kind == "seconds":
            return units.seconds(value)
        if self.kind == "bytes":
            return units.bytes_iec(value)
        if self.kind == "ratio":
            return units.percent(value)
        if self.kind == "rate":
            return units.rate(value, self.what)
        if self.kind == "cores":
            return units.cores(value)
        return units.count(value, self.what)


KPIS: dict[str, Kpi] = {k.key: k for k in (
    Kpi("step_time_s", "step time", "seconds", better="lower", phase="training"),
    Kpi("step_p50_s", "step time p50", "seconds", better="lower", phase="training"),
    Kpi("step_p99_s", "step time p99", "seconds", better="lower", phase="training"),
    Kpi("steps_per_s", "step rate", "rate", "steps", "higher", "training"),
    Kpi("samples_per_s", "throughput", "rate", "samples", "higher", "training"),
    Kpi("tokens_per_s", "token throughput", "rate", "tokens", "higher", "training"),
    Kpi("data_wait_fraction", "data wait", "ratio", better="lower", phase="training"),
    Kpi("mfu", "MFU", "ratio", better="higher", phase="training"),
    Kpi("requests_per_s", "request rate", "rate", "req", "higher", "inference"),
    Kpi("client_errors_per_s", "client errors (4xx)", "rate", "errors", "lower", "inference"),
    Kpi("server_errors_per_s", "server errors (5xx)", "rate", "errors", "lower", "inference"),
    Kpi("latency_p50_s", "p50 latency", "seconds", better="lower", phase="inference"),
    Kpi("latency_p99_s", "p99 latency", "seconds", better="lower", phase="inference"),
    Kpi("process_cpu_cores", "job CPU", "cores"),
    Kpi("host_cpu_util", "host CPU", "ratio"),
    Kpi("rss_bytes", "job memory (RSS)", "bytes", better="lower"),
    Kpi("gpu_util", "GPU utilisation", "ratio"),
    Kpi("gpu_mem_ratio", "GPU memory used", "ratio"),
)}
ACTIVITY = {"training": "steps_per_s", "inference": "requests_per_s"}  # the KPI that says a phase is running


@dataclass(frozen=True)
class Distribution:
    """A duration histogram a run record keeps whole (runs/distributions.py): what the run recorded of it, from its
    first sweep to its last, which `outrider compare` judges step by step and request by request."""

    key: str  # its name in the record
    metric: str  # the histogram family (all its series merged)
    label: str
    items: str  # what it counts: steps, requests
    stats: tuple[float | str, ...]  # what compare compares: quantiles and "mean"
    per_sweep: tuple[tuple[float | str, str], ...] = ()  # (statistic, the per-sweep KPI) for records without it
    by_route: bool = False  # kept per route as well (key:route)


DISTRIBUTIONS: dict[str, Distribution] = {d.key: d for d in (
    Distribution("step_time", "outrider_train_step_duration_seconds", "step time", "steps", (0.5, "mean", 0.99),
                 ((0.5, "step_p50_s"), ("mean", "step_time_s"), (0.99, "step_p99_s"))),
    Distribution("data_wait", "outrider_train_data_wait_seconds", "data-loader wait", "waits", (0.5, "mean")),
    Distribution("latency", "outrider_request_duration_seconds", "request latency", "requests",
                 (0.5, 0.9, 0.99, "mean"), ((0.5, "latency_p50_s"), (0.99, "latency_p99_s")), by_route=True),
    Distribution("ttft", "outrider_inference_time_to_first_token_seconds", "time to first token", "responses",
                 (0.5, 0.99)),
    Distribution("inter_token", "outrider_inference_inter_token_latency_seconds", "inter-token latency", "tokens",
                 (0.5, 0.99)),
)}

# The diagnosis's evidence that is not a KPI (diagnosis/signals.Signals names them). A key missing here is still
# shown in human units, by its suffix (units.by_key).
EVIDENCE: dict[str, Kpi] = {k.key: k for k in (
    Kpi("cpus", "logical CPUs", "count"),
    Kpi("gpus", "GPUs", "count"),
    Kpi("requests_in_flight", "requests in flight", "count"),
    Kpi("host_mem_available_ratio", "host memory available", "ratio"),
    Kpi("sm_activity", "SM activity", "ratio"),
    Kpi("tensor_activity", "tensor core activity", "ratio"),
    Kpi("dram_activity", "DRAM activity", "ratio"),
    Kpi("alloc_retries", "allocator retries", "count"),
    Kpi("throttle_thermal", "thermal throttling", "count"),
    Kpi("throttle_power", "power throttling", "count"),
)}


def describe(key: str, value: float) -> tuple[str, str]:
    """(label, value in human units) for a KPI or a piece of evidence."""
    kpi = KPIS.get(key) or EVIDENCE.get(key)
    if kpi is not None:
        return kpi.label, kpi.format(value)
    return units.label_of(key), units.by_key(key, value)


def evidence_order(keys: list[str]) -> list[str]:
    """KPIs first in the table's order, then the rest by name: the same order in every rendering."""
    known = [k for k in (*KPIS, *EVIDENCE) if k in keys]
    return known + sorted(k for k in keys if k not in KPIS and k not in EVIDENCE)


def is_count(key: str) -> bool:
    kpi = KPIS.get(key) or EVIDENCE.get(key)
    return kpi is not None and kpi.kind == "count"
