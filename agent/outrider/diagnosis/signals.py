"""The numbers a verdict rests on, from two sweeps a window apart: rates from counters, latest values of gauges.

Every signal is a ratio of measurements of the job itself, never of the machine: the loop's parts over its wall
time, a thread role's demand (CPU time plus run delay: what it would have used with a CPU to itself) per second,
the GPU's busy share of the steps, collective wait over step time. None depends on how many cores the machine has
or on what else runs on it; run delay says how much the neighbours (or the job's own surplus of threads) cost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields

from outrider.metrics.family import Family, HistogramValue
from outrider.metrics.quantile import median

ROLE_SIGNALS = ("main", "intra_op", "data_workers", "other")  # the outrider role is the monitor, not the job
# Where the loop thread's stack samples were (hook/profiler.py WHERE)
WHERE = ("python", "native", "waiting", "data", "collective", "checkpoint", "optimizer")
PROFILE_MIN_SAMPLES = 20  # fewer samples in a window: their shares say nothing
TOP_FRAMES = 10
SEP = "\t"  # joins (training_job, rank, field) in a snapshot's per-rank keys


def snapshot(families: list[Family]) -> dict[str, float]:
    """The scalars of one sweep the diagnosis uses (sums over ranks and GPUs, means or maxima where so named)."""
    readings = _Readings()
    for fam in families:
        name = fam.defn.name
        for values, v in fam.samples:
            lab = dict(zip(fam.defn.label_names, values))
            if isinstance(v, HistogramValue):
                readings.note_histogram(name, lab, v)
            else:
                readings.note(name, lab, v)
    return readings.scalars()


# Counters summed over all their series, under one key
SUMMED = {
    "outrider_samples_total": "samples",
    "outrider_tokens_total": "tokens",
    "outrider_requests_total": "requests",
    "outrider_watched_cpu_seconds_total": "process_cpu",
    "outrider_train_collective_seconds_total": "collective",
    "outrider_train_gpu_busy_seconds_total": "gpu_busy",
    "outrider_train_gpu_observed_seconds_total": "gpu_observed",
    "outrider_train_autograd_ops_total": "autograd_ops",
    "outrider_torch_cuda_alloc_retries_total": "alloc_retries",
    "outrider_requests_in_flight": "in_flight",  # a gauge: the sweep's sum over routes and processes
    "outrider_child_processes": "worker_processes",  # a gauge: the sweep's sum over processes
}
# Counters summed per value of one label: (key prefix, label)
SUMMED_BY = {
    "outrider_watched_io_bytes_total": ("tree_io_", "direction"),
    "outrider_thread_cpu_seconds_total": ("cpu_", "role"),
    "outrider_thread_run_delay_seconds_total": ("delay_", "role"),
}
# Gauges of the host or the container, one series each
LATEST = {
    "outrider_host_cpu_utilization_ratio": "host_cpu_util",
    "outrider_host_logical_cpus": "cpus",
    "outrider_host_memory_available_bytes": "host_mem_avail",
    "outrider_host_memory_limit_bytes": "host_mem_total",
    "outrider_cgroup_memory_working_set_bytes": "cgroup_mem_working_set",
    "outrider_cgroup_memory_limit_bytes": "cgroup_mem_limit",
}
GPM = ("outrider_gpu_sm_activity_ratio", "outrider_gpu_tensor_activity_ratio", "outrider_gpu_dram_activity_ratio")
POWER_REASONS = ("hw_power_brake_slowdown", "hw_slowdown", "sw_power_cap")


class _Readings:
    """One sweep's samples as the snapshot adds them up: the job's sums (whole, per label value and per rank) and
    the GPUs' readings, whose means and maxima are taken once all are in (`scalars`)."""

    def __init__(self) -> None:
        self.out: dict[str, float] = {}
        self.gpu_util: list[float] = []
        self.gpm: dict[str, list[float]] = {}
        self.mem_used: dict[str, float] = {}
        self.mem_total: dict[str, float] = {}
        self.intra_op: list[float] = []
        self.thermal = self.power = 0.0
        self._special: dict[str, Callable[[dict[str, str], float], None]] = {
            "outrider_train_loop_seconds_total": self._loop_part,
            "outrider_train_collective_wait_seconds_total": self._collective_wait,
            "outrider_train_loop_samples_total": self._loop_samples,
            "outrider_train_loop_frame_samples_total": self._frame_samples,
            "outrider_threads": self._threads,
            "outrider_torch_intra_op_threads": lambda lab, v: self.intra_op.append(v),
            "outrider_host_pressure_stalled_seconds_total": self._io_pressure,
            "outrider_gpu_utilization_ratio": self._gpu_util,
            "outrider_gpu_memory_used_bytes": lambda lab, v: self.mem_used.update({lab["gpu"]: v}),
            "outrider_gpu_memory_total_bytes": lambda lab, v: self.mem_total.update({lab["gpu"]: v}),
            "outrider_gpu_clock_event_active": self._clock_event,
        }

    def add(self, key: str, value: float) -> None:
        self.out[key] = self.out.get(key, 0.0) + value

    def by_rank(self, lab: dict[str, str], what: str, value: float) -> None:
        self.add(SEP.join(("rank", lab.get("training_job", ""), lab.get("rank", ""), what)), value)

    def note_histogram(self, name: str, lab: dict[str, str], v: HistogramValue) -> None:
        if name == "outrider_train_step_duration_seconds":
            self.add("step_sum", v.sum)
            self.add("step_count", v.count)
            self.by_rank(lab, "steps", v.count)
        elif name == "outrider_train_data_wait_seconds":
            self.add("wait_sum", v.sum)
        elif name == "outrider_train_gpu_step_duration_seconds":
            self.out["cuda_used"] = 1.0
        elif name == "outrider_request_duration_seconds":
            self.add("request_sum", v.sum)
            self.add("request_count", v.count)
        elif name == "outrider_request_phase_duration_seconds" and lab.get("phase") == "queue":
            self.add("queue_sum", v.sum)

    def note(self, name: str, lab: dict[str, str], v: float) -> None:
        if name in SUMMED:
            self.add(SUMMED[name], v)
        elif name in SUMMED_BY:
            prefix, label = SUMMED_BY[name]
            self.add(prefix + lab.get(label, ""), v)
        elif name in LATEST:
            self.out[LATEST[name]] = v
        elif name in GPM:
            self.gpm.setdefault(name, []).append(v)
        elif name in self._special:
            self._special[name](lab, v)
        if name == "outrider_thread_run_delay_seconds_total":
            self.out["has_run_delay"] = 1.0
        if name.startswith("outrider_torch_cuda_"):
            self.out["cuda_used"] = 1.0

    def _loop_part(self, lab: dict[str, str], v: float) -> None:
        part = lab.get("part", "")
        self.add(f"loop_{part}", v)
        self.add("loop_wall", v)
        self.by_rank(lab, part, v)
        self.by_rank(lab, "wall", v)

    def _collective_wait(self, lab: dict[str, str], v: float) -> None:
        self.add("collective_wait", v)
        self.by_rank(lab, "collective_wait", v)

    def _loop_samples(self, lab: dict[str, str], v: float) -> None:
        keys = (f"prof_{lab.get('where', '')}", "prof_total")
        for key in keys:
            self.add(key, v)
        for key in keys:
            self.by_rank(lab, key, v)

    def _frame_samples(self, lab: dict[str, str], v: float) -> None:
        self.add(SEP.join(("frame", lab.get("where", ""), lab.get("frame", ""))), v)

    def _threads(self, lab: dict[str, str], v: float) -> None:
        key = {"main": "main_threads", "data_workers": "worker_threads"}.get(lab.get("role", ""))
        if key is not None:
            self.add(key, v)

    def _io_pressure(self, lab: dict[str, str], v: float) -> None:
        if lab.get("resource") == "io" and lab.get("kind") == "some":
            self.out["io_pressure"] = v

    def _gpu_util(self, lab: dict[str, str], v: float) -> None:
        if lab.get("task") == "general":
            self.gpu_util.append(v)

    def _clock_event(self, lab: dict[str, str], v: float) -> None:
        reason = lab.get("reason", "") if v else ""
        if "thermal" in reason:
            self.thermal = 1.0
        elif reason in POWER_REASONS:
            self.power = 1.0

    def scalars(self) -> dict[str, float]:
        """The sums, with the means over GPUs (utilisation, activity), the fullest GPU's memory, the pool's
        smallest intra-op thread count and whether any GPU throttled."""
        out = self.out
        if self.gpu_util:
            out["gpu_util"] = sum(self.gpu_util) / len(self.gpu_util)
            out["gpus"] = len(self.gpu_util)
        if self.intra_op:
            out["intra_op_threads"] = min(self.intra_op)
        for name, vals in self.gpm.items():
            out[name.replace("outrider_gpu_", "").replace("_ratio", "")] = sum(vals) / len(vals)
        ratios = [self.mem_used[g] / self.mem_total[g] for g in self.mem_used if self.mem_total.get(g)]
        if ratios:
            out["gpu_mem_ratio"] = max(ratios)
        out["throttle_thermal"], out["throttle_power"] = self.thermal, self.power
        return out


