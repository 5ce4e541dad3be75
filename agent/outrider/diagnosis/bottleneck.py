"""Bottleneck verdicts: the class, the evidence (the numbers behind it) and what to do about it.

A verdict names what the process does. A process that steps or serves (a step or a request finished in the window,
or a request in flight) is never idle: idle is a process that does neither and uses no CPU or GPU.

Classes, checked in this order (the rules are one table, `verdict_rules()`, walked in order: the first rule whose
condition holds gives the verdict and its reason): idle, throttled, memory_pressure, then a service (requests, no
steps) by its requests: waiting (its handlers' time is mostly off CPU, outside the process: a downstream call, the
network, a lock, a sleep) or, on the CPU, compute_bound (the requests' time is CPU: theirs, their wait for a CPU,
and their wait for the process's other requests' CPU); then a training loop: checkpoint_bound (recognised
checkpoints on the loop's thread a large part of its time, at least as large as its data wait), input_bound (the
reason and the advice say which of the data pipeline's CPU, CPU starvation, storage or something outside it the loop
waits for, from their own evidence), communication_bound (a straggler rank, or collectives blocking the loop on
every rank), memory_bandwidth_bound, waiting (the loop thread off CPU most of the time beside its data, collectives,
checkpoints and GPU: a sleep, a lock, a network call in the loop), python_bound, then compute_bound / host_bound /
balanced:

- python_bound, from the loop thread's stack samples (hook/profiler.py): most of them in the user's own Python
  code (a tokeniser in the loop, tensors built from lists) while the accelerator or torch's work does not pace the
  job; the reason names the hottest line;
- with CUDA, from the GPU's busy share of the steps (CUDA events, hook/gpu_pacing.py; NVML utilisation only where
  no events were measured): the GPU pacing the steps is compute_bound, a GPU waiting for the host is host_bound;
- on CPU, from the demand (CPU + run delay) of the training loop's main thread and the size of its operations
  (main-thread CPU per differentiable operation): the main thread saturated with small operations (overhead) is
  host_bound, large operations are compute_bound. Where operations are not counted (no grad, an older torch),
  torch's intra-op pool decides: busy is compute_bound, idle beside a saturated main thread is host_bound. (The
  pool's CPU alone cannot decide: libgomp's workers spin after each parallel region, so one small parallel
  operation per step keeps an idle pool looking busy.)

A window without the evidence its rule needs is **not judged** (`NOT_JUDGED`, with the reason): never a class,
never "balanced" by default, and it never votes in a run's verdict. balanced is a measured verdict: the numbers
are there and none dominates.

A job slowed by its neighbours keeps its class; the reason says how long its threads waited for a CPU. Only the
data pipeline's workers starved of CPU change what the advice says (fewer workers or more CPUs): there, adding the
workers the decoding advice asks for makes it worse.

The advice (`advice()`) follows the evidence as the reason does: which input the loop waits for, a service or a
loop, and an accelerator or none (a job without one never reads about CUDA, GPUs or tensor cores).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from outrider.diagnosis.signals import Signals, gpu_share
from outrider.metrics import units

CLASSES = ("idle", "throttled", "memory_pressure", "checkpoint_bound", "input_bound", "memory_bandwidth_bound",
           "compute_bound", "host_bound", "python_bound", "communication_bound", "waiting", "balanced")
NOT_JUDGED = "not_judged"  # a window without the evidence its rule needs: not a class
NOT_JUDGED_ADVICE = "Not judged: this window lacks the measurements its rule needs (see why)."

# The advice for each class, for a job with an accelerator (and for the classes whose advice does not depend on
# one); CPU_RECOMMENDATIONS replaces it for a job without one, INPUT_ADVICE for input_bound once its evidence says
# what the loop waits for, SERVICE_COMPUTE for a service whose requests' time is CPU.
RECOMMENDATIONS = {
    "idle": "Nothing is running: no steps, no requests finished or in flight, and no CPU or GPU use.",
    "throttled": "The GPU runs below its clocks for heat or power: check cooling and airflow, the power limit and "
                 "the node's power supply; move the job if one GPU or node is the outlier.",
    "memory_pressure": "Memory is nearly exhausted (GPU near capacity, allocator retries, or little host memory): "
                       "smaller batches with gradient accumulation, activation checkpointing, mixed precision, "
                       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation.",
    "checkpoint_bound": "Checkpoints take a large part of the loop: save less often (by training time, not every "
                        "few steps), asynchronously (torch.distributed.checkpoint.async_save, or a copy to CPU "
                        "memory written by a background thread), to fast local storage (upload afterwards), and "
                        "less (the model and optimizer state only; sharded across ranks with "
                        "torch.distributed.checkpoint rather than everything from rank 0).",
    "input_bound": "The loop waits for data. Workers busy decoding (on a CPU): more DataLoader workers where cores "
                   "are free, cheaper decoding, preprocessing offline or on the GPU, pin_memory=True, "
                   "persistent_workers=True. Workers waiting on storage (the reason says which): faster or local "
                   "storage, a cache of the dataset, larger sequential reads, more workers or prefetch_factor to "
                   "overlap more reads.",
    "memory_bandwidth_bound": "DRAM bandwidth, not compute, limits the kernels: fuse operations (torch.compile), "
                              "use lower precision (bf16/fp8) to move fewer bytes, larger batches for reuse.",
    "compute_bound": "The processor is busy doing the work: this is where a well-fed job should be. Faster still: "
                     "mixed precision and tensor cores, torch.compile, fewer FLOPs (smaller model, sparsity).",
    "host_bound": "The CPU side (Python, kernel launches, tiny operations) limits the job while the accelerator "
                  "waits: larger batches, CUDA graphs, torch.compile to fuse small ops, fewer host syncs.",
    "python_bound": "The loop's own Python code paces the job (the hottest line is in the reason): move it out of "
                    "the loop (tokenise or preprocess offline or in DataLoader workers), vectorise it with tensor "
                    "operations, cache what it computes; profile that line (py-spy) for what inside it is slow.",
    "communication_bound": "Collectives dominate the step. A straggler rank: find why it computes longer (a slower "
                           "or busier node, more data, a throttled GPU) and balance the work. Otherwise: overlap "
                           "communication with compute, bucket gradients, compress them, check the interconnect.",
    "waiting": "The job waits on something outside the process (a downstream service, the network, a lock, a "
               "sleep or a poll): neither its CPUs nor an accelerator are the limit, and more of either will not "
               "help. Find the wait (the reason names where the loop waits, or how a request's time splits): "
               "overlap it (more concurrent requests, threads or async calls, prefetching), shorten it (a closer "
               "or faster downstream, a cache, batched remote calls, timeouts), or drop it (an event instead of a "
               "sleep or a poll, a lock held for less).",
    "balanced": "No single bottleneck stands out in this window.",
}
CPU_RECOMMENDATIONS = {
    "memory_pressure": "Memory is nearly exhausted (host memory, or the container's memory limit): smaller "
                       "batches, fewer DataLoader workers or a smaller prefetch_factor (each worker holds batches "
                       "and a copy of the dataset object), a larger memory limit; a resident set that keeps growing "
                       "is a leak.",
    "input_bound": "The loop waits for data. Workers busy decoding (on a CPU): more DataLoader workers where cores "
                   "are free, cheaper decoding, preprocessing offline, persistent_workers=True. Workers waiting on "
                   "storage (the reason says which): faster or local storage, a cache of the dataset, larger "
                   "sequential reads, more workers or prefetch_factor to overlap more reads.",
    "memory_bandwidth_bound": "Memory bandwidth, not arithmetic, limits the operations: fuse them (torch.compile), "
                              "a lower precision (bf16) to move fewer bytes, larger batches for reuse.",
    "compute_bound": "The CPUs are busy doing the work: this is where a well-fed CPU job should be. Faster still: "
                     "torch.compile, bf16 where the CPU has it (AMX, AVX-512 BF16), torch.set_num_threads to the "
                     "cores the job may use, fewer FLOPs (a smaller model, quantisation).",
    "host_bound": "Python and framework overhead (many small operations) pace the job on the CPU: larger batches "
                  "(fewer, larger operations), torch.compile to fuse small operations, less work in Python per "
                  "step; torch.set_num_threads(1) where the operations are too small to split.",
    "communication_bound": "Collectives dominate the step. A straggler rank: find why it computes longer (a slower "
                           "or busier node, more data, fewer CPUs) and balance the work. Otherwise: overlap "
                           "communication with compute, bucket gradients, compress them, check the network.",
}
INPUT_ADVICE = {
    "cpu_starved": "The data pipeline waits for CPUs: its workers wait for a CPU longer than they use one (the job "
                   "runs more busy threads than it has cores, or neighbours take them). Fewer DataLoader workers "
                   "(no more than the cores the job may use, less what the loop needs) or more CPUs (a larger CPU "
                   "request or limit, a node without CPU-hungry neighbours); more workers would wait longer.",
    "loader_cpu": "The data pipeline's CPU paces the loop: the DataLoader workers are busy producing samples. More "
                  "workers where cores are free, cheaper decoding and augmentation, preprocessing offline, "
                  "persistent_workers=True.",
    "loop_cpu": "The data pipeline's CPU paces the loop: the loader runs on the loop's own thread. DataLoader "
                "workers (num_workers=N) to produce batches beside the steps, cheaper decoding and augmentation, "
                "preprocessing offline.",
    "storage": "Storage paces the loader: faster or local storage, a cache of the dataset (memory, a local SSD), "
               "larger sequential reads (samples packed into shards rather than a file each), more workers or a "
               "larger prefetch_factor to overlap more reads.",
    "outside": "The loader waits for something that is neither a CPU nor storage (a network fetch, a remote store, "
               "a lock, a sleep in the dataset): overlap more of it (more workers, prefetch_factor, asynchronous "
               "fetches), cache what it fetches, and find the wait in the dataset's code.",
}
# said after the advice for what an input-bound loop waits for where its workers, short of starvation, wait for a
# CPU as long as they use one or longer: more workers would take CPUs the others wait for
CPUS_SHORT = (" The workers also wait for a CPU as long as they use one or longer: CPUs are short too, so more CPUs "
              "(or fewer busy threads beside them) before more workers.")
SERVICE_COMPUTE = ("The requests' time is CPU: the process's threads, a request's wait for a CPU, and its wait for "
                   "the other requests' CPU (one Python process computes on about one core at a time). More worker "
                   "processes or replicas, batching requests, a cheaper model (torch.compile, quantisation), less "
                   "Python per request.")
INPUT_ADVICE_GPU = {  # with an accelerator, the data pipeline's CPU can also move onto it
    "loader_cpu": "The data pipeline's CPU paces the loop: the DataLoader workers are busy producing samples. More "
                  "workers where cores are free, cheaper decoding and augmentation, preprocessing offline or on the "
                  "GPU, pin_memory=True, persistent_workers=True.",
    "loop_cpu": "The data pipeline's CPU paces the loop: the loader runs on the loop's own thread. DataLoader "
                "workers (num_workers=N) to produce batches beside the steps, cheaper decoding and augmentation, "
                "preprocessing offline or on the GPU.",
}


@dataclass(frozen=True)
class Verdict:
    cls: str
    evidence: dict[str, float]
    reason: str
    # the loop thread's most sampled frames in the window: (where, `file:line function`, share of the samples)
    frames: tuple[tuple[str, str, float], ...] = ()

    @property
    def recommendation(self) -> str:
        return advice(self.cls, Signals.from_evidence(self.evidence))

    @property
    def judged(self) -> bool:
        return self.cls != NOT_JUDGED


# Thresholds. All are shares of the job's own time or demand: none depends on the machine's core count or load,
# but STORAGE_READ, a rate (a loader reading less than it from storage is not waiting for its bandwidth; one
# waiting on a device's latency shows in the I/O pressure, a share).
# tests/diagnosis/test_verdict_rules.py pins each one's value and the verdict just below and just above it.
IDLE_CORES = 0.05  # a job without steps or requests using less CPU than this (cores) is idle...
IDLE_GPU = 0.05  # ...with its GPUs busy less than this
THROTTLED_BUSY = 0.3  # a GPU busier than this with a thermal or power clock event is throttled
GPU_MEMORY = 0.95  # GPU memory used over this is memory_pressure
HOST_MEMORY = 0.05  # host memory available under this is memory_pressure
INPUT_WAIT = 0.3  # share of the loop waiting for data
CHECKPOINT_SHARE = 0.3  # share of the loop inside recognised checkpoints (and no less than its data wait)
COMM_WAIT = 0.3  # share of the loop blocked in collectives
GPU_BUSY = 0.6  # share of the steps the GPU paced (CUDA events) for compute_bound
CONTAINER_MEMORY = 0.95  # working set over the memory cgroup's limit for memory_pressure
GPU_IDLE = 0.3  # below it, the GPU waits for the host
FED = 0.1  # a loop waiting for data less than this share is fed: only then can the host be what paces it
DRAM_BUSY = 0.7  # DRAM activity at least this while the SMs are under SM_BUSY is memory_bandwidth_bound
SM_BUSY = 0.5
# The main thread's demand (CPU + run delay) per second. Not 1.0: on a crowded machine the main thread also sleeps
# at the intra-op pool's barriers, waiting for workers that wait for a CPU.
MAIN_SATURATED = 0.6
POOL_BUSY = 0.5  # intra-op pool demand, in main threads' worth, for CPU compute_bound
POOL_IDLE = 0.25  # below it (in main threads' worth) the pool idles
CONTENDED = 0.2  # run delay share of the job's CPU demand worth saying
# Main-thread CPU per differentiable operation. Eager PyTorch spends some 10-30 us of framework work (Python, the
# dispatcher, autograd bookkeeping) on every operation, whatever its size: at 100 us or less that overhead is a
# quarter of the work or more (host-bound); from 500 us on, the operations' own math dominates (compute-bound).
# CPU time, not wall time: neighbours do not move it.
HOST_OP_US = 100.0
COMPUTE_OP_US = 500.0
# The loop thread's stack samples: at least this share in the user's Python is python_bound
PYTHON_SHARE = 0.5
# Operations counted: their size decides once the main thread is busy at least this share of the time
OPS_MAIN = 0.5
# No per-thread CPU (a hook too old to publish it): the process's CPU, cores, that says compute_bound
PROCESS_COMPUTE_CORES = 1.5
# waiting: more than this share (most) of the loop's time off CPU beside its data, collectives, checkpoints and
# GPU (signals.loop_waiting_fraction), or of a service's requests' time off CPU, outside the process
# (signals.request_waiting_fraction)...
WAITING_SHARE = 0.5
# ...while torch's pool does no work the loop waits for: its demand under POOL_RESTING (in main threads' worth), or
# the loop thread's samples RESTING_SHARE or more waiting (off CPU; the pool spins after each parallel region, all
# the more on a crowded machine)...
POOL_RESTING = 0.2
RESTING_SHARE = 0.5
# ...and the process's other threads want less than this (threads' worth): a loop waiting for its own process's
# threads (a producer thread, a thread pool) waits on the job's work, not outside it
OTHER_BUSY = 0.5
# DataLoader workers busy (demand per worker process) under this share of the time while the loop waits for them
# wait for something else than a CPU more than they want one: storage, the network, a lock
WORKERS_WAITING = 0.5
# DataLoader workers starved of CPU: their run delay at least WORKERS_STARVED times their CPU (they wait for a CPU
# at least as long as they use one) and each worker waiting for a CPU WORKERS_DELAYED of the time or more. Only then
# is the CPU surely what they wait for most: a worker's time off CPU is either work (a read, a sleep) or no work
# (its batches delivered, or waiting its turn), which no counter tells apart, and a worker that sleeps or reads
# also waits for a CPU after each wake-up (measured here: two workers sleeping 10 ms a sample beside a loop whose
# pool spins waited for a CPU 1.6 to 9 times as long as they ran, each 6-20% of the time). Below that line the
# reason still says how long they waited for a CPU.
WORKERS_STARVED = 1.0
WORKERS_DELAYED = 0.5
# Storage is named only with storage's evidence: the host's I/O pressure (PSI io "some": the share of the time a
# task waited for I/O) at least STORAGE_PRESSURE, or the job's processes reading at least STORAGE_READ bytes a
# second from storage (page-cache hits are not storage reads)
STORAGE_PRESSURE = 0.1
STORAGE_READ = 1e6


def nothing_ran(s: Signals) -> bool:
    """No steps or requests, and neither the job's CPU nor its GPUs in use: the first idle rule, and what a run's
    record does not count as active time, whatever its window's verdict (runs/recorder.py)."""
    return _nothing_ran(facts(s))


