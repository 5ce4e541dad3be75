"""GPU node dashboard: the node's totals, which workload owns each GPU and which processes run on it (nvitop's
table), every GPU's utilisation, memory, temperature, power, clocks, throttle reasons, XID and ECC, PCIe and
NVLink, and its MIG devices."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from outrider.dashboards.panels import (
    GREEN,
    OWNER,
    SEL,
    dashboard,
    joined_table,
    query,
    runbook,
    stat,
    table,
    thresholds,
    ts,
)
from outrider.dashboards.training import firing_alerts_annotation

G = f'{SEL}, {OWNER}, gpu=~"$gpu"'
# Every compute process on the selected GPUs with value 0: the rows of the process table, to which the process
# collector's columns are joined by pid (both in the agent's PID namespace) on the same agent.
GPU_PROCS = f"max by (instance, gpu, pid) (outrider_gpu_process_memory_bytes{{{G}}}) * 0"


def _of_gpu_procs(expr: str) -> str:
    """A per-process series (by instance and pid) on each GPU process row."""
    return f"{GPU_PROCS} + on (instance, pid) group_left () {expr}"


def build() -> Dashboard:
    d = dashboard("outrider-gpu-node", "Outrider / GPU node",
                  "Per-node and per-GPU health and load from NVML: the node's totals, which Kubernetes workload owns "
                  "each GPU (kubelet PodResources) and the processes on it, utilisation, memory, thermals, power, "
                  "clocks and throttling, errors, interconnect and MIG devices. Node lists the nodes of agents in "
                  "Kubernetes; Workload namespace and pod narrow the GPUs to one workload's.", ["gpu"],
                  ["namespace", "job", "node", "instance", "workload_namespace", "workload_pod", "gpu"])
    d = d.annotation(firing_alerts_annotation())
    d = d.with_row(Row("Node"))
    d = d.with_panel(stat("GPUs", "GPUs NVML reports on the selected nodes.", "short",
                          query(f"sum(outrider_gpu_count{{{SEL}}})", instant=True), width=4))
    d = d.with_panel(stat("Total power", "Power drawn by the selected GPUs together.", "watt",
                          query(f"sum(outrider_gpu_power_watts{{{G}}})", instant=True), width=4))
    d = d.with_panel(stat("Energy in range", "Energy the selected GPUs consumed over the dashboard's time range.",
                          "joule", query(f"sum(increase(outrider_gpu_energy_joules_total{{{G}}}[$__range]))",
                                         instant=True), width=4))
    d = d.with_panel(stat("GPU memory in use", "Device memory in use on the selected GPUs against their capacity.",
                          "percentunit", query(f"sum(outrider_gpu_memory_used_bytes{{{G}}}) / "
                                               f"sum(outrider_gpu_memory_total_bytes{{{G}}})", instant=True),
                          width=4, th=thresholds(GREEN, (0.9, "orange"), (0.95, "red"))))
    d = d.with_panel(stat("NVML", "1 while NVML answers on every selected node; 0: no driver or library there (the "
                          "agent's log says why).", "short", query(f"min(outrider_gpu_nvml_up{{{SEL}}})", instant=True),
                          width=4, th=thresholds((None, "red"), (1, "green"))))
    d = d.with_panel(stat("GPUs lost", "Times a GPU was found lost (fallen off the bus, needs a reset) since its "
                          "agent started.", "short", query(f"sum(outrider_gpu_lost_total{{{G}}})", instant=True),
                          width=4, th=thresholds(GREEN, (1, "red")),
                          links=[runbook("hardware.md", "gpulost", "GPU lost")]))
    d = d.with_panel(joined_table(
        "Nodes", "Per agent (node): its GPUs, their total power, memory in use and mean utilisation.", [
            ("GPUs", "short", query(f"max by (instance) (outrider_gpu_count{{{SEL}}})")),
            ("Power", "watt", query(f"sum by (instance) (outrider_gpu_power_watts{{{G}}})")),
            ("Memory used", "bytes", query(f"sum by (instance) (outrider_gpu_memory_used_bytes{{{G}}})")),
            ("Utilisation", "percentunit",
             query(f'avg by (instance) (outrider_gpu_utilization_ratio{{{G}, task="general"}})')),
        ], height=6))
    d = d.with_row(Row("Workloads and processes"))
    by_gpu = "instance, gpu, uuid, exported_namespace, exported_pod, exported_container"
    d = d.with_panel(joined_table(
        "GPUs by workload", "Each GPU with the Kubernetes workload (namespace, pod, container) the kubelet allocated "
        "it to (empty: no pod owns it; commas: time-sliced between pods), its utilisation, memory and power.", [
            ("Utilisation", "percentunit",
             query(f'max by ({by_gpu}) (outrider_gpu_utilization_ratio{{{G}, task="general"}})')),
            ("Memory used", "bytes", query(f"max by ({by_gpu}) (outrider_gpu_memory_used_bytes{{{G}}})")),
            ("Power", "watt", query(f"max by ({by_gpu}) (outrider_gpu_power_watts{{{G}}})")),
        ], height=7))
    d = d.with_panel(joined_table(
        "Processes on the GPUs", "Like nvitop: each compute process on the selected GPUs with its user and command, "
        "GPU memory and SM share (NVML), and CPU (1 = one core), host memory (RSS) and running time from the "
        "process collector (joined on pid, in the agent's PID namespace; empty where the process is not among the "
        "agent's watched top N).", [
            ("GPU memory", "bytes",
             query(f"max by (instance, gpu, pid, name, exported_namespace, exported_pod) "
                   f"(outrider_gpu_process_memory_bytes{{{G}}})")),
            ("SM share", "percentunit",
             query(f"max by (instance, gpu, pid) (outrider_gpu_process_sm_utilization_ratio{{{G}}})")),
            ("CPU", "percentunit",
             query(_of_gpu_procs(f"sum by (instance, pid) (rate(outrider_process_cpu_seconds_total{{{SEL}}}"
                                 "[$__rate_interval]))"))),
            ("Host memory", "bytes",
             query(_of_gpu_procs(f"max by (instance, pid) (outrider_process_memory_rss_bytes{{{SEL}}})"))),
            ("Running", "dtdurations",
             query(_of_gpu_procs(f"(time() - max by (instance, pid) (outrider_process_start_time_seconds{{{SEL}}}))"))),
            ("User and command", "short",
             query(f"{GPU_PROCS} + on (instance, pid) group_left (user, command) "
                   f"max by (instance, pid, user, command) (outrider_process_info{{{SEL}}})")),
        ], height=9))
    d = d.with_panel(ts("Process GPU memory", "Device memory of each compute process over time.", "bytes",
                        query(f"sum by (gpu, pid, name) (outrider_gpu_process_memory_bytes{{{G}}})",
                              "GPU {{gpu}} {{pid}} {{name}}"), width=12))
    d = d.with_panel(ts("Process SM share", "Each compute process's share of SM time (NVML's last sample).",
                        "percentunit", query(f"max by (gpu, pid, name) (outrider_gpu_process_sm_utilization_ratio"
                                             f"{{{G}}})", "GPU {{gpu}} {{pid}} {{name}}"),
                        width=12, min_val=0, max_val=1))
    d = d.with_row(Row("Load"))
    d = d.with_panel(ts("Utilisation", "Fraction of time a kernel ran (NVML) and SM activity (GPM, Hopper+).",
                        "percentunit",
                        query(f'outrider_gpu_utilization_ratio{{{G}, task="general"}}', "GPU {{gpu}}"),
                        query(f"outrider_gpu_sm_activity_ratio{{{G}}}", "SM activity GPU {{gpu}}"),
                        min_val=0, max_val=1))
    d = d.with_panel(ts("Memory used", "Device memory in use against capacity.", "percentunit",
                        query(f"outrider_gpu_memory_utilization_ratio{{{G}}}", "GPU {{gpu}}"),
                        th=thresholds(GREEN, (0.9, "orange"), (0.95, "red")),
                        min_val=0, max_val=1, links=[runbook("exhaustion.md", "gpumemorynearlyfull", "GPU memory")]))
    d = d.with_panel(ts("Memory free and reserved", "Device memory free, and reserved by the driver and firmware "
                        "(never available to processes).", "bytes",
                        query(f"outrider_gpu_memory_free_bytes{{{G}}}", "free GPU {{gpu}}"),
                        query(f"outrider_gpu_memory_reserved_bytes{{{G}}}", "reserved GPU {{gpu}}")))
    d = d.with_panel(ts("Tensor, DRAM and occupancy", "Tensor-core activity, DRAM bandwidth use and SM occupancy "
                        "(active warps against the maximum), from GPM.", "percentunit",
                        query(f"outrider_gpu_tensor_activity_ratio{{{G}}}", "tensor GPU {{gpu}}"),
                        query(f"outrider_gpu_dram_activity_ratio{{{G}}}", "DRAM GPU {{gpu}}"),
                        query(f"outrider_gpu_sm_occupancy_ratio{{{G}}}", "occupancy GPU {{gpu}}"),
                        min_val=0, max_val=1))
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
    d = d.with_panel(ts("Energy", "Energy each GPU consumed per interval (the driver's counter since it loaded).",
                        "joule", query(f"increase(outrider_gpu_energy_joules_total{{{G}}}[$__rate_interval])",
                                       "GPU {{gpu}}")))
    d = d.with_panel(ts("Clocks", "SM and memory clocks against their maxima: below them under load means "
                        "throttling.", "hertz",
                        query(f"outrider_gpu_clock_hertz{{{G}}}", "{{clock}} GPU {{gpu}}"),
                        query(f"outrider_gpu_clock_max_hertz{{{G}}}", "max {{clock}} GPU {{gpu}}")))
    d = d.with_panel(ts("Throttle reasons", "Clock event reasons active now (1 = holding clocks down), idle "
                        "and application settings left out.", "short",
                        query(f'outrider_gpu_clock_event_active{{{G}, reason!~"gpu_idle|applications_clocks_setting|'
                              f'display_clock_setting"}} > 0', "GPU {{gpu}} {{reason}}"),
                        th=thresholds(GREEN, (1, "red")),
                        links=[runbook("hardware.md", "gpupowerbrakeorhardwareslowdown", "power brake")]))
    d = d.with_panel(ts("Violation time", "Share of time clocks were held below target, per policy (power, "
                        "thermal, sync boost, board limit, low utilisation, reliability).", "percentunit",
                        query(f"rate(outrider_gpu_violation_seconds_total{{{G}}}[$__rate_interval])",
                              "GPU {{gpu}} {{reason}}"), th=thresholds(GREEN, (0.1, "orange"), (0.5, "red")),
                        min_val=0, max_val=1))
    d = d.with_panel(ts("Performance state", "P-state: 0 is maximum performance, up to 15; a GPU under load above "
                        "P0 is being held back.", "short", query(f"outrider_gpu_performance_state{{{G}}}",
                                                                "GPU {{gpu}}"),
                        th=thresholds(GREEN, (1, "orange")), min_val=0, max_val=15))
    d = d.with_panel(ts("Fan speed", "Fan speed against its maximum (absent on passively cooled GPUs).",
                        "percentunit", query(f"outrider_gpu_fan_speed_ratio{{{G}}}", "GPU {{gpu}}"),
                        th=thresholds(GREEN, (0.9, "orange")), min_val=0, max_val=1))
    d = d.with_row(Row("Errors"))
    d = d.with_panel(ts("XID errors", "XID errors by code and class in each interval.", "short",
                        query(f"sum by (gpu, xid, class) (increase(outrider_gpu_xid_errors_total{{{G}}}"
                              "[$__rate_interval]))", "GPU {{gpu}} XID {{xid}} ({{class}})"),
                        th=thresholds(GREEN, (1, "red")), links=[runbook("hardware.md", "gpuxid", "XID")]))
    d = d.with_panel(stat("Since the last XID", "Time since each GPU's last XID error.", "s",
                          query(f"time() - max by (gpu) (outrider_gpu_last_xid_timestamp_seconds{{{G}}})",
                                "GPU {{gpu}}", instant=True),
                          th=thresholds((None, "red"), (3600, "orange"), (86400, "green")),
                          links=[runbook("hardware.md", "gpuxid", "XID")]))
    d = d.with_panel(ts("ECC errors and remapped rows", "Volatile ECC errors and remapped memory rows.", "short",
                        query(f'outrider_gpu_ecc_errors_total{{{G}, counter="volatile"}}', "GPU {{gpu}} {{type}}"),
                        query(f"outrider_gpu_remapped_rows{{{G}}}", "GPU {{gpu}} remapped {{kind}}"),
                        links=[runbook("hardware.md", "gpuuncorrectableecc", "ECC")]))
    d = d.with_panel(ts("Row remapping", "1 while a row remap waits for a GPU reset (pending) or has failed (the GPU "
                        "needs service).", "short",
                        query(f"outrider_gpu_row_remap_pending{{{G}}}", "pending GPU {{gpu}}"),
                        query(f"outrider_gpu_row_remap_failure{{{G}}}", "failed GPU {{gpu}}"),
                        th=thresholds(GREEN, (1, "red")), min_val=0, max_val=1,
                        links=[runbook("hardware.md", "gpuuncorrectableecc", "row remap failure")]))
    d = d.with_panel(ts("PCIe replays and NVLink errors", "PCIe link retransmissions and NVLink data-link errors "
                        "(CRC, replay, recovery) per interval: a rising rate means a bad link.", "short",
                        query(f"increase(outrider_gpu_pcie_replays_total{{{G}}}[$__rate_interval])",
                              "PCIe replays GPU {{gpu}}"),
                        query(f"sum by (gpu, type) (increase(outrider_gpu_nvlink_errors_total{{{G}}}"
                              "[$__rate_interval]))", "NVLink {{type}} GPU {{gpu}}"),
                        th=thresholds(GREEN, (1, "orange"))))
    d = d.with_panel(ts("GPU up", "1 while the GPU answers; 0 once NVML reports it lost.", "short",
                        query(f"outrider_gpu_up{{{G}}}", "GPU {{gpu}}"), th=thresholds((None, "red"), (1, "green")),
                        min_val=0, max_val=1, links=[runbook("hardware.md", "gpulost", "GPU lost")]))
    d = d.with_row(Row("Interconnect"))
    d = d.with_panel(ts("NVLink links active", "Each NVLink link: 1 while active, 0 once it is not. A link that was "
                        "active and is no longer cuts the GPU's bandwidth to its peers (collectives slow or hang).",
                        "short", query(f"outrider_gpu_nvlink_link_active{{{G}}}", "GPU {{gpu}} link {{link}}"),
                        th=thresholds((None, "red"), (1, "green")), min_val=0, max_val=1,
                        links=[runbook("hardware.md", "gpunvlinkdown", "NVLink link down")]))
    d = d.with_panel(ts("PCIe throughput", "PCIe bytes per second, transmit and receive.", "Bps",
                        query(f"outrider_gpu_pcie_throughput_bytes_per_second{{{G}}}", "GPU {{gpu}} {{direction}}")))
    d = d.with_panel(ts("NVLink throughput", "NVLink data bytes per second over all links.", "Bps",
                        query(f"rate(outrider_gpu_nvlink_bytes_total{{{G}}}[$__rate_interval])",
                              "GPU {{gpu}} {{direction}}")))
    d = d.with_row(Row("MIG and attribution"))
    d = d.with_panel(table("MIG mode", "GPUs with MIG on (1) or off (0).", "short",
                           query(f"max by (instance, gpu, uuid) (outrider_gpu_mig_mode{{{G}}})", instant=True,
                                 table=True), width=8))
    d = d.with_panel(ts("MIG device memory", "Memory in use on each MIG device (GPU instance) against its size.",
                        "bytes", query(f"outrider_gpu_mig_memory_used_bytes{{{G}}}",
                                       "used GPU {{gpu}} GI {{gpu_instance}} {{exported_pod}}"),
                        query(f"outrider_gpu_mig_memory_total_bytes{{{G}}}", "size GPU {{gpu}} GI {{gpu_instance}}"),
                        width=8))
    d = d.with_panel(ts("Kubelet PodResources errors", "Failed asks of the kubelet for the GPUs' owners, by reason "
                        "(missing socket, timeout, ...): meanwhile GPU series carry no workload labels. Zero when "
                        "none failed or attribution is off.", "short",
                        query(f"sum by (reason) (increase(outrider_k8s_podresources_errors_total{{{SEL}}}"
                              "[$__rate_interval])) or vector(0)", "{{reason}}"),
                        width=8, th=thresholds(GREEN, (1, "orange"))))
    return d
