"""PyTorch integration, attached by instrument() when the user has already imported torch, else right after the
user's `import torch` has run (hook/api.py: a one-shot import hook; torch is never imported by Outrider).

- Steps: a global optimizer step post hook counts steps (the first optimizer that steps, so a GAN's two
  optimizers count one step), unless the user times steps explicitly: the first explicit step removes it.
- CUDA allocator statistics (allocated, reserved, active, inactive split, peak, alloc retries, OOMs and the step
  of the last OOM) are sampled by the publisher thread, off the hot path, and only once CUDA is initialised
  (Outrider never initialises CUDA itself).
- GPU time per step: a CUDA event recorded at each step end (never while a CUDA graph is being captured); the
  publisher polls completed events with query() and observes the time between consecutive ones, and how much of
  each step the GPU was busy working off the host's queue (hook/gpu_pacing.py). Nothing ever synchronises the
  device.
- Data wait: every DataLoader iterator's __next__ is timed (hook/torch_data.py).
- Collectives: torch.distributed's collectives and DDP's gradient buckets are timed (hook/torch_distributed.py).
- Training, recognised: building an optimizer, a DistributedDataParallel or FSDP wrapper (strong evidence), or
  initialising a process group (weak: inference servers do too) makes the process a training process
  (hook/progress.py), so a hang before its first step is a stall after first_step_timeout_s with zero
  configuration. Each is seen at its call (a wrapped `__init__` or `init_process_group`: once per object, never
  on the hot path), and a process group initialised before instrument() by the publisher's look at
  `dist.is_initialized()`.
- Checkpoints: torch.save and the like on the loop's thread are timed as checkpoints (hook/torch_checkpoint.py).
- The intra-op pool's size (torch.get_num_threads()), for the per-thread CPU attribution (hook/threads.py).
- Operations per step: the training thread's autograd sequence number (one per differentiable operation run
  with grad enabled), read at the first step end after each flush (a C call right after a step costs about
  0.5 us: not on every step). Main-thread CPU per operation tells many small operations (framework overhead:
  host-bound) from few large ones (the math: compute-bound) where the intra-op pool's CPU cannot: libgomp's
  workers spin after every parallel region (GOMP_SPINCOUNT), so a pool that one small parallel operation per step
  keeps spinning looks as busy as one doing matrix products.

Each part that cannot attach to this torch (a future version) says so once; the others work on.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from outrider.hook import torch_checkpoint, torch_data, torch_distributed
from outrider.hook.gpu_pacing import GpuPacing
from outrider.hook.state import HookState
from outrider.hook.torch_flops import FlopCounter

if TYPE_CHECKING:
    from outrider.hook.runtime import Hook

LOG = logging.getLogger("outrider.hook")
MAX_PENDING_EVENTS = 1024
StepHook = Callable[[HookState, list[Any], Callable[[Any], bool]], Callable[[Any, Any, Any], None]]
# The integration attached to torch in this process. A new one (a hook built again: tests, a re-instrumented
# process) first detaches it: two would count every optimizer step twice and time every batch into a dead state.
ACTIVE: list[TorchIntegration] = []
MEMORY_KINDS = {
    "allocated": "allocated_bytes.all.current",
    "reserved": "reserved_bytes.all.current",
    "active": "active_bytes.all.current",
    "inactive_split": "inactive_split_bytes.all.current",
}


def _not_counted(optimizer: Any, args: Any, kwargs: Any) -> None:
    """The optimizer hook of an integration that counts no steps (tests of its other parts)."""


class TorchIntegration:
    def __init__(self, hook: Hook, state: HookState, torch: Any, step_hook: StepHook | None = None,
                 timing: bool = False, clock: Callable[[], float] = perf_counter) -> None:
        """state: the hook API's module state, whose parts this hands on (hook/state.py): the steps (whether the
        user times them, the step listeners, the operation counter) kept here, the data waits to the DataLoader
        timer, the loop accounting to the collective timer and the checkpoint watch; step_hook: builds the
        optimizer step post hook that records a step of the optimizer claim() chose (hook/api.py; None: steps are
        not counted); timing: whether DataLoaders, collectives and checkpoints are timed, and operations counted
        (False: tests of the other parts); clock: the host clock step-end markers are read on."""
        for previous in list(ACTIVE):
            previous.detach()
        self.hook = hook
        self.steps = state.steps
        self.torch = torch
        self.clock = clock
        self.first: list[weakref.ref[Any] | None] = [None]  # the optimizer whose steps count (the first to step)
        # Step-end markers not yet complete, and the host time each was recorded at (appended together: the two
        # drop their oldest together when full)
        self.pending: collections.deque[Any] = collections.deque(maxlen=MAX_PENDING_EVENTS)
        self.recorded_at: collections.deque[float] = collections.deque(maxlen=MAX_PENDING_EVENTS)
        self.last_done: Any = None
        self.lost = False  # a marker fell off the full deque: the next one restarts the pacing chain
        self.pacing = GpuPacing()
        self.bound: tuple[Any, float] | None = None  # the oldest marker a poll saw pending, and for how long
        self.last_ooms: dict[int, float] = {}
        # torch.optim loads this module but does not keep it as an attribute: take it from sys.modules (never
        # imported here; torch is the user's)
        optimizer_module = sys.modules.get("torch.optim.optimizer") or torch.optim.optimizer
        self.on_optimizer_step = (step_hook(state, self.first, self._claim) if step_hook is not None
                                  else _not_counted)
        self.handle: Any = None
        if not self.steps.explicit:
            self.handle = optimizer_module.register_optimizer_step_post_hook(self.on_optimizer_step)
        ACTIVE.append(self)
        self.listening = False  # on_step joins the step path only once CUDA is initialised (never on CPU)
        self._sequence_nr = _autograd_sequence_nr(torch) if timing else None
        self.waits = state.waits
        self.flops = FlopCounter(torch, self.steps, hook.drop, hook.settings.flops_every_s if timing else 0.0)
        self._shape_seen = (0, 0, 0)  # steps, samples and tokens at the last flush (the steps' shape: FlopCounter)
        if timing:
            self.steps.ops_reader = self._at_step_end
        self.data = torch_data.attach(state.waits, torch) if timing else None
        self.distributed = torch_distributed.attach(state.loop, torch, hook.drop) if timing else None
        self.setup = TrainingSetup(torch, hook.progress, hook.drop)
        self.checkpoints = (torch_checkpoint.attach(state.steps, state.loop, hook.progress, hook.drop) if timing
                            else None)
        hook.samplers.append(self.sample)

    def detach(self) -> None:
        """Remove every patch and hook from torch (tests; a replaced hook). Idempotent."""
        if self in ACTIVE:
            ACTIVE.remove(self)
        self.stop_counting()
        self.flops.leave()
        if self.steps.ops_reader == self._at_step_end:
            self.steps.ops_reader = None
        if self.data is not None:
            self.data.detach()
        if self.distributed is not None:
            self.distributed.detach()
        self.setup.detach()
        if self.checkpoints is not None:
            self.checkpoints.detach()

    # once per optimizer step: the hook itself is hook/api.py's (on_optimizer_step)
    def _claim(self, optimizer: Any) -> bool:
        """Whether this optimizer's steps count, asked when the one that counted is unset or gone: the first to
        step counts, so a GAN's two optimizers count one step."""
        ref = self.first[0]
        if ref is not None and ref() is not None:
            return False
        self.first[0] = weakref.ref(optimizer)
        return True

    def after_fork_in_child(self) -> None:
        """In a forked child (hook/api.py's fork handler)."""
        self.flops.after_fork_in_child()

    def _at_step_end(self) -> int:
        """The step-end reader (StepState.ops_reader): the hot path calls it at the first step end after each flush
        (want_ops), and at the next one while a step's FLOPs are counted (hook/torch_flops.py); it returns the
        autograd operation counter."""
        flops = self.flops
        if flops.wanted or flops.mode is not None:
            flops.at_step_end()
        return self._sequence_nr() if self._sequence_nr is not None else 0

    def stop_counting(self) -> None:
        """The user times steps (or this integration is detached): the optimizer hook leaves torch's step. Called
        on the user's thread outside any optimizer step (hook/api.py), never while torch iterates its hooks."""
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def on_step(self) -> None:
        cuda = self.torch.cuda
        try:
            if cuda.is_current_stream_capturing():
                return
            event = cuda.Event(enable_timing=True)
            event.record()
            if len(self.pending) == MAX_PENDING_EVENTS:
                self.lost = True
            self.pending.append(event)
            self.recorded_at.append(self.clock())
        except Exception:
            self.hook.drop("cuda_event_error")

    # publisher thread
    def sample(self) -> None:
        self._intra_op_threads()
        self.setup.poll()
        if self.checkpoints is not None:
            self.checkpoints.sample(self.hook)
        if self.steps.ops_reader is not None:
            if self._sequence_nr is not None and self.steps.loop_tid == threading.get_native_id():
                self.steps.ops = self._sequence_nr()  # the final flush, on the loop's thread: now
            self.flops.plan(self._shape())
            self.steps.want_ops = True  # read by the loop's next step end
        if self.steps.ops:
            self.hook.series("counter", "outrider_train_autograd_ops_total", builtin=True).set_total(self.steps.ops)
        if self.distributed is not None:
            self.distributed.poll(self.hook)
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return
        if not self.listening:
            self.listening = True
            self.steps.listeners.append(self.on_step)
        self._poll_events()
        for device in range(cuda.device_count()):
            stats = cuda.memory_stats(device)
            if not stats:
                continue
            self._sample_device(str(device), stats)

    def _shape(self) -> tuple[float, float] | None:
        """Samples and tokens per step since the last flush (None: no step since)."""
        steps, waits = self.steps, self.waits
        n = steps.ring.n
        samples = steps.sample_sum if steps.samples_given else waits.batch_samples
        tokens = steps.token_sum or waits.batch_tokens
        seen, self._shape_seen = self._shape_seen, (n, samples, tokens)
        if n <= seen[0]:
            return None
        return (samples - seen[1]) / (n - seen[0]), (tokens - seen[2]) / (n - seen[0])

    def _intra_op_threads(self) -> None:
        try:
            n = self.torch.get_num_threads()
        except Exception:
            return
        self.hook.series("gauge", "outrider_torch_intra_op_threads", builtin=True).set(n)

    def _poll_events(self) -> None:
        series = self.hook.series
        gpu_step = series("histogram", "outrider_train_gpu_step_duration_seconds", builtin=True)
        busy = observed = 0.0
        while self.pending and self.pending[0].query():
            event = self.pending.popleft()
            host_t = self.recorded_at.popleft()
            interval = None
            if self.last_done is not None and not self.lost:
                interval = self.last_done.elapsed_time(event) / 1000.0
                gpu_step.observe(interval)
            self.lost = False
            age = self.bound[1] if self.bound is not None and self.bound[0] is event else 0.0
            paced = self.pacing.marker(host_t, interval, age)
            if paced is not None:
                busy += paced[0]
                observed += paced[1]
            self.last_done = event
        self.bound = (self.pending[0], self.clock() - self.recorded_at[0]) if self.pending else None
        if observed:
            series("counter", "outrider_train_gpu_busy_seconds_total", builtin=True).inc(busy)
            series("counter", "outrider_train_gpu_observed_seconds_total", builtin=True).inc(observed)

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