@dataclass(frozen=True)
class RankSignals:
    """One rank of a distributed job over the window."""

    training_job: str
    rank: str
    steps: float
    compute_s: float  # per step: step work less collective wait
    wait_s: float  # per step: collective wait
    wall_s: float  # per step: the loop's wall time
    wait_fraction: float  # collective wait over the loop's wall time
    data_wait_fraction: float = 0.0  # data wait over the loop's wall time


@dataclass
class Signals:
    window_s: float
    steps_per_s: float = 0.0
    step_time_s: float | None = None
    data_wait_fraction: float | None = None
    # data wait over the loop's time less the time its thread waited for a CPU (run delay): the share the loop
    # would wait for data with the CPUs to itself. Neighbours stretch the step, never the wait for storage.
    data_wait_alone_fraction: float | None = None
    step_fraction: float | None = None
    other_fraction: float | None = None
    checkpoint_fraction: float | None = None  # inside recognised checkpoints (hook/torch_checkpoint.py)
    collective_wait_fraction: float | None = None
    collective_fraction: float | None = None
    samples_per_s: float = 0.0
    requests_per_s: float = 0.0
    process_cpu_cores: float = 0.0
    cpus: float = 1.0
    host_cpu_util: float | None = None
    host_mem_available_ratio: float | None = None
    container_mem_ratio: float | None = None  # the memory cgroup's working set over its limit (None: no limit)
    # per-thread demand (CPU + run delay, per second), per instrumented process
    main_thread_busy: float | None = None
    main_thread_cpu: float | None = None
    intra_op_busy: float | None = None
    intra_op_threads: float | None = None
    torch_cpu_only: bool = False  # a torch job that never initialised CUDA (whatever GPUs the node has)
    ops_counted: bool = False  # torch counts this job's operations (ops per step known once a window has them)
    ops_per_step: float | None = None
    main_cpu_us_per_op: float | None = None
    data_workers_cpu_cores: float | None = None
    # the DataLoader workers' demand (CPU + run delay) per worker process (per thread from hooks that do not count
    # them): near 1 they decode, near 0 they wait (for storage, the network, a lock)
    data_worker_busy: float | None = None
    # the DataLoader workers' run delay (runnable, waiting for a CPU), in cores' worth, and each worker's share of
    # the time it spent waiting for a CPU: workers that wait for a CPU longer than they use one, and for much of
    # their time, are starved of CPU (neighbours, or more busy threads than the job has cores), whatever they do
    data_workers_delay_cores: float | None = None
    data_worker_delay_fraction: float | None = None
    # the demand (CPU + run delay, per second) of the process's threads of no other role: the workload's own
    # Python threads (a service's handlers, a producer thread), per instrumented process
    other_threads_busy: float | None = None
    # the share of the loop's time its thread is off CPU outside its waits for data, collectives, checkpoints and
    # the GPU: neither running nor waiting for a CPU, nor waiting for anything the job measures: a sleep, a lock,
    # the network, another service
    loop_waiting_fraction: float | None = None
    # a service, from the requests that finished in the window: mean latency, mean time in the server's queue phase
    # (where it reports one, outrider.record_phase("queue", ...)), the job's CPU and its run delay per request, the
    # job's threads' demand per process (cores), and the share of the requests' time (less the queue) that neither
    # CPU, nor a CPU's wait, nor the process's other requests' CPU explain: spent waiting outside the process
    requests_in_flight: float | None = None
    request_latency_s: float | None = None
    request_queue_s: float | None = None
    request_cpu_s: float | None = None
    request_cpu_wait_s: float | None = None
    demand_per_process: float | None = None
    request_waiting_fraction: float | None = None
    storage_read_bytes_per_s: float | None = None  # what the watched process tree read from storage
    io_pressure_fraction: float | None = None  # PSI io "some": the share of time a task of the host waited on I/O
    run_delay_fraction: float | None = None
    gpus: int = 0
    gpu_util: float | None = None
    gpu_busy_ratio: float | None = None
    sm_activity: float | None = None
    tensor_activity: float | None = None
    dram_activity: float | None = None
    gpu_mem_ratio: float | None = None
    alloc_retries: float = 0.0
    throttle_thermal: bool = False
    throttle_power: bool = False
    straggler_rank: float | None = None
    straggler_compute_ratio: float | None = None
    others_wait_fraction: float | None = None
    starved_rank: float | None = None
    starved_data_wait_fraction: float | None = None  # the starved rank's own loop waiting for data
    ranks: list[RankSignals] = field(default_factory=list)
    straggler: RankSignals | None = None
    starved: RankSignals | None = None  # the rank whose DataLoader starves it while the others wait for it
    # the loop thread's stack samples in the window (hook/profiler.py): how many, the share of each place, and the
    # top frames (where, `file:line function`, share of all samples), most sampled first
    loop_samples: float | None = None
    profile: dict[str, float] = field(default_factory=dict)
    top_frames: list[tuple[str, str, float]] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)

    def evidence(self) -> dict[str, float]:
        """The signals that have a value, rounded, for reports and the diagnosis metrics."""
        out = {}
        for key, value in vars(self).items():
            if key in ("extra", "window_s", "ranks", "straggler", "starved", "profile", "top_frames") \
                    or value is None:
                continue
            out[key] = round(float(value), 4)
        for where, share in self.profile.items():
            out[f"in_{where}_fraction"] = round(share, 4)
        return out

    @classmethod
    def from_evidence(cls, evidence: Mapping[str, float], frames: Iterable[tuple[str, str, float]] = ()) -> Signals:
        """The signals a verdict's evidence holds (`evidence()` the other way round), with the loop's top frames:
        a run's verdict is explained from the evidence it shows, so the reason's numbers are the evidence's. The
        straggler and the starved rank come back with what the evidence says of them (their rank, the starved
        rank's data wait); the other per-rank numbers are not in it."""
        kinds = {f.name: str(f.type) for f in fields(cls)}
        s = cls(window_s=0.0)
        for key, value in evidence.items():
            kind = kinds.get(key, "")
            if kind == "bool":
                setattr(s, key, bool(value))
            elif kind == "int":
                setattr(s, key, int(value))
            elif kind.startswith("float"):
                setattr(s, key, float(value))
        s.profile = {k[3:-9]: v for k, v in evidence.items() if k.startswith("in_") and k.endswith("_fraction")}
        s.top_frames = sorted(frames, key=lambda f: -f[2])[:TOP_FRAMES]
        if s.straggler_rank is not None:
            s.straggler = RankSignals("", f"{s.straggler_rank:g}", 0.0, 0.0, 0.0, 0.0, 0.0)
        if s.starved_rank is not None:
            s.starved = RankSignals("", f"{s.starved_rank:g}", 0.0, 0.0, 0.0, 0.0, 0.0,
                                    s.starved_data_wait_fraction or 0.0)
        return s

    def share(self, where: str) -> float | None:
        """The share of the loop thread's samples in `where`; None without enough samples in the window."""
        return self.profile.get(where, 0.0) if self.profile else None

    def top_frame(self, *where: str) -> tuple[str, float] | None:
        """The most sampled frame in one of `where` (any when none given), and its share of all samples."""
        for w, frame, share in self.top_frames:
            if not where or w in where:
                return frame, share
        return None


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
    wall = delta("loop_wall")
    if wall > 0:  # the loop's own decomposition (hook/loop.py)
        s.data_wait_fraction = delta("loop_data_wait") / wall
        s.step_fraction = delta("loop_step") / wall
        s.other_fraction = delta("loop_other") / wall
        s.checkpoint_fraction = delta("loop_checkpoint") / wall
        if "collective_wait" in new:
            s.collective_wait_fraction = min(1.0, delta("collective_wait") / wall)
            s.collective_fraction = delta("collective") / wall
    elif delta("step_sum") > 0:  # hooks that publish no decomposition
        s.data_wait_fraction = delta("wait_sum") / (delta("step_sum") + delta("wait_sum"))
    s.samples_per_s = delta("samples") / dt
    s.requests_per_s = delta("requests") / dt
    s.process_cpu_cores = delta("process_cpu") / dt
    if "tree_io_read" in old and "tree_io_read" in new:
        s.storage_read_bytes_per_s = delta("tree_io_read") / dt
    if "io_pressure" in old and "io_pressure" in new:
        s.io_pressure_fraction = min(1.0, delta("io_pressure") / dt)
    s.cpus = new.get("cpus", 1.0) or 1.0
    s.host_cpu_util = new.get("host_cpu_util")
    if new.get("host_mem_total"):
        s.host_mem_available_ratio = new.get("host_mem_avail", 0.0) / new["host_mem_total"]
    if new.get("cgroup_mem_limit"):  # the container's limit, which the kernel enforces long before the host runs out
        s.container_mem_ratio = new.get("cgroup_mem_working_set", 0.0) / new["cgroup_mem_limit"]
    if "cpu_main" in old and "cpu_main" in new:  # a counter that appears mid-window holds time from before it
        _threads(s, old, new, dt, delta)
    s.torch_cpu_only = "intra_op_threads" in new and not new.get("cuda_used") and "gpu_busy" not in new
    s.gpus = int(new.get("gpus", 0))
    s.gpu_util = new.get("gpu_util")
    if delta("gpu_observed") > 0:
        s.gpu_busy_ratio = min(1.0, delta("gpu_busy") / delta("gpu_observed"))
    s.sm_activity = new.get("sm_activity")
    s.tensor_activity = new.get("tensor_activity")
    s.dram_activity = new.get("dram_activity")
    s.gpu_mem_ratio = new.get("gpu_mem_ratio")
    s.alloc_retries = delta("alloc_retries")
    s.throttle_thermal = bool(new.get("throttle_thermal"))
    s.throttle_power = bool(new.get("throttle_power"))
    _profile(s, old, new, delta)
    _ranks(s, old, new)
    _service(s, old, new, dt, delta)
    _loop_waiting(s)
    return s