def _nothing_ran(f: Facts) -> bool:
    return not f.active and f.s.process_cpu_cores < IDLE_CORES and (f.gpu_util is None or f.gpu_util < IDLE_GPU)


def classify(s: Signals) -> Verdict:
    v = _classify(s)
    reason = v.reason
    # (a job that waits outside the process is not slowed by a wait for a CPU: its reason says how long it was)
    if s.run_delay_fraction is not None and s.run_delay_fraction >= CONTENDED \
            and v.cls not in ("idle", "waiting", NOT_JUDGED):
        reason += (f"; slowed by CPU contention: its threads waited for a CPU {s.run_delay_fraction:.0%} of the "
                   "time they were runnable (neighbours on the machine, or more threads than cores)")
    return Verdict(v.cls, v.evidence, reason, tuple(s.top_frames))


def has_accelerator(s: Signals) -> bool:
    """Whether the job uses a GPU: CUDA events measured, or GPUs whose utilisation is read, unless the job's torch
    never initialised CUDA."""
    return gpu_share(s) is not None


def serving(s: Signals) -> bool:
    """A service in this window: requests finished or in flight, and no steps (a loop that also answers requests
    is judged as the loop it is)."""
    return s.steps_per_s <= 0 and (s.requests_per_s > 0 or (s.requests_in_flight or 0.0) > 0)


