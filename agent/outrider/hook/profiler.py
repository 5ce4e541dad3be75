"""Where the training loop's thread spends its time, measured rather than inferred: a low-rate sampler of its
Python stack.

The hook's one thread (runtime.Hook's loop, `outrider-hook`) wakes `profile_hz` times a second (default 50; 0: off)
between its flushes, while the loop steps: once the loop thread is known (the thread of the first step; before it
nothing is sampled) and until it has completed no step for IDLE_S or IDLE_STEPS of its recent steps' median,
whichever is longer (a process that does not step, or stopped stepping, costs no wake-up beyond the flush's:
an idle process paid 0.8% of a core at 50 Hz, and a thousand idle workers starved their own publishers). A
sample takes the loop thread's innermost frame from `sys._current_frames()` and walks it outwards (at most
MAX_DEPTH frames). Each sample is one of WHERE:

- **data**: inside a DataLoader iterator's `__next__` (any frame in torch/utils/data, or the hook's own timed
  `__next__`): the loop waits for its next batch, or fetches it itself (num_workers=0);
- **collective**: inside torch.distributed (all_reduce, barrier, ...);
- **checkpoint**: inside torch.save / torch.load (torch/serialization.py) or torch.distributed.checkpoint;
- **optimizer**: inside an optimizer's step (torch/optim);
- **native**: inside torch (an operator, or torch's own Python layers: nn modules, autograd) or a C call from the
  user's code that released the GIL while the thread was on a CPU (a tensor operation written in the user's file:
  `a @ b`);
- **waiting**: a C call from the user's code that released the GIL while the thread was off CPU (time.sleep, a
  lock, a socket, a file read outside the DataLoader);
- **python**: the user's own Python code running in the interpreter (a tokeniser in the loop, building tensors
  from lists, logging).

The first four are decided by the outermost such frame (a dataset's `__getitem__` called by the DataLoader is
data). For the rest: a sampler in Python needs the GIL, so it can only look at the loop thread when that thread
lets go of it: inside a call that released it (every torch operator does; so do sleep and I/O), or, running
Python, at the switch interval (5 ms) or sooner wherever it next calls into such code. What the thread was doing
*when the sampler woke* is told by whether the sampler then had to wait for the GIL: a wait blocks the sampler's
thread once more after its sleep (the hook thread's wait on its pipe), which the kernel counts as a voluntary
context switch of that thread
(getrusage(RUSAGE_THREAD)). The count is exact and does not depend on how late the timer woke the sampler (a VM's
timers wake 0.1-1 ms late, which a wake-up-lag threshold took for a held GIL), nor on a neighbour keeping the
CPUs busy (waiting for a CPU is an involuntary switch). Then:

- off the CPU since the previous sample (its schedstat: CPU time plus time runnable but waiting for a CPU, so a
  loop starved of CPUs by neighbours is not mistaken for one that blocks): **waiting**, however the GIL was;
- the GIL held at the wake-up: the loop was running Python, **python**, wherever it then let go of the GIL.
  Measured on the tokeniser loop: 92% of the samples waited, half of them seen inside torch's `nn` layers, the
  first place that released the GIL after the Python work; on 60 tiny layers 13% waited, on large matrix
  products 5% (in the DataLoader's Python);
- the GIL free: the loop was in a GIL-free call on a CPU, **native** (an operator, or a C call of the user's:
  `a @ b`).

Where the count is unavailable (not Linux), the wake-up lag decides as before (GIL_WAIT_S).
The frame shown is the one seen once the sampler has the GIL: for a Python sample, the line where the loop let
go of it (the call of the torch function after the Python work), within the user's function that did the work.
Another Python thread of the workload that holds the GIL when the sampler wakes (a busy logging or prefetch
thread) makes that sample python too: the loop shares the interpreter with it.

The hot path is untouched: the sampler reads frames, it never sets a trace or profile function. Each sample holds
the GIL for as long as it takes to walk the stack (measured in benchmarks/profiler_overhead.py). Counts per class
go out as `outrider_train_loop_samples_total{where}`; the top frames of the loop (the innermost frame of the
user's code, `file:line function`, else the innermost frame) as `outrider_train_loop_frame_samples_total{where,
frame}`, at most TOP_PUBLISHED of them, from a table of at most MAX_FRAMES kept with space-saving eviction (a new
frame replaces the least-counted one and inherits its count, so a frame that becomes hot late still rises).
Standard library only; never raises into the workload.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

try:
    import resource

    _RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)  # Linux
except ImportError:  # not Unix
    _RUSAGE_THREAD = None

WHERE = ("python", "native", "waiting", "data", "collective", "checkpoint", "optimizer")
SPECIAL = ("data", "collective", "checkpoint", "optimizer")
MAX_DEPTH = 256
MAX_FRAMES = 512  # the bounded table of frames
TOP_PUBLISHED = 20  # frames published per flush
MAX_FRAME_SERIES = 60  # distinct frame series ever registered (each one a series in the shard)
MAX_FILE_KINDS = 8192
MAX_LABEL = 120
ON_CPU = 0.2
IDLE_S = 10.0  # no step for this long (or IDLE_STEPS recent medians, if longer): the loop is idle, no samples
IDLE_STEPS = 3.0
# Where voluntary switches are not counted per thread (not Linux): a wake-up later than this, less the sampler's
# own run delay, is a wait for the GIL. Timer slack (50 us) and the wake-up itself come first: measured on a
# 2-core machine at load 60, 79-107 us (p10-p90) with the loop in a tensor operation, 190 us at p10 and 640 us at
# p50 with it in a pure-Python tokeniser; a VM's late timers (137 us at p50, 0.8 ms at p90) blur it.
GIL_WAIT_S = 0.00015
_OUTRIDER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# the standard library's directory: where os.py lives (sysconfig would import its generated data module)
_STDLIB = os.path.dirname(os.__file__) + os.sep


def file_kind(path: str) -> str:
    """What a code object's file is: one of SPECIAL, torch, lib (other packages, the standard library),
    outrider, or user."""
    p = path.replace("\\", "/")
    if p.startswith(_OUTRIDER_DIR):
        if p.startswith(_OUTRIDER_DIR + "commands/demo/"):
            return "user"  # the demo's workload is a user's training script
        return "data" if p.endswith("hook/torch_data.py") else "outrider"
    if "/torch/" in p:
        if "/torch/utils/data/" in p:
            return "data"
        if "/torch/serialization.py" in p or "/torch/distributed/checkpoint/" in p:
            return "checkpoint"
        if "/torch/distributed/" in p:
            return "collective"
        if "/torch/optim/" in p:
            return "optimizer"
        return "torch"
    if "/site-packages/" in p or "/dist-packages/" in p or p.startswith("<") or p.startswith(_STDLIB):
        return "lib"
    return "user"


def _thread_switches() -> int | None:
    """Voluntary context switches of the calling thread so far; None where the platform does not count them."""
    if _RUSAGE_THREAD is None:
        return None
    try:
        return int(resource.getrusage(_RUSAGE_THREAD).ru_nvcsw)
    except (OSError, ValueError):
        return None


def frame_label(path: str, line: int, function: str) -> str:
    """`pkg/file.py:42 function`: the last two parts of the path, bounded for a label."""
    parts = path.replace("\\", "/").rsplit("/", 2)
    short = "/".join(parts[-2:])
    text = f"{short}:{line} {function}"
    return text if len(text) <= MAX_LABEL else "..." + text[-(MAX_LABEL - 3):]


class LoopProfiler:
    """Samples the loop thread from the hook's thread (runtime.Sampling): period_s() says when, before_wait() and
    after_wait() tell whether the GIL was held at the wake-up, tick() takes the sample; sample() (a flush's
    sampler) publishes the counts and decides whether the loop is idle."""

    def __init__(self, hook: Any, loop_tid: Callable[[], int], hz: float) -> None:
        """hook: where the series go, and the process's progress (steps, phases); loop_tid: the native id of the
        thread that completes steps (0: none yet, nothing is sampled)."""
        self.hook = hook
        self.loop_tid = loop_tid
        self.period = 1.0 / hz if hz > 0 else 0.0
        self.counts = dict.fromkeys(WHERE, 0)
        self.frames: dict[tuple[str, str], int] = {}
        self.kinds: dict[str, str] = {}
        self.registered: set[tuple[str, str]] = set()
        self.active = False  # the loop steps (sample() decides, once a flush)
        self.pid = os.getpid()
        self.counted = _thread_switches() is not None
        self._native = -1  # the loop thread's native id the ident below is for
        self._ident = 0
        self._clock: int | None = None  # the loop thread's CPU clock, where its schedstat cannot be read
        self._sched_fd = -1  # the loop thread's /proc schedstat: CPU time and time waiting for a CPU
        self._demand = 0.0  # the loop thread's CPU time (+ its wait for a CPU), seconds
        self._at = 0.0  # when _demand was read
        self._delay_fd = -1  # the sampling thread's own schedstat, where switches are not counted
        self._delay_tid = 0

    # --- the flush's sampler -------------------------------------------------------------------------------
    def sample(self) -> None:
        """Once a flush: start afresh in a forked child, decide whether the loop is active, publish the counts."""
        if not self.period:
            return
        pid = os.getpid()
        if pid != self.pid:  # a forked child: the parent's samples and descriptors are the parent's
            self.pid = pid
            self._close_sched()
            self._close_delay()
            self.counts = dict.fromkeys(WHERE, 0)
            self.frames = {}
            self.registered = set()
            self._native = -1
        self.active = self._stepping()
        self.publish()

    def _stepping(self) -> bool:
        """Whether the loop steps now: a step within the idle window, or a declared phase or checkpoint open."""
        p = self.hook.progress
        if not p.steps or not self.loop_tid():
            return False
        if p.open_phases or p.checkpoint_since:
            return True
        return bool(time.perf_counter() - p.last_step_perf <= max(IDLE_S, IDLE_STEPS * p.typical_step_s()))

    def publish(self) -> None:
        # Outside the user's series caps: bounded here (the classes, MAX_FRAME_SERIES frames), and a process at its
        # cap must not lose its profile (nor count its own series as refused, flush after flush).
        counter = self.hook.registry.builtin_counter
        for where, n in list(self.counts.items()):
            if n:
                counter("outrider_train_loop_samples_total", {"where": where}).set_total(n)
        top = sorted(list(self.frames.items()), key=lambda kv: -kv[1])[:TOP_PUBLISHED]
        for key, n in top:
            if key not in self.registered:
                if len(self.registered) >= MAX_FRAME_SERIES:
                    continue
                self.registered.add(key)
            counter("outrider_train_loop_frame_samples_total", {"where": key[0], "frame": key[1]}).set_total(n)

    # --- the hook's thread, between flushes ----------------------------------------------------------------
    def period_s(self) -> float:
        """Seconds between samples now; 0: none (off, or the loop is idle or not known yet)."""
        return self.period if self.active and os.getpid() == self.pid else 0.0

    def before_wait(self) -> tuple[int | None, int]:
        """What after_wait compares with: this thread's voluntary switches, else its wait for a CPU so far."""
        if self.counted:
            return _thread_switches(), 0
        return None, self._own_delay_ns()

    def after_wait(self, mark: tuple[int | None, int], overslept_s: float) -> bool:
        """Whether the GIL was held when this thread woke: the wait blocks it once; blocking again before it could
        run is the GIL's wait. Without a count of switches: the wake-up lag not spent waiting for a CPU."""
        switches, delay_before = mark
        if switches is not None:
            now = _thread_switches()
            if now is not None:
                return now - switches >= 2
        delay = self._own_delay_ns()
        waited = overslept_s - max(0, delay - delay_before) / 1e9
        return waited >= GIL_WAIT_S

    def _own_delay_ns(self) -> int:
        """Nanoseconds the calling thread has waited for a CPU (schedstat's second field); 0 when unknown."""
        tid = threading.get_native_id()
        if tid != self._delay_tid:
            self._close_delay()
            self._delay_tid = tid
            with contextlib.suppress(OSError):
                self._delay_fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        if self._delay_fd < 0:
            return 0
        try:
            return int(os.pread(self._delay_fd, 64, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    def _close_delay(self) -> None:
        if self._delay_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._delay_fd)
            self._delay_fd = -1
        self._delay_tid = 0

    def _loop_ident(self) -> int:
        native = self.loop_tid()
        if native != self._native:
            self._native = native
            ident = threading.main_thread().ident or 0
            if native:
                for t in threading.enumerate():
                    if getattr(t, "native_id", None) == native and t.ident is not None:
                        ident = t.ident
                        break
            self._ident = ident
            self._close_sched()
            self._clock = None
            try:
                self._sched_fd = os.open(f"/proc/self/task/{native}/schedstat", os.O_RDONLY) if native else -1
            except OSError:
                self._sched_fd = -1
            if self._sched_fd < 0:
                try:
                    self._clock = time.pthread_getcpuclockid(ident)
                except (OSError, AttributeError, OverflowError):
                    self._clock = None
            self._demand, self._at = self._loop_demand(), time.perf_counter()
        return self._ident

    def _close_sched(self) -> None:
        if self._sched_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._sched_fd)
            self._sched_fd = -1

    def _loop_demand(self) -> float:
        """The loop thread's CPU time plus its time runnable but waiting for a CPU (schedstat), in seconds; its CPU
        clock alone where schedstat cannot be read; -1.0 when neither can."""
        if self._sched_fd >= 0:
            try:
                fields = os.pread(self._sched_fd, 64, 0).split()
                return (int(fields[0]) + int(fields[1])) / 1e9
            except (OSError, ValueError, IndexError):
                self._close_sched()
        if self._clock is not None:
            try:
                return time.clock_gettime(self._clock)
            except OSError:
                self._clock = None
        return -1.0

    def tick(self, held: bool) -> None:
        """One sample of the loop thread; held: whether the GIL was held when this thread woke (it had to wait)."""
        if not self.loop_tid():
            return  # no step yet: which thread runs the loop is not known (the main thread may only wait for it)
        ident = self._loop_ident()
        on_cpu: bool | None = None
        demand, at = self._loop_demand(), time.perf_counter()
        if demand >= 0 and self._demand >= 0:
            # running or runnable a fifth of the time since the last sample or more: on a CPU, or wanting one on a
            # crowded machine (its wait for a CPU counts: a neighbour's load is not the loop waiting); a thread
            # blocked in sleep, a lock or I/O gathers next to nothing
            on_cpu = (demand - self._demand) >= ON_CPU * (at - self._at)
        self._demand, self._at = demand, at
        frame = sys._current_frames().get(ident)
        if frame is None:
            return
        where, label = self.classify(frame, held=held, on_cpu=on_cpu)
        self.count(where, label)

    def count(self, where: str, label: str) -> None:
        """One sample into the counts and the bounded frame table."""
        self.counts[where] += 1
        key = (where, label)
        frames = self.frames
        if key in frames:
            frames[key] += 1
        elif len(frames) < MAX_FRAMES:
            frames[key] = 1
        else:  # space-saving: the newcomer takes the least-counted entry's place and count
            low = min(frames, key=frames.__getitem__)
            frames[key] = frames.pop(low) + 1

    def _kind(self, path: str) -> str:
        kind = self.kinds.get(path)
        if kind is None:
            kind = file_kind(path)
            if len(self.kinds) < MAX_FILE_KINDS:
                self.kinds[path] = kind
        return kind

    def classify(self, frame: FrameType, held: bool, on_cpu: bool | None) -> tuple[str, str]:
        """(where, the frame to show) of one stack, given its innermost frame; held: the GIL was held when the
        sampler woke; on_cpu: the loop thread ran since the previous sample (None: unknown)."""
        chain: list[tuple[FrameType, str]] = []
        f: FrameType | None = frame
        while f is not None and len(chain) < MAX_DEPTH:
            chain.append((f, self._kind(f.f_code.co_filename)))
            f = f.f_back
        user = next((fr for fr, kind in chain if kind == "user"), None)
        shown = user if user is not None else chain[0][0]
        label = frame_label(shown.f_code.co_filename, shown.f_lineno or 0, shown.f_code.co_name)
        for _, kind in reversed(chain):  # outermost first: the DataLoader calling a dataset is data
            if kind in SPECIAL:
                return kind, label
        if on_cpu is False:  # off the CPU since the last sample (sleep, a lock, I/O): waiting, whatever the GIL
            return "waiting", label
        if held:  # the loop ran Python when the sampler woke: where it let go of the GIL is only where it stopped
            return "python", label
        return "native", label
