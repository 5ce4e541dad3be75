"""The hook's runtime: one Hook per process, wiring its parts together, and the publisher thread that drives them.

- registry.py: the series and their limits;  progress.py: steps, phases, stalls;
- publisher.py: the shard in the spool;  election.py: starting the agent's process when no agent holds the spool.

The publisher thread wakes every flush interval (1 s): it runs the samplers (the step ring's drain, PyTorch's
allocator and CUDA events), writes the shard (heartbeat, progress, values), checks for a stall (dumping the Python
stacks when one starts) and, while no agent holds the spool's lock, starts one as a separate process. Standard
library only: nothing of the agent is imported or run in this process (decision 9).

Exit paths (the last flush, marked closed): interpreter exit and sys.exit (atexit); SIGTERM with the default
disposition (exit_signal.py: a handler that flushes, restores the default and re-raises, so the exit status stays
the signal's, and a watch for a main thread blocked in C);
a child forked by multiprocessing, which leaves through os._exit (a multiprocessing finalizer); os._exit
elsewhere after an explicit outrider.flush(). SIGKILL loses what changed since the last flush.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from outrider import spool
from outrider.hook import exit_signal
from outrider.hook.election import Election
from outrider.hook.progress import Progress
from outrider.hook.publisher import WRITER_RETRY_S, ShardPublisher
from outrider.hook.registry import Registry
from outrider.hook.series import DURATION_BOUNDS, SIZE_BOUNDS, Counter, Gauge
from outrider.hook.settings import HookSettings
from outrider.kernel import procfs

LOG = logging.getLogger("outrider.hook")


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


class Hook:
    """One per process (renewed in a forked child). Thread-safe registration; lock-free recording."""

    def __init__(self, settings: HookSettings | None = None, identity: Identity | None = None,
                 max_series: int = 2000, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self._wall_ns = wall_ns  # the heartbeats' clock: the system's, or a test's own
        self.settings = s = settings or HookSettings()
        self.identity = identity or Identity(training_job=s.training_job)
        explicit = bool(s.spool_dir)
        self.spool_dir = s.spool_dir or spool.default_dir()
        trusted = frozenset(s.spool_trusted_uids)
        self.registry = Registry(s.hook_max_series_per_metric, max_series)
        self.drop = self.registry.drop
        self.progress = Progress(s.stall_factor, s.stall_floor_s, s.first_step_timeout_s, s.phase_timeout_s,
                                 s.role, training_hint=bool(os.environ.get("TORCHELASTIC_RUN_ID")))
        self.spawned = False
        self._settle_role()
        self.publisher = ShardPublisher(self.spool_dir, explicit, self.drop, trusted, self._retry_s())
        self.election = Election(self.spool_dir, s.listen, explicit, trusted)
        self.samplers: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # One flush at a time: the final one at exit (closing the shard) must not race a periodic one still
        # writing on the publisher thread, which would leave older values and no closed flag as the last word.
        self._flushing = threading.Lock()
        self.closed = False
        # The last flush's series (registry.layout()): read whole by other threads (outrider.prometheus_collector),
        # replaced whole by the publisher, so a reader never sees half of one flush.
        self.last_layout: tuple[list[list[Any]], list[float]] = ([], [])
        # Per thread: how deep it is inside flush()/close(), and a SIGTERM that arrived meanwhile (exit_signal).
        self._inside = threading.local()

    def _retry_s(self) -> float:
        return min(WRITER_RETRY_S, max(1.0, 10 * self.settings.flush_interval_s))

    # --- recording ---------------------------------------------------------------------------------------------
    def series(self, kind: str, name: str, labels: dict[str, str] | None = None,
               bounds: tuple[float, ...] = DURATION_BOUNDS, builtin: bool = False) -> Any:
        return self.registry.series(kind, name, labels, bounds, builtin)

    # --- the publisher thread --------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outrider-hook", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.flush_interval_s):
            try:
                if self.settings.standalone:
                    self.election.maybe_start_agent()
                self.flush()
            except Exception:  # the publisher never dies and never touches the workload
                self.drop("flush_error")
                LOG.debug("outrider hook flush failed", exc_info=True)

    def flush(self, closing: bool = False) -> None:
        """Sample, then publish one consistent state of this process into its shard."""
        self._enter()
        try:
            with self._flushing:
                self._flush(closing)
        finally:
            self._leave()

    def _enter(self) -> None:
        self._inside.depth = getattr(self._inside, "depth", 0) + 1

    def _leave(self) -> None:
        """Leaving the outermost flush or close: a SIGTERM deferred meanwhile on this thread is raised now."""
        self._inside.depth -= 1
        if self._inside.depth == 0 and getattr(self._inside, "deferred", 0):
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
        entries, values = self.registry.layout()
        self.last_layout = (entries, values)
        flags = (spool.FLAG_CLOSED if closing else 0) | (spool.FLAG_STALLED if stall else 0)
        ident = self.identity
        self.publisher.publish(ident.pid, ident.start_ns, ident.meta(), entries, values, flags=flags,
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
    def close(self) -> None:
        """Final flush, marked closed, so the agent can tell a finished process from a dead one."""
        if self.closed:
            return
        self._enter()
        try:
            self.closed = True
            self._stop.set()
            with contextlib.suppress(Exception):
                self.flush(closing=True)
            self.election.stop()
            self.publisher.close()
        finally:
            self._leave()

    def after_fork_in_child(self) -> None:
        """In a forked child: its own identity and shard, zeroed series, no inherited lock or agent, a new thread."""
        self._flushing = threading.Lock()  # the parent's publisher may have held it when the child was forked
        self._inside = threading.local()
        self.election.after_fork_in_child()
        self.registry.reset_after_fork()
        self.progress.reset()
        self.identity = Identity(training_job=self.identity.training_job)
        self._settle_role()
        self.publisher = ShardPublisher(self.spool_dir, self.publisher.explicit, self.drop,
                                        self.publisher.trusted_uids, self._retry_s())
        self._thread = None
        self.closed = False
        self.last_layout = ([], [])  # the parent's series are not the child's
        _close_at_multiprocessing_exit(self)
        self.start()


def register_exit(hook_getter: Callable[[], Hook | None]) -> None:
    """The final flush at interpreter exit (sys.exit included) and, where SIGTERM has its default disposition,
    on SIGTERM (exit_signal.py)."""
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
    "batch_size": ("histogram", "outrider_inference_batch_size", SIZE_BOUNDS),
}
