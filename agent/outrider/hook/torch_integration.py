"""PyTorch integration, attached by instrument() only when the user has already imported torch.

- Steps: a global optimizer step post hook counts steps (the first optimizer that steps, so a GAN's two
  optimizers count one step), unless the user times steps explicitly.
- CUDA allocator statistics (allocated, reserved, active, inactive split, peak, alloc retries, OOMs and the step
  of the last OOM) are sampled by the publisher thread, off the hot path, and only once CUDA is initialised
  (Outrider never initialises CUDA itself).
- GPU time per step: a CUDA event recorded at each step end (never while a CUDA graph is being captured); the
  publisher polls completed events with query() and observes the time between consecutive ones. Nothing ever
  synchronises the device.
"""

from __future__ import annotations

import collections
import logging
import sys
import weakref
from collections.abc import Callable
from typing import Any

LOG = logging.getLogger("outrider.hook")
MAX_PENDING_EVENTS = 1024
MEMORY_KINDS = {
    "allocated": "allocated_bytes.all.current",
    "reserved": "reserved_bytes.all.current",
    "active": "active_bytes.all.current",
    "inactive_split": "inactive_split_bytes.all.current",
}


class TorchIntegration:
    def __init__(self, hook: Any, state: Any, torch: Any, step_done: Callable[[], None]) -> None:
        """state: the hook API's module state (whether the user times steps, the step listeners); step_done: the
        hook's step path, called once per counted optimizer step."""
        self.hook = hook
        self.state = state
        self.torch = torch
        self.first_optimizer: weakref.ref[Any] | None = None
        self.pending: collections.deque[Any] = collections.deque(maxlen=MAX_PENDING_EVENTS)
        self.last_done: Any = None
        self.last_ooms: dict[int, float] = {}
        # torch.optim loads this module but does not keep it as an attribute: take it from sys.modules (never
        # imported here; torch is the user's)
        optimizer_module = sys.modules.get("torch.optim.optimizer") or torch.optim.optimizer
        self.handle = optimizer_module.register_optimizer_step_post_hook(self.on_optimizer_step)
        self._step_done = step_done
        self.listening = False  # on_step joins the step path only once CUDA is initialised (never on CPU)
        hook.samplers.append(self.sample)

    # hot-ish path: once per optimizer step
    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if self.state.explicit:
                return
            first = self.first_optimizer() if self.first_optimizer is not None else None
            if first is None:  # the first optimizer to step, or it was freed and another took over
                self.first_optimizer = weakref.ref(optimizer)
            elif first is not optimizer:
                return
            self._step_done()
        except Exception:
            self.hook.drop("torch_hook_error")

    def on_step(self) -> None:
        cuda = self.torch.cuda
        try:
            if cuda.is_current_stream_capturing():
                return
            event = cuda.Event(enable_timing=True)
            event.record()
            self.pending.append(event)
        except Exception:
            self.hook.drop("cuda_event_error")

    # publisher thread
    def sample(self) -> None:
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return
        if not self.listening:
            self.listening = True
            self.state.step_listeners.append(self.on_step)
        self._poll_events()
        for device in range(cuda.device_count()):
            stats = cuda.memory_stats(device)
            if not stats:
                continue
            self._sample_device(str(device), stats)

    def _poll_events(self) -> None:
        gpu_step = self.hook.series("histogram", "outrider_train_gpu_step_duration_seconds", builtin=True)
        while self.pending and self.pending[0].query():
            event = self.pending.popleft()
            if self.last_done is not None:
                gpu_step.observe(self.last_done.elapsed_time(event) / 1000.0)
            self.last_done = event

    def _sample_device(self, device: str, stats: dict[str, Any]) -> None:
        series = self.hook.series
        for kind, key in MEMORY_KINDS.items():
            if key in stats:
                series("gauge", "outrider_torch_cuda_memory_bytes", {"device": device, "kind": kind},
                       builtin=True).set(stats[key])
        if "allocated_bytes.all.peak" in stats:
            series("gauge", "outrider_torch_cuda_memory_peak_bytes", {"device": device},
                   builtin=True).set(stats["allocated_bytes.all.peak"])
        retries = stats.get("num_alloc_retries", 0)
        series("counter", "outrider_torch_cuda_alloc_retries_total", {"device": device},
               builtin=True).set_total(retries)
        ooms = stats.get("num_ooms", 0)
        series("counter", "outrider_torch_cuda_ooms_total", {"device": device}, builtin=True).set_total(ooms)
        if ooms > self.last_ooms.get(int(device), 0):
            series("gauge", "outrider_torch_cuda_oom_step", {"device": device},
                   builtin=True).set(self.hook.progress.steps)
        self.last_ooms[int(device)] = ooms


def attach(hook: Any, state: Any, step_done: Callable[[], None]) -> TorchIntegration | None:
    """Attach to the torch the user already imported (never imported here: the hook imports no third-party
    package)."""
    try:
        return TorchIntegration(hook, state, sys.modules["torch"], step_done)
    except Exception as e:
        LOG.warning("outrider: PyTorch integration unavailable: %s", e)
        return None
