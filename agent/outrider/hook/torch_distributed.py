"""Time in collectives, per rank and step, with zero configuration: torch.distributed's collectives and DDP's
gradient buckets, timed where they run.

- **Blocking collectives** (`dist.all_reduce(t)`, `broadcast`, `barrier`, ... called without async_op): the wall
  time of the call, all of it a wait of the loop. On CUDA tensors the call returns once the work is queued, so the
  time is taken from two CUDA events around it (on the current stream, which waits for the collective), resolved
  by the publisher without synchronising; it counts in the collective time but not in the loop's wait (the host
  did not wait). A call made with async_op=True returns a handle and is not timed here (its wait happens in
  Work.wait()); neither is a collective made inside a timed one (all_gather_object's all_gather).
- **DDP**: every gradient bucket's reduction, from the moment DDP hands it over (its gradients are ready) to its
  completion, through a communication hook: the user's own, wrapped when registered, or, when none is registered
  by the first forward, the equivalent of torch's default (`allreduce_hook`: divide by the world size, all-reduce).
  Buckets overlap the backward pass; the loop's accounting (hook/loop.py) counts as a wait only what outlasts the
  last bucket's launch. Buckets on a GPU complete on the device, where host times say nothing: they are not
  timed. A built-in C++ hook (`_register_builtin_comm_hook`) cannot be wrapped: its buckets are not timed (said
  once).

Finished collectives go into the loop accounting's `collectives` deque (hook/state.LoopAccounting) as (begin, end,
op, blocking) on the host clock; appending is atomic, from whichever thread saw the collective finish (gloo runs
DDP's callbacks on its own thread). Nothing here raises into user code: a failing measurement is counted in
outrider_hook_dropped_total, and the collective's own result or exception reaches the caller unchanged.

**At exit** a process that ran a collective gives torch's threads `EXIT_SETTLE_S` without the GIL before the
interpreter finalises. A gloo worker thread frees a finished collective's work after the caller has its result,
and that frees a Python object, which needs the GIL; if the interpreter is finalising by then, CPython ends the
thread inside a C++ destructor and the process aborts with "terminate called without an active exception"
(SIGABRT: torchrun reports the rank failed). That is torch's race, not the hook's: a two-rank DDP script whose
main thread keeps the GIL to its end aborted so 4 times in 10 without Outrider, and 0 in 12 with the hook's pause.
"""

from __future__ import annotations

import atexit
import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any

from outrider.hook.state import LoopAccounting

LOG = logging.getLogger("outrider.hook")
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
               "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "reduce", "all_to_all",
               "all_to_all_single", "barrier", "gather", "scatter", "monitored_barrier")
DDP_OP = "ddp_bucket"
MAX_PENDING_EVENTS = 1024
EXIT_SETTLE_S = 0.05


