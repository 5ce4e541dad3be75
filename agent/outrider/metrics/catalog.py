"""The one table of metric definitions.

Every metric Outrider exports is declared here once: its Prometheus name (as it appears in the text format,
counters ending in ``_total``), its OpenTelemetry name (a semantic-convention name where one exists, otherwise
``outrider.*``), its unit, its type, its help text and its labels with their OpenTelemetry attribute names.
Collectors refer to definitions by Prometheus name; the exporters and the metrics reference (docs/metrics.md)
are derived from this table, so the three cannot drift apart.

OpenTelemetry: a definition's OTLP instrument is its type, except where the conventions make a gauge-like value an
UpDownCounter (`otel_instrument="updowncounter"`: a non-monotonic cumulative Sum on OTLP, a gauge on /metrics). A
label whose OpenTelemetry name is empty is Prometheus-only (status_class: a convenience derived from the status
code); constant attributes (`otel_attributes`, e.g. hw.type=gpu) are added on OTLP only. A label may map its values
to the conventions' enum (`otel_values`: the kernel's irq and softirq are cpu.mode "interrupt"); data points that
end up with the same attributes are summed by the exporter. An integer attribute (process.pid) whose value is not an
integer (the top-N process collector's "other") goes under `otel_other` instead, so that the pid stays an integer.

Enrichment: a definition may name labels that a collector appends after its own when a source of them is
configured (the Kubernetes owner of a GPU, from the kubelet). They are optional: a series whose owner is unknown
leaves them out of the exposition and out of its OTLP attributes. Their Prometheus names may be renamed by
configuration (with_enrichment); their OpenTelemetry names are the semantic-convention ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal

MetricType = Literal["counter", "gauge", "histogram"]
Instrument = Literal["counter", "updowncounter", "gauge", "histogram"]


@dataclass(frozen=True)
class Label:
    """A label: its Prometheus name and the OpenTelemetry attribute it becomes on OTLP. An optional label with an
    empty value is left out of the exposition and the OTLP attributes (an owner that is not known)."""

    prom: str
    otel: str  # "" for a Prometheus-only label
    optional: bool = False
    otel_values: tuple[tuple[str, str], ...] = ()  # Prometheus value -> OpenTelemetry enum value, where they differ
    otel_int: bool = False  # an integer attribute (process.pid)
    otel_other: str = ""  # where a non-integer value of an integer attribute goes


@dataclass(frozen=True)
class MetricDef:
    name: str
    otel_name: str
    unit: str  # UCUM, as OpenTelemetry writes it: "s", "By", "1", "{process}"
    type: MetricType
    help: str
    labels: tuple[Label, ...]
    collector: str
    semconv: bool = False  # True where otel_name is an OpenTelemetry semantic-convention name
    enrichment: tuple[Label, ...] = ()  # appended after `labels` by a collector whose enrichment is configured
    otel_instrument: Instrument | None = None  # the OTLP instrument where it is not `type` (updowncounter)
    otel_attributes: tuple[tuple[str, str], ...] = ()  # constant OTLP attributes (hw.type=gpu)

    @property
    def instrument(self) -> Instrument:
        """The OpenTelemetry instrument: counter, updowncounter, gauge or histogram."""
        return self.otel_instrument or self.type

    # Derived once per definition (cached_property writes the instance's __dict__, which a frozen dataclass allows):
    # rendering asks for them for every family of every scrape.
    @cached_property
    def label_names(self) -> tuple[str, ...]:
        return tuple(label.prom for label in self.labels)

    @cached_property
    def arity(self) -> int:
        """How many label values a sample carries."""
        return len(self.labels)

    @cached_property
    def family_name(self) -> str:
        """The OpenMetrics family name: a counter's name without its ``_total`` suffix."""
        if self.type == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name

    @cached_property
    def prom_unit(self) -> str:
        """The OpenMetrics ``# UNIT``, only where the family name ends with it (as the spec requires)."""
        for unit in ("seconds", "bytes", "ratio", "joules", "celsius", "watts", "hertz"):
            if self.family_name.endswith("_" + unit):
                return unit
        return ""


# Labels shared by several definitions.
RECEIVER = Label("receiver", "outrider.receiver")
RECEIVER_TYPE = Label("type", "outrider.receiver.type")
# The kernel's irq and softirq modes are one "interrupt" in the conventions' cpu.mode enum.
MODE = Label("mode", "cpu.mode", otel_values=(("irq", "interrupt"), ("softirq", "interrupt")))
DEVICE = Label("device", "system.device")
DISK_DIRECTION = Label("direction", "disk.io.direction")
NET_DIRECTION = Label("direction", "network.io.direction")
INTERFACE = Label("interface", "network.interface.name")
MOUNTPOINT = Label("mountpoint", "system.filesystem.mountpoint")
FSTYPE = Label("fstype", "system.filesystem.type")
PID = Label("pid", "process.pid", otel_int=True, otel_other="outrider.process.group")
PNAME = Label("name", "process.executable.name")
COLLECTOR = Label("collector", "outrider.collector")
RANK = Label("rank", "outrider.rank")
TRAINING_JOB = Label("training_job", "outrider.training_job")
PHASE = Label("phase", "outrider.train.phase")
DTYPE = Label("dtype", "outrider.train.dtype")
CAUSE = Label("cause", "outrider.train.goodput.cause")
BY_RANK = (RANK, TRAINING_JOB)  # what the agent adds to every series a hooked process publishes
GPU = (Label("gpu", "outrider.gpu.index"), Label("uuid", "hw.id"), Label("model", "hw.model"))
MIG_DEVICE = (*GPU, Label("mig_uuid", "outrider.gpu.mig.uuid"), Label("gpu_instance", "outrider.gpu.mig.instance"))
# The Kubernetes workload that owns a GPU or MIG device (kubelet PodResources): "exported_" as Prometheus prefixes
# labels that clash with a target's own, so these never collide with the namespace/pod labels of the scrape.
K8S_OWNER = (Label("exported_namespace", "k8s.namespace.name", optional=True),
             Label("exported_pod", "k8s.pod.name", optional=True),
             Label("exported_container", "k8s.container.name", optional=True))
ROUTE = Label("route", "http.route")
STATUS_CLASS = Label("status_class", "")  # 2xx, 5xx: derived from the status code, for PromQL only
METHOD = Label("method", "http.request.method")  # a fixed set: the known methods, else _OTHER
SCHEME = Label("scheme", "url.scheme")
STATUS_CODE = Label("status_code", "http.response.status_code", otel_int=True)
HTTP = (ROUTE, METHOD, SCHEME, STATUS_CODE, STATUS_CLASS)
GEN_AI = (Label("operation", "gen_ai.operation.name"), Label("provider", "gen_ai.provider.name"))
HW_GPU = (("hw.type", "gpu"), ("hw.vendor", "nvidia"))  # every hw.* series of a GPU

