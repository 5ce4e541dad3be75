"""The same collector against a real NVIDIA driver. Marked `gpu`: skipped where no GPU is present; run on a GPU
machine with `bash scripts/gpu-check.sh`."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.gpu import GpuCollector
from outrider.ground.config import Config
from outrider.metrics.exposition import render
from outrider.wiring.sampler import SweepStats
from tests.gpu.conftest import nvml_call_bound
from tests.helpers import samples

pytestmark = pytest.mark.gpu


@pytest.fixture
def real() -> GpuCollector:
    if not os.path.exists("/dev/nvidiactl"):
        pytest.skip("no NVIDIA GPU here (/dev/nvidiactl absent)")
    import pynvml

    pynvml.nvmlLib = None  # other tests in this process may have loaded the fake: load the driver's by soname
    pynvml._nvmlGetFunctionPointer_cache.clear()
    c = GpuCollector(CollectorContext(Config(), SweepStats()))
    if not c.nvml.init():
        pytest.skip(f"no NVIDIA GPU here: {c.nvml.unavailable_reason}")
    yield c
    c.close()


def by(parsed: dict, name: str) -> dict:  # type: ignore[type-arg]
    return {dict(labels).get("gpu"): v for (n, labels), v in parsed.items() if n == name}


def test_real_driver_readings_are_sane(real: GpuCollector) -> None:
    real.collect()
    time.sleep(0.5)
    parsed = samples(render(real.collect()).decode())
    count = int(parsed[("outrider_gpu_count", ())])
    assert count >= 1
    total, used = by(parsed, "outrider_gpu_memory_total_bytes"), by(parsed, "outrider_gpu_memory_used_bytes")
    assert len(total) == count and all(t > 1 << 30 for t in total.values())
    assert all(0 <= used[g] <= total[g] for g in total)
    util = {dict(k[1])["gpu"]: v for k, v in parsed.items()
            if k[0] == "outrider_gpu_utilization_ratio" and dict(k[1])["task"] == "general"}
    assert all(0 <= u <= 1 for u in util.values())
    assert all(0 < t < 120 for t in by(parsed, "outrider_gpu_temperature_celsius").values())
    assert all(v == 1 for v in by(parsed, "outrider_gpu_up").values())
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
        uuids = {line.split(",")[1].strip() for line in out.strip().splitlines()}
        seen = {dict(labels)["uuid"] for (n, labels) in parsed if n == "outrider_gpu_up"}
        assert seen == uuids, "the same GPUs nvidia-smi lists"


def test_real_sweep_cost(real: GpuCollector) -> None:
    """The cost of a sweep in NVML calls, which a noisy machine does not change: after the first sweep (which finds
    what the driver offers) every sweep asks the same calls, never more than each reading of each GPU once
    (nvml_call_bound, which the fake driver meets exactly), and none of them fails."""
    import pynvml

    real.collect()
    first_calls = real.nvml.calls
    count = real.nvml.device_count()
    handles = [real.nvml.handle(i) for i in range(count)]
    nvlinks = sum(len(real.nvml.nvlink_links(i, h)) for i, h in enumerate(handles))
    mig_gpus = mig_slots = 0
    for h in handles:
        try:
            if pynvml.nvmlDeviceGetMigMode(h)[0]:
                mig_gpus += 1
                mig_slots += pynvml.nvmlDeviceGetMaxMigDeviceCount(h)
        except pynvml.NVMLError:
            pass  # no MIG on this GPU
    bound = nvml_call_bound(count, nvlinks, mig_slots, mig_gpus)
    errors, per_sweep, t0 = real.nvml.errors, [], time.process_time()
    for _ in range(20):
        before = real.nvml.calls
        real.collect()
        per_sweep.append(real.nvml.calls - before)
    print(f"real driver: {count} GPUs, {nvlinks} NVLinks, {(time.process_time() - t0) / 20 * 1000:.2f} ms CPU per "
          f"sweep (not asserted), {per_sweep[0]} NVML calls per sweep (bound {bound}; first sweep {first_calls})")
    assert len(set(per_sweep)) == 1, f"the calls per sweep changed: {per_sweep}"
    assert per_sweep[0] <= bound, f"{per_sweep[0]} NVML calls a sweep, more than each reading once ({bound})"
    assert per_sweep[0] <= first_calls, "the first sweep probes; later ones ask no more"
    assert real.nvml.errors == errors, "no NVML call failed in 20 sweeps"


def test_cuda_events_and_allocator_on_a_real_gpu(tmp_path) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    from outrider.hook import api
    from outrider.hook.runtime import Hook
    from outrider.hook.torch_integration import TorchIntegration

    hook = Hook(spool_dir=str(tmp_path), standalone=False)
    state = api.HookState()
    state.hook = hook
    integ = TorchIntegration(hook, state, torch)
    try:
        x = torch.randn(4096, 4096, device="cuda")
        integ.sample()  # CUDA is initialised now: the step listener joins
        for _ in range(20):
            y = x @ x
            integ.on_step()
        torch.cuda.synchronize()  # the test waits for the GPU; the hook never does
        integ.sample()
        gpu_step = hook.series("histogram", "outrider_train_gpu_step_duration_seconds", builtin=True)
        total = gpu_step.total()
        assert sum(total[:-1]) == 19 and total[-1] > 0, "19 intervals between 20 events"
        reserved = hook.series("gauge", "outrider_torch_cuda_memory_bytes", {"device": "0", "kind": "reserved"},
                               builtin=True).total()[0]
        assert reserved >= 3 * 4096 * 4096 * 4
        del y
    finally:
        integ.detach()
