"""Bottleneck verdicts: the class, the evidence (the numbers behind it) and what to do about it.

Classes, checked in this order: idle, throttled, memory_pressure, checkpoint_bound (recognised checkpoints on the
loop's thread a large part of its time, at least as large as its data wait), input_bound, communication_bound (a
straggler rank, or collectives blocking the loop on every rank), memory_bandwidth_bound, python_bound, then
compute_bound / host_bound / balanced:

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

A job slowed by its neighbours keeps its class; the reason says how long its threads waited for a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from outrider.diagnosis.signals import Signals

CLASSES = ("idle", "throttled", "memory_pressure", "checkpoint_bound", "input_bound", "memory_bandwidth_bound",
           "compute_bound", "host_bound", "python_bound", "communication_bound", "balanced")
NOT_JUDGED = "not_judged"  # a window without the evidence its rule needs: not a class
NOT_JUDGED_ADVICE = "Not judged: this window lacks the measurements its rule needs (see why)."

RECOMMENDATIONS = {
    "idle": "Nothing is running, or the loop is at rest: no steps or requests, or steps that sleep or wait on "
            "something else most of the time while the job's CPU and GPUs rest.",
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
    "balanced": "No single bottleneck stands out in this window.",
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
        return RECOMMENDATIONS.get(self.cls, NOT_JUDGED_ADVICE)

    @property
    def judged(self) -> bool:
        return self.cls != NOT_JUDGED


# Thresholds. All are shares of the job's own time or demand: none depends on the machine's core count or load.
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
# An active loop whose main thread and intra-op pool are each busy (demand) under IDLE_MAIN of the time is at rest
# (a loop that sleeps between steps), not bound by anything: idle; so is one whose loop thread's samples are
# RESTING_SHARE or more waiting (off CPU) beside a main thread under IDLE_MAIN
IDLE_MAIN = 0.2
RESTING_SHARE = 0.5
# DataLoader workers busy (demand per worker thread) under this share of the time while the loop waits for them
# wait for something else than a CPU: storage, the network, a lock
WORKERS_WAITING = 0.3


def nothing_ran(s: Signals) -> bool:
    """No steps or requests, and neither the job's CPU nor its GPUs in use: the first idle rule, and what a run's
    record does not count as active time, whatever its window's verdict (runs/recorder.py)."""
    has_gpu = s.gpus > 0 and s.gpu_util is not None and not s.torch_cpu_only
    active = s.steps_per_s > 0 or s.requests_per_s > 0
    return not active and s.process_cpu_cores < IDLE_CORES and (not has_gpu or (s.gpu_util or 0.0) < IDLE_GPU)


def classify(s: Signals) -> Verdict:
    v = _classify(s)
    reason = v.reason
    if s.run_delay_fraction is not None and s.run_delay_fraction >= CONTENDED and v.cls not in ("idle", NOT_JUDGED):
        reason += (f"; slowed by CPU contention: its threads waited for a CPU {s.run_delay_fraction:.0%} of the "
                   "time they were runnable (neighbours on the machine, or more threads than cores)")
    return Verdict(v.cls, v.evidence, reason, tuple(s.top_frames))


