"""Bottleneck verdicts: the class, the evidence (the numbers behind it) and what to do about it.

Classes, checked in this order: idle, throttled, memory_pressure, input_bound, memory_bandwidth_bound,
compute_bound, host_bound, balanced. communication_bound needs collective timing, which Outrider does not measure
yet: it is never reported rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from outrider.diagnosis.signals import Signals

CLASSES = ("idle", "throttled", "memory_pressure", "input_bound", "memory_bandwidth_bound", "compute_bound",
           "host_bound", "communication_bound", "balanced")

RECOMMENDATIONS = {
    "idle": "Nothing is running: no steps, no requests, GPUs and CPU at rest.",
    "throttled": "The GPU runs below its clocks for heat or power: check cooling and airflow, the power limit and "
                 "the node's power supply; move the job if one GPU or node is the outlier.",
    "memory_pressure": "Memory is nearly exhausted (GPU near capacity, allocator retries, or little host memory): "
                       "smaller batches with gradient accumulation, activation checkpointing, mixed precision, "
                       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation.",
    "input_bound": "The loop waits for data: more DataLoader workers, pin_memory=True, prefetch_factor, "
                   "persistent_workers=True, preprocessing offline or on the GPU, faster storage.",
    "memory_bandwidth_bound": "DRAM bandwidth, not compute, limits the kernels: fuse operations (torch.compile), "
                              "use lower precision (bf16/fp8) to move fewer bytes, larger batches for reuse.",
    "compute_bound": "The processor is busy doing the work: this is where a well-fed job should be. Faster still: "
                     "mixed precision and tensor cores, torch.compile, fewer FLOPs (smaller model, sparsity).",
    "host_bound": "The CPU side (Python, kernel launches, tiny operations) limits the job while the accelerator "
                  "waits: larger batches, CUDA graphs, torch.compile to fuse small ops, fewer host syncs.",
    "communication_bound": "Collectives dominate the step: overlap communication with compute, bucket gradients, "
                           "check the interconnect.",
    "balanced": "No single bottleneck stands out in this window.",
}


@dataclass(frozen=True)
class Verdict:
    cls: str
    evidence: dict[str, float]
    reason: str

    @property
    def recommendation(self) -> str:
        return RECOMMENDATIONS[self.cls]


def classify(s: Signals) -> Verdict:
    ev = s.evidence()
    has_gpu = s.gpus > 0 and s.gpu_util is not None
    gpu_util = s.gpu_util or 0.0
    wait = s.data_wait_fraction or 0.0
    active = s.steps_per_s > 0 or s.requests_per_s > 0
    if not active and s.process_cpu_cores < 0.05 and (not has_gpu or gpu_util < 0.05):
        return Verdict("idle", ev, "no steps or requests, no CPU or GPU use")
    if has_gpu and (s.throttle_thermal or s.throttle_power) and gpu_util > 0.3:
        why = "thermal" if s.throttle_thermal else "power"
        return Verdict("throttled", ev, f"{why} clock event reasons active on a busy GPU")
    if (s.gpu_mem_ratio or 0) > 0.95 or s.alloc_retries > 0 or (s.host_mem_available_ratio or 1) < 0.05:
        return Verdict("memory_pressure", ev, "GPU memory above 95%, allocator retries, or host memory below 5%")
    if wait > 0.3 and (not has_gpu or gpu_util < 0.6):
        return Verdict("input_bound", ev, f"{wait:.0%} of the loop waiting for data, accelerator underused")
    if has_gpu and (s.dram_activity or 0) >= 0.7 and (s.sm_activity is None or s.sm_activity < 0.5):
        return Verdict("memory_bandwidth_bound", ev, "DRAM bandwidth high while SMs are not")
    if has_gpu and gpu_util >= 0.8:
        return Verdict("compute_bound", ev, f"GPU busy {gpu_util:.0%} of the time")
    if not has_gpu and s.process_cpu_cores >= 0.8 * s.cpus:
        return Verdict("compute_bound", ev, f"{s.process_cpu_cores:.1f} of {s.cpus:.0f} CPU cores busy with the work")
    if active and wait < 0.1 and s.process_cpu_cores >= 0.7 and (not has_gpu or gpu_util < 0.6):
        return Verdict("host_bound", ev, f"one host thread's worth of CPU ({s.process_cpu_cores:.1f} cores) paces "
                                         "the job while the accelerator or the other cores wait")
    return Verdict("balanced", ev, "no rule matched")