def advice(cls: str, s: Signals) -> str:
    """What to do about a class, as its evidence says: which input the loop waits for, a service or a loop, an
    accelerator or none."""
    gpu = has_accelerator(s)
    if cls == "input_bound":
        cause = input_cause(s)
        short = CPUS_SHORT if cause != "cpu_starved" and workers_wait_for_cpus(s) else ""
        if gpu and cause in INPUT_ADVICE_GPU:
            return INPUT_ADVICE_GPU[cause] + short
        if cause in INPUT_ADVICE:
            return INPUT_ADVICE[cause] + short
    if cls == "compute_bound" and serving(s) and not gpu:
        return SERVICE_COMPUTE
    if not gpu and cls in CPU_RECOMMENDATIONS:
        return CPU_RECOMMENDATIONS[cls]
    return RECOMMENDATIONS.get(cls, NOT_JUDGED_ADVICE)


def input_cause(s: Signals) -> str:
    """What the loop's wait for data is, from its evidence: cpu_starved (the DataLoader workers wait for a CPU),
    loader_cpu (the workers are busy decoding), loop_cpu (no workers: the loader works on the loop's saturated
    thread), storage (storage's evidence: reads or I/O pressure), outside (none of these: the network, a lock, a
    sleep); "" where the evidence cannot say (no per-thread CPU)."""
    if s.data_worker_busy is not None:
        if workers_wait_for_cpus(s) and (s.data_worker_delay_fraction or 0.0) >= WORKERS_DELAYED:
            return "cpu_starved"
        if s.data_worker_busy >= WORKERS_WAITING:
            return "loader_cpu"
    elif s.main_thread_busy is None or s.data_workers_cpu_cores:
        return ""
    elif s.main_thread_busy >= MAIN_SATURATED:
        return "loop_cpu"
    return "storage" if storage_evidence(s) else "outside"