def _loop_waiting(s: Signals) -> None:
    """The loop thread's time off CPU that none of the job's own waits explain (its demand, data, collectives,
    checkpoints, the GPU's share of the steps): what is left waits outside the process."""
    if s.steps_per_s <= 0 or s.main_thread_busy is None:
        return
    explained = s.main_thread_busy + sum(x or 0.0 for x in (s.data_wait_fraction, s.collective_wait_fraction,
                                                            s.checkpoint_fraction, gpu_share(s)))
    s.loop_waiting_fraction = max(0.0, 1.0 - explained)


def gpu_share(s: Signals) -> float | None:
    """The GPU's busy share of the job's time: CUDA events' where measured, else NVML's utilisation of the GPUs a
    job uses (none for a torch job that never initialised CUDA, whatever the node has)."""
    if s.gpu_busy_ratio is not None:
        return s.gpu_busy_ratio
    if s.gpus > 0 and s.gpu_util is not None and not s.torch_cpu_only:
        return s.gpu_util
    return None


def _service(s: Signals, old: dict[str, float], new: dict[str, float], dt: float, d: Callable[[str], float]) \
        -> None:
    """How a service's requests spend their time: in the queue, on a CPU (the job's CPU and run delay per request),
    waiting for the process's other requests' CPU, or outside the process.

    The job's CPU is its threads' (the roles but the hook's own), or the watched tree's where threads are not
    measured; all of it is counted against the requests, so a request's own CPU is never underestimated. A process
    serves on one interpreter: a request also waits for the others' CPU (the GIL, its cores), which a single
    server's queue puts at rho / (1 - rho) times its own CPU, rho being the process's demand in cores; from
    SATURATED on, the process's own work explains any wait."""
    finished = d("request_count")
    in_flight = new.get("in_flight", 0.0)
    if finished <= 0 and in_flight <= 0:
        return
    s.requests_in_flight = new.get("in_flight")
    threads = "cpu_main" in old and "cpu_main" in new
    if not threads and "process_cpu" not in new:  # no CPU measured at all: nothing to split the requests' time by
        return
    cpu = sum(d(f"cpu_{r}") for r in ROLE_SIGNALS) if threads else d("process_cpu")
    delay = sum(d(f"delay_{r}") for r in ROLE_SIGNALS) if threads and new.get("has_run_delay") else 0.0
    rho = (cpu + delay) / dt / max(1.0, new.get("main_threads", 1.0))
    s.demand_per_process = rho
    if finished > 0:
        latency = d("request_sum") / finished
        queue = min(latency, d("queue_sum") / finished)  # 0 where the server reports no queue phase
        s.request_latency_s = latency
        s.request_queue_s = queue if "queue_sum" in new else None
        s.request_cpu_s, s.request_cpu_wait_s = cpu / finished, delay / finished
        handled = finished * (latency - queue) / dt  # requests in their handlers at once, on average (Little)
    else:  # requests in flight, none finished in the window: the gauge says how many are being handled
        handled = in_flight
    if rho >= SATURATED or handled <= 0:
        s.request_waiting_fraction = 0.0
        return
    own = (cpu + delay) / dt / (1.0 - rho)  # the CPU the handlers used, waited for, or waited for others to use
    s.request_waiting_fraction = max(0.0, 1.0 - own / handled - (gpu_share(s) or 0.0))


