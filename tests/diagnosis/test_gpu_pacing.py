"""GPU busy per step from the step-end CUDA events decides host- against compute-bound where CUDA is used.

No GPU here: a simulated CUDA stream stands in for the device at the boundary the hook uses (torch.cuda.Event:
record, query, elapsed_time; never synchronize). The stream executes queued work in order, on its own time; the
host queues work and, like a real launch queue, blocks when it runs too far ahead. The gpu-marked test runs the
same measurement on a real GPU with real kernels.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from outrider.diagnosis.bottleneck import classify
from outrider.diagnosis.signals import signals, snapshot
from outrider.hook import api
from outrider.hook.runtime import Hook
from outrider.hook.settings import HookSettings
from outrider.metrics.family import Family, HistogramValue

torch = pytest.importorskip("torch")


class Stream:
    """A device executing queued work in order; `now` is the host's clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.done_at = 0.0  # when everything queued so far will have run

    def queue(self, work_s: float, max_ahead_s: float) -> None:
        if self.done_at - self.now > max_ahead_s:
            self.now = self.done_at - max_ahead_s  # the launch queue is full: the host blocks
        self.done_at = max(self.done_at, self.now) + work_s


class Event:
    stream: Stream

    def __init__(self, enable_timing: bool = False) -> None:
        self.at = 0.0

    def record(self) -> None:
        self.at = max(self.stream.done_at, self.stream.now)  # runs after what is queued before it

    def query(self) -> bool:
        return self.stream.now >= self.at

    def elapsed_time(self, end: Event) -> float:
        assert self.query() and end.query(), "elapsed_time of an event not yet complete: the hook must not wait"
        return (end.at - self.at) * 1000.0


def run(tmp_path: Path, host_s: float, gpu_s: float, steps: int = 400) -> dict[str, float]:
    """A loop whose steps take host_s to launch gpu_s of work; the publisher polls every 50 steps."""
    from outrider.hook.torch_integration import TorchIntegration

    stream = Stream()
    Event.stream = stream
    cuda = types.SimpleNamespace(is_initialized=lambda: True, is_current_stream_capturing=lambda: False,
                                 Event=Event, device_count=lambda: 0,
                                 synchronize=lambda: pytest.fail("the hook must never synchronise the device"))
    fake = types.SimpleNamespace(cuda=cuda, optim=torch.optim, get_num_threads=lambda: 1)
    hook = Hook(HookSettings(spool_dir=str(tmp_path), standalone=False))
    integ = TorchIntegration(hook, api.HookState(), fake, clock=lambda: stream.now)
    try:
        for k in range(steps):
            stream.now += host_s
            stream.queue(gpu_s, max_ahead_s=3 * gpu_s)
            integ.on_step()
            if k % 50 == 49:
                integ.sample()
        stream.now = stream.done_at + 1.0
        integ.sample()
    finally:
        integ.detach()
    return {name: s.total()[0] for (name, _), s in hook.registry._series.items() if s.kind == "counter"}


def verdict(counters: dict[str, float]) -> str:
    def fams(busy: float, observed: float) -> list[Family]:
        return [Family("outrider_gpu_utilization_ratio").add(0.9, "0", "GPU-0", "H100", "general"),
                Family("outrider_train_gpu_busy_seconds_total").add(busy, "", ""),
                Family("outrider_train_gpu_observed_seconds_total").add(observed, "", ""),
                Family("outrider_train_step_duration_seconds").add(
                    HistogramValue((1.0,), (int(observed * 100), 0), observed), "", "")]

    busy, observed = counters["outrider_train_gpu_busy_seconds_total"], \
        counters["outrider_train_gpu_observed_seconds_total"]
    return classify(signals(snapshot(fams(0, 0)), snapshot(fams(busy, observed)), observed)).cls


def test_a_gpu_that_paces_the_loop_is_busy_every_step(tmp_path: Path) -> None:
    c = run(tmp_path, host_s=0.002, gpu_s=0.010)
    assert c["outrider_train_gpu_busy_seconds_total"] / c["outrider_train_gpu_observed_seconds_total"] > 0.9
    assert verdict(c) == "compute_bound"


def test_a_gpu_the_host_cannot_feed_waits_every_step(tmp_path: Path) -> None:
    """NVML would say 90% (a kernel ran in most of its sample periods); the events say the GPU waited."""
    c = run(tmp_path, host_s=0.010, gpu_s=0.002)
    assert c["outrider_train_gpu_busy_seconds_total"] / c["outrider_train_gpu_observed_seconds_total"] < 0.1
    assert verdict(c) == "host_bound"


@pytest.mark.gpu
def test_real_gpu_busy_share_tells_matmuls_from_tiny_kernels(tmp_path: Path) -> None:
    """On a real GPU: large matrix products keep it busy every step; a Python loop of tiny kernels does not."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    from outrider.hook.torch_integration import TorchIntegration

    def measure(step: Any, steps: int) -> float:
        hook = Hook(HookSettings(spool_dir=str(tmp_path), standalone=False))
        integ = TorchIntegration(hook, api.HookState(), torch)
        try:
            for k in range(steps):
                step()
                integ.on_step()
                if k % 20 == 19:
                    integ.sample()
            torch.cuda.synchronize()  # the test may wait; the hook never does
            integ.sample()
        finally:
            integ.detach()
        c = {name: s.total()[0] for (name, _), s in hook.registry._series.items() if s.kind == "counter"}
        return float(c["outrider_train_gpu_busy_seconds_total"] / c["outrider_train_gpu_observed_seconds_total"])

    a = torch.randn(8192, 8192, device="cuda")
    tiny = torch.ones(4, device="cuda")

    def matmuls() -> None:
        for _ in range(4):
            a.copy_(torch.tanh(a @ a) * 0.01)

    def tiny_kernels() -> None:
        x = tiny
        for _ in range(200):
            x = x * 1.0001 + 0.0001

    assert measure(matmuls, 60) > 0.8
    assert measure(tiny_kernels, 200) < 0.3
