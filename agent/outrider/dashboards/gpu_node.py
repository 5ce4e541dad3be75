"""GPU node dashboard: every GPU's utilisation, memory, temperature, power, clocks, throttle reasons, XID and ECC,
PCIe and NVLink, and the processes using it."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from outrider.dashboards.panels import GREEN, SEL, dashboard, query, runbook, table, thresholds, ts
from outrider.dashboards.training import firing_alerts_annotation

G = f'{SEL}, gpu=~"$gpu"'


def build() -> Dashboard:
    d = dashboard("outrider-gpu-node", "Outrider / GPU node",
                  "Per-GPU health and load from NVML: utilisation, memory, thermals, power, clocks and throttling, "
                  "errors, interconnect and processes.", ["gpu"], ["namespace", "job", "instance", "gpu"])
    d = d.annotation(firing_alerts_annotation())
    d = d.with_row(Row("Load"))
    d = d.with_panel(ts("Utilisation", "Fraction of time a kernel ran (NVML) and SM activity (GPM, Hopper+).",
                        "percentunit",
                        query(f'outrider_gpu_utilization_ratio{{{G}, task="general"}}', "GPU {{gpu}}"),
                        query(f"outrider_gpu_sm_activity_ratio{{{G}}}", "SM activity GPU {{gpu}}"),
                        min_val=0, max_val=1))
    d = d.with_panel(ts("Memory used", "Device memory in use against capacity.", "percentunit",
                        query(f"outrider_gpu_memory_used_bytes{{{G}}} / outrider_gpu_memory_total_bytes{{{G}}}",
                              "GPU {{gpu}}"), th=thresholds(GREEN, (0.9, "orange"), (0.95, "red")),
                        min_val=0, max_val=1, links=[runbook("exhaustion.md", "gpumemorynearlyfull", "GPU memory")]))
    d = d.with_panel(ts("Tensor and DRAM activity", "Tensor-core activity and DRAM bandwidth use (GPM).",
                        "percentunit", query(f"outrider_gpu_tensor_activity_ratio{{{G}}}", "tensor GPU {{gpu}}"),
                        query(f"outrider_gpu_dram_activity_ratio{{{G}}}", "DRAM GPU {{gpu}}"), min_val=0, max_val=1))
    d = d.with_panel(ts("Memory bandwidth utilisation", "Fraction of time device memory was read or written.",
                        "percentunit", query(f"outrider_gpu_memory_bandwidth_utilization_ratio{{{G}}}", "GPU {{gpu}}"),
                        min_val=0, max_val=1))
    d = d.with_row(Row("Thermals and power"))
    d = d.with_panel(ts("Temperature", "GPU die and memory temperature.", "celsius",
                        query(f"outrider_gpu_temperature_celsius{{{G}}}", "GPU {{gpu}} {{sensor}}"),
                        th=thresholds(GREEN, (80, "orange"), (87, "red")),
                        links=[runbook("hardware.md", "gputhermalthrottling", "thermal throttling")]))
    d = d.with_panel(ts("Power", "Power draw against the enforced limit.", "watt",
                        query(f"outrider_gpu_power_watts{{{G}}}", "GPU {{gpu}}"),
                        query(f"outrider_gpu_power_limit_watts{{{G}}}", "limit GPU {{gpu}}")))
    d = d.with_panel(ts("Clocks", "SM clock against its maximum: below it under load means throttling.", "hertz",
                        query(f'outrider_gpu_clock_hertz{{{G}, clock="sm"}}', "SM GPU {{gpu}}"),
                        query(f'outrider_gpu_clock_max_hertz{{{G}, clock="sm"}}', "max SM GPU {{gpu}}")))
    d = d.with_panel(ts("Throttle reasons", "Clock event reasons active now (1 = holding clocks down), idle "
                        "and application settings left out.", "short",
                        query(f'outrider_gpu_clock_event_active{{{G}, reason!~"gpu_idle|applications_clocks_setting|'
                              f'display_clock_setting"}} > 0', "GPU {{gpu}} {{reason}}"),
                        th=thresholds(GREEN, (1, "red")),
                        links=[runbook("hardware.md", "gpupowerbrakeorhardwareslowdown", "power brake")]))
    d = d.with_row(Row("Errors"))
    d = d.with_panel(ts("XID errors", "XID errors by code and class in each interval.", "short",
                        query(f"sum by (gpu, xid, class) (increase(outrider_gpu_xid_errors_total{{{G}}}"
                              "[$__rate_interval]))", "GPU {{gpu}} XID {{xid}} ({{class}})"),
                        th=thresholds(GREEN, (1, "red")), links=[runbook("hardware.md", "gpuxid", "XID")]))
    d = d.with_panel(ts("ECC errors and remapped rows", "Volatile ECC errors and remapped memory rows.", "short",
                        query(f'outrider_gpu_ecc_errors_total{{{G}, counter="volatile"}}', "GPU {{gpu}} {{type}}"),
                        query(f"outrider_gpu_remapped_rows{{{G}}}", "GPU {{gpu}} remapped {{kind}}"),
                        links=[runbook("hardware.md", "gpuuncorrectableecc", "ECC")]))
    d = d.with_panel(ts("GPU up", "1 while the GPU answers; 0 once NVML reports it lost.", "short",
                        query(f"outrider_gpu_up{{{G}}}", "GPU {{gpu}}"), th=thresholds((None, "red"), (1, "green")),
                        min_val=0, max_val=1, links=[runbook("hardware.md", "gpulost", "GPU lost")]))
    d = d.with_row(Row("Interconnect"))
    d = d.with_panel(ts("PCIe throughput", "PCIe bytes per second, transmit and receive.", "Bps",
                        query(f"outrider_gpu_pcie_throughput_bytes_per_second{{{G}}}", "GPU {{gpu}} {{direction}}")))
    d = d.with_panel(ts("NVLink throughput", "NVLink data bytes per second over all links.", "Bps",
                        query(f"rate(outrider_gpu_nvlink_bytes_total{{{G}}}[$__rate_interval])",
                              "GPU {{gpu}} {{direction}}")))
    d = d.with_row(Row("Processes"))
    d = d.with_panel(table("Processes on the GPUs", "Compute processes, their device memory and SM share (PIDs in "
                           "the agent's namespace).", "bytes",
                           query(f"outrider_gpu_process_memory_bytes{{{G}}}", instant=True, table=True)))
    return d