def _classify(s: Signals) -> Verdict:
    ev = s.evidence()
    # a torch job that never initialised CUDA runs on the CPU, whatever GPUs the node has
    has_gpu = s.gpus > 0 and s.gpu_util is not None and not s.torch_cpu_only
    gpu_util = s.gpu_util or 0.0
    gpu_busy = s.gpu_busy_ratio if s.gpu_busy_ratio is not None else (gpu_util if has_gpu else None)
    gpu_source = "CUDA events: the GPU paced" if s.gpu_busy_ratio is not None else "NVML: the GPU was busy"
    wait = s.data_wait_fraction or 0.0
    # on a crowded machine the step is stretched by the time the loop's thread waits for a CPU, the wait for data
    # is not: the loop's own share decides (it is the measured share on a machine to itself)
    if s.data_wait_alone_fraction is not None:
        wait = max(wait, s.data_wait_alone_fraction)
    active = s.steps_per_s > 0 or s.requests_per_s > 0
    if nothing_ran(s):
        return Verdict("idle", ev, "no steps or requests, no CPU or GPU use")
    if has_gpu and (s.throttle_thermal or s.throttle_power) and gpu_util > THROTTLED_BUSY:
        why = "thermal" if s.throttle_thermal else "power"
        return Verdict("throttled", ev, f"{why} clock event reasons active on a busy GPU")
    # no memory available at all is the most pressure there is, not a missing measurement: tested for None
    host_short = s.host_mem_available_ratio is not None and s.host_mem_available_ratio < HOST_MEMORY
    if (s.gpu_mem_ratio or 0) > GPU_MEMORY or s.alloc_retries > 0 or host_short:
        return Verdict("memory_pressure", ev, "GPU memory above 95%, allocator retries, or host memory below 5%")
    if (s.container_mem_ratio or 0) > CONTAINER_MEMORY:
        return Verdict("memory_pressure", ev, f"the container's working set at {s.container_mem_ratio:.0%} of its "
                                              "memory limit: the kernel reclaims and will OOM-kill before the host "
                                              "runs out")
    saving = s.checkpoint_fraction or 0.0
    if active and saving >= CHECKPOINT_SHARE and saving >= wait:
        return Verdict("checkpoint_bound", ev, f"{saving:.0%} of the loop's time in checkpoints (torch.save and "
                                               f"the like on the loop's thread), the step's work "
                                               f"{s.step_fraction or 0.0:.0%}")
    if active and s.starved is not None and (gpu_busy is None or gpu_busy < GPU_BUSY):
        r = s.starved
        return Verdict("input_bound", ev, f"rank {r.rank or '-'} is starved by its DataLoader: "
                                          f"{r.data_wait_fraction:.0%} of its loop waiting for data, while the "
                                          f"other ranks spend "
                                          f"{s.others_wait_fraction or 0:.0%} of theirs waiting for it in "
                                          f"collectives{_workers(s)}")
    if active and wait > INPUT_WAIT and (gpu_busy is None or gpu_busy < GPU_BUSY):
        workers = _workers(s)
        measured = s.data_wait_fraction or 0.0
        alone = f" ({wait:.0%} of its own time, less the time its thread waited for a CPU)" \
            if wait > measured + 0.05 else ""
        return Verdict("input_bound", ev, f"{measured:.0%} of the loop waiting for data{alone}, accelerator "
                                          f"underused{workers}")
    if s.straggler is not None:
        r = s.straggler
        return Verdict("communication_bound", ev,
                       f"rank {r.rank or '-'} is a straggler: its compute per step is "
                       f"{s.straggler_compute_ratio or 0:.1f}x the other ranks', which spend "
                       f"{s.others_wait_fraction or 0:.0%} of their loop waiting for it in collectives")
    comm = s.collective_wait_fraction or 0.0
    if comm >= COMM_WAIT:
        return Verdict("communication_bound", ev, f"{comm:.0%} of the loop blocked in collectives, evenly across "
                                                  "ranks (no straggler)")
    if has_gpu and (s.dram_activity or 0) >= DRAM_BUSY and (s.sm_activity is None or s.sm_activity < SM_BUSY):
        return Verdict("memory_bandwidth_bound", ev, "DRAM bandwidth high while SMs are not")
    # a loop at rest (sleeping between steps, waiting on something else), neither waiting for data nor in
    # collectives: nothing limits it. Its own threads' demand, not the process's CPU (the hook's threads are in it)
    # (the pool works only inside the main thread's parallel regions: a pool looking busier than that spins after
    # them, all the more on a crowded machine, so the loop thread's samples mostly waiting decide as well)
    resting = (s.intra_op_busy or 0.0) < IDLE_MAIN or (s.share("waiting") or 0.0) >= RESTING_SHARE
    if active and s.main_thread_busy is not None and s.main_thread_busy < IDLE_MAIN and resting \
            and (not has_gpu or gpu_util < IDLE_GPU):
        top = s.top_frame("waiting")
        at = f", mostly at {top[0]}" if top else ""
        return Verdict("idle", ev, f"the loop steps but is at rest: its thread busy {s.main_thread_busy:.0%} of "
                                   f"the time, torch's pool {s.intra_op_busy or 0.0:.2f}{at}")
    python = s.share("python")
    if active and python is not None and python >= PYTHON_SHARE and (gpu_busy is None or gpu_busy < GPU_BUSY):
        top = s.top_frame("python")
        at = f"; the hottest line: {top[0]} ({top[1]:.0%} of the samples)" if top else ""
        return Verdict("python_bound", ev, f"{python:.0%} of the loop thread's samples in the user's Python "
                                           f"code{at}")
    if gpu_busy is not None:
        if gpu_busy >= GPU_BUSY:
            return Verdict("compute_bound", ev, f"{gpu_source} {gpu_busy:.0%} of the steps")
        if active and gpu_busy < GPU_IDLE and wait < FED:
            return Verdict("host_bound", ev, f"the GPU waits for the host ({gpu_source} only {gpu_busy:.0%} of the "
                                             "steps): Python, kernel launches or small operations pace the job")
        if not active:
            return Verdict(NOT_JUDGED, ev, f"no steps or requests; {gpu_source} {gpu_busy:.0%} of the time")
        return Verdict("balanced", ev, f"{gpu_source} {gpu_busy:.0%} of the steps: neither GPU nor host dominates")
    return _cpu(s, ev, active, wait)


