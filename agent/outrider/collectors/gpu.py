"""GPU collector: every NVIDIA GPU through NVML (agent/outrider/nvml.py is the only NVML caller).

Per GPU (labels gpu index, uuid, model): utilisation, memory, temperatures, power and energy, clocks, P-state, fan,
clock event reasons and violation times, PCIe and NVLink traffic, ECC and row remapping, XID errors (from an NVML
event set on a background thread), GPM activity where the GPU supports it, MIG mode, and per compute process the
device memory and SM share. A reading the GPU or driver does not offer is left out, never reported as 0. A lost
GPU reports outrider_gpu_up 0; with no NVML at all the collector reports outrider_gpu_nvml_up 0 and says why, once.
"""

from __future__ import annotations

import os
from typing import Any

from outrider.collectors.base import Collector, CollectorContext
from outrider.collectors.procfs import read_proc_stat, read_text
from outrider.metrics.catalog import CATALOG
from outrider.metrics.family import Family
from outrider.nvml import NA, GpuLost, Nvml

CLOCK_EVENT_REASONS = (  # bit -> reason, as nvml.h names them
    (0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"), (0x100, "display_clock_setting"),
)
VIOLATION_POLICIES = ((0, "power"), (1, "thermal"), (2, "sync_boost"), (3, "board_limit"), (4, "low_utilization"),
                      (5, "reliability"))
GPM_METRICS = ((2, "outrider_gpu_sm_activity_ratio"), (3, "outrider_gpu_sm_occupancy_ratio"),
               (5, "outrider_gpu_tensor_activity_ratio"), (10, "outrider_gpu_dram_activity_ratio"))
FIELD_MEMORY_TEMP, FIELD_NVLINK_TX, FIELD_NVLINK_RX = 82, 138, 139


def xid_class(code: int) -> str:
    """A coarse class per XID code, for alert routing (NVIDIA's XID catalogue has the details)."""
    if code == 79:
        return "gpu_lost"
    if code in (48, 63, 64, 92, 94, 95, 140):
        return "memory"
    if code in (74, 144, 145, 146, 147, 148, 149, 150):
        return "nvlink"
    if code in (13, 31, 43, 45, 68, 69):
        return "application"
    if code in (61, 62, 119, 120, 121, 154):
        return "hardware"
    return "other"


class _Out:
    """One sweep's families, by name."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}

    def add(self, name: str, value: float, labels: tuple[str, ...]) -> None:
        f = self.families.get(name)
        if f is None:
            f = self.families[name] = Family(CATALOG[name])
        f.add(value, *labels)


class GpuCollector(Collector):
    name = "gpu"
    may_block = True  # an NVML call can hang (a wedged driver, a GPU falling off the bus)
    description = "NVIDIA GPUs through NVML: utilisation, memory, power, clocks, throttling, ECC, XID, processes"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.nvml = Nvml(ctx.config.nvml_library or None)
        self._lost: set[int] = set()
        self._lost_counts: dict[int, int] = {}
        self._util_ts: dict[int, int] = {}
        self._gpm: dict[int, Any] = {}  # index -> previous GPM sample
        self._gpm_supported: dict[int, bool] = {}
        self._ns_depth: int | None = None

    def collect(self) -> list[Family]:
        if not self.nvml.init():
            return [Family("outrider_gpu_nvml_up").add(0)]
        count = self.nvml.device_count()
        out = _Out()
        out.add("outrider_gpu_nvml_up", 1 if self.nvml.initialized else 0, ())
        out.add("outrider_gpu_count", count, ())
        handles: dict[int, Any] = {}
        gpu_labels: dict[int, tuple[str, ...]] = {}
        for index in range(count):
            labels: tuple[str, ...] = (str(index), f"index-{index}", "unknown")
            try:
                h = self.nvml.handle(index)
                if h is NA:
                    continue
                handles[index] = h
                facts = self.nvml.facts(index)
                labels = (str(index), facts.uuid, facts.name)
                gpu_labels[index] = labels
                self._device(index, h, facts, labels, out)
                self._lost.discard(index)
                out.add("outrider_gpu_up", 1, labels)
            except GpuLost:
                gpu_labels[index] = labels
                if index not in self._lost:
                    self._lost.add(index)
                    self._lost_counts[index] = self._lost_counts.get(index, 0) + 1
                    self.log.error("GPU %d (%s) is lost: fallen off the bus or in need of a reset", index,
                                   labels[1])
                out.add("outrider_gpu_up", 0, labels)
            out.add("outrider_gpu_lost_total", self._lost_counts.get(index, 0), labels)
        watcher = self.nvml.watch_xid(handles)
        if watcher is not None:
            counts, last = watcher.snapshot()
            for (index, code), n in sorted(counts.items()):
                if index in gpu_labels:
                    out.add("outrider_gpu_xid_errors_total", n, (*gpu_labels[index], str(code), xid_class(code)))
            for index, ts in sorted(last.items()):
                if index in gpu_labels:
                    out.add("outrider_gpu_last_xid_timestamp_seconds", ts, gpu_labels[index])
        self.errors = self.nvml.errors
        return list(out.families.values())

    def _device(self, i: int, h: Any, facts: Any, labels: tuple[str, ...], out: _Out) -> None:
        q, lib = self.nvml.query, self.nvml.lib

        def put(name: str, value: float, *extra: str) -> None:
            out.add(name, value, (*labels, *extra))

        util = q("nvmlDeviceGetUtilizationRates", h, device=i)
        if util is not NA:
            put("outrider_gpu_utilization_ratio", util.gpu / 100.0, "general")
            put("outrider_gpu_memory_bandwidth_utilization_ratio", util.memory / 100.0)
        for fn, task in (("nvmlDeviceGetEncoderUtilization", "encoder"),
                         ("nvmlDeviceGetDecoderUtilization", "decoder")):
            v = q(fn, h, device=i)
            if v is not NA:
                put("outrider_gpu_utilization_ratio", v[0] / 100.0, task)
        mem = q("nvmlDeviceGetMemoryInfo", h, lib.nvmlMemory_v2, device=i, key="nvmlDeviceGetMemoryInfo_v2")
        if mem is NA:
            mem = q("nvmlDeviceGetMemoryInfo", h, device=i)
        if mem is not NA:
            put("outrider_gpu_memory_total_bytes", mem.total)
            put("outrider_gpu_memory_used_bytes", mem.used)
            put("outrider_gpu_memory_free_bytes", mem.free)
            if hasattr(mem, "reserved"):
                put("outrider_gpu_memory_reserved_bytes", mem.reserved)
        temp = q("nvmlDeviceGetTemperature", h, lib.NVML_TEMPERATURE_GPU, device=i)
        if temp is not NA:
            put("outrider_gpu_temperature_celsius", temp, "gpu")
        fields = self.nvml.field_values(h, [FIELD_MEMORY_TEMP, FIELD_NVLINK_TX, FIELD_NVLINK_RX], device=i)
        if FIELD_MEMORY_TEMP in fields:
            put("outrider_gpu_temperature_celsius", fields[FIELD_MEMORY_TEMP], "memory")
        if FIELD_NVLINK_TX in fields:
            put("outrider_gpu_nvlink_bytes_total", fields[FIELD_NVLINK_TX] * 1024, "transmit")
        if FIELD_NVLINK_RX in fields:
            put("outrider_gpu_nvlink_bytes_total", fields[FIELD_NVLINK_RX] * 1024, "receive")
        for kind, n in sorted(self.nvml.nvlink_errors(i, h).items()):
            put("outrider_gpu_nvlink_errors_total", n, kind)
        power = q("nvmlDeviceGetPowerUsage", h, device=i)
        if power is not NA:
            put("outrider_gpu_power_watts", power / 1000.0)
        if facts.power_limit_w is not NA:
            put("outrider_gpu_power_limit_watts", facts.power_limit_w)
        energy = q("nvmlDeviceGetTotalEnergyConsumption", h, device=i)
        if energy is not NA:
            put("outrider_gpu_energy_joules_total", energy / 1000.0)
        for clock_type, clock in ((lib.NVML_CLOCK_SM, "sm"), (lib.NVML_CLOCK_MEM, "memory")):
            v = q("nvmlDeviceGetClockInfo", h, clock_type, device=i, key=f"nvmlDeviceGetClockInfo:{clock}")
            if v is not NA:
                put("outrider_gpu_clock_hertz", v * 1e6, clock)
        if facts.max_sm_clock_hz is not NA:
            put("outrider_gpu_clock_max_hertz", facts.max_sm_clock_hz, "sm")
        if facts.max_mem_clock_hz is not NA:
            put("outrider_gpu_clock_max_hertz", facts.max_mem_clock_hz, "memory")
        pstate = q("nvmlDeviceGetPerformanceState", h, device=i)
        if pstate is not NA:
            put("outrider_gpu_performance_state", pstate)
        fan = q("nvmlDeviceGetFanSpeed", h, device=i)
        if fan is not NA:
            put("outrider_gpu_fan_speed_ratio", fan / 100.0)
        reasons = self.nvml.probe(("nvmlDeviceGetCurrentClocksEventReasons",
                                   "nvmlDeviceGetCurrentClocksThrottleReasons"), h, device=i)
        if reasons is not NA:
            for bit, reason in CLOCK_EVENT_REASONS:
                put("outrider_gpu_clock_event_active", 1 if reasons & bit else 0, reason)
        for policy, reason in VIOLATION_POLICIES:
            v = q("nvmlDeviceGetViolationStatus", h, policy, device=i, key=f"nvmlDeviceGetViolationStatus:{reason}")
            if v is not NA:
                put("outrider_gpu_violation_seconds_total", v.violationTime / 1e9, reason)
        for counter, direction in ((lib.NVML_PCIE_UTIL_TX_BYTES, "transmit"), (lib.NVML_PCIE_UTIL_RX_BYTES, "receive")):
            v = q("nvmlDeviceGetPcieThroughput", h, counter, device=i, key=f"nvmlDeviceGetPcieThroughput:{direction}")
            if v is not NA:
                put("outrider_gpu_pcie_throughput_bytes_per_second", v * 1024, direction)
        replay = q("nvmlDeviceGetPcieReplayCounter", h, device=i)
        if replay is not NA:
            put("outrider_gpu_pcie_replays_total", replay)
        for err_type, type_name in ((lib.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
                                    (lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected")):
            for counter, counter_name in ((lib.NVML_VOLATILE_ECC, "volatile"), (lib.NVML_AGGREGATE_ECC, "aggregate")):
                v = q("nvmlDeviceGetTotalEccErrors", h, err_type, counter, device=i,
                      key=f"nvmlDeviceGetTotalEccErrors:{type_name}:{counter_name}")
                if v is not NA:
                    put("outrider_gpu_ecc_errors_total", v, type_name, counter_name)
        rows = q("nvmlDeviceGetRemappedRows", h, device=i)
        if rows is not NA:
            corr, unc, pending, failure = rows
            put("outrider_gpu_remapped_rows", corr, "correctable")
            put("outrider_gpu_remapped_rows", unc, "uncorrectable")
            put("outrider_gpu_row_remap_pending", 1 if pending else 0)
            put("outrider_gpu_row_remap_failure", 1 if failure else 0)
        mig = q("nvmlDeviceGetMigMode", h, device=i)
        if mig is not NA:
            put("outrider_gpu_mig_mode", 1 if mig[0] else 0)
            if mig[0]:
                self._mig_devices(i, h, labels, out)
        self._gpm_metrics(i, h, put)
        self._processes(i, h, labels, out)

    def _mig_devices(self, i: int, h: Any, labels: tuple[str, ...], out: _Out) -> None:
        """With MIG on, memory per MIG device (GPU instance); device-wide utilisation is not defined there."""
        q = self.nvml.query
        slots = q("nvmlDeviceGetMaxMigDeviceCount", h, device=i)
        for slot in range(slots if slots is not NA else 0):
            ref = -(1000 * (i + 1) + slot)  # the MIG device's own key for unsupported readings
            mh = q("nvmlDeviceGetMigDeviceHandleByIndex", h, slot, device=ref)
            if mh is NA:
                continue  # an empty slot
            uuid = q("nvmlDeviceGetUUID", mh, device=ref)
            instance = q("nvmlDeviceGetGpuInstanceId", mh, device=ref)
            mem = q("nvmlDeviceGetMemoryInfo", mh, device=ref)
            mig_labels = (*labels, str(uuid if uuid is not NA else f"slot-{slot}"),
                          str(instance) if instance is not NA else "")
            if mem is not NA:
                out.add("outrider_gpu_mig_memory_used_bytes", mem.used, mig_labels)
                out.add("outrider_gpu_mig_memory_total_bytes", mem.total, mig_labels)

    def _gpm_metrics(self, i: int, h: Any, put: Any) -> None:
        """GPM needs two samples: the previous sweep's and this one's. No exclusive profiling lock is taken."""
        nv, lib = self.nvml, self.nvml.lib
        if not nv.has("nvmlGpmQueryDeviceSupport") or self._gpm_supported.get(i) is False:
            return
        if i not in self._gpm_supported:
            support = nv.query("nvmlGpmQueryDeviceSupport", h, device=i)
            self._gpm_supported[i] = bool(support is not NA and support.isSupportedDevice)
            if not self._gpm_supported[i]:
                return
        sample = nv.query("nvmlGpmSampleAlloc")
        if sample is NA or nv.query("nvmlGpmSampleGet", h, sample, device=i) is NA:
            return
        previous, self._gpm[i] = self._gpm.get(i), sample
        if previous is None:
            return
        request = lib.c_nvmlGpmMetricsGet_t()
        request.version = lib.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = previous, sample
        for k, (metric_id, _) in enumerate(GPM_METRICS):
            request.metrics[k].metricId = metric_id
        result = nv.query("nvmlGpmMetricsGet", request, device=i)
        nv.query("nvmlGpmSampleFree", previous)
        if result is NA:
            return
        for k, (_, name) in enumerate(GPM_METRICS):
            if result.metrics[k].nvmlReturn == 0:
                put(name, result.metrics[k].value / 100.0)

    def _processes(self, i: int, h: Any, labels: tuple[str, ...], out: _Out) -> None:
        nv = self.nvml
        procs = nv.probe(("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"), h,
                         device=i)
        if procs is NA:
            return
        since = self._util_ts.get(i, 0)
        samples = nv.query("nvmlDeviceGetProcessUtilization", h, since, device=i)
        sm: dict[int, float] = {}
        if samples is not NA:
            for s in samples:
                sm[int(s.pid)] = s.smUtil / 100.0
                self._util_ts[i] = max(self._util_ts.get(i, 0), int(s.timeStamp))
        for p in procs:
            pid, name = self._translate(int(p.pid))
            if p.usedGpuMemory is not None:
                out.add("outrider_gpu_process_memory_bytes", p.usedGpuMemory, (*labels, pid, name))
            if int(p.pid) in sm:
                out.add("outrider_gpu_process_sm_utilization_ratio", sm[int(p.pid)], (*labels, pid, name))

    def _translate(self, nvml_pid: int) -> tuple[str, str]:
        """NVML reports PIDs as the procfs mount we read sees them (the host's, for a node agent given the host's
        /proc). NSpid in /proc/PID/status lists the PID in each nested namespace; the entry at the agent's own
        depth is the PID in the agent's namespace (a sidecar sharing its pod's namespace sees its workload's)."""
        root = self.ctx.config.proc_root
        if self._ns_depth is None:
            own = _nspid(root, "self")
            self._ns_depth = len(own) - 1 if own else 0
        chain = _nspid(root, str(nvml_pid))
        if not chain:
            return str(nvml_pid), ""  # not visible from here: reported as NVML gave it
        local = chain[self._ns_depth] if self._ns_depth < len(chain) else chain[-1]
        try:
            name = read_proc_stat(root, nvml_pid).name
        except (OSError, ValueError, IndexError):
            name = ""
        return str(local), name

    def close(self) -> None:
        """The XID watcher stops and frees its event set, then NVML shuts down (nvml.Nvml.shutdown)."""
        self.nvml.shutdown()


def _nspid(root: str, pid: str) -> list[int]:
    try:
        for line in read_text(os.path.join(root, pid, "status")).splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []
