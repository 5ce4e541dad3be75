"""GPU collector: every NVIDIA GPU through NVML (agent/outrider/adapters/nvml.py is the only NVML caller).

Per GPU (labels gpu index, uuid, model): utilisation, memory, temperatures, power and energy, clocks, P-state, fan,
clock event reasons and violation times, PCIe and NVLink traffic, ECC and row remapping, XID errors (from an NVML
event set on a background thread), GPM activity where the GPU supports it, MIG mode, and per compute process the
device memory and SM share. A reading the GPU or driver does not offer is left out, never reported as 0. A lost
GPU reports outrider_gpu_up 0; with no NVML at all the collector reports outrider_gpu_nvml_up 0 and says why, once.

With k8s_pod_resources_socket set, every series of a GPU, of a MIG device and of a GPU process also carries the
namespace, pod and container the kubelet assigned that device to (outrider/k8s/gpu_owners.py), under the configured
label names; where the kubelet cannot be asked, the series stay, without those labels, and the failure is counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from outrider.adapters.nvml import NA, GpuLost, Nvml, percent
from outrider.collectors.base import Collector, CollectorContext, owner_definitions
from outrider.k8s.gpu_owners import GpuOwners, Owner
from outrider.kernel.procfs import read_nspid, read_proc_stat
from outrider.metrics.catalog import CATALOG, MetricDef
from outrider.metrics.family import Family

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
NO_INSTANCE = 0xFFFFFFFF  # a process's gpuInstanceId outside MIG


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


class _Families:
    """One sweep's families, by name: with attribution on, GPU metrics take the definitions that carry the owner
    labels after their own (their values come last in every add; empty ones are left out of the exposition)."""

    def __init__(self, defs: Mapping[str, MetricDef]) -> None:
        self._defs = defs
        self.families: dict[str, Family] = {}

    def __call__(self, name: str) -> Family:
        f = self.families.get(name)
        if f is None:
            f = self.families[name] = Family(self._defs.get(name) or CATALOG[name])
        return f


@dataclass(frozen=True)
class _Gpu:
    """One GPU in one sweep: what its readings ask NVML with, and where its samples go."""

    index: int
    handle: Any
    facts: Any
    labels: tuple[str, ...]  # gpu index, uuid, model
    owned: tuple[str, ...]  # the owner's label values, after each series' own labels (none with attribution off)
    fam: _Families

    def add(self, name: str, value: float, *own: str) -> None:
        """One sample: the GPU's labels, the series' own, then the owner's."""
        self.fam(name).add(value, *self.labels, *own, *self.owned)