def workers_wait_for_cpus(s: Signals) -> bool:
    """The DataLoader workers waited for a CPU at least as long as they used one (WORKERS_STARVED)."""
    delay = s.data_workers_delay_cores or 0.0
    return delay > 0 and delay >= WORKERS_STARVED * (s.data_workers_cpu_cores or 0.0)


def storage_evidence(s: Signals) -> bool:
    pressure, read = s.io_pressure_fraction, s.storage_read_bytes_per_s
    return (pressure is not None and pressure >= STORAGE_PRESSURE) or (read is not None and read >= STORAGE_READ)


def _input(s: Signals) -> str:
    """What the loop waits for when it waits for data, with the evidence that says so."""
    cause = input_cause(s)
    read = s.storage_read_bytes_per_s
    reads = f"{units.bytes_iec(read)}/s read from storage" if read is not None else "storage reads not measured"
    psi = f", I/O pressure on the host {s.io_pressure_fraction:.0%}" if s.io_pressure_fraction is not None else ""
    delay, cpu = s.data_workers_delay_cores or 0.0, s.data_workers_cpu_cores or 0.0
    waited = (f"{delay:.2f} s a second waiting for a CPU and {cpu:.2f} s on one, each worker "
              f"{s.data_worker_delay_fraction or 0.0:.0%} of the time waiting")
    # short of starvation, the workers' wait for a CPU where it is as long as their CPU, said beside the cause
    also = f"; they also wait for a CPU ({waited})" if workers_wait_for_cpus(s) else ""
    if cause == "cpu_starved":
        return f"; the DataLoader workers are starved of CPU: {waited} ({reads})"
    if cause == "loader_cpu":
        return (f"; the data pipeline's CPU: the DataLoader workers decode, each busy {s.data_worker_busy:.0%} of the "
                f"time ({units.cores(cpu)}; {reads}){also}")
    if cause in ("loop_cpu", "storage", "outside"):  # measured: the workers' demand, else the loop thread's
        if s.data_worker_busy is not None:
            who, wait = f"the DataLoader workers (each busy {s.data_worker_busy:.0%} of the time)", "wait"
        else:
            who, wait = f"the loop's thread (no DataLoader workers; busy {s.main_thread_busy:.0%} of the time)", \
                "waits"
        if cause == "loop_cpu":
            return f"; the data pipeline's CPU: the loader works on {who}"
        if cause == "storage":
            return f"; {who} {wait} for storage: {reads}{psi}{also}"
        return (f"; {who} {wait} off CPU, and not for storage ({reads}{psi}): the network, a remote store, a lock "
                f"or a sleep in the loader{also}")
    if s.data_workers_cpu_cores:
        return f", DataLoader workers {units.cores(s.data_workers_cpu_cores)}"
    return ""


