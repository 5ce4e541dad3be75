"""The numbers a verdict rests on, from two sweeps a window apart: rates from counters, latest values of gauges."""

from __future__ import annotations

from dataclasses import dataclass, field

from outrider.metrics.family import Family, HistogramValue


def snapshot(families: list[Family]) -> dict[str, float]:
    """The scalars of one sweep the diagnosis uses (sums over ranks and GPUs, means or maxima where so named)."""
    out: dict[str, float] = {}
    gpu_util: list[float] = []
    gpm: dict[str, list[float]] = {}
    mem_used: dict[str, float] = {}
    mem_total: dict[str, float] = {}
    thermal = power = 0.0

    def add(key: str, value: float) -> None:
        out[key] = out.get(key, 0.0) + value

    for fam in families:
        name = fam.defn.name
        labels = fam.defn.label_names
        for values, v in fam.samples:
            if isinstance(v, HistogramValue):
                if name == "outrider_train_step_duration_seconds":
                    add("step_sum", v.sum)
                    add("step_count", v.count)
                elif name == "outrider_train_data_wait_seconds":
                    add("wait_sum", v.sum)
                continue
            lab = dict(zip(labels, values))
            if name == "outrider_samples_total":
                add("samples", v)
            elif name == "outrider_requests_total":
                add("requests", v)
            elif name == "outrider_watched_cpu_seconds_total":
                add("process_cpu", v)
            elif name == "outrider_host_cpu_utilization_ratio":
                out["host_cpu_util"] = v
            elif name == "outrider_host_logical_cpus":
                out["cpus"] = v
            elif name == "outrider_host_memory_available_bytes":
                out["host_mem_avail"] = v
            elif name == "outrider_host_memory_limit_bytes":
                out["host_mem_total"] = v
            elif name == "outrider_gpu_utilization_ratio" and lab.get("task") == "general":
                gpu_util.append(v)
            elif name in ("outrider_gpu_sm_activity_ratio", "outrider_gpu_tensor_activity_ratio",
                          "outrider_gpu_dram_activity_ratio"):
                gpm.setdefault(name, []).append(v)
            elif name == "outrider_gpu_memory_used_bytes":
                mem_used[lab["gpu"]] = v
            elif name == "outrider_gpu_memory_total_bytes":
                mem_total[lab["gpu"]] = v
            elif name == "outrider_gpu_clock_event_active" and v:
                reason = lab.get("reason", "")
                if "thermal" in reason:
                    thermal = 1.0
                elif reason in ("hw_power_brake_slowdown", "hw_slowdown", "sw_power_cap"):
                    power = 1.0
            elif name == "outrider_torch_cuda_alloc_retries_total":
                add("alloc_retries", v)
    if gpu_util:
        out["gpu_util"] = sum(gpu_util) / len(gpu_util)
        out["gpus"] = len(gpu_util)
    for name, vals in gpm.items():
        out[name.replace("outrider_gpu_", "").replace("_ratio", "")] = sum(vals) / len(vals)
    ratios = [mem_used[g] / mem_total[g] for g in mem_used if mem_total.get(g)]
    if ratios:
        out["gpu_mem_ratio"] = max(ratios)
    out["throttle_thermal"], out["throttle_power"] = thermal, power
    return out


@dataclass
class Signals:
    window_s: float
    steps_per_s: float = 0.0
    step_time_s: float | None = None
    data_wait_fraction: float | None = None
    samples_per_s: float = 0.0
    requests_per_s: float = 0.0
    process_cpu_cores: float = 0.0
    cpus: float = 1.0
    host_cpu_util: float | None = None
    host_mem_available_ratio: float | None = None
    gpus: int = 0
    gpu_util: float | None = None
    sm_activity: float | None = None
    tensor_activity: float | None = None
    dram_activity: float | None = None
    gpu_mem_ratio: float | None = None
    alloc_retries: float = 0.0
    throttle_thermal: bool = False
    throttle_power: bool = False
    extra: dict[str, float] = field(default_factory=dict)

    def evidence(self) -> dict[str, float]:
        """The signals that have a value, rounded, for reports and the diagnosis metrics."""
        out = {}
        for key, value in vars(self).items():
            if key in ("extra", "window_s") or value is None:
                continue
            out[key] = round(float(value), 4)
        return out


def signals(old: dict[str, float], new: dict[str, float], dt: float) -> Signals:
    def delta(key: str) -> float:
        return max(0.0, new.get(key, 0.0) - old.get(key, 0.0))

    s = Signals(window_s=dt)
    if dt <= 0:
        return s
    steps = delta("step_count")
    s.steps_per_s = steps / dt
    if steps:
        s.step_time_s = delta("step_sum") / steps
    busy = delta("step_sum") + delta("wait_sum")
    if busy > 0:
        s.data_wait_fraction = delta("wait_sum") / busy
    s.samples_per_s = delta("samples") / dt
    s.requests_per_s = delta("requests") / dt
    s.process_cpu_cores = delta("process_cpu") / dt
    s.cpus = new.get("cpus", 1.0) or 1.0
    s.host_cpu_util = new.get("host_cpu_util")
    if new.get("host_mem_total"):
        s.host_mem_available_ratio = new.get("host_mem_avail", 0.0) / new["host_mem_total"]
    s.gpus = int(new.get("gpus", 0))
    s.gpu_util = new.get("gpu_util")
    s.sm_activity = new.get("sm_activity")
    s.tensor_activity = new.get("tensor_activity")
    s.dram_activity = new.get("dram_activity")
    s.gpu_mem_ratio = new.get("gpu_mem_ratio")
    s.alloc_retries = delta("alloc_retries")
    s.throttle_thermal = bool(new.get("throttle_thermal"))
    s.throttle_power = bool(new.get("throttle_power"))
    return s
