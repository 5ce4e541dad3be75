"""Exit with the workload: the agent's end where Kubernetes has no native sidecars (a sidecar in a Job on a cluster
older than 1.29 would otherwise keep the pod Running after the trainer exits).

"The workload" is every process that published to the spool (instrumented processes, as the sweep's
outrider_hook_processes counts them: a shard not yet closed whose process is alive) plus, when `pids` are given,
those process trees. It has been seen once a sweep found one of them alive, or found the values of one that had
already exited (outrider_hook_retired_series: a trainer that lived less than one sweep, a crash at start). Once
seen and none is alive for a grace period (a launcher's next stage, `python prep.py && python train.py`, gets that
long to publish), the agent stops the way SIGTERM stops it: a final sweep, which takes in the values of the shards
closed last, and a flush of OTLP; then `outrider agent` exits 0.

A workload that is never seen (it failed before `instrument()`, or never calls it, and no `pids` are given) ends
the agent the same way after `startup_grace_s` (0: the agent then runs until it is told to stop).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from outrider.kernel import procfs

if TYPE_CHECKING:
    from outrider.config import Config
    from outrider.metrics.family import Family
    from outrider.sampler import Sampler

LOG = logging.getLogger("outrider.lifecycle")


def grace_s(interval_s: float) -> float:
    """Three sweeps, at least 5 s: long enough for a shard closed mid-sweep to be read, and for a chain of
    commands to start its next instrumented process."""
    return max(3.0 * interval_s, 5.0)


class WorkloadWatch:
    """Sweep by sweep, counts the workload's live processes; calls on_gone once, when it has been seen and then
    nothing of it was alive for grace_s (measured on the monotonic clock)."""

    def __init__(self, live: Callable[[Sequence[Family]], int], grace_s: float,
                 on_gone: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 ran: Callable[[Sequence[Family]], bool] = lambda families: False,
                 startup_grace_s: float = 0.0) -> None:
        self._live = live
        self._ran = ran
        self.grace_s = grace_s
        self.startup_grace_s = startup_grace_s
        self.on_gone = on_gone
        self.on_empty: Callable[[], None] | None = None  # once, when the grace period first starts
        self._clock = clock
        self._started = clock()
        self.seen = False
        self.gone = False
        self._empty_since: float | None = None

    def on_sweep(self, families: Sequence[Family]) -> None:
        """A sampler listener: runs after the collectors of each sweep, the hook collector's view fresh."""
        if self.gone:
            return
        alive = self._live(families)
        now = self._clock()
        if alive:
            if not self.seen:
                LOG.info("watching the workload: %d process(es); the agent exits once none is left", alive)
            self.seen = True
            self._empty_since = None
            return
        if not self.seen and self._ran(families):
            self.seen = True  # it came and went between two sweeps: its values are in, it has run
            LOG.info("the workload ran and exited between two sweeps")
        if not self.seen:
            if self.startup_grace_s > 0 and now - self._started >= self.startup_grace_s:
                self.gone = True
                LOG.warning("no workload appeared within startup_grace_s (%g s): it failed before instrument(), or "
                            "does not call it; the workload is gone: final sweep and flush, then exit",
                            self.startup_grace_s)
                if self.on_gone is not None:
                    self.on_gone()
            return
        if self._empty_since is None:
            self._empty_since = now
            LOG.info("the workload has exited; stopping in %g s unless it comes back", self.grace_s)
            if self.on_empty is not None:
                self.on_empty()
                self.on_empty = None
        if now - self._empty_since >= self.grace_s:
            self.gone = True
            LOG.info("the workload is gone: final sweep and flush, then exit")
            if self.on_gone is not None:
                self.on_gone()


def live_processes(proc_root: str, roots: tuple[int, ...]) -> Callable[[Sequence[Family]], int]:
    """What counts as the workload in a sweep: the hooked processes it saw alive (outrider_hook_processes, any
    state) plus the live (not zombie) processes of the trees rooted at `roots`."""

    def live(families: Sequence[Family]) -> int:
        n = sum(int(v) for f in families if f.defn.name == "outrider_hook_processes"
                for _, v in f.samples if isinstance(v, float))
        for pid in procfs.descendants(proc_root, roots) if roots else ():
            try:
                if procfs.read_proc_stat(proc_root, pid).state not in ("Z", "X"):
                    n += 1
            except (OSError, ValueError, IndexError):
                continue  # exited between listing and reading
        return n

    return live


def ran_and_exited(families: Sequence[Family]) -> bool:
    """Whether the sweep holds values of hooked processes that already exited (their series, retired)."""
    return any(v > 0 for f in families if f.defn.name == "outrider_hook_retired_series"
               for _, v in f.samples if isinstance(v, float))


def attach(sampler: Sampler, config: Config) -> WorkloadWatch | None:
    """A WorkloadWatch listening to the sampler's sweeps when exit_when_workload_exits is set, else None."""
    if not config.exit_when_workload_exits:
        return None
    roots = sampler.ctx.roots
    if "hook" not in {c.name for c in sampler.collectors} and not roots:
        LOG.warning("exit_when_workload_exits: with neither the hook collector nor pids there is no workload to "
                    "watch; the agent runs until it is stopped")
    watch = WorkloadWatch(live_processes(config.proc_root, roots), grace_s(config.interval_s), ran=ran_and_exited,
                          startup_grace_s=config.startup_grace_s)
    sampler.listeners.append(watch.on_sweep)
    return watch