def _profile(s: Signals, old: dict[str, float], new: dict[str, float], d: Callable[[str], float]) -> None:
    """Shares of the loop thread's stack samples, and its top frames, over the window; only where the window's
    first sweep already had samples (a counter that appears mid-window holds samples from before it)."""
    if "prof_total" not in old or "prof_total" not in new:
        return
    total = d("prof_total")
    s.loop_samples = total
    if total < PROFILE_MIN_SAMPLES:
        return
    s.profile = {w: d(f"prof_{w}") / total for w in WHERE if d(f"prof_{w}") > 0}
    frames = []
    for key in new:
        if key.startswith("frame" + SEP):
            n = d(key)
            if n > 0:
                _, where, frame = key.split(SEP, 2)
                frames.append((where, frame, min(1.0, n / total)))
    s.top_frames = sorted(frames, key=lambda f: -f[2])[:TOP_FRAMES]


def _threads(s: Signals, old: dict[str, float], new: dict[str, float], dt: float, d: Callable[[str], float]) \
        -> None:
    """Per-process demand of the main thread and of the intra-op pool, the workers' CPU, and the run delay."""
    processes = max(1.0, new.get("main_threads", 1.0))
    s.main_thread_cpu = d("cpu_main") / dt / processes
    s.main_thread_busy = (d("cpu_main") + d("delay_main")) / dt / processes
    s.intra_op_busy = (d("cpu_intra_op") + d("delay_intra_op")) / dt / processes
    s.data_workers_cpu_cores = d("cpu_data_workers") / dt
    s.other_threads_busy = (d("cpu_other") + d("delay_other")) / dt / processes
    if new.get("worker_threads"):
        # per worker process where the hook counts them (a DataLoader worker runs three threads), else per thread
        workers = new.get("worker_processes") or new["worker_threads"]
        s.data_worker_busy = (d("cpu_data_workers") + d("delay_data_workers")) / dt / workers
        if new.get("has_run_delay"):
            s.data_workers_delay_cores = d("delay_data_workers") / dt
            s.data_worker_delay_fraction = d("delay_data_workers") / dt / workers
    s.intra_op_threads = new.get("intra_op_threads")
    s.ops_counted = "autograd_ops" in new
    ops, steps = d("autograd_ops"), d("step_count")
    if ops > 0 and "autograd_ops" in old:
        s.main_cpu_us_per_op = d("cpu_main") / ops * 1e6
        if steps:
            s.ops_per_step = ops / steps
    wall, waited = d("loop_wall"), d("loop_data_wait")
    if new.get("has_run_delay") and wall > 0:
        # the main thread's run delay falls mostly in the step and other parts (it is not runnable while it waits
        # for data, but for the wake-up): without it, the loop's own time; never less than the CPU the thread
        # spent, so a wake-up delay counted in the wait cannot make the rest vanish
        own = waited + max(wall - waited - d("delay_main"), d("cpu_main"))
        if own > 0:
            s.data_wait_alone_fraction = waited / own
    if new.get("has_run_delay"):
        cpu = sum(d(f"cpu_{r}") for r in ROLE_SIGNALS)
        delay = sum(d(f"delay_{r}") for r in ROLE_SIGNALS)
        if cpu + delay > 0:
            s.run_delay_fraction = delay / (cpu + delay)