@dataclass(frozen=True)
class Facts:
    """What the rules read: the window's signals, and what is derived from them once for every rule."""

    s: Signals
    gpu_util: float | None  # None: no GPU, or a torch job that never initialised CUDA (it runs on the CPU)
    gpu_busy: float | None  # the GPU's busy share (signals.gpu_share); None without an accelerator
    wait: float  # the loop's share waiting for data: its own share where neighbours stretch the step
    active: bool  # a step or a request finished in the window, or a request in flight
    per_thread: bool  # the main thread's and torch's pool's demand measured (CPU rules)
    main: float  # the main thread's demand (0.0 where not per_thread)
    pool: float  # torch's intra-op pool's demand, in main threads' worth (0.0 where not per_thread)

    @property
    def gpu_not_pacing(self) -> bool:
        """No GPU busy enough to pace the steps (GPU_BUSY): the loop's data, Python or CPU can."""
        return self.gpu_busy is None or self.gpu_busy < GPU_BUSY

    @property
    def gpu_source(self) -> str:
        return "CUDA events: the GPU paced" if self.s.gpu_busy_ratio is not None else "NVML: the GPU was busy"

    @property
    def serving(self) -> bool:
        """A service judged on its requests (how their time splits is measured)."""
        return serving(self.s) and self.s.request_waiting_fraction is not None

    @property
    def ops_decide(self) -> bool:
        """Operations counted, with a main thread busy enough (OPS_MAIN) for their size to decide (CPU rules)."""
        return self.per_thread and self.s.main_cpu_us_per_op is not None and self.main >= OPS_MAIN

    @property
    def per_op(self) -> float:
        return self.s.main_cpu_us_per_op or 0.0


def facts(s: Signals) -> Facts:
    # a torch job that never initialised CUDA runs on the CPU, whatever GPUs the node has
    gpu_util = s.gpu_util if s.gpus > 0 and not s.torch_cpu_only else None
    wait = s.data_wait_fraction or 0.0
    # on a crowded machine the step is stretched by the time the loop's thread waits for a CPU, the wait for data
    # is not: the loop's own share decides (it is the measured share on a machine to itself)
    if s.data_wait_alone_fraction is not None:
        wait = max(wait, s.data_wait_alone_fraction)
    active = s.steps_per_s > 0 or s.requests_per_s > 0 or (s.requests_in_flight or 0.0) > 0
    main, pool = s.main_thread_busy, s.intra_op_busy
    per_thread = main is not None and pool is not None
    return Facts(s, gpu_util, gpu_share(s), wait, active, per_thread, main or 0.0, pool or 0.0)


