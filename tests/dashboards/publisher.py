"""A hooked process that publishes every hook metric the dashboards query, until a file appears.

The CUDA allocator, GPU step and GPU pacing series are published through the hook's own series API: they stand in for a
GPU, which this machine lacks (the gpu-marked tests cover the real CUDA path). So do the torch series (collectives of a
multi-rank job, autograd operations, the intra-op thread setting), which tests/diagnosis produces with real torch; this
process stays light so that the dashboards test starts quickly.
"""

from __future__ import annotations

import pathlib
import random
import sys
import time

import outrider
from outrider.hook import api

hold = pathlib.Path(sys.argv[1])
outrider.instrument()
hook = api.S.hook
rng = random.Random(1)
for kind in ("allocated", "reserved", "active", "inactive_split"):
    hook.series("gauge", "outrider_torch_cuda_memory_bytes", {"device": "0", "kind": kind}, builtin=True).set(2 << 30)
hook.series("gauge", "outrider_torch_cuda_memory_peak_bytes", {"device": "0"}, builtin=True).set(3 << 30)
retries = hook.series("counter", "outrider_torch_cuda_alloc_retries_total", {"device": "0"}, builtin=True)
ooms = hook.series("counter", "outrider_torch_cuda_ooms_total", {"device": "0"}, builtin=True)
hook.series("gauge", "outrider_torch_cuda_oom_step", {"device": "0"}, builtin=True).set(1234)
gpu_step = hook.series("histogram", "outrider_train_gpu_step_duration_seconds", builtin=True)
gpu_busy = hook.series("counter", "outrider_train_gpu_busy_seconds_total", builtin=True)
gpu_observed = hook.series("counter", "outrider_train_gpu_observed_seconds_total", builtin=True)
all_reduce = hook.series("counter", "outrider_train_collective_seconds_total", {"op": "all_reduce"}, builtin=True)
collective_wait = hook.series("counter", "outrider_train_collective_wait_seconds_total", builtin=True)
autograd_ops = hook.series("counter", "outrider_train_autograd_ops_total", builtin=True)
checkpoint = hook.series("histogram", "outrider_train_checkpoint_duration_seconds", builtin=True)  # torch.save's
hook.series("gauge", "outrider_torch_intra_op_threads", builtin=True).set(2)
in_flight = outrider.in_flight("all")
in_flight.add(1)
batches = iter(range(10**9))
for i, _ in enumerate(outrider.dataloader(batches)):
    with outrider.step(samples=32, tokens=4096, flops=2e12):
        time.sleep(0.02)
    gpu_step.observe(0.015)
    gpu_busy.inc(0.012)
    gpu_observed.inc(0.02)
    all_reduce.inc(0.004)
    collective_wait.inc(0.001)
    autograd_ops.inc(300)
    retries.inc(0)
    ooms.inc(0)
    route = "/v1/chat" if i % 2 else "/v1/embed"
    outrider.record_request(rng.uniform(0.01, 0.3), route=route, status=500 if i % 20 == 0 else 200, method="POST",
                            scheme="http")
    outrider.record_latency(rng.uniform(0.001, 0.01), "tokenize")
    if i % 25 == 0:
        with outrider.phase("checkpoint"):
            time.sleep(0.01)
        checkpoint.observe(0.01)
    outrider.record_phase("queue", rng.uniform(0.001, 0.01))
    outrider.record_phase("compute", rng.uniform(0.01, 0.2))
    outrider.record_batch_size(rng.randint(1, 16))
    outrider.record_time_to_first_token(rng.uniform(0.05, 0.2), route="/v1/chat")
    outrider.record_inter_token_latency(rng.uniform(0.01, 0.03), route="/v1/chat")
    if hold.exists():
        break
outrider.shutdown()