_DEFS: tuple[MetricDef, ...] = (
    # --- host -----------------------------------------------------------------------------------------------
    MetricDef("outrider_host_cpu_seconds_total", "system.cpu.time", "s", "counter",
              "CPU time spent by all CPUs of the host, by mode (from /proc/stat).", (MODE,), "host", semconv=True),
    MetricDef("outrider_host_cpu_utilization_ratio", "system.cpu.utilization", "1", "gauge",
              "Fraction of host CPU time not idle or waiting for I/O, averaged over all CPUs since the previous "
              "sweep.", (), "host", semconv=True),
    MetricDef("outrider_host_logical_cpus", "system.cpu.logical.count", "{cpu}", "gauge",
              "Number of logical CPUs online.", (), "host", semconv=True,
              otel_instrument="updowncounter"),
    MetricDef("outrider_host_context_switches_total", "outrider.host.context_switches", "{switch}", "counter",
              "Context switches on the host.", (), "host"),
    MetricDef("outrider_host_procs_running", "outrider.host.procs.running", "{process}", "gauge",
              "Runnable threads on the host right now (a run queue longer than the CPU count means CPU "
              "saturation).", (), "host"),
    MetricDef("outrider_host_procs_blocked", "outrider.host.procs.blocked", "{process}", "gauge",
              "Threads blocked waiting for I/O.", (), "host"),
    MetricDef("outrider_host_load1", "outrider.host.load.1m", "{thread}", "gauge",
              "1-minute load average.", (), "host"),
    MetricDef("outrider_host_load5", "outrider.host.load.5m", "{thread}", "gauge",
              "5-minute load average.", (), "host"),
    MetricDef("outrider_host_load15", "outrider.host.load.15m", "{thread}", "gauge",
              "15-minute load average.", (), "host"),
    MetricDef("outrider_host_memory_limit_bytes", "system.memory.limit", "By", "gauge",
              "Total usable host memory (MemTotal).", (), "host", semconv=True,
              otel_instrument="updowncounter"),
    MetricDef("outrider_host_memory_available_bytes", "system.memory.linux.available", "By", "gauge",
              "Memory available for new work without swapping (MemAvailable): the number to alert on.", (),
              "host", semconv=True, otel_instrument="updowncounter"),
    MetricDef("outrider_host_memory_usage_bytes", "system.memory.usage", "By", "gauge",
              "Host memory by state: used (total - available), free, cached, buffers.",
              (Label("state", "system.memory.state"),), "host", semconv=True,
              otel_instrument="updowncounter"),
    MetricDef("outrider_host_memory_shared_bytes", "system.memory.linux.shared", "By", "gauge",
              "Shared memory (Shmem: tmpfs and /dev/shm, where PyTorch data-loader workers pass batches).", (),
              "host", semconv=True, otel_instrument="updowncounter"),
    MetricDef("outrider_host_memory_dirty_bytes", "outrider.host.memory.dirty", "By", "gauge",
              "Memory waiting to be written back to storage (Dirty + Writeback): checkpoint writes in flight.", (),
              "host"),
    MetricDef("outrider_host_oom_kills_total", "outrider.host.oom_kills", "{kill}", "counter",
              "Processes killed by the kernel's out-of-memory killer (from /proc/vmstat oom_kill).", (), "host"),
    MetricDef("outrider_host_page_faults_total", "system.paging.faults", "{fault}", "counter",
              "Page faults by type: major (read from storage) and minor.",
              (Label("type", "system.paging.fault.type"),), "host", semconv=True),
    MetricDef("outrider_host_paging_operations_total", "system.paging.operations", "{operation}", "counter",
              "Pages swapped in and out.", (Label("direction", "system.paging.direction"),), "host", semconv=True),
    MetricDef("outrider_host_swap_usage_bytes", "system.paging.usage", "By", "gauge",
              "Swap space by state: used, free.", (Label("state", "system.paging.state"),), "host", semconv=True,
              otel_instrument="updowncounter"),
    MetricDef("outrider_host_pressure_stalled_seconds_total", "outrider.host.pressure.stall_time", "s", "counter",
              "Pressure stall information: time some (or all, kind=full) runnable tasks were stalled on a "
              "resource (from /proc/pressure). Its rate is the stalled fraction.",
              (Label("resource", "outrider.pressure.resource"), Label("kind", "outrider.pressure.kind")),
              "host"),
    MetricDef("outrider_host_disk_io_bytes_total", "system.disk.io", "By", "counter",
              "Bytes read from and written to each block device.", (DEVICE, DISK_DIRECTION), "host", semconv=True),
    MetricDef("outrider_host_disk_operations_total", "system.disk.operations", "{operation}", "counter",
              "Completed read and write operations per block device.", (DEVICE, DISK_DIRECTION), "host", semconv=True),
    MetricDef("outrider_host_disk_operation_time_seconds_total", "system.disk.operation_time", "s", "counter",
              "Time spent on completed reads and writes per block device; divided by the operations' rate it "
              "is the average latency.", (DEVICE, DISK_DIRECTION), "host", semconv=True),
    MetricDef("outrider_host_disk_io_in_progress", "outrider.host.disk.pending_operations", "{operation}",
              "gauge", "I/O operations in flight on each block device right now.", (DEVICE,), "host"),
    MetricDef("outrider_host_disk_io_time_seconds_total", "system.disk.io_time", "s", "counter",
              "Time each block device had I/O in flight (its rate is the device's busy fraction).", (DEVICE,),
              "host", semconv=True),
    MetricDef("outrider_host_network_io_bytes_total", "system.network.io", "By", "counter",
              "Bytes received and transmitted per network interface.", (INTERFACE, NET_DIRECTION), "host",
              semconv=True),
    MetricDef("outrider_host_network_packets_total", "system.network.packet.count", "{packet}", "counter",
              "Packets received and transmitted per network interface.", (INTERFACE, NET_DIRECTION), "host",
              True),
    MetricDef("outrider_host_network_errors_total", "system.network.errors", "{error}", "counter",
              "Receive and transmit errors per network interface.", (INTERFACE, NET_DIRECTION), "host", semconv=True),
    MetricDef("outrider_host_network_dropped_total", "system.network.packet.dropped", "{packet}", "counter",
              "Packets dropped per network interface.", (INTERFACE, NET_DIRECTION), "host", semconv=True),
    MetricDef("outrider_host_filesystem_size_bytes", "system.filesystem.limit", "By", "gauge",
              "Size of the filesystem holding each configured path (checkpoint and data directories).",
              (MOUNTPOINT, DEVICE, FSTYPE), "host", semconv=True, otel_instrument="updowncounter"),
    MetricDef("outrider_host_filesystem_free_bytes", "outrider.host.filesystem.free", "By", "gauge",
              "Free bytes on the filesystem, including blocks reserved for root.", (MOUNTPOINT, DEVICE, FSTYPE),
              "host"),
    MetricDef("outrider_host_filesystem_avail_bytes", "outrider.host.filesystem.available", "By", "gauge",
              "Bytes available to unprivileged users: what a checkpoint writer can still use.",
              (MOUNTPOINT, DEVICE, FSTYPE), "host"),
    MetricDef("outrider_host_filesystem_readonly", "outrider.host.filesystem.readonly", "1", "gauge",
              "1 where the filesystem is mounted read-only.", (MOUNTPOINT, DEVICE, FSTYPE), "host"),
    MetricDef("outrider_host_filesystem_files", "outrider.host.filesystem.files", "{inode}", "gauge",
              "Inodes of the filesystem (statvfs f_files; 0 where the filesystem has no fixed inode table).",
              (MOUNTPOINT, DEVICE, FSTYPE), "host"),
    MetricDef("outrider_host_filesystem_files_free", "outrider.host.filesystem.files.free", "{inode}", "gauge",
              "Free inodes of the filesystem (statvfs f_ffree): at 0 no file can be created, whatever the space.",
              (MOUNTPOINT, DEVICE, FSTYPE), "host"),
    MetricDef("outrider_host_time_seconds", "outrider.host.time", "s", "gauge",
              "The host's wall clock (Unix time) when the sweep read it. Prometheus stamps the sample with its own "
              "clock: value minus timestamp() is the node's clock skew, give or take the sweep's age (at most one "
              "interval_s).", (), "host"),
    MetricDef("outrider_host_clock_synchronized", "outrider.host.clock.synchronized", "1", "gauge",
              "1 while the kernel says an NTP (or PTP) daemon keeps the clock synchronised (adjtimex: STA_UNSYNC "
              "clear, not TIME_ERROR), 0 otherwise.", (), "host"),
    MetricDef("outrider_host_clock_max_error_seconds", "outrider.host.clock.max_error", "s", "gauge",
              "The kernel's bound on the clock's error (adjtimex maxerror): it grows by 500 ppm while nothing "
              "synchronises the clock, up to 16 s.", (), "host"),
    MetricDef("outrider_cgroup_cpu_limit_cores", "outrider.cgroup.cpu.limit", "{cpu}", "gauge",
              "CPU limit of the cgroup the agent runs in (its container), in cores: the CFS quota over its period "
              "(cpu.max, or cpu.cfs_quota_us / cpu.cfs_period_us on cgroup v1); absent where no limit is set.",
              (), "host"),
    MetricDef("outrider_cgroup_cpu_periods_total", "outrider.cgroup.cpu.periods", "{period}", "counter",
              "CFS enforcement periods of the agent's cgroup in which it had runnable tasks (cpu.stat nr_periods).",
              (), "host"),
    MetricDef("outrider_cgroup_cpu_throttled_periods_total", "outrider.cgroup.cpu.throttled_periods", "{period}",
              "counter", "Periods in which the cgroup used up its CPU quota and was throttled until the next "
              "(cpu.stat nr_throttled): data-loader workers and kernel launches wait.", (), "host"),
    MetricDef("outrider_cgroup_cpu_throttled_seconds_total", "outrider.cgroup.cpu.throttled_time", "s", "counter",
              "Time the cgroup's tasks spent throttled (cpu.stat throttled_usec, or throttled_time on v1).", (),
              "host"),
    MetricDef("outrider_cgroup_memory_limit_bytes", "outrider.cgroup.memory.limit", "By", "gauge",
              "Memory limit of the cgroup the agent runs in (its container: memory.max, or memory.limit_in_bytes "
              "on cgroup v1); absent where no limit is set. The kernel OOM-kills in the cgroup at this limit, "
              "whatever the host's memory.", (), "host"),
    MetricDef("outrider_cgroup_memory_usage_bytes", "outrider.cgroup.memory.usage", "By", "gauge",
              "Memory charged to the agent's cgroup, page cache included (memory.current).", (), "host"),
    MetricDef("outrider_cgroup_memory_working_set_bytes", "outrider.cgroup.memory.working_set", "By", "gauge",
              "Memory of the agent's cgroup the kernel cannot simply drop: usage minus inactive page cache (the "
              "number the kubelet evicts on and the one to compare with the limit).", (), "host"),
    MetricDef("outrider_cgroup_memory_oom_kills_total", "outrider.cgroup.memory.oom_kills", "{kill}", "counter",
              "Processes the kernel OOM-killed in the agent's cgroup (cgroup v2 memory.events oom_kill: the cgroup "
              "and the ones below it; v1 memory.oom_control oom_kill: its own processes).", (), "host"),
    # --- oom (who the OOM killer killed) --------------------------------------------------------------------
    MetricDef("outrider_oom_victim_kills_total", "outrider.oom.victim.kills", "{kill}", "counter",
              "Processes the kernel OOM-killed, by victim: the memory cgroup it charged the kill to (a container's, "
              "or its pod's where the container's cgroup was gone before the agent looked), with the pod's UID "
              "and the container's ID where the kubelet's and runtimes' cgroup names say, the killed process's "
              "name where the kernel log is readable (the first one named, for later kills in the same cgroup), "
              "and victim, those in words. Counted since the agent saw the victim's first kill: the series appears "
              "with it (kills before the agent started are not counted), and goes an hour after the last. Kills "
              "in the agent's own cgroup are outrider_cgroup_memory_oom_kills_total's.",
              (Label("cgroup", "outrider.oom.cgroup"), Label("pod_uid", "k8s.pod.uid", optional=True),
               Label("container_id", "container.id", optional=True),
               Label("process", "process.executable.name", optional=True), Label("victim", "outrider.oom.victim")),
              "oom", enrichment=K8S_OWNER),
    MetricDef("outrider_oom_unattributed_kills_total", "outrider.oom.unattributed_kills", "{kill}", "counter",
              "OOM kills the host counted (/proc/vmstat oom_kill) but no victim series holds, by reason: unnamed "
              "(no cgroup counter nor kernel log line named a cgroup: a process of the root cgroup, a v1 cgroup "
              "removed before the agent looked; counted only where the agent sees the host's whole cgroup "
              "hierarchy) or cap (a victim beyond the bound of 100 at once).",
              (Label("reason", "error.type"),), "oom"),
    MetricDef("outrider_oom_scans_total", "outrider.oom.scans", "{scan}", "counter",
              "Times the oom collector looked at the memory cgroups and the kernel log, which it does only when "
              "the host's OOM-kill count (/proc/vmstat oom_kill) moved.", (), "oom"),
    MetricDef("outrider_oom_kernel_log_readable", "outrider.oom.kernel_log.readable", "1", "gauge",
              "1 where the kernel log (kmsg_path, /dev/kmsg) is readable, so OOM victims carry the killed process's "
              "name; 0 where it is not (no such device in the container, no CAP_SYSLOG).", (), "oom"),
    # --- process (the watched tree) -------------------------------------------------------------------------
    MetricDef("outrider_process_cpu_seconds_total", "process.cpu.time", "s", "counter",
              "CPU time of each watched process (top N; pid=\"other\" accumulates the rest while they are not "
              "in the top N).", (PID, PNAME, MODE), "process", semconv=True),
    MetricDef("outrider_process_memory_rss_bytes", "process.memory.usage", "By", "gauge",
              "Resident set size of each watched process (top N; pid=\"other\" sums the rest that the agent may "
              "read).", (PID, PNAME),
              "process", semconv=True, otel_instrument="updowncounter"),
    MetricDef("outrider_process_threads", "process.thread.count", "{thread}", "gauge",
              "Threads of each watched process.", (PID, PNAME), "process", semconv=True,
              otel_instrument="updowncounter"),
    MetricDef("outrider_process_open_fds", "process.unix.file_descriptor.count", "{file_descriptor}", "gauge",
              "Open file descriptors of each watched process.", (PID, PNAME), "process", semconv=True,
              otel_instrument="updowncounter"),
    MetricDef("outrider_process_io_bytes_total", "process.disk.io", "By", "counter",
              "Bytes each watched process caused to be read from and written to storage.",
              (PID, PNAME, DISK_DIRECTION), "process", semconv=True),
    MetricDef("outrider_process_context_switches_total", "process.context_switches", "{context_switch}",
              "counter", "Voluntary and involuntary context switches of each watched process.",
              (PID, PNAME, Label("type", "process.context_switch.type")), "process", semconv=True),
    MetricDef("outrider_process_start_time_seconds", "outrider.process.start_time", "s", "gauge",
              "Unix time each watched process started (its running time is time() minus this).", (PID, PNAME),
              "process"),
    MetricDef("outrider_process_info", "outrider.process.info", "1", "gauge",
              "Constant 1 per watched process shown one by one, labelled with its user and command: the program "
              "and its script (with process_command_arguments its arguments too, secrets redacted; the first 128 "
              "characters): join on pid.",
              (PID, PNAME, Label("user", "process.owner"), Label("command", "process.command_line")), "process"),
    MetricDef("outrider_watched_up", "outrider.watched.up", "1", "gauge",
              "1 while the root of the watched process tree is alive (always 1 when the whole host is "
              "watched).", (), "process"),
    MetricDef("outrider_watched_processes", "outrider.watched.processes", "{process}", "gauge",
              "Live processes in the watched tree.", (), "process"),
    MetricDef("outrider_watched_cpu_seconds_total", "outrider.watched.cpu.time", "s", "counter",
              "CPU time of the whole watched tree, including processes that have exited since watching began; only "
              "processes whose /proc the agent may read are summed.",
              (MODE,), "process"),
    MetricDef("outrider_watched_memory_rss_bytes", "outrider.watched.memory.usage", "By", "gauge",
              "Sum of the resident set sizes of the live processes in the watched tree.", (), "process"),
    MetricDef("outrider_watched_io_bytes_total", "outrider.watched.disk.io", "By", "counter",
              "Storage bytes read and written by the whole watched tree, including exited processes; only processes "
              "whose /proc/PID/io the agent may read are summed (other users' need CAP_SYS_PTRACE).",
              (DISK_DIRECTION,), "process"),
    MetricDef("outrider_watched_threads", "outrider.watched.thread.count", "{thread}", "gauge",
              "Threads of the live processes in the watched tree.", (), "process"),
    # --- gpu (NVML) -------------------------------------------------------------------------------------------
    MetricDef("outrider_gpu_nvml_up", "outrider.gpu.nvml.up", "1", "gauge",
              "1 while NVML answers; 0 with no driver or library (the reason is logged once).", (), "gpu"),
    MetricDef("outrider_gpu_count", "outrider.gpu.count", "{gpu}", "gauge", "GPUs NVML reports.", (), "gpu"),
    MetricDef("outrider_gpu_up", "hw.status", "1", "gauge",
              "1 while the GPU answers; 0 once NVML says it is lost (fallen off the bus, needs a reset).", GPU,
              "gpu", semconv=True, otel_instrument="updowncounter", otel_attributes=(*HW_GPU, ("hw.state", "ok"))),
    MetricDef("outrider_gpu_lost_total", "outrider.gpu.lost", "{event}", "counter",
              "Times the GPU was found lost.", GPU, "gpu"),
    MetricDef("outrider_gpu_utilization_ratio", "hw.gpu.utilization", "1", "gauge",
              "Fraction of time a kernel (task=general), the encoder or the decoder was running.",
              (*GPU, Label("task", "hw.gpu.task")), "gpu", semconv=True, otel_attributes=HW_GPU),
    MetricDef("outrider_gpu_memory_bandwidth_utilization_ratio", "outrider.gpu.memory_bandwidth.utilization", "1",
              "gauge", "Fraction of time device memory was being read or written.", GPU, "gpu"),
    MetricDef("outrider_gpu_memory_total_bytes", "hw.gpu.memory.limit", "By", "gauge", "Device memory.", GPU,
              "gpu", semconv=True, otel_instrument="updowncounter", otel_attributes=HW_GPU),
    MetricDef("outrider_gpu_memory_used_bytes", "hw.gpu.memory.usage", "By", "gauge", "Device memory in use.", GPU,
              "gpu", semconv=True, otel_instrument="updowncounter", otel_attributes=HW_GPU),
    MetricDef("outrider_gpu_memory_utilization_ratio", "hw.gpu.memory.utilization", "1", "gauge",
              "Fraction of device memory in use (used / total).", GPU, "gpu", semconv=True, otel_attributes=HW_GPU),
    MetricDef("outrider_gpu_memory_free_bytes", "outrider.gpu.memory.free", "By", "gauge",
              "Device memory free.", GPU, "gpu"),
    MetricDef("outrider_gpu_memory_reserved_bytes", "outrider.gpu.memory.reserved", "By", "gauge",
              "Device memory reserved by the driver and firmware.", GPU, "gpu"),
    MetricDef("outrider_gpu_temperature_celsius", "hw.temperature", "Cel", "gauge",
              "GPU die (sensor=gpu) and memory (sensor=memory) temperature.",
              (*GPU, Label("sensor", "hw.sensor_location")), "gpu", semconv=True, otel_attributes=HW_GPU),
    MetricDef("outrider_gpu_power_watts", "hw.power", "W", "gauge", "Power draw.", GPU, "gpu", semconv=True,
              otel_attributes=HW_GPU),
    MetricDef("outrider_gpu_power_limit_watts", "outrider.gpu.power.limit", "W", "gauge",
              "Enforced power limit.", GPU, "gpu"),
    MetricDef("outrider_gpu_energy_joules_total", "hw.energy", "J", "counter",
              "Energy consumed since the driver loaded.", GPU, "gpu", semconv=True, otel_attributes=HW_GPU),
    MetricDef("outrider_gpu_clock_hertz", "outrider.gpu.clock.frequency", "Hz", "gauge",
              "Current SM and memory clocks.", (*GPU, Label("clock", "outrider.gpu.clock")), "gpu"),
    MetricDef("outrider_gpu_clock_max_hertz", "outrider.gpu.clock.frequency.max", "Hz", "gauge",
              "Maximum SM and memory clocks.", (*GPU, Label("clock", "outrider.gpu.clock")), "gpu"),
    MetricDef("outrider_gpu_performance_state", "outrider.gpu.performance_state", "1", "gauge",
              "Performance state: 0 (P0, maximum) to 15 (minimum).", GPU, "gpu"),
    MetricDef("outrider_gpu_fan_speed_ratio", "hw.fan.speed_ratio", "1", "gauge",
              "Fan speed as a fraction of its maximum (absent on passively cooled GPUs).", GPU, "gpu", semconv=True,
              otel_attributes=HW_GPU),
    MetricDef("outrider_gpu_clock_event_active", "outrider.gpu.clock_event.active", "1", "gauge",
              "1 while the reason is holding clocks down (clock event / throttle reasons), one series per reason.",
              (*GPU, Label("reason", "outrider.gpu.clock_event.reason")), "gpu"),
    MetricDef("outrider_gpu_violation_seconds_total", "outrider.gpu.violation.time", "s", "counter",
              "Time clocks were held below target by each policy (power, thermal, sync boost, board limit, low "
              "utilization, reliability).", (*GPU, Label("reason", "outrider.gpu.violation.reason")), "gpu"),
    MetricDef("outrider_gpu_pcie_throughput_bytes_per_second", "outrider.gpu.pcie.throughput", "By/s", "gauge",
              "PCIe throughput over the driver's last 20 ms window.",
              (*GPU, Label("direction", "network.io.direction")), "gpu"),
    MetricDef("outrider_gpu_pcie_replays_total", "outrider.gpu.pcie.replays", "{replay}", "counter",
              "PCIe replays (link retransmissions): a rising rate means a bad link.", GPU, "gpu"),
    MetricDef("outrider_gpu_nvlink_bytes_total", "hw.gpu.io", "By", "counter",
              "NVLink data bytes over all links.", (*GPU, Label("direction", "network.io.direction")), "gpu",
              semconv=True, otel_attributes=(*HW_GPU, ("outrider.gpu.link", "nvlink"))),
    MetricDef("outrider_gpu_nvlink_errors_total", "outrider.gpu.nvlink.errors", "{error}", "counter",
              "NVLink data-link errors summed over the GPU's active links, by type: crc_flit and crc_data (receive "
              "CRC errors), replay (transmit replays), recovery (link recoveries). Absent where NVLink or the "
              "counter is not supported.", (*GPU, Label("type", "error.type")), "gpu"),
    MetricDef("outrider_gpu_nvlink_link_active", "outrider.gpu.nvlink.link.active", "1", "gauge",
              "1 while an NVLink link of the GPU is active, 0 once it is not (nvmlDeviceGetNvLinkState), for every "
              "link the GPU has; absent without NVLink. A link that was active and is not any more cuts the GPU's "
              "bandwidth to its peers: collectives fall back to slower paths or hang.",
              (*GPU, Label("link", "outrider.gpu.nvlink.link")), "gpu"),
    MetricDef("outrider_gpu_ecc_errors_total", "hw.errors", "{error}", "counter",
              "ECC memory errors: corrected or uncorrected, volatile (since the driver loaded) or aggregate "
              "(lifetime).", (*GPU, Label("type", "error.type"), Label("counter", "outrider.gpu.ecc.counter")),
              "gpu", semconv=True, otel_attributes=(*HW_GPU, ("outrider.gpu.errors.source", "ecc"))),
    MetricDef("outrider_gpu_remapped_rows", "outrider.gpu.remapped_rows", "{row}", "gauge",
              "Memory rows remapped because of correctable or uncorrectable errors.",
              (*GPU, Label("kind", "outrider.gpu.remap.kind")), "gpu"),
    MetricDef("outrider_gpu_row_remap_pending", "outrider.gpu.row_remap.pending", "1", "gauge",
              "1 when a row remap waits for a GPU reset.", GPU, "gpu"),
    MetricDef("outrider_gpu_row_remap_failure", "outrider.gpu.row_remap.failure", "1", "gauge",
              "1 when a row remap failed: the GPU needs service.", GPU, "gpu"),
    MetricDef("outrider_gpu_xid_errors_total", "outrider.gpu.xid.errors", "{error}", "counter",
              "XID errors reported by the driver, by code and class (memory, nvlink, gpu_lost, application, "
              "hardware, other).", (*GPU, Label("xid", "outrider.gpu.xid"), Label("class", "outrider.gpu.xid.class")),
              "gpu"),
    MetricDef("outrider_gpu_last_xid_timestamp_seconds", "outrider.gpu.xid.last.time", "s", "gauge",
              "Unix time of the GPU's last XID error.", GPU, "gpu"),
    MetricDef("outrider_gpu_mig_mode", "outrider.gpu.mig_mode", "1", "gauge", "1 where MIG is enabled.", GPU, "gpu"),
    MetricDef("outrider_gpu_mig_memory_used_bytes", "outrider.gpu.mig.memory.usage", "By", "gauge",
              "Memory in use on each MIG device (GPU instance) of a GPU with MIG on.",
              MIG_DEVICE, "gpu"),
    MetricDef("outrider_gpu_mig_memory_total_bytes", "outrider.gpu.mig.memory.limit", "By", "gauge",
              "Memory of each MIG device (GPU instance).", MIG_DEVICE, "gpu"),
    MetricDef("outrider_gpu_sm_activity_ratio", "outrider.gpu.sm.activity", "1", "gauge",
              "Fraction of SMs busy (GPM, Hopper and later).", GPU, "gpu"),
    MetricDef("outrider_gpu_sm_occupancy_ratio", "outrider.gpu.sm.occupancy", "1", "gauge",
              "Active warps against the theoretical maximum (GPM).", GPU, "gpu"),
    MetricDef("outrider_gpu_tensor_activity_ratio", "outrider.gpu.tensor.activity", "1", "gauge",
              "Fraction of time SMs ran any tensor-core instruction (GPM).", GPU, "gpu"),
    MetricDef("outrider_gpu_dram_activity_ratio", "outrider.gpu.dram.activity", "1", "gauge",
              "DRAM bandwidth used against the theoretical maximum (GPM).", GPU, "gpu"),
    MetricDef("outrider_gpu_process_memory_bytes", "outrider.gpu.process.memory.usage", "By", "gauge",
              "Device memory used by each compute process (pid in the agent's PID namespace).",
              (*GPU, PID, PNAME), "gpu"),
    MetricDef("outrider_gpu_process_sm_utilization_ratio", "outrider.gpu.process.sm.utilization", "1", "gauge",
              "Each compute process's share of SM time in NVML's last sample (absent where NVML gives none).",
              (*GPU, PID, PNAME), "gpu"),
    MetricDef("outrider_k8s_podresources_errors_total", "outrider.k8s.podresources.errors", "{error}", "counter",
              "Failed asks of the kubelet's PodResources API for the owners of the GPUs, by reason: missing (no "
              "socket), unavailable, timeout, invalid_response, unimplemented, error, no_grpc (the 'k8s' extra "
              "not installed). GPU series go on without the owner labels meanwhile.",
              (Label("reason", "error.type"),), "gpu"),
    # --- hook (published by instrumented processes through the spool) ------------------------------------------
    MetricDef("outrider_train_step_duration_seconds", "outrider.train.step.duration", "s", "histogram",
              "Training step time, from step begin (or the previous step's end) to step end.", BY_RANK, "hook"),
    MetricDef("outrider_train_steps_total", "outrider.train.steps", "{step}", "counter",
              "Training steps completed.", BY_RANK, "hook"),
    MetricDef("outrider_samples_total", "outrider.samples", "{sample}", "counter",
              "Samples processed (its rate is samples/s): as outrider.step(samples=) or count_samples() count "
              "them, else the batches the DataLoaders yield (the first dimension of each batch's first tensor).",
              BY_RANK, "hook"),
    MetricDef("outrider_tokens_total", "outrider.tokens", "{token}", "counter",
              "Tokens processed (its rate is tokens/s).", BY_RANK, "hook"),
    MetricDef("outrider_train_data_wait_seconds", "outrider.train.data_wait", "s", "histogram",
              "Time the training loop waited for its next batch (data-loader wait).", BY_RANK, "hook"),
    MetricDef("outrider_train_gpu_step_duration_seconds", "outrider.train.gpu_step.duration", "s", "histogram",
              "GPU time between consecutive step ends, from CUDA events polled without synchronising.", BY_RANK,
              "hook"),
    MetricDef("outrider_train_loop_seconds_total", "outrider.train.loop.time", "s", "counter",
              "The training loop's wall time, split exactly into parts: data_wait (inside DataLoader __next__ or "
              "outrider.dataloader()), step (the step's work: from its explicit begin, else from the iteration's first "
              "data request, to its end, less data wait), checkpoint (inside torch.save, torch.distributed.checkpoint "
              "or safetensors saves, or fsspec and boto3 uploads, on the loop's thread) and other (the rest of the "
              "iteration: logging, evaluation, saves through other libraries). An iteration runs from one step's end "
              "to the next; the parts' rates add up to the loop's wall time.",
              (*BY_RANK, Label("part", "outrider.train.loop.part")), "hook"),
    MetricDef("outrider_train_checkpoint_duration_seconds", "outrider.train.checkpoint.duration", "s",
              "histogram", "Duration of each checkpoint recognised on the loop's thread (torch.save, "
              "torch.distributed.checkpoint, safetensors, fsspec and boto3 uploads), from the outermost save's call "
              "to its return.", BY_RANK,
              "hook"),
    MetricDef("outrider_train_collective_seconds_total", "outrider.train.collective.time", "s", "counter",
              "Time in torch.distributed collectives, by operation (all_reduce, broadcast, ..., ddp_bucket for DDP's "
              "gradient buckets, from hand-over to completion): wall time of blocking calls on CPU, CUDA events on "
              "GPU.", (*BY_RANK, Label("op", "outrider.train.collective.op")), "hook"),
    MetricDef("outrider_train_collective_wait_seconds_total", "outrider.train.collective.wait", "s", "counter",
              "Part of the step the loop was blocked in collectives: blocking calls whole, DDP buckets from the last "
              "one's launch to its completion. Step work less this is the rank's compute: the straggler is the rank "
              "with the most compute, the one that waits least.", BY_RANK, "hook"),
    MetricDef("outrider_train_gpu_busy_seconds_total", "outrider.train.gpu.busy", "s", "counter",
              "Part of each step (between step-end CUDA events) during which the GPU was still working off work the "
              "host had queued before the step: the GPU paced the loop. Its rate over that of "
              "outrider_train_gpu_observed_seconds_total is the GPU-busy share of the steps.", BY_RANK, "hook"),
    MetricDef("outrider_train_gpu_observed_seconds_total", "outrider.train.gpu.observed", "s", "counter",
              "Wall time of the steps whose GPU busy time is known (between two completed step-end CUDA events).",
              BY_RANK, "hook"),
    MetricDef("outrider_train_autograd_ops_total", "outrider.train.autograd_ops", "{operation}", "counter",
              "Differentiable operations the training thread ran with grad enabled (its autograd sequence number at "
              "the last step's end). Main-thread CPU per operation tells many small operations (framework "
              "overhead) from few large ones (the math).", BY_RANK, "hook"),
    MetricDef("outrider_train_loop_samples_total", "outrider.train.loop.samples", "{sample}", "counter",
              "Samples of the training loop thread's Python stack (hook/profiler.py, profile_hz a second) by where it "
              "was: python (the user's code in the interpreter), native (inside torch or a C call, on a CPU), "
              "waiting (a C call off CPU: sleep, a lock, I/O), data (a DataLoader's __next__), collective "
              "(torch.distributed), checkpoint (torch.save/load), optimizer (torch.optim). Shares of the loop's time.",
              (*BY_RANK, Label("where", "outrider.train.loop.where")), "hook"),
    MetricDef("outrider_train_loop_frame_samples_total", "outrider.train.loop.frame_samples", "{sample}", "counter",
              "Samples of the training loop thread by its top frame (the innermost frame of the user's code, "
              "`file:line function`) and where it was: the loop's hottest lines, at most 20 published per flush and "
              "60 frames per process.",
              (*BY_RANK, Label("where", "outrider.train.loop.where"), Label("frame", "outrider.code.frame")), "hook"),
    MetricDef("outrider_thread_cpu_seconds_total", "outrider.thread.cpu.time", "s", "counter",
              "CPU time of an instrumented process by thread role: main (the training loop's thread), intra_op "
              "(unnamed native threads: torch's intra-op pool), data_workers (child processes: DataLoader workers), "
              "outrider (the hook's own threads), other.", (*BY_RANK, Label("role", "outrider.thread.role")), "hook"),
    MetricDef("outrider_thread_run_delay_seconds_total", "outrider.thread.run_delay", "s", "counter",
              "Time the threads of each role were runnable but waiting for a CPU (/proc/PID/task/*/schedstat): "
              "CPUs taken by neighbours or too many threads. CPU time plus run delay is a role's demand, whatever "
              "else runs on the machine.", (*BY_RANK, Label("role", "outrider.thread.role")), "hook"),
    MetricDef("outrider_threads", "outrider.thread.count", "{thread}", "gauge",
              "Threads of an instrumented process (and of its child processes) by role.",
              (*BY_RANK, Label("role", "outrider.thread.role")), "hook"),
    MetricDef("outrider_child_processes", "outrider.child_process.count", "{process}", "gauge",
              "Child processes of an instrumented process and their descendants (DataLoader workers) at their last "
              "reading; their threads are outrider_threads{role=\"data_workers\"}.", BY_RANK, "hook"),
    MetricDef("outrider_torch_intra_op_threads", "outrider.torch.intra_op.threads", "{thread}", "gauge",
              "Threads torch's intra-op parallelism uses (torch.get_num_threads()), the calling thread included.",
              BY_RANK, "hook"),
    MetricDef("outrider_train_time_to_first_step_seconds", "outrider.train.time_to_first_step", "s", "gauge",
              "Seconds from process start to the end of the first training step.", BY_RANK, "hook"),
    MetricDef("outrider_train_first_step_timestamp_seconds", "outrider.train.first_step.time", "s", "gauge",
              "Unix time the rank's process completed its first training step (a restarted process's is later).",
              BY_RANK, "hook"),
    MetricDef("outrider_train_flops_total", "outrider.train.flops", "{flop}", "counter",
              "Model FLOPs the training steps did, by dtype (fp32, tf32, bf16, fp16, fp8, fp64, other; declared: "
              "given by outrider.step(flops=)): one step counted now and then with PyTorch's FLOP formulas, times the "
              "steps around it, or what the steps declared. Its rate over the device's peak is the MFU.",
              (*BY_RANK, DTYPE), "hook"),
    MetricDef("outrider_train_step_flops", "outrider.train.step.flops", "{flop}", "gauge",
              "Model FLOPs of one training step, by dtype, as the last counted step had them (or the steps "
              "declared them).", (*BY_RANK, DTYPE), "hook"),
    MetricDef("outrider_train_goodput_seconds_total", "outrider.train.goodput.time", "s", "counter",
              "A rank's wall time across its processes' restarts, by cause: productive (the steps' work), data_wait, "
              "checkpoint, other (the rest of the loop), stall (from the last step to the death of a process that "
              "died stalled), restart (from a death to the next process's first step), startup (a process's start "
              "to its first step). Goodput is the productive share.", (*BY_RANK, CAUSE), "hook"),
    MetricDef("outrider_train_goodput_ratio", "outrider.train.goodput", "1", "gauge",
              "The productive share of a rank's wall time so far, counting a stall, restart or start-up going on "
              "now.", BY_RANK, "hook"),
    MetricDef("outrider_train_restarts_total", "outrider.train.restarts", "{restart}", "counter",
              "Times a new process of the rank took its first step after one that stepped died.", BY_RANK, "hook"),
    MetricDef("outrider_train_last_step_timestamp_seconds", "outrider.train.last_step.time", "s", "gauge",
              "Unix time the last training step completed (of the live processes of the rank).", BY_RANK, "hook"),
    MetricDef("outrider_latency_seconds", "outrider.latency", "s", "histogram",
              "Latency recorded with outrider.latency(), record_latency() or @outrider.timed, by name.",
              (Label("name", "outrider.latency.name"), *BY_RANK), "hook"),
    MetricDef("outrider_request_duration_seconds", "http.server.request.duration", "s", "histogram",
              "Inference request duration by route template (never the raw path), method, scheme, status code and "
              "status class.", (*HTTP, *BY_RANK), "hook", semconv=True),
    MetricDef("outrider_requests_total", "outrider.requests", "{request}", "counter",
              "Requests finished, by route template, method, scheme, status code and status class.",
              (*HTTP, *BY_RANK), "hook"),
    MetricDef("outrider_requests_in_flight", "http.server.active_requests", "{request}", "gauge",
              "Requests being served now.", (ROUTE, METHOD, SCHEME, *BY_RANK), "hook", semconv=True,
              otel_instrument="updowncounter"),
    MetricDef("outrider_request_phase_duration_seconds", "outrider.request.phase.duration", "s", "histogram",
              "Time requests spent in a phase the server reports (queue, compute).",
              (Label("phase", "outrider.request.phase"), *BY_RANK), "hook"),
    MetricDef("outrider_inference_batch_size", "outrider.inference.batch_size", "{request}", "histogram",
              "Requests per batch in a batching server.", BY_RANK, "hook"),
    MetricDef("outrider_inference_time_to_first_token_seconds", "gen_ai.server.time_to_first_token", "s",
              "histogram", "Time from request start to the first streamed chunk (first token), by route, GenAI "
              "operation and provider.", (ROUTE, *GEN_AI, *BY_RANK), "hook", semconv=True),
    MetricDef("outrider_inference_inter_token_latency_seconds", "gen_ai.server.time_per_output_token", "s",
              "histogram", "Time between consecutive streamed chunks (tokens) of a response, by route, GenAI "
              "operation and provider.", (ROUTE, *GEN_AI, *BY_RANK), "hook", semconv=True),
    MetricDef("outrider_torch_cuda_memory_bytes", "outrider.torch.cuda.memory", "By", "gauge",
              "PyTorch CUDA caching allocator memory by kind: allocated, reserved, active, inactive_split.",
              (*BY_RANK, Label("device", "outrider.cuda.device"), Label("kind", "outrider.torch.memory.kind")),
              "hook"),
    MetricDef("outrider_torch_cuda_memory_peak_bytes", "outrider.torch.cuda.memory.peak", "By", "gauge",
              "Peak memory allocated by the PyTorch CUDA allocator since the process started (or the last "
              "reset_peak_memory_stats).", (*BY_RANK, Label("device", "outrider.cuda.device")), "hook"),
    MetricDef("outrider_torch_cuda_alloc_retries_total", "outrider.torch.cuda.alloc_retries", "{retry}",
              "counter", "cudaMalloc retries after freeing cached blocks: fragmentation or memory pressure.",
              (*BY_RANK, Label("device", "outrider.cuda.device")), "hook"),
    MetricDef("outrider_torch_cuda_ooms_total", "outrider.torch.cuda.ooms", "{error}", "counter",
              "CUDA out-of-memory errors raised by the PyTorch allocator.",
              (*BY_RANK, Label("device", "outrider.cuda.device")), "hook"),
    MetricDef("outrider_torch_cuda_oom_step", "outrider.torch.cuda.oom.step", "{step}", "gauge",
              "The training step during which the last CUDA out-of-memory error happened.",
              (*BY_RANK, Label("device", "outrider.cuda.device")), "hook"),
    MetricDef("outrider_hook_processes", "outrider.hook.processes", "{process}", "gauge",
              "Instrumented processes publishing to the spool, by state: running, stalled (no step within the "
              "stall threshold), unresponsive (alive, publisher silent), stopped (SIGSTOP, job control, a "
              "debugger).", (Label("state", "outrider.state"),),
              "hook"),
    MetricDef("outrider_hook_stalled", "outrider.hook.stalled", "1", "gauge",
              "1 while a process of the rank is stalled or unresponsive (its Python stacks are in the spool).",
              BY_RANK, "hook"),
    MetricDef("outrider_hook_stopped", "outrider.hook.stopped", "1", "gauge",
              "1 while a process of the rank is stopped (SIGSTOP, a job-control stop, a debugger: /proc state T or "
              "t): not stalled, its work resumes where it was when it is continued. Only where the agent sees the "
              "process's pid.", BY_RANK, "hook"),
    MetricDef("outrider_hook_last_heartbeat_timestamp_seconds", "outrider.hook.heartbeat.time", "s", "gauge",
              "Unix time of each instrumented process's last shard update.", (*BY_RANK, PID), "hook"),
    MetricDef("outrider_hook_dropped_total", "outrider.hook.dropped", "{measurement}", "counter",
              "Measurements and metric registrations the hook refused (bad value, invalid name or label, series "
              "limit), by reason.", (Label("reason", "outrider.reason"), *BY_RANK), "hook"),
    MetricDef("outrider_hook_shard_errors_total", "outrider.hook.shard_errors", "{shard}", "counter",
              "Shards the agent could not read (corrupt, truncated, newer_version, busy, untrusted owner, "
              "not_regular, bad_mode, too_large, unreadable, no_descriptors), each file counted once while it "
              "stays the same, and series it refused in readable shards (invalid_series, shape_conflict), by "
              "reason.", (Label("reason", "outrider.reason"),), "hook"),
    MetricDef("outrider_hook_spool_rejected_files", "outrider.hook.spool.rejected_files", "{file}", "gauge",
              "Files named like shards in the spool that the agent refuses now (never opened again while "
              "unchanged), by reason: planted or broken files.", (Label("reason", "outrider.reason"),), "hook"),
    MetricDef("outrider_hook_spool_owner", "outrider.hook.spool.owner", "1", "gauge",
              "1 when this agent owns the spool (holds agent.lock: it deletes finished processes' shards), 0 when "
              "it reads a spool another agent owns. Every agent on a spool reports every process it reads, so "
              "select one of them (== 1) where several serve one spool.", (), "hook"),
    MetricDef("outrider_hook_retired_series", "outrider.hook.retired_series", "{series}", "gauge",
              "Series of exited processes the agent still holds (so merged counters never go backwards); those "
              "with no live process expire after 15 minutes, and at most 10,000 are held.", (), "hook"),
    MetricDef("outrider_train_phase_active", "outrider.train.phase.active", "1", "gauge",
              "1 while a rank is inside a declared long phase (outrider.phase(\"checkpoint\")), which does not "
              "count as a stall up to phase_timeout_s.", (*BY_RANK, PHASE), "hook"),
    MetricDef("outrider_train_phase_seconds_total", "outrider.train.phase.time", "s", "counter",
              "Time spent inside declared phases (checkpoint, evaluation, ...).", (*BY_RANK, PHASE),
              "hook"),
    MetricDef("outrider_train_first_step_pending", "outrider.train.first_step.pending", "1", "gauge",
              "1 while a training process of the rank has not completed its first step.", BY_RANK,
              "hook"),
    MetricDef("outrider_train_start_timestamp_seconds", "outrider.train.start.time", "s", "gauge",
              "Unix time the rank's oldest live instrumented process called instrument().", BY_RANK,
              "hook"),
    # --- efficiency (MFU) ---------------------------------------------------------------------------------------
    MetricDef("outrider_train_peak_flops", "outrider.train.peak_flops", "{flop}/s", "gauge",
              "Peak FLOP rate of the devices a rank uses, by dtype: the GPU table's dense figure for the NVML name "
              "(at its maximum SM clock) times the rank's CUDA devices, the CPU's measured peak (scaled to the "
              "rank's intra-op threads), or peak_flops.", (*BY_RANK, DTYPE), "efficiency"),
    MetricDef("outrider_train_mfu_ratio", "outrider.train.mfu", "1", "gauge",
              "Model FLOPs utilisation of a rank over the steps between the last two of its publications: the time "
              "its FLOPs would take at the peak (per dtype) over the loop's wall time.", BY_RANK, "efficiency"),
    MetricDef("outrider_train_flops_peak_seconds_total", "outrider.train.flops.peak_time", "s", "counter",
              "Time the rank's model FLOPs would have taken at its devices' peak, over the steps whose FLOPs and "
              "peak are known: over outrider_train_flops_timed_seconds_total, the MFU of any window.", BY_RANK,
              "efficiency"),
    MetricDef("outrider_train_flops_timed_seconds_total", "outrider.train.flops.timed", "s", "counter",
              "The training loop's wall time of the steps whose FLOPs and peak are known (MFU's denominator).",
              BY_RANK, "efficiency"),
    MetricDef("outrider_train_device_tokens_per_second", "outrider.train.device.token_rate", "{token}/s", "gauge",
              "Tokens a second per device of a rank (declared by the steps or carried by the batches), over the "
              "loop's wall time between its last two publications.", BY_RANK, "efficiency"),
    # --- diagnosis ----------------------------------------------------------------------------------------------
    MetricDef("outrider_bottleneck", "outrider.bottleneck", "1", "gauge",
              "1 for the bottleneck class of the last window (idle, throttled, memory_pressure, checkpoint_bound, "
              "input_bound, memory_bandwidth_bound, compute_bound, host_bound, python_bound, communication_bound, "
              "waiting, balanced), 0 for the others; all 0 for a window not judged (without the evidence its rule "
              "needs).",
              (Label("class", "outrider.bottleneck.class"),), "diagnosis"),
    MetricDef("outrider_diagnosis_signal", "outrider.diagnosis.signal", "1", "gauge",
              "The evidence behind the verdict: data-wait fraction, GPU utilisation, process CPU cores, step time, "
              "... over the diagnosis window.", (Label("signal", "outrider.diagnosis.signal"),), "diagnosis"),
    # --- self ----------------------------------------------------------------------------------------------
    MetricDef("outrider_agent_info", "outrider.agent.info", "1", "gauge",
              "Constant 1, labelled with the agent's version.", (Label("version", "service.version"),), "self"),
    MetricDef("outrider_k8s_info", "outrider.k8s.info", "1", "gauge",
              "Constant 1, labelled with the pod, namespace, node and container the agent runs in (Downward API "
              "variables; labels outside the k8s_labels allow-list stay empty). Join on instance.",
              (Label("pod", "k8s.pod.name"), Label("namespace", "k8s.namespace.name"), Label("node", "k8s.node.name"),
               Label("container", "k8s.container.name")), "self"),
    MetricDef("outrider_agent_start_time_seconds", "outrider.agent.start_time", "s", "gauge",
              "Unix time the agent started.", (), "self"),
    MetricDef("outrider_agent_cpu_seconds_total", "outrider.agent.cpu.time", "s", "counter",
              "CPU time used by the agent itself.", (MODE,), "self"),
    MetricDef("outrider_agent_memory_rss_bytes", "outrider.agent.memory.usage", "By", "gauge",
              "Resident set size of the agent itself.", (), "self"),
    MetricDef("outrider_agent_sweeps_total", "outrider.agent.sweeps", "{sweep}", "counter",
              "Sweeps completed.", (), "self"),
    MetricDef("outrider_agent_sweep_duration_seconds", "outrider.agent.sweep.duration", "s", "gauge",
              "Wall time of the previous sweep over all collectors.", (), "self"),
    MetricDef("outrider_agent_scrapes_total", "outrider.agent.scrapes", "{scrape}", "counter",
              "Requests served on /metrics.", (), "self"),
    MetricDef("outrider_agent_accept_errors_total", "outrider.agent.accept_errors", "{error}", "counter",
              "Connections the agent's HTTP server could not accept, by reason (emfile, enfile: out of "
              "descriptors; the server pauses accepting, backing off up to 1 s, and never spins).",
              (Label("reason", "outrider.reason"),), "self"),
    MetricDef("outrider_agent_connections_closed_total", "outrider.agent.connections.closed", "{connection}",
              "counter", "Connections to the agent's endpoint that it closed itself, by reason: evicted (the least "
              "recently active waiting one, to make room at max_connections: clients outnumber the table) or "
              "timed_out (at a deadline: a half-sent request, an idle kept-alive connection, a response not read, "
              "the linger after a close).", (Label("reason", "outrider.reason"),), "self"),
    MetricDef("outrider_agent_otlp_exports_total", "outrider.agent.otlp.exports", "{export}", "counter",
              "OTLP export attempts by result: success, failure, deadline (no complete answer within "
              "otlp_timeout_s, which bounds the whole export), too_large (a response body over 1 MiB), or skipped "
              "while backing off after a failure.",
              (Label("result", "outrider.result"),), "self"),
    MetricDef("outrider_collector_success", "outrider.collector.success", "1", "gauge",
              "1 if the collector's last sweep succeeded, 0 if it failed (and was skipped).", (COLLECTOR,),
              "self"),
    MetricDef("outrider_collector_duration_seconds", "outrider.collector.duration", "s", "gauge",
              "Wall time of the collector's last sweep.", (COLLECTOR,), "self"),
    MetricDef("outrider_collector_hung", "outrider.collector.hung", "1", "gauge",
              "1 while a collector that may block (NVML) has not answered within collector_timeout_s: the sweeps "
              "go on without it.", (COLLECTOR,), "self"),
    MetricDef("outrider_alerts", "outrider.alerts", "1", "gauge",
              "1 for every pending or firing alert of the agent's embedded rule evaluation, with the alert's own "
              "labels besides these: Prometheus's ALERTS under Outrider's prefix, so that a Prometheus scraping the "
              "agent keeps its own ALERTS apart.",
              (Label("alertname", "outrider.alert.name"), Label("alertstate", "outrider.alert.state")), "alerts"),
    MetricDef("outrider_alert_active_since_timestamp_seconds", "outrider.alert.active_since", "s", "gauge",
              "Unix time each pending or firing alert became active, with the alert's own labels (Prometheus's "
              "ALERTS_FOR_STATE).",
              (Label("alertname", "outrider.alert.name"),), "alerts"),
    MetricDef("outrider_rule_evaluations_total", "outrider.rule.evaluations", "{evaluation}", "counter",
              "Evaluations of the rule groups by the embedded evaluator.", (), "alerts"),
    MetricDef("outrider_rule_evaluation_failures_total", "outrider.rule.evaluation.failures", "{evaluation}",
              "counter", "Rule evaluations that failed (the agent log says why); the rule's alerts keep their state.",
              (Label("rule", "outrider.rule"),), "alerts"),
    MetricDef("outrider_rule_evaluation_duration_seconds", "outrider.rule.evaluation.duration", "s", "gauge",
              "Wall time of the last evaluation of all rule groups.", (), "alerts"),
    MetricDef("outrider_rule_store_series", "outrider.rule.store.series", "{series}", "gauge",
              "Series held for rule evaluation (only those the loaded rules select).", (), "alerts"),
    MetricDef("outrider_rule_store_samples", "outrider.rule.store.samples", "{sample}", "gauge",
              "Samples held for rule evaluation (only as far back as the loaded rules read).", (), "alerts"),
    MetricDef("outrider_rule_store_bytes", "outrider.rule.store.size", "By", "gauge",
              "Approximate memory the rule evaluation's sample store holds.", (), "alerts"),
    MetricDef("outrider_rule_store_out_of_order_samples_total", "outrider.rule.store.out_of_order_samples",
              "{sample}", "counter", "Samples the rule evaluation's store dropped as older than their series' newest, "
              "so rules never saw them. The evaluator's clock is monotonic: above 0 is a bug to report.", (),
              "alerts"),
    MetricDef("outrider_notify_sent_total", "outrider.notify.sent", "{notification}", "counter",
              "Alert notifications a receiver confirmed.", (RECEIVER, RECEIVER_TYPE), "alerts"),
    MetricDef("outrider_notify_failed_total", "outrider.notify.failed", "{attempt}", "counter",
              "Failed delivery attempts: reason retry (429, 5xx, a redirect, a timeout, a connection, DNS or TLS "
              "error; tried again), deadline (no complete answer within the receiver's timeout_s, which bounds the "
              "whole delivery; tried again) or rejected (other 4xx; dropped).",
              (RECEIVER, RECEIVER_TYPE, Label("reason", "error.type")), "alerts"),
    MetricDef("outrider_notify_queued", "outrider.notify.queued", "{notification}", "gauge",
              "Notifications waiting in a receiver's outbox.", (RECEIVER, RECEIVER_TYPE), "alerts"),
    MetricDef("outrider_notify_oldest_queued_age_seconds", "outrider.notify.oldest_queued.age", "s", "gauge",
              "Age of the oldest notification waiting in a receiver's outbox (0 when empty).",
              (RECEIVER, RECEIVER_TYPE), "alerts"),
    MetricDef("outrider_notify_dropped_total", "outrider.notify.dropped", "{notification}", "counter",
              "Notifications dropped undelivered by reason: full (the receiver's outbox held its bound, 10,000 "
              "notifications or 16 MiB, and the oldest went, its file with it) or unreadable (a corrupt outbox "
              "file at start).", (RECEIVER, RECEIVER_TYPE, Label("reason", "error.type")), "alerts"),
    MetricDef("outrider_notify_outbox_write_errors_total", "outrider.notify.outbox.write_errors", "{error}",
              "counter", "Notifications the outbox could not write to disk (full or unwritable): held in memory "
              "and written out when the disk takes them again.", (RECEIVER, RECEIVER_TYPE), "alerts"),
    MetricDef("outrider_collector_errors_total", "outrider.collector.errors", "{error}", "counter",
              "Readings a collector could not take (a file it could not read, a value it could not parse): "
              "dropped and counted, never fatal.", (COLLECTOR,), "self"),
    MetricDef("outrider_otlp_receiver_requests_total", "outrider.otlp_receiver.requests", "{request}", "counter",
              "Requests to the local OTLP receiver (otlp_receiver_listen) by result: accepted, bad_request (not "
              "OTLP, not /v1/metrics, no Content-Length), too_large (a body over 4 MiB, inflated or not), busy "
              "(answered 503 with Retry-After: the bodies of all clients together held their 16 MiB), aborted (the "
              "client left before the whole request), timed_out (a request not whole within 10 s of its first "
              "byte, or a connection idle for 60 s), evicted (closed to make room at 64 connections).",
              (Label("result", "outrider.result"),), "otlp_receiver"),
)