@dataclass(frozen=True)
class Rule:
    """One verdict rule: the class it gives, when (its condition on the window's facts), and the reason it says."""

    verdict: str
    when: Callable[[Facts], bool]
    reason: Callable[[Facts], str]


def _host_memory_short(s: Signals) -> bool:
    # no memory available at all is the most pressure there is, not a missing measurement: tested for None
    return s.host_mem_available_ratio is not None and s.host_mem_available_ratio < HOST_MEMORY


def _memory_short(s: Signals) -> bool:
    return (s.gpu_mem_ratio or 0) > GPU_MEMORY or s.alloc_retries > 0 or _host_memory_short(s)


def _memory_said(s: Signals) -> str:
    said = [f"GPU memory at {s.gpu_mem_ratio:.0%} of its capacity (above 95%)"
            if (s.gpu_mem_ratio or 0) > GPU_MEMORY else "",
            units.count(s.alloc_retries, "allocator retry" if s.alloc_retries == 1 else "allocator retries")
            if s.alloc_retries > 0 else "",
            f"host memory available {s.host_mem_available_ratio:.0%} (below 5%)" if _host_memory_short(s) else ""]
    return ", ".join(x for x in said if x)


def _requests_held(s: Signals) -> str:
    """A service's requests in flight, none finished in the window."""
    held = s.requests_in_flight or 0.0
    return f"{held:.0f} request{'' if round(held) == 1 else 's'} in flight and none finished in the window"


def _requests_split(s: Signals) -> str:
    """How a service's requests' time splits."""
    split = (f"{units.seconds(s.request_latency_s or 0.0)} per request (mean latency), "
             f"{units.seconds(s.request_cpu_s or 0.0)} of CPU and {units.seconds(s.request_cpu_wait_s or 0.0)} "
             "waiting for a CPU per request")
    if s.request_queue_s:
        split += f", {units.seconds(s.request_queue_s)} of it queued"
    return split


def _starved_said(f: Facts) -> str:
    s = f.s
    r = s.starved
    assert r is not None  # the rule's condition
    return (f"rank {r.rank or '-'} is starved by its DataLoader: {r.data_wait_fraction:.0%} of its loop waiting for "
            f"data, while the other ranks spend {s.others_wait_fraction or 0:.0%} of theirs waiting for it in "
            f"collectives{_input(s)}")


def _data_wait_said(f: Facts) -> str:
    s, wait = f.s, f.wait
    measured = s.data_wait_fraction or 0.0
    alone = f" ({wait:.0%} of its own time, less the time its thread waited for a CPU)" \
        if wait > measured + 0.05 else ""
    underused = ", accelerator underused" if has_accelerator(s) else ""
    return f"{measured:.0%} of the loop waiting for data{alone}{underused}{_input(s)}"


def _straggler_said(f: Facts) -> str:
    s = f.s
    r = s.straggler
    assert r is not None  # the rule's condition
    return (f"rank {r.rank or '-'} is a straggler: its compute per step is {s.straggler_compute_ratio or 0:.1f}x the "
            f"other ranks', which spend {s.others_wait_fraction or 0:.0%} of their loop waiting for it in collectives")


def _loop_waits_outside(f: Facts) -> bool:
    """A loop whose thread is off CPU most of its time beside everything the job measures (data, collectives,
    checkpoints, the GPU): it waits on something outside the process. Its own threads' demand, not the process's
    CPU (the hook's threads are in it). The pool works only inside the main thread's parallel regions: a pool
    looking busier than that spins after them, all the more on a crowded machine, so the loop thread's samples
    mostly waiting decide as well."""
    s = f.s
    resting = (s.intra_op_busy or 0.0) < POOL_RESTING or (s.share("waiting") or 0.0) >= RESTING_SHARE
    return s.steps_per_s > 0 and (s.loop_waiting_fraction or 0.0) > WAITING_SHARE and resting \
        and (s.other_threads_busy or 0.0) < OTHER_BUSY


def _loop_waiting_said(f: Facts) -> str:
    s = f.s
    top = s.top_frame("waiting")
    at = f", mostly at {top[0]}" if top else ""
    beside = "data, collectives, checkpoints and the GPU" if has_accelerator(s) else \
        "data, collectives and checkpoints"
    return (f"the loop waits outside the process: its thread off CPU {s.loop_waiting_fraction:.0%} of the loop's "
            f"time beside {beside} (busy {s.main_thread_busy or 0.0:.0%}, {units.cores(s.main_thread_cpu or 0.0)} "
            f"of CPU; torch's pool {s.intra_op_busy or 0.0:.2f}){at}")


def _python_paces(f: Facts) -> bool:
    python = f.s.share("python")
    return f.active and python is not None and python >= PYTHON_SHARE and f.gpu_not_pacing