class GpuCollector(Collector):
    name = "gpu"
    may_block = True  # an NVML call can hang (a wedged driver, a GPU falling off the bus)
    description = "NVIDIA GPUs through NVML: utilisation, memory, power, clocks, throttling, ECC, XID, processes"

    def __init__(self, ctx: CollectorContext, owners: GpuOwners | None = None) -> None:
        super().__init__(ctx)
        config = ctx.config
        self.nvml = Nvml(config.nvml_library or None)
        self.owners = owners
        if self.owners is None and config.k8s_pod_resources_socket:
            self.owners = GpuOwners(config.k8s_pod_resources_socket, config.k8s_pod_resources_timeout_s)
        self._defs: dict[str, MetricDef] = {}
        if self.owners is not None:
            self._defs = owner_definitions(config, self.name)
        self._owner_errors_seen = 0
        self._lost: set[int] = set()
        self._lost_counts: dict[int, int] = {}
        self._util_ts: dict[int, int] = {}
        self._gpm: dict[int, Any] = {}  # index -> previous GPM sample
        self._gpm_supported: dict[int, bool] = {}
        self._ns_depth: int | None = None

    def collect(self) -> list[Family]:
        owners = self._owners()
        if not self.nvml.init():
            return [Family("outrider_gpu_nvml_up").add(0), *self._owner_families()]
        count = self.nvml.device_count()
        fam = _Families(self._defs)
        fam("outrider_gpu_nvml_up").add(1 if self.nvml.initialized else 0)
        fam("outrider_gpu_count").add(count)
        handles: dict[int, Any] = {}
        gpu_labels: dict[int, tuple[tuple[str, ...], Owner | None]] = {}
        for index in range(count):
            labels: tuple[str, ...] = (str(index), f"index-{index}", "unknown")
            owner = owners.get(str(index))  # the device plugin's "index" device-id strategy
            try:
                h = self.nvml.handle(index)
                if h is NA:
                    continue
                handles[index] = h
                facts = self.nvml.facts(index)
                labels = (str(index), facts.uuid, facts.name)
                owner = owners.get(facts.uuid, owner)
                gpu_labels[index] = (labels, owner)
                self._device(index, h, facts, labels, owner, owners, fam)
                self._lost.discard(index)
                fam("outrider_gpu_up").add(1, *labels, *self._owner_values(owner))
            except GpuLost:
                gpu_labels[index] = (labels, owner)
                if index not in self._lost:
                    self._lost.add(index)
                    self._lost_counts[index] = self._lost_counts.get(index, 0) + 1
                    self.log.error("GPU %d (%s) is lost: fallen off the bus or in need of a reset", index,
                                   labels[1])
                fam("outrider_gpu_up").add(0, *labels, *self._owner_values(owner))
            fam("outrider_gpu_lost_total").add(self._lost_counts.get(index, 0), *labels, *self._owner_values(owner))
        watcher = self.nvml.watch_xid(handles)
        if watcher is not None:
            counts, last = watcher.snapshot()
            for (index, code), n in sorted(counts.items()):
                if index in gpu_labels:
                    labels, owner = gpu_labels[index]
                    fam("outrider_gpu_xid_errors_total").add(n, *labels, str(code), xid_class(code),
                                                            *self._owner_values(owner))
            for index, ts in sorted(last.items()):
                if index in gpu_labels:
                    labels, owner = gpu_labels[index]
                    fam("outrider_gpu_last_xid_timestamp_seconds").add(ts, *labels, *self._owner_values(owner))
        self.errors = self.nvml.errors + self._owner_errors_seen
        driver = self.nvml.driver_version()
        if driver:  # an OTLP fact about the GPU, not a Prometheus label (a driver upgrade starts no new series)
            for f in fam.families.values():
                if f.defn.otel_name.startswith("hw."):
                    f.attributes = {"hw.driver_version": driver}
        return [*fam.families.values(), *self._owner_families()]

    def _owner_values(self, owner: Owner | None) -> tuple[str, ...]:
        """The owner label values a GPU series ends with: none with attribution off, empty ones where unowned."""
        if self.owners is None:
            return ()
        return owner.labels() if owner is not None else ("", "", "")

    def _owners(self) -> Mapping[str, Owner]:
        """Device id -> owner from the kubelet (cached there); empty when attribution is off or failed."""
        if self.owners is None:
            return {}
        owners = self.owners.owners()
        failures = sum(self.owners.errors.values())
        if failures > self._owner_errors_seen:
            self._owner_errors_seen = failures
            self._once.warning(f"podresources:{self.owners.last_error}", "GPU owners unavailable: %s (GPU series go "
                               "on without pod labels; counted in outrider_k8s_podresources_errors_total)",
                               self.owners.last_error_text)
        return owners

    def _owner_families(self) -> list[Family]:
        if self.owners is None:
            return []
        f = Family("outrider_k8s_podresources_errors_total")
        for reason, n in sorted(self.owners.errors.items()):
            f.add(n, reason)
        return [f]

    def _device(self, i: int, h: Any, facts: Any, labels: tuple[str, ...], owner: Owner | None,
                owners: Mapping[str, Owner], fam: _Families) -> None:
        """Every reading of one GPU, in the order its families first appear in the exposition."""
        gpu = _Gpu(i, h, facts, labels, self._owner_values(owner), fam)
        self._utilization(gpu)
        self._memory(gpu)
        self._temperatures_and_nvlink(gpu)
        self._power(gpu)
        self._clocks(gpu)
        self._throttling(gpu)
        self._pcie(gpu)
        self._memory_errors(gpu)
        instances = self._mig(gpu, owners)  # GPU instance id -> the owner of its MIG device
        self._gpm_metrics(i, h, fam, (*labels, *gpu.owned))
        self._processes(i, h, labels, owner, instances, fam)

    def _utilization(self, gpu: _Gpu) -> None:
        """Busy time of the GPU, its memory interface, encoder and decoder."""
        q, i, h = self.nvml.query, gpu.index, gpu.handle
        util = q("nvmlDeviceGetUtilizationRates", h, device=i)
        if util is not NA:
            if percent(util.gpu) is not NA:
                gpu.add("outrider_gpu_utilization_ratio", util.gpu / 100.0, "general")
            if percent(util.memory) is not NA:
                gpu.add("outrider_gpu_memory_bandwidth_utilization_ratio", util.memory / 100.0)
        for fn, task in (("nvmlDeviceGetEncoderUtilization", "encoder"),
                         ("nvmlDeviceGetDecoderUtilization", "decoder")):
            v = q(fn, h, device=i)
            if v is not NA and percent(v[0]) is not NA:
                gpu.add("outrider_gpu_utilization_ratio", v[0] / 100.0, task)

    def _memory(self, gpu: _Gpu) -> None:
        """Device memory: total, used, free, reserved (the v2 call where the driver has it)."""
        q, lib, i, h = self.nvml.query, self.nvml.lib, gpu.index, gpu.handle
        mem = q("nvmlDeviceGetMemoryInfo", h, lib.nvmlMemory_v2, device=i, key="nvmlDeviceGetMemoryInfo_v2")
        if mem is NA:
            mem = q("nvmlDeviceGetMemoryInfo", h, device=i)
        if mem is NA:
            return
        gpu.add("outrider_gpu_memory_total_bytes", mem.total)
        gpu.add("outrider_gpu_memory_used_bytes", mem.used)
        gpu.add("outrider_gpu_memory_free_bytes", mem.free)
        if mem.total:
            gpu.add("outrider_gpu_memory_utilization_ratio", mem.used / mem.total)
        if hasattr(mem, "reserved"):
            gpu.add("outrider_gpu_memory_reserved_bytes", mem.reserved)

    def _temperatures_and_nvlink(self, gpu: _Gpu) -> None:
        """The GPU's temperature, and what one field-values call gives: the memory's, and NVLink traffic; then
        NVLink errors."""
        nv, i, h = self.nvml, gpu.index, gpu.handle
        temp = nv.query("nvmlDeviceGetTemperature", h, nv.lib.NVML_TEMPERATURE_GPU, device=i)
        if temp is not NA:
            gpu.add("outrider_gpu_temperature_celsius", temp, "gpu")
        fields = nv.field_values(h, [FIELD_MEMORY_TEMP, FIELD_NVLINK_TX, FIELD_NVLINK_RX], device=i)
        if FIELD_MEMORY_TEMP in fields:
            gpu.add("outrider_gpu_temperature_celsius", fields[FIELD_MEMORY_TEMP], "memory")
        if FIELD_NVLINK_TX in fields:
            gpu.add("outrider_gpu_nvlink_bytes_total", fields[FIELD_NVLINK_TX] * 1024, "transmit")
        if FIELD_NVLINK_RX in fields:
            gpu.add("outrider_gpu_nvlink_bytes_total", fields[FIELD_NVLINK_RX] * 1024, "receive")
        for kind, n in sorted(nv.nvlink_errors(i, h).items()):
            gpu.add("outrider_gpu_nvlink_errors_total", n, kind)
        for link, active in sorted(nv.nvlink_states(i, h).items()):
            gpu.add("outrider_gpu_nvlink_link_active", 1 if active else 0, str(link))

    def _power(self, gpu: _Gpu) -> None:
        """Power drawn, its limit, and the energy used since the driver loaded."""
        q, i, h = self.nvml.query, gpu.index, gpu.handle
        power = q("nvmlDeviceGetPowerUsage", h, device=i)
        if power is not NA:
            gpu.add("outrider_gpu_power_watts", power / 1000.0)
        if gpu.facts.power_limit_w is not NA:
            gpu.add("outrider_gpu_power_limit_watts", gpu.facts.power_limit_w)
        energy = q("nvmlDeviceGetTotalEnergyConsumption", h, device=i)
        if energy is not NA:
            gpu.add("outrider_gpu_energy_joules_total", energy / 1000.0)

    def _clocks(self, gpu: _Gpu) -> None:
        """SM and memory clocks (now, and their maximum), the performance state and the fan."""
        q, lib, i, h, facts = self.nvml.query, self.nvml.lib, gpu.index, gpu.handle, gpu.facts
        for clock_type, clock in ((lib.NVML_CLOCK_SM, "sm"), (lib.NVML_CLOCK_MEM, "memory")):
            v = q("nvmlDeviceGetClockInfo", h, clock_type, device=i, key=f"nvmlDeviceGetClockInfo:{clock}")
            if v is not NA:
                gpu.add("outrider_gpu_clock_hertz", v * 1e6, clock)
        if facts.max_sm_clock_hz is not NA:
            gpu.add("outrider_gpu_clock_max_hertz", facts.max_sm_clock_hz, "sm")
        if facts.max_mem_clock_hz is not NA:
            gpu.add("outrider_gpu_clock_max_hertz", facts.max_mem_clock_hz, "memory")
        pstate = q("nvmlDeviceGetPerformanceState", h, device=i)
        if pstate is not NA and pstate != getattr(lib, "NVML_PSTATE_UNKNOWN", 32):
            gpu.add("outrider_gpu_performance_state", pstate)
        fan = percent(q("nvmlDeviceGetFanSpeed", h, device=i))
        if fan is not NA:
            gpu.add("outrider_gpu_fan_speed_ratio", fan / 100.0)

    def _throttling(self, gpu: _Gpu) -> None:
        """Why the clocks are held down now (clock event reasons), and for how long each policy has held them."""
        nv, i, h = self.nvml, gpu.index, gpu.handle
        reasons = nv.probe(("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
                           h, device=i)
        if reasons is not NA:
            for bit, reason in CLOCK_EVENT_REASONS:
                gpu.add("outrider_gpu_clock_event_active", 1 if reasons & bit else 0, reason)
        for policy, reason in VIOLATION_POLICIES:
            v = nv.query("nvmlDeviceGetViolationStatus", h, policy, device=i,
                         key=f"nvmlDeviceGetViolationStatus:{reason}")
            if v is not NA:
                gpu.add("outrider_gpu_violation_seconds_total", v.violationTime / 1e9, reason)

    def _pcie(self, gpu: _Gpu) -> None:
        """PCIe throughput each way, and link replays."""
        q, lib, i, h = self.nvml.query, self.nvml.lib, gpu.index, gpu.handle
        for counter, direction in ((lib.NVML_PCIE_UTIL_TX_BYTES, "transmit"), (lib.NVML_PCIE_UTIL_RX_BYTES, "receive")):
            v = q("nvmlDeviceGetPcieThroughput", h, counter, device=i, key=f"nvmlDeviceGetPcieThroughput:{direction}")
            if v is not NA:
                gpu.add("outrider_gpu_pcie_throughput_bytes_per_second", v * 1024, direction)
        replay = q("nvmlDeviceGetPcieReplayCounter", h, device=i)
        if replay is not NA:
            gpu.add("outrider_gpu_pcie_replays_total", replay)

    def _memory_errors(self, gpu: _Gpu) -> None:
        """ECC error counts, and the rows remapped around failing memory."""
        q, lib, i, h = self.nvml.query, self.nvml.lib, gpu.index, gpu.handle
        for err_type, type_name in ((lib.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
                                    (lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected")):
            for counter, counter_name in ((lib.NVML_VOLATILE_ECC, "volatile"), (lib.NVML_AGGREGATE_ECC, "aggregate")):
                v = q("nvmlDeviceGetTotalEccErrors", h, err_type, counter, device=i,
                      key=f"nvmlDeviceGetTotalEccErrors:{type_name}:{counter_name}")
                if v is not NA:
                    gpu.add("outrider_gpu_ecc_errors_total", v, type_name, counter_name)
        rows = q("nvmlDeviceGetRemappedRows", h, device=i)
        if rows is not NA:
            corr, unc, pending, failure = rows
            gpu.add("outrider_gpu_remapped_rows", corr, "correctable")
            gpu.add("outrider_gpu_remapped_rows", unc, "uncorrectable")
            gpu.add("outrider_gpu_row_remap_pending", 1 if pending else 0)
            gpu.add("outrider_gpu_row_remap_failure", 1 if failure else 0)

    def _mig(self, gpu: _Gpu, owners: Mapping[str, Owner]) -> dict[int, Owner | None]:
        """MIG mode, and with it on, its devices; returns the owner of each GPU instance's MIG device."""
        mig = self.nvml.query("nvmlDeviceGetMigMode", gpu.handle, device=gpu.index)
        if mig is NA:
            return {}
        gpu.add("outrider_gpu_mig_mode", 1 if mig[0] else 0)
        if not mig[0]:
            return {}
        return self._mig_devices(gpu.index, gpu.handle, gpu.labels, owners, gpu.fam)

    def _mig_devices(self, i: int, h: Any, labels: tuple[str, ...], owners: Mapping[str, Owner],
                     fam: _Families) -> dict[int, Owner | None]:
        """With MIG on, memory per MIG device (GPU instance); device-wide utilisation is not defined there.
        Returns the owner of each GPU instance's MIG device, for the processes running on it."""
        q = self.nvml.query
        instances: dict[int, Owner | None] = {}
        slots = q("nvmlDeviceGetMaxMigDeviceCount", h, device=i)
        for slot in range(slots if slots is not NA else 0):
            ref = -(1000 * (i + 1) + slot)  # the MIG device's own key for unsupported readings
            mh = q("nvmlDeviceGetMigDeviceHandleByIndex", h, slot, device=ref)
            if mh is NA:
                continue  # an empty slot
            uuid = q("nvmlDeviceGetUUID", mh, device=ref)
            instance = q("nvmlDeviceGetGpuInstanceId", mh, device=ref)
            mem = q("nvmlDeviceGetMemoryInfo", mh, device=ref)
            mig_uuid = str(uuid if uuid is not NA else f"slot-{slot}")
            owner = owners.get(mig_uuid)
            if instance is not NA:
                instances[int(instance)] = owner
            mig_labels = (*labels, mig_uuid, str(instance) if instance is not NA else "", *self._owner_values(owner))
            if mem is not NA:
                fam("outrider_gpu_mig_memory_used_bytes").add(mem.used, *mig_labels)
                fam("outrider_gpu_mig_memory_total_bytes").add(mem.total, *mig_labels)
        return instances

    def _gpm_metrics(self, i: int, h: Any, fam: _Families, labels: tuple[str, ...]) -> None:
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
                fam(name).add(result.metrics[k].value / 100.0, *labels)

    def _processes(self, i: int, h: Any, labels: tuple[str, ...], owner: Owner | None,
                   instances: Mapping[int, Owner | None], fam: _Families) -> None:
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
            instance = int(getattr(p, "gpuInstanceId", NO_INSTANCE))
            owned = self._owner_values(instances.get(instance, owner))  # a MIG device's process: its owner
            if p.usedGpuMemory is not None:
                fam("outrider_gpu_process_memory_bytes").add(p.usedGpuMemory, *labels, pid, name, *owned)
            if int(p.pid) in sm:
                fam("outrider_gpu_process_sm_utilization_ratio").add(sm[int(p.pid)], *labels, pid, name, *owned)

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
        if self.owners is not None:
            self.owners.close()


def _nspid(root: str, pid: str) -> list[int]:
    try:
        return read_nspid(root, pid)
    except (OSError, ValueError):
        return []