def _workers(s: Signals) -> str:
    """What the DataLoader workers do while the loop waits for them: decode (on a CPU) or wait (storage)."""
    if s.data_worker_busy is None:
        return f", DataLoader workers {s.data_workers_cpu_cores:.1f} CPU cores" if s.data_workers_cpu_cores else ""
    read = s.storage_read_bytes_per_s
    rate = f" at {read / 1e6:.1f} MB/s" if read else ""
    psi = f", I/O pressure on the host {s.io_pressure_fraction:.0%}" if s.io_pressure_fraction else ""
    if s.data_worker_busy < WORKERS_WAITING:
        return (f"; the DataLoader workers wait rather than decode (each busy {s.data_worker_busy:.0%} of the time): "
                f"they wait for storage{rate}{psi} (or the network, a lock): faster or local storage, a cache, "
                "more workers to overlap reads, not cheaper decoding")
    return (f"; the DataLoader workers decode: each busy {s.data_worker_busy:.0%} of the time "
            f"({s.data_workers_cpu_cores or 0.0:.1f} CPU cores; reading{rate or ' nothing'} from storage): more "
            "workers where cores are free, cheaper decoding, preprocessing offline")


def _cpu(s: Signals, ev: dict[str, float], active: bool, wait: float) -> Verdict:
    """CPU-only: where the job's threads want CPU. The main thread runs Python and takes part in torch's parallel
    regions; the intra-op pool only ever does torch's (or BLAS's) work."""
    main, pool = s.main_thread_busy, s.intra_op_busy
    if not active:
        return Verdict(NOT_JUDGED, ev, "no steps or requests in this window: no loop to judge")
    if main is None or pool is None:  # a hook too old to say where its CPU goes, or not yet: the process as a whole
        if wait < FED and s.process_cpu_cores >= PROCESS_COMPUTE_CORES:
            return Verdict("compute_bound", ev, f"{s.process_cpu_cores:.1f} CPU cores busy with the work")
        return Verdict(NOT_JUDGED, ev, "no per-thread CPU measurements in this window to tell host from compute")
    per_op = s.main_cpu_us_per_op
    if per_op is not None and main >= OPS_MAIN:  # operations counted: their size decides
        ops = f"{s.ops_per_step:.0f} operations per step, " if s.ops_per_step else ""
        # Large operations split their math across torch's pool: with a pool, it works as the main thread does.
        # A pool idle beside a main thread spending milliseconds of CPU per operation is the main thread spinning at
        # the pool's barriers on a crowded machine (libgomp), not math: the evidence disagrees, not judged
        pooled = s.intra_op_threads is not None and s.intra_op_threads > 1
        if per_op >= COMPUTE_OP_US and pooled and pool < POOL_IDLE * main:
            return Verdict(NOT_JUDGED, ev, f"{ops}{per_op / 1000:.1f} ms of main-thread CPU each, but torch's pool "
                                           f"idles ({pool:.2f} beside {main:.2f}): the CPU per operation is not "
                                           "the math's (spinning at the pool's barriers, on a crowded machine)")
        if per_op >= COMPUTE_OP_US:
            return Verdict("compute_bound", ev, f"{ops}{per_op / 1000:.1f} ms of main-thread CPU each: the "
                                                f"operations' math dominates (intra-op pool demand {pool:.1f})")
        if per_op <= HOST_OP_US and main >= MAIN_SATURATED and wait < FED:
            return Verdict("host_bound", ev, f"the main thread is saturated ({main:.0%} demand) with {ops}"
                                             f"{per_op:.0f} us of CPU each: Python and framework overhead pace the "
                                             "job, the intra-op pool has no real work")
        return Verdict("balanced", ev, f"{ops}{per_op:.0f} us of main-thread CPU each: neither framework overhead "
                                       "nor the math dominates")
    if s.ops_counted and per_op is None and main >= OPS_MAIN:
        return Verdict(NOT_JUDGED, ev, "operations are counted but none at both ends of this window")
    # the pool busy beside a main thread that is itself busy: not a loop at rest whose pool spins after each op
    if main >= 0.5 * MAIN_SATURATED and pool >= POOL_BUSY * max(main, MAIN_SATURATED):
        return Verdict("compute_bound", ev, f"torch's intra-op pool is busy: {pool:.1f} threads' worth of demand "
                                            f"beside the main thread's {main:.1f}")
    if main >= MAIN_SATURATED and pool < POOL_IDLE * main and wait < FED:
        one = " (torch uses one intra-op thread: its operations run on the main thread too; " \
              "torch.set_num_threads)" if s.intra_op_threads == 1 else ""
        return Verdict("host_bound", ev, f"the main thread is saturated ({main:.0%} demand) while the intra-op pool "
                                         f"idles ({pool:.2f}): Python and dispatch pace the job{one}")
    return Verdict("balanced", ev, f"main thread {main:.0%} demand, intra-op pool {pool:.2f}: no single bottleneck")
