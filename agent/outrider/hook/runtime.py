"""The hook's runtime: one Hook per process, wiring its parts together, and the one thread that drives them.

- registry.py: the series and their limits;  progress.py: steps, phases, stalls;
- publisher.py: the shard in the spool;  election.py: starting the agent's process when no agent holds the spool;
- profiler.py: where the loop's thread spends its time;  exit_signal.py: SIGTERM;  native.py: OS threads and waits.

The hook takes one thread, `outrider-hook`, and only one: under a thread limit (RLIMIT_NPROC, a pids cgroup) every
thread it takes is one the workload cannot have. The thread waits on the hook's pipe (the Waker) with a timeout:
every flush interval (1 s) it runs the samplers (the step ring's drain, PyTorch's allocator and CUDA events), writes
the shard (heartbeat, progress, values), checks for a stall (dumping the Python stacks when one starts) and, while
no agent holds the spool's lock, starts one as a separate process; between flushes, while the loop steps, it
samples the loop's stack (profiler.py); a byte in the pipe wakes it at once: a signal (the pipe is the process's
signal wakeup descriptor where free: exit_signal.py's watch), or a request from a signal handler (close and
flush, below), or a stop. It logs what the hook has to say (series.log_aside's queue) outside every lock of the
hook. It is an OS thread even under gevent or eventlet (native.py), so it never blocks the workload's greenlets
and they never starve it. Standard library only: nothing of the agent is imported or run in this process
(decision 9).

Signal handlers: everything public may be called from one (a SLURM-style SIGUSR1 handler calling outrider.flush()
to publish before preemption). A flush or close that interrupted this thread's own flush is done when that one
ends, never waited for (it is below the handler on the stack); one that finds another thread flushing waits for it
at most FLUSH_WAIT_S, then is counted (`flush_busy`) and skipped. SIGTERM's handler has the hook's own thread
close the hook, waiting FLUSH_TIMEOUT_S at most.

Exit paths (the last flush, marked closed): interpreter exit and sys.exit (atexit); SIGTERM with the default
disposition outside PID 1 (exit_signal.py: a handler that flushes, restores the default and re-raises, so the exit
status stays the signal's, and a watch for a main thread blocked in C);
a child forked by multiprocessing, which leaves through os._exit (a multiprocessing finalizer); os._exit
elsewhere after an explicit outrider.flush(). SIGKILL loses what changed since the last flush.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from outrider.hook import exit_signal, native
from outrider.hook.election import Election
from outrider.hook.progress import Progress
from outrider.hook.publisher import WRITER_RETRY_S, ShardPublisher
from outrider.hook.registry import MAX_SERIES, Registry
from outrider.hook.series import DURATION_BOUNDS, SIZE_BOUNDS, Counter, Gauge, drain_logs, log_aside
from outrider.hook.settings import HookSettings
from outrider.kernel import procfs
from outrider.shared import spool

LOG = logging.getLogger("outrider.hook")
FLUSH_WAIT_S = 2.0  # how long a flush waits for another thread's flush to end
AGAIN_MAX = 2  # flushes asked by signal handlers during a flush, done right after it (more wait for the next one)
THREAD_NAME = "outrider-hook"
WAKE = b"\0"  # what the hook writes into its own pipe (signal numbers, which the kernel writes, are never 0)


@dataclass
class Identity:
    """Who this process is, as the shard's meta says it (the agent labels every series with rank and job)."""

    pid: int = field(default_factory=os.getpid)
    start_ns: int = field(default_factory=time.time_ns)
    rank: str = field(default_factory=lambda: os.environ.get("RANK", ""))
    local_rank: str = field(default_factory=lambda: os.environ.get("LOCAL_RANK", ""))
    world_size: str = field(default_factory=lambda: os.environ.get("WORLD_SIZE", ""))
    training_job: str = ""
    argv0: str = field(default_factory=lambda: os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python")
    # With the pid, who this process is: a pid reused by another process is never taken for this one.
    starttime: int = field(default_factory=lambda: procfs.start_ticks("/proc", "self") or 0)  # 0: unknown
    role: str = ""  # "worker": a helper of a rank (a spawned child that never stepped), never paged as the rank

    def meta(self) -> dict[str, Any]:
        return {"pid": self.pid, "rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
                "training_job": self.training_job, "argv0": self.argv0, "start_ns": self.start_ns,
                "starttime": self.starttime, "role": self.role}


class Sampling(Protocol):
    """What the hook's thread asks of the loop profiler (profiler.LoopProfiler) between flushes."""

    def period_s(self) -> float: ...  # 0: no sample now (off, no loop thread yet, or the loop is idle)
    def before_wait(self) -> Any: ...
    def after_wait(self, mark: Any, overslept_s: float) -> bool: ...  # whether the GIL was held at the wake-up
    def tick(self, held: bool) -> None: ...


class Waker:
    """The hook thread's pipe: its thread waits on the read end; a signal (the write end as the wakeup descriptor),
    a request from a signal handler or a stop writes a byte. Both ends non-blocking and close-on-exec; without a
    pipe (out of descriptors) the thread polls every POLL_S instead."""

    POLL_S = 0.1

    def __init__(self) -> None:
        self.r = self.w = -1
        # os.read and os.write as the kernel's: eventlet makes them wait in its hub (refused in a signal handler
        # that runs there, and never woken on the hook's own thread)
        self._read: Callable[[int, int], bytes] = os.read
        self._write: Callable[[int, bytes], int] = os.write

    def open(self) -> bool:
        if self.r >= 0:
            return True
        try:
            r, w = os.pipe()
        except OSError:
            return False
        for fd in (r, w):
            os.set_blocking(fd, False)
        self._read, self._write = native.original("os", "read"), native.original("os", "write")
        self.r, self.w = r, w
        return True

    def poke(self) -> None:
        if self.w >= 0:
            with contextlib.suppress(OSError):  # full (already poked) or gone: either way the thread wakes
                self._write(self.w, WAKE)

    def wait(self, timeout_s: float, select: Callable[..., Any], sleep: Callable[[float], None]) -> bytes:
        """Waits up to timeout_s for a byte; returns what was read (b"" on a timeout)."""
        if self.r < 0:
            sleep(min(max(0.0, timeout_s), self.POLL_S))
            return b""
        try:
            ready, _, _ = select([self.r], [], [], max(0.0, timeout_s))
        except (OSError, ValueError):
            sleep(min(max(0.0, timeout_s), self.POLL_S))
            return b""
        if not ready:
            return b""
        out = b""
        with contextlib.suppress(OSError):  # BlockingIOError once drained
            while len(out) < 4096:
                chunk = self._read(self.r, 512)
                if not chunk:
                    break
                out += chunk
        return out

    def after_fork_in_child(self) -> None:
        """The parent's pipe is the parent's: the child closes its copies (the write end was pointed at /dev/null
        first where it was the wakeup descriptor) and makes its own at its thread's start."""
        for fd in (self.r, self.w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.r = self.w = -1


def spawned_child() -> bool:
    """Whether multiprocessing started this process with spawn or forkserver (a DataLoader worker with
    multiprocessing_context="spawn", a pool, a helper). It inherits its parent's environment (RANK,
    TORCHELASTIC_RUN_ID, OUTRIDER_ROLE) but is not that rank: it is one only once it steps. While it imports the
    parent's main module (where instrument() may be called) its __main__ is "__mp_main__" and multiprocessing is
    "inheriting"; later, parent_process() says so."""
    if "--multiprocessing-fork" in getattr(sys, "argv", ()):
        return True
    main = sys.modules.get("__main__")
    if getattr(main, "__name__", "") == "__mp_main__":
        return True
    mp = sys.modules.get("multiprocessing.process")
    if mp is None:
        return False
    try:
        return bool(getattr(mp.current_process(), "_inheriting", False)) or mp.parent_process() is not None
    except Exception:
        return False


def in_dataloader_worker() -> bool:
    """Whether this is a torch DataLoader worker (its worker loop has set get_worker_info())."""
    worker = sys.modules.get("torch.utils.data._utils.worker")
    return worker is not None and getattr(worker, "_worker_info", None) is not None


def absolute_dir(path: str) -> str:
    """A relative spool directory taken against the workload's working directory at the hook's start. The shards
    must stay where they began whatever the workload's later chdir, and the standalone agent, started in /, must be
    told the same place (a relative --spool-dir would be read from /). Kept as given where there is no working
    directory left to resolve it against (a removed one): the hook never raises."""
    if not path or os.path.isabs(path):
        return path
    try:
        return os.path.abspath(path)
    except OSError:
        return path


class Hook:
    """One per process (renewed in a forked child). Thread-safe registration; lock-free recording."""

    def __init__(self, settings: HookSettings | None = None, identity: Identity | None = None,
                 max_series: int = MAX_SERIES, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self._wall_ns = wall_ns  # the heartbeats' clock: the system's, or a test's own
        self.settings = s = settings or HookSettings()
        self.identity = identity or Identity(training_job=s.training_job)
        explicit = bool(s.spool_dir)
        self.spool_dir = absolute_dir(s.spool_dir) or spool.default_dir()
        trusted = frozenset(s.spool_trusted_uids)
        self.registry = Registry(s.hook_max_series_per_metric, max_series)
        # Recording: the series for a kind, name and labels (created on first use), typed by kind as the registry's
        # overloads say (a Counter | NoopSeries for "counter", ...); the registry's own method, no call in between
        self.series = self.registry.series
        self.drop = self.registry.drop
        self.progress = Progress(s.stall_factor, s.stall_floor_s, s.first_step_timeout_s, s.phase_timeout_s,
                                 s.role, training_hint=bool(os.environ.get("TORCHELASTIC_RUN_ID")))
        self.spawned = False
        self._settle_role()
        self.publisher = ShardPublisher(self.spool_dir, explicit, self.drop, trusted, self._retry_s())
        self.election = Election(self.spool_dir, s.listen, explicit, trusted)
        self.samplers: list[Callable[[], None]] = []
        self.profiler: Sampling | None = None
        self.waker = Waker()
        self._stopping = False
        self._running = False  # the hook's thread is in its loop
        self._thread_failed = False  # no thread could be started (said once)
        self._requests: collections.deque[tuple[str, Any]] = collections.deque()  # from signal handlers
        # One flush at a time: the final one at exit (closing the shard) must not race a periodic one still
        # writing on the hook's thread, which would leave older values and no closed flag as the last word. An OS
        # lock even under gevent: the hook's thread is an OS thread (native.py).
        self._flushing = native.allocate_lock()
        self.closed = False
        # The last flush's series (registry.layout()): read whole by other threads (outrider.prometheus_collector),
        # replaced whole by the publisher, so a reader never sees half of one flush.
        self.last_layout: tuple[list[list[Any]], list[float]] = ([], [])
        # Per thread: how deep it is inside flush()/close(), and a SIGTERM that arrived meanwhile (exit_signal).
        self._inside = threading.local()

    def _retry_s(self) -> float:
        return min(WRITER_RETRY_S, max(1.0, 10 * self.settings.flush_interval_s))

    # --- the hook's thread -------------------------------------------------------------------------------------
    def start(self) -> bool:
        """Starts the hook's thread (again, after a fork or a stop); False when no thread can be started now (a
        thread limit): the hook then publishes only at exit and on outrider.flush(), which tries again."""
        if self._running:
            return True
        if self.waker.open():
            exit_signal.take_wakeup_fd(self.waker.w)  # refused on any thread but the main one
        self._stopping = False
        self._running = True  # before the start: a second start() meanwhile must not start a second thread
        if native.start_thread(self._run, THREAD_NAME):
            return True
        self._running = False
        self.drop("no_thread")
        if not self._thread_failed:
            self._thread_failed = True
            log_aside(LOG, logging.WARNING, "outrider: the hook could not start its thread (a thread limit: ulimit -u, "
                      "a pids cgroup); metrics are published at exit and by outrider.flush(), which tries again")
            drain_logs()  # no thread will: said here (instrument() or a flush, never a signal handler's close)
        return False

    def stop(self) -> None:
        """The thread leaves its loop at its next wake-up (now: the waker is poked); the hook stays usable."""
        self._stopping = True
        self.waker.poke()

    @property
    def running(self) -> bool:
        return self._running

    def _run(self) -> None:
        """The hook's thread: flushes every flush interval, samples the loop in between, and answers its pipe."""
        select, sleep = native.original("select", "select"), native.original("time", "sleep")
        clock = time.monotonic
        interval = self.settings.flush_interval_s
        next_flush = clock() + interval
        next_tick = 0.0
        try:
            while not self._stopping:
                now = clock()
                profiler = self.profiler
                period = profiler.period_s() if profiler is not None else 0.0
                due = min(next_flush, max(next_tick, now)) if period else next_flush
                watch = exit_signal.due()
                if watch is not None:
                    due = min(due, watch)
                mark = profiler.before_wait() if period and profiler is not None else None
                data = self.waker.wait(due - now, select, sleep)
                woke = clock()
                if data:
                    exit_signal.on_wakeup(data, woke)
                    self._serve_requests()
                exit_signal.check(woke)
                if period and profiler is not None and not data and woke >= next_tick:
                    try:
                        profiler.tick(profiler.after_wait(mark, woke - due))
                    except Exception:
                        self.drop("profiler_error")
                    next_tick = next_tick + period if woke - next_tick < period else woke + period
                if woke >= next_flush and not self._stopping:
                    if self.settings.standalone:
                        try:
                            self.election.maybe_start_agent()
                        except Exception:  # never the flush's problem
                            self.drop("election_error")
                    try:
                        self.flush()
                    except Exception:  # the thread never dies and never touches the workload
                        self.drop("flush_error")
                    next_flush = max(next_flush + interval, clock() + interval / 2)
                drain_logs()
        finally:
            self._running = False

    def _serve_requests(self) -> None:
        """What signal handlers asked of this thread: ("flush" | "close", a lock to release when done)."""
        while self._requests:
            try:
                what, done = self._requests.popleft()
            except IndexError:
                break
            try:
                if what == "close":
                    self.close()
                else:
                    self.flush()
            except Exception:
                self.drop("flush_error")
            finally:
                with contextlib.suppress(RuntimeError):
                    done.release()

    def _ask_thread(self, what: str, timeout_s: float) -> bool:
        """Has the hook's thread do `what`, waiting at most timeout_s; False when it is not running, or did not get
        to it in time (the caller then does what it can without waiting)."""
        if not self._running or self.waker.w < 0:
            return False
        done = native.allocate_lock()
        done.acquire()
        self._requests.append((what, done))
        self.waker.poke()
        return bool(done.acquire(timeout=timeout_s))

    def close_from_signal(self, timeout_s: float) -> None:
        """close(), from a signal handler: on the hook's thread (the interrupted code may hold what a flush needs),
        else here, waiting for nothing."""
        if not self._ask_thread("close", timeout_s):
            self.close(wait_s=0.0)

    def flush_from_signal(self, timeout_s: float) -> None:
        if not self._ask_thread("flush", timeout_s):
            self.flush(wait_s=0.0)

    def flush(self, closing: bool = False, wait_s: float = FLUSH_WAIT_S) -> None:
        """Sample, then publish one consistent state of this process into its shard. Called again on a thread that
        is inside a flush (a signal handler that interrupted it), it has that flush publish once more when it ends;
        waits at most wait_s for another thread's flush."""
        if self._thread_failed and not self._running and not self.closed:
            self.start()  # no thread could start at instrument() (a thread limit): try again
        self._enter()
        try:
            if getattr(self._inside, "flushing", False):
                self._inside.again = max(getattr(self._inside, "again", 0), 2 if closing else 1)
                return
            if not (self._flushing.acquire(timeout=wait_s) if wait_s > 0 else self._flushing.acquire(False)):
                self.drop("flush_busy")
                return
            self._inside.flushing = True
            try:
                self._flush(closing)
                for _ in range(AGAIN_MAX):  # bounded: a storm of handlers must not keep the loop here
                    again, self._inside.again = getattr(self._inside, "again", 0), 0
                    if not again:
                        break
                    self._flush(closing or again == 2)
            finally:
                self._inside.flushing = False
                self._flushing.release()
        finally:
            self._leave()

    def _enter(self) -> None:
        self._inside.depth = getattr(self._inside, "depth", 0) + 1

    def _leave(self) -> None:
        """Leaving the outermost flush or close: a close asked meanwhile on this thread (by a signal handler) is
        done now, then a SIGTERM deferred meanwhile is raised."""
        self._inside.depth -= 1
        if self._inside.depth:
            return
        if getattr(self._inside, "close_pending", False):
            self._inside.close_pending = False
            self.close()
        if getattr(self._inside, "deferred", 0):
            signum, self._inside.deferred = self._inside.deferred, 0
            os.kill(os.getpid(), signum)

    def defer_exit_signal(self, signum: int) -> bool:
        """Called by the SIGTERM handler: when it interrupted this very thread inside flush() or close(), that
        flush cannot be waited for (it is below the handler on the stack), so the signal is raised again once it
        is done. False when the thread is elsewhere."""
        if getattr(self._inside, "depth", 0) == 0:
            return False
        self._inside.deferred = signum
        return True

    def _flush(self, closing: bool) -> None:
        if self.closed and not closing:
            return  # the publisher woke after close(): the closed shard is the last word
        for sample in list(self.samplers):
            try:
                sample()
            except Exception:
                self.drop("sampler_error")
        p = self.progress
        self._settle_role()
        self._publish_progress(p)
        if self.publisher.writer is None and not (p.steps or p.training or self.registry.has_data()):
            return  # nothing to say yet: no shard, no file
        stall = None if closing or self.closed else p.check()
        entries, values, sketches = self.registry.layout()
        self.last_layout = (entries, values)
        flags = (spool.FLAG_CLOSED if closing else 0) | (spool.FLAG_STALLED if stall else 0)
        ident = self.identity
        self.publisher.publish(ident.pid, ident.start_ns, ident.meta(), entries, values, sketches, flags=flags,
                               stalls=p.stalls, heartbeat_ns=self._wall_ns(), last_step_ns=p.last_step_wall_ns(),
                               steps=p.steps, stalled_since_ns=p.stalled_since_ns)
        if stall is not None and stall.newly:
            self.publisher.dump_stacks(f"# outrider: pid {ident.pid} rank {ident.rank or '-'}: {stall.message}\n")

    def _settle_role(self) -> None:
        """A spawned child takes nothing from its parent's environment that would make it a rank (torchrun's
        hint, OUTRIDER_ROLE=training): it is a worker until it steps or uses a training API, so one that never
        steps (a DataLoader worker) never waits for a first step and never pages."""
        p = self.progress
        if not self.spawned:
            with contextlib.suppress(Exception):  # never a reason for a flush (or instrument()) to fail
                self.spawned = spawned_child() or in_dataloader_worker()
            if self.spawned:
                p.training_hint = False
                if p.role == "training":
                    p.role = ""
        if self.spawned:
            self.identity.role = "" if p.training else "worker"

    def _publish_progress(self, p: Progress) -> None:
        """Progress as series: steps, phases, and whether the first step is still awaited."""
        reg = self.registry
        if p.steps:
            reg.builtin_counter("outrider_train_steps_total").set_total(p.steps)
        for name, (seconds, active) in p.phase_seconds().items():  # names are user input: the registry's caps
            total = reg.series("counter", "outrider_train_phase_seconds_total", {"phase": name}, builtin=True)
            if isinstance(total, Counter):
                total.set_total(seconds)
            gauge = reg.series("gauge", "outrider_train_phase_active", {"phase": name}, builtin=True)
            if isinstance(gauge, Gauge):
                gauge.set(1.0 if active else 0.0)
        if p.training or p.pending_published:  # 0 once no longer training (it served requests after all)
            p.pending_published = True
            pending = reg.series("gauge", "outrider_train_first_step_pending", builtin=True)
            if isinstance(pending, Gauge):
                pending.set(1.0 if p.first_step_pending else 0.0)

    # --- lifecycle -------------------------------------------------------------------------------------------
    def close(self, wait_s: float = FLUSH_WAIT_S) -> None:
        """Final flush, marked closed, so the agent can tell a finished process from a dead one. Asked on a thread
        that is inside a flush or close (a signal handler that interrupted it), it is done once that ends."""
        if self.closed:
            return
        if getattr(self._inside, "depth", 0):
            self._inside.close_pending = True
            return
        self._enter()
        try:
            self.closed = True
            self.stop()
            with contextlib.suppress(Exception):
                self.flush(closing=True, wait_s=wait_s)
            self.election.stop()
            self.publisher.close()
        finally:
            self._leave()
        drain_logs()  # the exit path: what the hook's thread had no time to log

    def after_fork_in_child(self) -> None:
        """In a forked child: its own identity and shard, zeroed series, no inherited lock or agent, a new thread."""
        self._flushing = native.allocate_lock()  # the parent's thread may have held it when the child was forked
        self._inside = threading.local()
        self._running = self._stopping = False  # the parent's thread is not the child's
        self._requests = collections.deque()
        inherited = self.waker.w
        exit_signal.after_fork_in_child(inherited)
        self.waker.after_fork_in_child()
        self.election.after_fork_in_child()
        self.registry.reset_after_fork()
        self.progress.reset()
        self.identity = Identity(training_job=self.identity.training_job)
        self._settle_role()
        self.publisher = ShardPublisher(self.spool_dir, self.publisher.explicit, self.drop,
                                        self.publisher.trusted_uids, self._retry_s())
        self.closed = False
        self.last_layout = ([], [])  # the parent's series are not the child's
        _close_at_multiprocessing_exit(self)
        self.start()


def register_exit(hook_getter: Callable[[], Hook | None]) -> None:
    """The final flush at interpreter exit (sys.exit included) and, where SIGTERM has its default disposition
    (outside PID 1, where that disposition ignores it), on SIGTERM (exit_signal.py)."""
    def on_exit() -> None:
        h = hook_getter()
        if h is not None:
            h.close()

    atexit.register(on_exit)
    exit_signal.install(hook_getter)


def _close_at_multiprocessing_exit(hook: Hook) -> None:
    """In a forked child: a child started by multiprocessing leaves through os._exit, past atexit; its exit
    runs multiprocessing's finalizers instead (cleared at its start, then its after-fork functions run, where
    this one registers the final flush). Only when multiprocessing is loaded; nothing is imported for it."""
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is None:
        return
    with contextlib.suppress(Exception):
        mp_util.register_after_fork(hook, _register_multiprocessing_finalizer)


def _register_multiprocessing_finalizer(hook: Hook) -> None:
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        with contextlib.suppress(Exception):
            mp_util.Finalize(hook, hook.close, exitpriority=-100)  # after the user's own finalizers


BUILTIN = {
    "step": ("histogram", "outrider_train_step_duration_seconds", DURATION_BOUNDS),
    "samples": ("counter", "outrider_samples_total", ()),
    "tokens": ("counter", "outrider_tokens_total", ()),
    "data_wait": ("histogram", "outrider_train_data_wait_seconds", DURATION_BOUNDS),
    "gpu_step": ("histogram", "outrider_train_gpu_step_duration_seconds", DURATION_BOUNDS),
    "first_step": ("gauge", "outrider_train_time_to_first_step_seconds", ()),
    "first_step_at": ("gauge", "outrider_train_first_step_timestamp_seconds", ()),
    "batch_size": ("histogram", "outrider_inference_batch_size", SIZE_BOUNDS),
}