def _ranks(s: Signals, old: dict[str, float], new: dict[str, float]) -> None:
    """Each rank's compute per step and collective wait; the straggler, when one rank computes clearly longer
    than the others and they wait for it."""
    fields: dict[tuple[str, str], dict[str, float]] = {}
    for key, value in new.items():
        if not key.startswith("rank" + SEP):
            continue
        parts = key.split(SEP)
        if len(parts) < 4:
            continue
        job, rank, what = SEP.join(parts[1:-2]), parts[-2], parts[-1]
        fields.setdefault((job, rank), {})[what] = max(0.0, value - old.get(key, 0.0))
    ranks = []
    for (job, rank), f in sorted(fields.items()):
        steps, wall = f.get("steps", 0.0), f.get("wall", 0.0)
        if steps <= 0 or wall <= 0 or "collective_wait" not in f:
            continue
        compute = max(0.0, f.get("step", 0.0) - f["collective_wait"]) / steps
        ranks.append(RankSignals(job, rank, steps, compute, f["collective_wait"] / steps, wall / steps,
                                 min(1.0, f["collective_wait"] / wall), min(1.0, f.get("data_wait", 0.0) / wall)))
    s.ranks = ranks
    for job in {r.training_job for r in ranks}:
        group = [r for r in ranks if r.training_job == job]
        if len(group) < 2:
            continue
        hungry = max(group, key=lambda r: r.data_wait_fraction)
        fed = [r for r in group if r is not hungry]
        if hungry.data_wait_fraction >= STARVED_WAIT \
                and median(r.data_wait_fraction for r in fed) < STARVED_FED * hungry.data_wait_fraction \
                and median(r.wait_fraction for r in fed) >= STARVED_WAITED * hungry.data_wait_fraction:
            s.starved = hungry
            s.starved_rank = _number(hungry.rank)
            s.starved_data_wait_fraction = hungry.data_wait_fraction
            s.others_wait_fraction = median(r.wait_fraction for r in fed)
        slow = max(group, key=lambda r: r.compute_s)
        others = [r for r in group if r is not slow]
        typical = median(r.compute_s for r in others)
        if typical <= 0:
            continue
        ratio = slow.compute_s / typical
        extra = slow.compute_s - typical  # seconds per step the others would wait for it
        waited = median(r.wait_s for r in others) - slow.wait_s
        if s.straggler_compute_ratio is None or ratio > s.straggler_compute_ratio:
            s.straggler_compute_ratio = ratio
            if s.starved is None:  # a starved rank's verdict states the fed ranks' wait for it, measured above
                s.others_wait_fraction = median(r.wait_fraction for r in others)
            if ratio >= STRAGGLER_RATIO and extra >= STRAGGLER_SHARE * slow.wall_s \
                    and waited >= STRAGGLER_WAITED * extra:
                s.straggler = slow
                s.straggler_rank = _number(slow.rank)


# The straggler: the rank whose compute per step is at least STRAGGLER_RATIO times the others' median, by at least
# STRAGGLER_SHARE of its step (a difference of a millisecond in a step spent communicating is noise, not a
# straggler), and the others wait in collectives, per step, at least STRAGGLER_WAITED of that difference more than
# it does: they wait for it.
STRAGGLER_RATIO = 1.5
STRAGGLER_SHARE = 0.1
STRAGGLER_WAITED = 0.5
# The starved rank: the one whose loop waits for data at least STARVED_WAIT of its time while the others' median
# is under STARVED_FED of its share, and the others spend, in collectives, at least STARVED_WAITED of its share:
# they wait for it.
STARVED_WAIT = 0.3
STARVED_FED = 0.5
STARVED_WAITED = 0.5
# A process whose threads want this much of a CPU or more (cores of demand) makes its requests wait for one another
# (one interpreter's GIL, or its cores): its own work can explain any wait of theirs
SATURATED = 0.95


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