# Every GPU metric labelled by its GPU also names the GPU's Kubernetes owner when attribution is on.
_DEFS = tuple(replace(d, enrichment=K8S_OWNER) if d.collector == "gpu" and d.labels[:len(GPU)] == GPU else d
              for d in _DEFS)

CATALOG: dict[str, MetricDef] = {d.name: d for d in _DEFS}
if len(CATALOG) != len(_DEFS) or len({d.otel_name for d in _DEFS}) != len(_DEFS):  # pragma: no cover
    raise RuntimeError("duplicate metric name in the catalog")  # guards the table itself


def definitions(collector: str | None = None) -> list[MetricDef]:
    """All definitions, or those of one collector, in table order."""
    return [d for d in _DEFS if collector is None or d.collector == collector]


CUSTOM_HELP = "Custom metric published by the workload through the Outrider hook."


def custom_definition(name: str, kind: str, label_names: tuple[str, ...], collector: str, help_text: str,
                      otel_name: str = "") -> MetricDef:
    """The definition of a metric the catalog has no entry for (a workload's own, through the hook or its own
    instrumentation): its OTLP name is `otel_name`, else its Prometheus name; its unit seconds where that name says
    so, else 1; each label its own attribute."""
    base = otel_name or name
    return MetricDef(name, base, "s" if base.endswith("_seconds") else "1", kind,  # type: ignore[arg-type]
                     help_text, tuple(Label(n, n) for n in label_names), collector)