def _python_said(f: Facts) -> str:
    top = f.s.top_frame("python")
    at = f"; the hottest line: {top[0]} ({top[1]:.0%} of the samples)" if top else ""
    return f"{f.s.share('python') or 0.0:.0%} of the loop thread's samples in the user's Python code{at}"


def _gpu_said(f: Facts, only: str = "") -> str:
    """The GPU's busy share, of the steps (of the time for a service: its GPU paces no steps)."""
    return f"{f.gpu_source} {only}{f.gpu_busy or 0.0:.0%} {'of the steps' if f.s.steps_per_s > 0 else 'of the time'}"


def _ops(s: Signals) -> str:
    return f"{s.ops_per_step:.0f} operations per step, " if s.ops_per_step else ""


def _pool_spins(f: Facts) -> bool:
    """Large operations split their math across torch's pool: with a pool, it works as the main thread does. A
    pool idle beside a main thread spending milliseconds of CPU per operation is the main thread spinning at the
    pool's barriers on a crowded machine (libgomp), not math: the evidence disagrees."""
    pooled = f.s.intra_op_threads is not None and f.s.intra_op_threads > 1
    return f.ops_decide and f.per_op >= COMPUTE_OP_US and pooled and f.pool < POOL_IDLE * f.main


def verdict_rules() -> tuple[Rule, ...]:
    """The verdict rules, in the order they are checked: the first whose condition holds gives the window's verdict
    (docs/diagnosis.md describes them class by class). The GPU's rules (from compute_bound by the GPU on) end with
    one that takes every window with a GPU busy share; the CPU's follow, each for a window without one. Built per
    classification (31 small objects, once a window): a table in a function's body is code that mutation testing
    mutates, where a module-level one would be left out of it."""
    return (
        Rule("idle", _nothing_ran, lambda f: "no steps or requests, no CPU or GPU use"),
        Rule("throttled",
             lambda f: f.gpu_util is not None and (f.s.throttle_thermal or f.s.throttle_power)
             and f.gpu_util > THROTTLED_BUSY,
             lambda f: f"{'thermal' if f.s.throttle_thermal else 'power'} clock event reasons active on a busy GPU"),
        Rule("memory_pressure", lambda f: _memory_short(f.s), lambda f: _memory_said(f.s)),
        Rule("memory_pressure", lambda f: (f.s.container_mem_ratio or 0) > CONTAINER_MEMORY,
             lambda f: f"the container's working set at {f.s.container_mem_ratio:.0%} of its memory limit: the kernel "
                       "reclaims and will OOM-kill before the host runs out"),
        # a service (requests, no steps), by how its requests' time splits; where a GPU decides, the GPU's rules below
        Rule("waiting",
             lambda f: f.serving and f.s.request_latency_s is None
             and (f.s.request_waiting_fraction or 0.0) > WAITING_SHARE,
             lambda f: f"{_requests_held(f.s)}, the process's threads busy {units.cores(f.s.demand_per_process or 0.0)}"
                       ": its handlers wait outside the process (a downstream call, the network, a lock, a sleep)"),
        Rule(NOT_JUDGED, lambda f: f.serving and f.s.request_latency_s is None and f.gpu_busy is None,
             lambda f: f"{_requests_held(f.s)}: no latency to split"),
        Rule("waiting",
             lambda f: f.serving and f.s.request_latency_s is not None
             and (f.s.request_waiting_fraction or 0.0) > WAITING_SHARE,
             lambda f: f"handlers wait: {_requests_split(f.s)}; {f.s.request_waiting_fraction or 0.0:.0%} of the "
                       "requests' time off CPU, outside the process (a downstream call, the network, a lock, a sleep)"),
        Rule("compute_bound", lambda f: f.serving and f.s.request_latency_s is not None and f.gpu_busy is None,
             lambda f: f"the requests' time is CPU: {_requests_split(f.s)}, the process's threads busy "
                       f"{units.cores(f.s.demand_per_process or 0.0)} "
                       f"({f.s.request_waiting_fraction or 0.0:.0%} of the requests' time outside the process)"),
        # a training loop
        Rule("checkpoint_bound",
             lambda f: f.active and (f.s.checkpoint_fraction or 0.0) >= CHECKPOINT_SHARE
             and (f.s.checkpoint_fraction or 0.0) >= f.wait,
             lambda f: f"{f.s.checkpoint_fraction or 0.0:.0%} of the loop's time in checkpoints (torch.save and the "
                       f"like on the loop's thread), the step's work {f.s.step_fraction or 0.0:.0%}"),
        Rule("input_bound", lambda f: f.active and f.s.starved is not None and f.gpu_not_pacing, _starved_said),
        Rule("input_bound", lambda f: f.active and f.wait > INPUT_WAIT and f.gpu_not_pacing, _data_wait_said),
        Rule("communication_bound", lambda f: f.s.straggler is not None, _straggler_said),
        Rule("communication_bound", lambda f: (f.s.collective_wait_fraction or 0.0) >= COMM_WAIT,
             lambda f: f"{f.s.collective_wait_fraction or 0.0:.0%} of the loop blocked in collectives, evenly across "
                       "ranks (no straggler)"),
        Rule("memory_bandwidth_bound",
             lambda f: f.gpu_util is not None and (f.s.dram_activity or 0) >= DRAM_BUSY
             and (f.s.sm_activity is None or f.s.sm_activity < SM_BUSY),
             lambda f: "DRAM bandwidth high while SMs are not"),
        Rule("waiting", _loop_waits_outside, _loop_waiting_said),
        Rule("python_bound", _python_paces, _python_said),
        # the GPU's busy share decides
        Rule("compute_bound", lambda f: f.gpu_busy is not None and f.gpu_busy >= GPU_BUSY, _gpu_said),
        Rule("host_bound",
             lambda f: f.gpu_busy is not None and f.active and f.gpu_busy < GPU_IDLE and f.wait < FED,
             lambda f: f"the GPU waits for the host ({_gpu_said(f, 'only ')}): Python, kernel launches or small "
                       "operations pace the job"),
        Rule(NOT_JUDGED, lambda f: f.gpu_busy is not None and not f.active,
             lambda f: f"no steps or requests; {f.gpu_source} {f.gpu_busy or 0.0:.0%} of the time"),
        Rule("balanced", lambda f: f.gpu_busy is not None,
             lambda f: f"{_gpu_said(f)}: neither GPU nor host dominates"),
        # CPU-only: where the job's threads want CPU. The main thread runs Python and takes part in torch's parallel
        # regions; the intra-op pool only ever does torch's (or BLAS's) work.
        Rule(NOT_JUDGED, lambda f: not f.active, lambda f: "no steps or requests in this window: no loop to judge"),
        # a hook too old to say where its CPU goes, or not yet: the process as a whole
        Rule("compute_bound",
             lambda f: not f.per_thread and f.wait < FED and f.s.process_cpu_cores >= PROCESS_COMPUTE_CORES,
             lambda f: f"{f.s.process_cpu_cores:.1f} CPU cores busy with the work"),
        Rule(NOT_JUDGED, lambda f: not f.per_thread,
             lambda f: "no per-thread CPU measurements in this window to tell host from compute"),
        # operations counted: their size decides
        Rule(NOT_JUDGED, _pool_spins,
             lambda f: f"{_ops(f.s)}{f.per_op / 1000:.1f} ms of main-thread CPU each, but torch's pool idles "
                       f"({f.pool:.2f} beside {f.main:.2f}): the CPU per operation is not the math's (spinning at the "
                       "pool's barriers, on a crowded machine)"),
        Rule("compute_bound", lambda f: f.ops_decide and f.per_op >= COMPUTE_OP_US,
             lambda f: f"{_ops(f.s)}{f.per_op / 1000:.1f} ms of main-thread CPU each: the operations' math dominates "
                       f"(intra-op pool demand {f.pool:.1f})"),
        Rule("host_bound",
             lambda f: f.ops_decide and f.per_op <= HOST_OP_US and f.main >= MAIN_SATURATED and f.wait < FED,
             lambda f: f"the main thread is saturated ({f.main:.0%} demand) with {_ops(f.s)}{f.per_op:.0f} us of CPU "
                       "each: Python and framework overhead pace the job, the intra-op pool has no real work"),
        Rule("balanced", lambda f: f.ops_decide,
             lambda f: f"{_ops(f.s)}{f.per_op:.0f} us of main-thread CPU each: neither framework overhead nor the math "
                       "dominates"),
        Rule(NOT_JUDGED, lambda f: f.s.ops_counted and f.s.main_cpu_us_per_op is None and f.main >= OPS_MAIN,
             lambda f: "operations are counted but none at both ends of this window"),
        # the pool busy beside a main thread that is itself busy: not a loop at rest whose pool spins after each op
        Rule("compute_bound",
             lambda f: f.main >= 0.5 * MAIN_SATURATED and f.pool >= POOL_BUSY * max(f.main, MAIN_SATURATED),
             lambda f: f"torch's intra-op pool is busy: {f.pool:.1f} threads' worth of demand beside the main thread's "
                       f"{f.main:.1f}"),
        Rule("host_bound", lambda f: f.main >= MAIN_SATURATED and f.pool < POOL_IDLE * f.main and f.wait < FED,
             lambda f: f"the main thread is saturated ({f.main:.0%} demand) while the intra-op pool idles "
                       f"({f.pool:.2f}): Python and dispatch pace the job"
                       + (" (torch uses one intra-op thread: its operations run on the main thread too; "
                          "torch.set_num_threads)" if f.s.intra_op_threads == 1 else "")),
    Rule("balanced", lambda f: True,
         lambda f: f"main thread {f.main:.0%} demand, intra-op pool {f.pool:.2f}: no single bottleneck"),
    )


def _classify(s: Signals) -> Verdict:
    """The verdict of the first rule whose condition holds (the last one always does)."""
    f = facts(s)
    ev = s.evidence()
    rule = next(r for r in verdict_rules() if r.when(f))
    return Verdict(rule.verdict, ev, rule.reason(f))