class CollectiveTimer:
    def __init__(self, loop: LoopAccounting, torch: Any, drop: Callable[[str], None],
                 clock: Callable[[], float] = perf_counter) -> None:
        self.loop = loop
        self.torch = torch
        self.drop = drop
        self.clock = clock
        self.dist = torch.distributed
        self.c10d = torch.distributed.distributed_c10d
        self.ddp = torch.nn.parallel.distributed.DistributedDataParallel
        self.inside = threading.local()
        # (before, after, op) of CUDA collectives not yet resolved: appended by callers, popped by the publisher
        self.events: collections.deque[tuple[Any, Any, str]] = collections.deque(maxlen=MAX_PENDING_EVENTS)
        self.saved: list[tuple[Any, str, Any]] = []  # (owner, attribute, original) to put back
        self.ran_collective = False  # set by the first timed collective or DDP bucket: the exit pause is due
        atexit.register(self.settle_at_exit)
        for name in COLLECTIVES:
            original = getattr(self.c10d, name, None)
            if original is None:
                continue
            timed = self._blocking(name, original)
            for owner in (self.c10d, self.dist):
                if getattr(owner, name, None) is original:
                    self._patch(owner, name, timed)
        ddp = self.ddp
        self._patch(ddp, "register_comm_hook", self._registering(ddp.register_comm_hook))
        self._patch(ddp, "_register_builtin_comm_hook", self._builtin(ddp._register_builtin_comm_hook))
        self._patch(ddp, "forward", self._first_forward(ddp.forward))

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        self.saved.append((owner, name, owner.__dict__[name] if name in owner.__dict__ else getattr(owner, name)))
        setattr(owner, name, replacement)

    def detach(self) -> None:
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved.clear()
        atexit.unregister(self.settle_at_exit)

    def settle_at_exit(self) -> None:
        """atexit, before the interpreter finalises: a pause without the GIL for torch's threads (module docstring).
        Nothing when this process ran no collective."""
        if self.ran_collective:
            time.sleep(EXIT_SETTLE_S)

    # --- blocking collectives (the caller's thread) -------------------------------------------------------
    def _blocking(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            inside = timer.inside
            timer.ran_collective = True
            if kwargs.get("async_op") or getattr(inside, "active", False):
                return original(*args, **kwargs)
            events = timer._cuda_events(args)
            inside.active = True
            try:
                t0 = timer.clock()
                out = original(*args, **kwargs)
                t1 = timer.clock()
            finally:
                inside.active = False
            if out is None:  # a handle means async_op=True: its wait is elsewhere
                timer._done(op, t0, t1, events)
            return out

        return collective

    def _cuda_events(self, args: tuple[Any, ...]) -> Any:
        """A CUDA event recorded before the call when its tensors are on a GPU (None on CPU)."""
        try:
            first = args[0] if args else None
            if isinstance(first, (list, tuple)):
                first = first[0] if first else None
            if first is None or not getattr(first, "is_cuda", False):
                return None
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        except Exception:
            self.drop("collective_timing_error")
            return None

    def _done(self, op: str, t0: float, t1: float, before: Any) -> None:
        try:
            if before is None:
                self.loop.collectives.append((t0, t1, op, True))
            else:
                after = self.torch.cuda.Event(enable_timing=True)
                after.record()
                self.events.append((before, after, op))
        except Exception:
            self.drop("collective_timing_error")

    # --- DDP --------------------------------------------------------------------------------------------------
    def _timed_hook(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        @functools.wraps(hook)
        def timed_comm_hook(state: Any, bucket: Any) -> Any:
            timer.ran_collective = True
            t0 = timer.clock()
            fut = hook(state, bucket)

            def finished(f: Any) -> Any:
                timer.loop.collectives.append((t0, timer.clock(), DDP_OP, False))
                return f.value()

            try:
                if bucket.buffer().is_cuda:
                    return fut  # GPU buckets complete on the device: their host times say nothing
                return fut.then(finished)
            except Exception:
                timer.drop("collective_timing_error")
                return fut

        return timed_comm_hook

    def _registering(self, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        @functools.wraps(original)
        def register_comm_hook(ddp: Any, state: Any, hook: Callable[..., Any]) -> None:
            timer.ran_collective = True
            ddp.__dict__["_outrider_comm_hook"] = True
            original(ddp, state, timer._timed_hook(hook) if callable(hook) else hook)

        return register_comm_hook

    def _builtin(self, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        @functools.wraps(original)
        def register_builtin(ddp: Any, comm_hook_type: Any) -> None:
            timer.ran_collective = True
            ddp.__dict__["_outrider_comm_hook"] = True
            LOG.info("outrider: DDP's built-in communication hook %s is not timed", comm_hook_type)
            original(ddp, comm_hook_type)

        return register_builtin

    def _first_forward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        @functools.wraps(original)
        def forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if "_outrider_comm_hook" not in ddp.__dict__:
                timer._register_default(ddp)
            return original(ddp, *args, **kwargs)

        return forward

    def _register_default(self, ddp: Any) -> None:
        self.ran_collective = True
        ddp.__dict__["_outrider_comm_hook"] = True
        if getattr(ddp, "_comm_hooks", None):
            return  # registered some other way
        dist = self.dist

        def allreduce_hook(state: Any, bucket: Any) -> Any:
            """torch's default_hooks.allreduce_hook: the bucket averaged over the group."""
            group = state if state is not None else dist.group.WORLD
            tensor = bucket.buffer()
            tensor.div_(dist.get_world_size(group))
            work = dist.all_reduce(tensor, group=group, async_op=True)
            return work.get_future().then(lambda fut: fut.value()[0])

        allreduce_hook.__annotations__ = {}  # DDP checks the bucket's annotation: postponed ones are strings
        try:
            type(ddp).register_comm_hook(ddp, None, allreduce_hook)
        except Exception as e:
            self.drop("ddp_comm_hook_error")
            LOG.warning("outrider: DDP's gradient buckets are not timed (%s)", e)

    # --- the publisher thread -------------------------------------------------------------------------------
    def poll(self, hook: Any) -> None:
        """CUDA collectives whose events have completed: their GPU time (never waited for)."""
        events = self.events
        for _ in range(len(events)):
            before, after, op = events.popleft()
            try:
                if not after.query():
                    events.append((before, after, op))  # still running: looked at again next flush
                    continue
                seconds = before.elapsed_time(after) / 1000.0
            except Exception:
                self.drop("collective_timing_error")
                continue
            hook.series("counter", "outrider_train_collective_seconds_total", {"op": op}, builtin=True).inc(seconds)


def attach(loop: LoopAccounting, torch: Any, drop: Callable[[str], None]) -> CollectiveTimer | None:
    try:
        if not torch.distributed.is_available():
            return None
        return CollectiveTimer(loop, torch, drop)
    except Exception as e:
        LOG.warning("outrider: cannot time torch.distributed collectives in this torch (%s)", e)
        return None