def otlp_attributes(defn: MetricDef, values: tuple[str, ...],
                    extra: Mapping[str, str] | None = None) -> dict[str, str | int]:
    """A sample's OTLP attributes: the definition's constants, `extra` (a family's own, hw.driver_version), then its
    label values under their semantic-convention names and enum values. Never an empty one (an unknown owner, a
    process without a rank) and never a Prometheus-only label."""
    out: dict[str, str | int] = dict(defn.otel_attributes)
    if extra:
        out.update(extra)
    for label, value in zip(defn.labels, values):
        if not value or not label.otel:
            continue
        if label.otel_int:
            if value.isdigit():
                out[label.otel] = int(value)
            elif label.otel_other:
                out[label.otel_other] = value  # "other": the processes not shown one by one, never a pid
            continue
        out[label.otel] = dict(label.otel_values).get(value, value) if label.otel_values else value
    return out


def with_enrichment(defn: MetricDef, names: Mapping[str, str] | None = None) -> MetricDef:
    """The definition as a collector with its enrichment on emits it: the enrichment labels appended after its own,
    with the Prometheus names that `names` maps them to (default name -> configured name)."""
    if not defn.enrichment:
        return defn
    names = names or {}
    extra = tuple(replace(label, prom=names.get(label.prom, label.prom)) for label in defn.enrichment)
    clash = {label.prom for label in extra} & set(defn.label_names)
    if clash or len({label.prom for label in extra}) != len(extra):
        raise ValueError(f"{defn.name}: enrichment label names {sorted(lb.prom for lb in extra)} clash")
    return replace(defn, labels=(*defn.labels, *extra), enrichment=())