# What only training builds, and what it says: (module, class, strong). A class whose module is not imported yet
# is left alone (FSDP: its process group is seen instead).
SETUP_CLASSES = (
    ("torch.optim.optimizer", "Optimizer", "built an optimizer", True),
    ("torch.nn.parallel.distributed", "DistributedDataParallel", "built a DistributedDataParallel wrapper", True),
    ("torch.distributed.fsdp.fully_sharded_data_parallel", "FullyShardedDataParallel", "built an FSDP wrapper",
     True),
)
PROCESS_GROUP = "initialised a torch.distributed process group"


class TrainingSetup:
    """Tells progress.py that this process sets up training, when it does (see the module's docstring)."""

    def __init__(self, torch: Any, progress: Any, drop: Callable[[str], None]) -> None:
        self.torch = torch
        self.progress = progress
        self.drop = drop
        self.pid = os.getpid()  # a forked child inherits the parent's process group, not its training
        self.saved: list[tuple[Any, str, Any]] = []
        for module_name, cls_name, evidence, strong in SETUP_CLASSES:
            cls = getattr(sys.modules.get(module_name), cls_name, None)
            if isinstance(cls, type) and "__init__" in cls.__dict__:
                self._wrap(cls, "__init__", evidence, strong)
        dist = getattr(torch, "distributed", None)
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        name = "init_process_group"
        original = getattr(c10d, name, None)
        if callable(original):
            marking = self._marking(original, PROCESS_GROUP, False)
            for owner in (c10d, dist):
                if owner is not None and getattr(owner, name, None) is original:
                    self.saved.append((owner, name, original))
                    setattr(owner, name, marking)
        self.poll()

    def _wrap(self, owner: Any, name: str, evidence: str, strong: bool) -> None:
        original = owner.__dict__[name]
        self.saved.append((owner, name, original))
        setattr(owner, name, self._marking(original, evidence, strong))

    def _marking(self, original: Callable[..., Any], evidence: str, strong: bool) -> Callable[..., Any]:
        progress, drop = self.progress, self.drop

        @functools.wraps(original)
        def marking(*args: Any, **kwargs: Any) -> Any:
            try:  # before the call: a rendezvous or DDP's first broadcast may be where it hangs
                progress.mark_training(evidence, strong)
            except Exception:
                drop("torch_hook_error")
            return original(*args, **kwargs)

        return marking

    def poll(self) -> None:
        """Publisher thread: a process group initialised before instrument() (or by a library's own import)."""
        if self.progress.weak_evidence or os.getpid() != self.pid:
            return
        try:
            dist = getattr(self.torch, "distributed", None)
            if dist is not None and dist.is_available() and dist.is_initialized():
                self.progress.mark_training(PROCESS_GROUP, False)
        except Exception:
            self.drop("torch_hook_error")

    def detach(self) -> None:
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved.clear()


def _autograd_sequence_nr(torch: Any) -> Callable[[], int] | None:
    fn = getattr(getattr(getattr(torch, "_C", None), "_autograd", None), "_get_sequence_nr", None)
    if not callable(fn):
        LOG.info("outrider: this torch has no autograd sequence number: operations per step are not counted")
        return None
    return fn  # type: ignore[no-any-return]


def attach(hook: Hook, state: HookState, step_hook: StepHook) -> TorchIntegration | None:
    """Attach to the torch the user already imported (never imported here: the hook imports no third-party
    package)."""
    try:
        return TorchIntegration(hook, state, sys.modules["torch"], step_hook, timing=True)
    except Exception as e:
        LOG.warning("outrider: PyTorch integration unavailable: %s", e)
        return None
